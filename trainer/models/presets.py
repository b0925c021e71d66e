"""Published model sizes as a table: one row per preset, each a ModelConfig plus the heads its paper counts.

What a preset's parameter count includes (the way the papers and Hugging Face report them; tied decoder weights and
shared layers counted once; the vocabulary padding rows of ModelConfig.pad_vocab_to left out, as the export drops
them: bert-base stores 30,528 x 768 word-embedding rows and 30,528 decoder biases, 4,614 more than it counts):

- bert-*, ernie-*, tiny: encoder + pooler + MLM head + NSP classifier   == Hugging Face BertForPreTraining /
  ErnieForPreTraining (bert-base 110M, bert-large 335M);
- roberta-*: encoder + MLM head (no pooler, no NSP)                    == RobertaForMaskedLM (125M, 355M);
- albert-*: encoder + pooler + MLM head + SOP classifier               == AlbertForPreTraining (12M ... 235M);
- electra-*: the discriminator, encoder + RTD head                     == ElectraForPreTraining (14M, 110M, 335M);
  electra-*-generator: the generator alone, encoder + MLM head         == ElectraForMaskedLM. Trained together with
  shared embeddings, ELECTRA holds discriminator + generator - one embedding block.

``python -m trainer.models`` prints every row with its count (built on the meta device: nothing is allocated).
The table is data (no torch), so a recipe's ``model: {preset: ...}`` resolves during config validation.
"""
from dataclasses import dataclass, field

from trainer.models.config import (DISCRIMINATOR_HEADS, GENERATOR_HEADS, MLM, NSP, SOP, HeadSpec, ModelConfig,
                                   generator_config)


@dataclass(frozen=True)
class Preset:
    config: ModelConfig
    heads: dict[str, HeadSpec]
    """The heads counted in the paper's parameter figure (and present in the Hugging Face equivalent)."""
    paper: str
    """The size the paper reports, for the listing."""
    role: str = field(default="model")
    """'model', or 'generator' for an ELECTRA generator row."""


BERT_HEADS = {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}
ROBERTA_HEADS = {MLM: HeadSpec("mlm")}
ALBERT_HEADS = {MLM: HeadSpec("mlm"), SOP: HeadSpec("sequence", 2)}


def _bert(h, layers, heads, **kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 30522, "hidden_size": h, "num_layers": layers, "num_heads": heads,
                          "family": "bert", **kw})


def _roberta(h, layers, heads, **kw) -> ModelConfig:
    # fairseq's dictionary: 50265 tokens with <pad> = 1; positions start at 2 and go to 513 (table of 514).
    return ModelConfig(**{"vocab_size": 50265, "hidden_size": h, "num_layers": layers, "num_heads": heads,
                          "family": "roberta", "max_position_embeddings": 514, "type_vocab_size": 1,
                          "pad_token_id": 1, "position_offset": 2, "layer_norm_eps": 1e-5, **kw})


def _albert(h, layers, heads, **kw) -> ModelConfig:
    # ALBERT v2: E = 128, all layers shared, no dropout, SentencePiece 30000, tanh-approximated GELU.
    return ModelConfig(**{"vocab_size": 30000, "hidden_size": h, "num_layers": layers, "num_heads": heads,
                          "embedding_size": 128, "sharing": "all", "dropout": 0.0, "attention_dropout": 0.0,
                          "hidden_act": "gelu_new", "family": "albert", **kw})


def _electra(h, layers, heads, fraction, **kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 30522, "hidden_size": h, "num_layers": layers, "num_heads": heads,
                          "family": "electra", "generator_fraction": fraction, **kw})


