"""Hugging Face folders from elsewhere (the hub's layouts, other trainers' saves) through ``checkpoint.init_from`` and
fine-tuning's ``--checkpoint``: weights that do not match their config are refused, never filled with random values;
an ELECTRA discriminator folder alone continues as the discriminator of a pair.

The folders are made by transformers itself (``save_pretrained``, or ``torch.save`` of a state dict the way other
trainers write ``pytorch_model.bin``) at tiny sizes; what the hub serves at full size is not downloaded (no network)."""
import pytest
import torch
import transformers

from trainer import init_from
from trainer.finetune.model import SourceError, load_source
from trainer.models import ElectraPretrainingModel, PretrainingModel, get_preset
from trainer.models.hf_convert import export_hf, import_hf
from trainer.models.presets import BERT_HEADS
from trainer.pretrain import load_init_weights

VOCAB = 64


def _bert_folder(tmp_path, name: str, edit=None, cls=transformers.BertForPreTraining, **cfg_kwargs):
    """A tiny folder: config.json + pytorch_model.bin holding ``edit(state_dict)`` of a seeded model (the decoder
    weight left out, as released BERT files hold it once); returns (folder, reference model)."""
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=40,
                                  architectures=["BertForMaskedLM"], **cfg_kwargs)
    torch.manual_seed(0)
    ref = cls(cfg)
    sd = {k: v for k, v in ref.state_dict().items() if "decoder.weight" not in k}
    folder = tmp_path / name
    cfg.save_pretrained(folder)
    torch.save(edit(sd) if edit else sd, folder / "pytorch_model.bin")
    return folder, ref


