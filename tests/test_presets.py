"""Presets: every row's parameter count equals the Hugging Face equivalent built from the published config, and the
table's API (get_preset, the listing CLI, ELECTRA generator sizes) behaves as documented."""
import pytest
import torch
import transformers as T

from trainer.models import PRESET_ROWS, PRESETS, ModelConfig, get_preset
from trainer.models.__main__ import main as list_presets
from trainer.models.electra import ElectraPretrainingModel
from trainer.models.heads import count_parameters
from trainer.models.presets import preset_parameters

# The Hugging Face side, written from the published config.json files (not from our configs), so a wrong preset
# row fails here. Each: (class, config class, config kwargs).
BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
ROBERTA = dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
ALBERT = dict(vocab_size=30000, embedding_size=128)
HF_EQUIVALENT = {
    "bert-base": (T.BertForPreTraining, T.BertConfig, {}),
    "bert-large": (T.BertForPreTraining, T.BertConfig, BERT_LARGE),
    "roberta-base": (T.RobertaForMaskedLM, T.RobertaConfig, ROBERTA),
    "roberta-large": (T.RobertaForMaskedLM, T.RobertaConfig, {**ROBERTA, **BERT_LARGE}),
    "albert-base": (T.AlbertForPreTraining, T.AlbertConfig,
                    dict(ALBERT, hidden_size=768, num_attention_heads=12, intermediate_size=3072)),
    "albert-large": (T.AlbertForPreTraining, T.AlbertConfig, dict(ALBERT, **BERT_LARGE)),
    "albert-xlarge": (T.AlbertForPreTraining, T.AlbertConfig,
                      dict(ALBERT, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                           intermediate_size=8192)),
    "albert-xxlarge": (T.AlbertForPreTraining, T.AlbertConfig,
                       dict(ALBERT, hidden_size=4096, num_hidden_layers=12, num_attention_heads=64,
                            intermediate_size=16384)),
    "electra-small": (T.ElectraForPreTraining, T.ElectraConfig,
                      dict(embedding_size=128, hidden_size=256, num_attention_heads=4, intermediate_size=1024)),
    "electra-small-generator": (T.ElectraForMaskedLM, T.ElectraConfig,
                                dict(embedding_size=128, hidden_size=64, num_attention_heads=1,
                                     intermediate_size=256)),
    "electra-base": (T.ElectraForPreTraining, T.ElectraConfig,
                     dict(embedding_size=768, hidden_size=768, num_attention_heads=12, intermediate_size=3072)),
    "electra-base-generator": (T.ElectraForMaskedLM, T.ElectraConfig,
                               dict(embedding_size=768, hidden_size=256, num_attention_heads=4,
                                    intermediate_size=1024)),
    "electra-large": (T.ElectraForPreTraining, T.ElectraConfig, dict(BERT_LARGE, embedding_size=1024)),
    "electra-large-generator": (T.ElectraForMaskedLM, T.ElectraConfig,
                                dict(embedding_size=1024, hidden_size=256, num_hidden_layers=24,
                                     num_attention_heads=4, intermediate_size=1024)),
    "ernie-base": (T.ErnieForPreTraining, T.ErnieConfig,
                   # layer_norm_eps: Paddle's LayerNorm default, which ERNIE 1.0 was trained with (config.json omits it)
                   dict(vocab_size=18000, max_position_embeddings=513, hidden_act="relu", layer_norm_eps=1e-5)),
    "ernie2-base": (T.ErnieForPreTraining, T.ErnieConfig, dict(type_vocab_size=4, use_task_id=True,
                                                               task_type_vocab_size=3, layer_norm_eps=1e-5)),
    "tiny": (T.BertForPreTraining, T.BertConfig,
             dict(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128)),
}
# Sizes the papers report (millions), to the paper's rounding; ALBERT-xxlarge's 235M is the paper's figure, while
# its published config gives 223M in both Hugging Face and here.
PAPER_MILLIONS = {"bert-base": 110, "bert-large": 336, "roberta-base": 125, "roberta-large": 355,
                  "albert-base": 12, "albert-large": 18, "albert-xlarge": 59, "electra-small": 14,
                  "electra-base": 109, "electra-large": 335}