def _rows() -> dict[str, Preset]:
    rows = {
        "bert-base": Preset(_bert(768, 12, 12), BERT_HEADS, "110M"),
        "bert-large": Preset(_bert(1024, 24, 16), BERT_HEADS, "340M"),
        "roberta-base": Preset(_roberta(768, 12, 12), ROBERTA_HEADS, "125M"),
        "roberta-large": Preset(_roberta(1024, 24, 16), ROBERTA_HEADS, "355M"),
        "albert-base": Preset(_albert(768, 12, 12), ALBERT_HEADS, "12M"),
        "albert-large": Preset(_albert(1024, 24, 16), ALBERT_HEADS, "18M"),
        "albert-xlarge": Preset(_albert(2048, 24, 16), ALBERT_HEADS, "60M"),
        "albert-xxlarge": Preset(_albert(4096, 12, 64), ALBERT_HEADS, "235M"),
        "electra-small": Preset(_electra(256, 12, 4, 0.25, embedding_size=128), DISCRIMINATOR_HEADS, "14M"),
        "electra-base": Preset(_electra(768, 12, 12, 1 / 3), DISCRIMINATOR_HEADS, "110M"),
        "electra-large": Preset(_electra(1024, 24, 16, 0.25), DISCRIMINATOR_HEADS, "335M"),
        # ERNIE 1.0 (Chinese, Baidu's released ernie-1.0-base-zh: 18k character vocabulary, ReLU, 513 positions).
        "ernie-base": Preset(_bert(768, 12, 12, vocab_size=18000, max_position_embeddings=513, hidden_act="relu",
                                   layer_norm_eps=1e-5, family="ernie"), BERT_HEADS, "BERT-base shape"),
        # ERNIE 2.0 (English base: 4 segment types, task embeddings for its 3 task types). LayerNorm eps 1e-5 as the
        # released ernie-2.0-base-en (nghuyong/ernie-2.0-base-en config.json; Paddle's LayerNorm default).
        "ernie2-base": Preset(_bert(768, 12, 12, type_vocab_size=4, extra_embeddings={"task": 3},
                                    layer_norm_eps=1e-5, family="ernie"), BERT_HEADS, "110M"),
        # Tiny rows for tests, recipes' tiny_* variants and the quickstart: seconds per hundred steps on a CPU.
        "tiny": Preset(_bert(64, 2, 4, vocab_size=1024, intermediate_size=128, max_position_embeddings=512),
                       BERT_HEADS, "-"),
        "tiny-roberta": Preset(_roberta(64, 2, 4, vocab_size=1024, intermediate_size=128), ROBERTA_HEADS, "-"),
        "tiny-albert": Preset(_albert(64, 4, 4, vocab_size=1024, embedding_size=32, intermediate_size=128),
                              ALBERT_HEADS, "-"),
        "tiny-electra": Preset(_electra(64, 2, 4, 0.25, vocab_size=1024, embedding_size=32, intermediate_size=128),
                               DISCRIMINATOR_HEADS, "-"),
        "tiny-ernie": Preset(_bert(64, 2, 4, vocab_size=1024, intermediate_size=128, extra_embeddings={"task": 3},
                                   family="ernie"), BERT_HEADS, "-"),
    }
    ordered = {}
    for name, row in rows.items():  # each ELECTRA generator listed right after its discriminator
        ordered[name] = row
        if row.config.family == "electra":
            ordered[f"{name}-generator"] = Preset(generator_config(row.config), GENERATOR_HEADS,
                                                  {"electra-small": "(1/4)", "electra-base": "(1/3)",
                                                   "electra-large": "(1/4)"}.get(name, "-"), role="generator")
    return ordered


PRESET_ROWS: dict[str, Preset] = _rows()
PRESETS: dict[str, ModelConfig] = {name: row.config for name, row in PRESET_ROWS.items()}


def get_preset(name: str, **overrides) -> ModelConfig:
    """The named preset's ModelConfig with ``overrides`` applied (and validated), e.g.
    ``get_preset("bert-base", vocab_size=32000, unpad=True)``."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def counted_model(name: str, device: str = "meta"):
    """The preset's encoder with the heads its paper counts (a ``PretrainingModel``), built on ``device`` (meta: no
    memory, no init cost). Imports torch when called: the table above stays importable without it."""
    import torch

    from trainer.models.heads import PretrainingModel

    row = PRESET_ROWS[name]
    with torch.device(device):
        return PretrainingModel(row.config, row.heads)


def preset_parameters(name: str) -> int:
    from trainer.models.heads import count_parameters

    return count_parameters(counted_model(name))
