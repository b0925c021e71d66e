"""Export to Hugging Face and import back: every family loads with ``from_pretrained`` offline and gives our logits
(fp32, 1e-4) on random padded inputs, at every position; import(export(x)) == x; tokenizer files travel along."""
import json

import pytest
import torch
import transformers

from trainer import export_hf as cli
from trainer.models import (MLM, NSP, SOP, ElectraPretrainingModel, HeadSpec, PretrainingModel, get_preset)
from trainer.models.hf_convert import import_hf
from trainer.models.model_folder import complete_tied, load_model_folder, save_model_folder

TOL = dict(rtol=0, atol=1e-4)

CASES = {
    # name: (preset, overrides, heads, expected Hugging Face class)
    "bert": ("tiny", {}, {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}, "BertForPreTraining"),
    "bert-mlm": ("tiny", {}, {MLM: HeadSpec("mlm")}, "BertForMaskedLM"),
    "roberta": ("tiny-roberta", {}, {MLM: HeadSpec("mlm")}, "RobertaForMaskedLM"),
    "albert": ("tiny-albert", {}, {MLM: HeadSpec("mlm"), SOP: HeadSpec("sequence", 2)}, "AlbertForPreTraining"),
    "albert-unshared": ("tiny-albert", {"sharing": "none"}, {MLM: HeadSpec("mlm"), SOP: HeadSpec("sequence", 2)},
                        "AlbertForPreTraining"),
    "ernie": ("tiny-ernie", {"hidden_act": "relu"}, {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)},
              "ErnieForPreTraining"),
}


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere (LayerNorm and biases too), so a mis-mapped tensor cannot hide behind init values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def inputs(cfg, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = cfg.pad_token_id
    types = torch.zeros_like(ids)
    if cfg.type_vocab_size > 1:
        types[:, 5:] = 1
        types *= mask
    return ids, mask, types


def export(model, cfg, tmp_path, tokenizer=None) -> tuple:
    src, out = tmp_path / "ours", tmp_path / "hf"
    save_model_folder(model, cfg, src)
    argv = ["--checkpoint", str(src), "--output", str(out)] + (["--tokenizer", str(tokenizer)] if tokenizer else [])
    assert cli.main(argv) == 0
    return src, out


def load_hf(folder):
    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    return getattr(transformers, arch).from_pretrained(folder, local_files_only=True).eval(), arch


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_loads_in_transformers_with_equal_logits(case, tmp_path):
    preset, overrides, heads, expected = CASES[case]
    cfg = get_preset(preset, dropout=0.0, attention_dropout=0.0, **overrides)
    model = perturbed(PretrainingModel(cfg, heads))
    _, out = export(model, cfg, tmp_path)
    hf, arch = load_hf(out)
    assert arch == expected
    ids, mask, types = inputs(cfg)
    extra = {"task": (torch.arange(12) % 3).expand(3, 12).contiguous()} if cfg.extra_embeddings else None
    hf_kwargs = {"task_type_ids": extra["task"]} if extra else {}
    with torch.no_grad():
        ours = model(ids, mask, types, extra)
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, **hf_kwargs)
    mlm_logits = getattr(theirs, "prediction_logits", None)
    torch.testing.assert_close(ours[MLM], mlm_logits if mlm_logits is not None else theirs.logits, **TOL)
    if NSP in heads:
        torch.testing.assert_close(ours[NSP], theirs.seq_relationship_logits, **TOL)
    if SOP in heads:
        torch.testing.assert_close(ours[SOP], theirs.sop_logits, **TOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_of_export_is_identity(case, tmp_path):
    preset, overrides, heads, _ = CASES[case]
    cfg = get_preset(preset, **overrides)
    model = perturbed(PretrainingModel(cfg, heads), seed=2)
    _, out = export(model, cfg, tmp_path)
    cfg2, state2 = import_hf(out)
    assert cfg2 == cfg
    state = model.state_dict()
    assert state2.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(state2[key], value), key
    # and it loads into a fresh model of that config
    PretrainingModel(cfg2, heads).load_state_dict(state2)


def test_electra_exports_discriminator_and_generator(tmp_path):
    cfg = get_preset("tiny-electra", dropout=0.0, attention_dropout=0.0)
    model = perturbed(ElectraPretrainingModel(cfg))
    _, out = export(model, cfg, tmp_path)
    disc, disc_arch = load_hf(out)
    gen, gen_arch = load_hf(out / "generator")
    assert (disc_arch, gen_arch) == ("ElectraForPreTraining", "ElectraForMaskedLM")
    assert gen.config.hidden_size == cfg.hidden_size // 4 and gen.config.embedding_size == cfg.emb_size
    ids, mask, types = inputs(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model.discriminator_logits(ids, mask, types),
                                   disc(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, **TOL)
        torch.testing.assert_close(model.generator_logits(ids, mask, types),
                                   gen(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, **TOL)
    cfg2, state2 = import_hf(out)
    assert cfg2 == cfg
    fresh = ElectraPretrainingModel(cfg2)
    fresh.load_state_dict(state2)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_model_folder_round_trip_restores_tied_and_shared_keys(tmp_path):
    cfg = get_preset("tiny-electra")
    model = ElectraPretrainingModel(cfg)
    save_model_folder(model, cfg, tmp_path)
    cfg2, state = load_model_folder(tmp_path)
    assert cfg2 == cfg and state.keys() == model.state_dict().keys()
    assert complete_tied({"heads.m.decoder.bias": 1, "encoder.embeddings.word.weight": 2})["heads.m.decoder.weight"] \
        == 2


def test_tokenizer_files_travel_with_the_export(tmp_path, en_corpus):
    from data_prep.train_tokenizer import main as train_tokenizer
    tok_dir = tmp_path / "tok"
    assert train_tokenizer(["--kind", "wordpiece", "--input", str(en_corpus), "--output", str(tok_dir),
                            "--vocab-size", "1024", "--limit-bytes", "200K", "--quiet"]) == 0
    cfg = get_preset("tiny", dropout=0.0, attention_dropout=0.0)
    model = perturbed(PretrainingModel(cfg, CASES["bert"][2]))
    _, out = export(model, cfg, tmp_path, tokenizer=tok_dir)
    text = "The quick brown fox jumps over the lazy dog."
    hf_tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    ref_tok = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    assert hf_tok(text)["input_ids"] == ref_tok(text)["input_ids"]
    enc = hf_tok([text, "short"], padding=True, return_tensors="pt")
    hf, _ = load_hf(out)
    with torch.no_grad():
        ours = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        theirs = hf(**enc)
    torch.testing.assert_close(ours[MLM], theirs.prediction_logits, **TOL)


def test_trainer_checkpoint_goes_through_load_model_state(tmp_path, monkeypatch):
    # trainer.checkpoint.load_model_state gives (consolidated state dict, resolved run config); stand in for it so
    # the test needs no DeepSpeed run. The run config carries the model section as full ModelConfig fields.
    import trainer.checkpoint
    cfg = get_preset("tiny-roberta", dropout=0.0, attention_dropout=0.0)
    model = perturbed(PretrainingModel(cfg, {MLM: HeadSpec("mlm")}))
    ckpt = tmp_path / "checkpoints" / "global_step5"
    ckpt.mkdir(parents=True)
    seen = []

    def fake_load_model_state(path):
        seen.append(str(path))
        state = {k: v for k, v in model.state_dict().items() if k != "heads.mlm.decoder.weight"}  # deduplicated
        return state, {"model": cfg.model_dump(), "data": {"corpora": []}}

    monkeypatch.setattr(trainer.checkpoint, "load_model_state", fake_load_model_state)
    assert cli.main(["--checkpoint", str(ckpt), "--output", str(tmp_path / "hf")]) == 0
    assert seen == [str(ckpt)]
    hf, _ = load_hf(tmp_path / "hf")
    ids, mask, types = inputs(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask)[MLM], hf(input_ids=ids, attention_mask=mask).logits, **TOL)
    assert cli.model_config_from_run({"model": {"preset": "bert-base", "dropout": 0.0}}) == \
        get_preset("bert-base", dropout=0.0)


def test_unexportable_models_fail_with_a_reason(tmp_path):
    cfg = get_preset("tiny", embedding_size=32)  # BERT has no embedding projection in Hugging Face
    with pytest.raises(ValueError, match="no embedding projection"):
        export(PretrainingModel(cfg, {MLM: HeadSpec("mlm")}), cfg, tmp_path)
    with pytest.raises(SystemExit, match="no such folder"):
        cli.main(["--checkpoint", str(tmp_path / "missing"), "--output", str(tmp_path / "o")])


def test_sharing_that_hugging_face_cannot_express_is_exported_as_copies(tmp_path):
    cfg = get_preset("tiny", num_layers=3, sharing="attention", dropout=0.0, attention_dropout=0.0)
    model = perturbed(PretrainingModel(cfg, CASES["bert"][2]))
    _, out = export(model, cfg, tmp_path)
    hf, _ = load_hf(out)
    ids, mask, types = inputs(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask, types)[MLM],
                                   hf(input_ids=ids, attention_mask=mask, token_type_ids=types).prediction_logits,
                                   **TOL)
    cfg2, state2 = import_hf(out)
    assert cfg2.sharing == "none" and sum(k.endswith("qkv.weight") for k in state2) == 3


@pytest.mark.parametrize("arch,config_kwargs", [
    ("BertForPreTraining", {}),
    ("RobertaForMaskedLM", dict(max_position_embeddings=40, type_vocab_size=1, pad_token_id=1)),
    ("AlbertForPreTraining", dict(embedding_size=16, num_hidden_groups=1)),
    ("ElectraForPreTraining", dict(embedding_size=16)),
])
def test_import_of_a_native_hugging_face_model_gives_its_logits(arch, config_kwargs, tmp_path):
    # A model that Hugging Face initialised and saved itself (not one of our exports) continues in our encoder.
    stem = arch.split("For")[0]
    hf_cfg = getattr(transformers, f"{stem}Config")(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=config_kwargs.pop("max_position_embeddings", 40), hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, **config_kwargs)
    hf = perturbed(getattr(transformers, arch)(hf_cfg))
    hf.save_pretrained(tmp_path)
    cfg, state = import_hf(tmp_path)
    from trainer.models.hf_convert import heads_from_state_dict
    model = PretrainingModel(cfg, heads_from_state_dict(state)).eval()
    model.load_state_dict(state)
    ids, mask, types = inputs(cfg)
    with torch.no_grad():
        ours = model(ids, mask, types)
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if arch == "ElectraForPreTraining":
        torch.testing.assert_close(ours["rtd"].squeeze(-1), theirs.logits, **TOL)
    else:
        logits = getattr(theirs, "prediction_logits", None)
        torch.testing.assert_close(ours[MLM], logits if logits is not None else theirs.logits, **TOL)


@pytest.mark.parametrize("stem,kwargs", [("Bert", {}), ("Ernie", {}),
                                         ("Albert", dict(embedding_size=16, num_hidden_groups=1))])
def test_released_folders_keep_their_pooler_whatever_class_they_name(stem, kwargs, tmp_path):
    """Released bert-base-uncased / albert-base-v2 / ERNIE folders name ``*ForMaskedLM`` in ``architectures`` while
    their weights hold the pooler and the NSP/SOP head. Fine-tuning starts from that pooler (as Hugging Face's
    ``*ForSequenceClassification.from_pretrained`` does), so the import keeps it: read through the named class it was
    dropped. A folder with the pooler but no NSP/SOP classifier (``*Model``) keeps the pooler; one without a pooler
    (a QA model) gives no sequence head."""
    hf_cfg = getattr(transformers, f"{stem}Config")(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, **kwargs)
    seq = "sop" if stem == "Albert" else "nsp"
    released = perturbed(getattr(transformers, f"{stem}ForPreTraining")(hf_cfg))
    released.config.architectures = [f"{stem}ForMaskedLM"]
    released.save_pretrained(tmp_path / "released")
    base = getattr(released, stem.lower())
    pooler = base.pooler if stem == "Albert" else base.pooler.dense
    cls = released.sop_classifier.classifier if stem == "Albert" else released.cls.seq_relationship
    _, state = import_hf(tmp_path / "released")
    assert {k.split(".")[1] for k in state if k.startswith("heads.")} == {"mlm", seq}
    for ours, theirs in ((f"heads.{seq}.pooler", pooler), (f"heads.{seq}.classifier", cls)):
        assert torch.equal(state[f"{ours}.weight"], theirs.weight.detach())
        assert torch.equal(state[f"{ours}.bias"], theirs.bias.detach())
    bare = perturbed(getattr(transformers, f"{stem}Model")(hf_cfg), seed=1)
    bare.save_pretrained(tmp_path / "bare")
    _, state = import_hf(tmp_path / "bare")
    bare_pooler = bare.pooler if stem == "Albert" else bare.pooler.dense
    assert torch.equal(state[f"heads.{seq}.pooler.weight"], bare_pooler.weight.detach())
    assert not any(k.startswith("heads.mlm.") for k in state)
    qa = perturbed(getattr(transformers, f"{stem}ForQuestionAnswering")(hf_cfg), seed=2)
    qa.save_pretrained(tmp_path / "qa")
    _, state = import_hf(tmp_path / "qa")
    assert not any(k.startswith("heads.") for k in state)
    assert torch.equal(state["encoder.embeddings.word.weight"][:100],
                       getattr(qa, stem.lower()).embeddings.word_embeddings.weight.detach())


def test_an_untied_output_layer_is_refused_not_replaced(tmp_path):
    """Our encoders tie the MLM decoder to the word embeddings; a folder whose decoder differs cannot be imported
    exactly, and taking the embedding instead (what the import did) changed the MLM logits by up to ~30."""
    hf_cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, tie_word_embeddings=False)
    perturbed(transformers.BertForMaskedLM(hf_cfg)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"cls\.predictions\.decoder\.(weight|bias) differs from .*an untied "
                                         r"output layer cannot be imported exactly"):
        import_hf(tmp_path)