def hf_count(name: str) -> int:
    cls, config_cls, kwargs = HF_EQUIVALENT[name]
    with torch.device("meta"):
        return cls(config_cls(**kwargs)).num_parameters()


@pytest.mark.parametrize("name", sorted(HF_EQUIVALENT))
def test_preset_count_equals_hugging_face(name):
    assert preset_parameters(name) == hf_count(name)


# Every field of a transformers config that shapes the model or its numerics.
HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
             "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "embedding_size",
             "num_hidden_groups", "inner_group_num", "use_task_id", "task_type_vocab_size")


@pytest.mark.parametrize("name", sorted(HF_EQUIVALENT))
def test_preset_config_equals_the_published_hugging_face_config(name):
    """The config our export writes for the preset (hf_config) against the published one, field by field: equal
    counts do not catch a swapped activation, layer-norm epsilon, dropout or position table."""
    from trainer.models.hf_convert import hf_config
    cls, config_cls, kwargs = HF_EQUIVALENT[name]
    ours = hf_config(PRESETS[name], cls.__name__)
    assert type(ours) is config_cls
    ours, ref = ours.to_dict(), config_cls(**kwargs).to_dict()
    diff = {f: (ours.get(f), ref.get(f)) for f in HF_FIELDS if ours.get(f) != ref.get(f)}
    assert not diff, f"{name}: (ours, published) {diff}"


@pytest.mark.parametrize("name", sorted(PAPER_MILLIONS))
def test_preset_count_matches_paper(name):
    assert round(preset_parameters(name) / 1e6) == PAPER_MILLIONS[name]


def test_bert_base_encoder_alone_matches_bert_model():
    # What the BERT paper's 110M counts: encoder + pooler (BertModel).
    from trainer.models import PretrainingModel
    from trainer.models.heads import HeadSpec
    with torch.device("meta"):
        ours = PretrainingModel(PRESETS["bert-base"], {"pool": HeadSpec("sequence", 2)})
        ref = T.BertModel(T.BertConfig()).num_parameters()
    # our pooler sits in the sequence head, whose 2-way classifier BertModel does not have
    assert count_parameters(ours) - (768 * 2 + 2) == ref


def test_every_preset_is_covered_by_a_reference():
    assert set(PRESET_ROWS) - set(HF_EQUIVALENT) <= {"tiny-roberta", "tiny-albert", "tiny-electra", "tiny-ernie",
                                                     "tiny-electra-generator"}


def test_electra_joint_model_shares_one_embedding_block():
    cfg = PRESETS["electra-small"]
    with torch.device("meta"):
        joint = ElectraPretrainingModel(cfg)
    embeddings = count_parameters(joint.discriminator.encoder.embeddings)
    assert count_parameters(joint) == (preset_parameters("electra-small")
                                       + preset_parameters("electra-small-generator") - embeddings)
    assert joint.generator_cfg == PRESETS["electra-small-generator"]


def test_get_preset_overrides_validate():
    cfg = get_preset("bert-base", vocab_size=32000, unpad=True)
    assert (cfg.vocab_size, cfg.unpad, cfg.hidden_size) == (32000, True, 768)
    assert PRESETS["bert-base"].vocab_size == 30522  # the table row is untouched
    with pytest.raises(KeyError, match="unknown model preset 'bert-huge'.*bert-base"):
        get_preset("bert-huge")
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        get_preset("bert-base", num_heads=7)
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        get_preset("bert-base", hiden_size=3)
    with pytest.raises(ValueError, match="segment_alternatives names 'role'"):
        ModelConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, segment_alternatives=["role"])


def test_listing_prints_every_preset_once_with_its_count(capsys):
    assert list_presets([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(PRESET_ROWS)
    for name in PRESET_ROWS:
        (line,) = [ln for ln in lines if ln.split()[0] == name]
        assert f"{preset_parameters(name):,d} parameters" in line