BROKEN = {
    "module": (lambda sd: {f"module.{k}": v for k, v in sd.items()}, r"start with 'module\.': a wrapper's state dict"),
    "model": (lambda sd: {f"model.{k}": v for k, v in sd.items()}, r"start with 'model\.': a wrapper's state dict"),
    "layer": (lambda sd: {k: v for k, v in sd.items() if ".layer.1." not in k},
              r"16 of the \d+ tensors .*bert\.encoder\.layer\.1\..*The file is incomplete"),
    "word": (lambda sd: {k: v for k, v in sd.items() if "word_embeddings" not in k},
             r"1 of the \d+ tensors .*\['bert\.embeddings\.word_embeddings\.weight'\]"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_weights_that_do_not_match_the_config_are_refused_everywhere(case, tmp_path):
    """Before: every one of these imported with transformers' random init in the gaps and printed only "initialised
    from X" (0 of 197 tensors the file's for a `module.` bert-base), and fine-tuning scored a random model."""
    edit, said = BROKEN[case]
    folder, _ = _bert_folder(tmp_path, case, edit)
    with pytest.raises(ValueError, match=said):
        import_hf(folder)
    with pytest.raises(ValueError, match=rf"checkpoint\.init_from {folder}: .*its weights do not match"):
        init_from.init_weights(folder, tmp_path / "run", rank=0)
    with pytest.raises(SourceError, match=rf"--checkpoint {folder}: .*its weights do not match"):
        load_source(folder)


def test_roberta_and_electra_path_refuses_too_and_drops_heads_the_file_lacks(tmp_path):
    """RoBERTa/ELECTRA are read through their named class, which had no loading report at all."""
    cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=40, pad_token_id=1,
                                     architectures=["RobertaForMaskedLM"])
    torch.manual_seed(0)
    ref = transformers.RobertaForMaskedLM(cfg)
    cfg.save_pretrained(tmp_path / "module")
    torch.save({f"module.{k}": v for k, v in ref.state_dict().items()}, tmp_path / "module" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"roberta\.embeddings.*start with 'module\.'"):
        import_hf(tmp_path / "module")
    # the body alone (no lm_head): imported exactly, the MLM head dropped (a new one is named by init_from) rather
    # than transformers' random one taken as the folder's
    cfg.save_pretrained(tmp_path / "body")
    torch.save({k: v for k, v in ref.state_dict().items() if not k.startswith("lm_head.")},
               tmp_path / "body" / "pytorch_model.bin")
    _, state = import_hf(tmp_path / "body")
    assert not any(k.startswith("heads.") for k in state)
    assert torch.equal(state["encoder.embeddings.word.weight"][:VOCAB], ref.roberta.embeddings.word_embeddings.weight)


def test_a_proper_folder_still_imports_exactly(tmp_path):
    """Released layouts that are whole: the word embedding stored only as the tied decoder, and BertModel keys
    without the `bert.` prefix, are not refused."""
    folder, ref = _bert_folder(tmp_path, "ok")
    _, state = import_hf(folder)
    assert torch.equal(state["encoder.embeddings.word.weight"][:VOCAB], ref.bert.embeddings.word_embeddings.weight)
    assert torch.equal(state["encoder.ffn.1.inner.weight"], ref.bert.encoder.layer[1].intermediate.dense.weight)
    assert {k.split(".")[1] for k in state if k.startswith("heads.")} == {"mlm", "nsp"}

    def tied_only(sd):
        sd = {k: v for k, v in sd.items() if "word_embeddings" not in k}
        return {**sd, "cls.predictions.decoder.weight": ref.bert.embeddings.word_embeddings.weight}
    folder, ref = _bert_folder(tmp_path, "tied", tied_only)
    _, state = import_hf(folder)
    assert torch.equal(state["encoder.embeddings.word.weight"][:VOCAB], ref.bert.embeddings.word_embeddings.weight)
    folder, ref = _bert_folder(tmp_path, "bare", lambda sd: {k[5:]: v for k, v in sd.items() if k.startswith("bert.")})
    _, state = import_hf(folder)
    assert torch.equal(state["encoder.ffn.1.inner.weight"], ref.bert.encoder.layer[1].intermediate.dense.weight)
    assert not any(k.startswith("heads.mlm.") for k in state)


def test_electra_discriminator_folder_alone_continues_as_the_discriminator(tmp_path):
    """The hub ships google/electra-*-discriminator without its generator. Before: init_from into an ELECTRA run
    stopped with "the source lacks 62 of this model's 62 encoder tensors". Now the folder is the discriminator and the
    generator starts new, said in one line; the generator/ nesting keeps giving both. The folders are written by
    transformers' save_pretrained (through our export)."""
    cfg = get_preset("tiny-electra", vocab_size=VOCAB)
    torch.manual_seed(1)
    source = ElectraPretrainingModel(cfg)
    export_hf(cfg, source.state_dict(), tmp_path / "pair")
    export_hf(cfg, {k[len("discriminator."):]: v for k, v in source.state_dict().items()
                    if k.startswith("discriminator.")}, tmp_path / "disc")
    assert not (tmp_path / "disc" / "generator").exists()
    assert transformers.AutoConfig.from_pretrained(tmp_path / "disc").architectures == ["ElectraForPreTraining"]
    want = source.state_dict()
    for name, fresh_generator in (("disc", True), ("pair", False)):
        weights = init_from.init_weights(tmp_path / name, tmp_path / "run", rank=0, vocab_size=(VOCAB, VOCAB))
        torch.manual_seed(2)
        target = ElectraPretrainingModel(cfg)
        said = load_init_weights(target, weights, tmp_path / name)
        assert ("ELECTRA generator: new" in said) == fresh_generator, said
        assert "put the generator's folder in the discriminator's as generator/" in said or not fresh_generator
        got = target.state_dict()
        for key in want:
            if key.startswith("discriminator.") or not fresh_generator:
                assert torch.equal(got[key], want[key]), (name, key)
    # a BERT-like model with an MLM head into the pair is still refused (it is not a discriminator)
    bert = PretrainingModel(get_preset("tiny", vocab_size=VOCAB), BERT_HEADS).state_dict()
    with pytest.raises(ValueError, match="the source lacks"):
        load_init_weights(ElectraPretrainingModel(cfg), bert, "SRC")
