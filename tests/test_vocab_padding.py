"""Vocabulary padding (ModelConfig.pad_vocab_to): the word embedding and tied decoder get rows up to a multiple of 64,
the logits and the loss are the unpadded model's, and the Hugging Face export drops the padding with equal logits.

Vocabulary 1000 (padded to 1024) stands in for 30,522 / 50,265 at tiny sizes; every family is covered."""
import json

import pytest
import torch

from trainer import export_hf as cli
from trainer.models import MLM, NSP, SOP, ElectraPretrainingModel, HeadSpec, PretrainingModel, get_preset
from trainer.models.heads import count_parameters
from trainer.models.hf_convert import import_hf
from trainer.models.model_folder import load_model_folder, save_model_folder
from trainer.models.vocab_padding import fit_rows, fit_to_config
from trainer.objectives.base import mlm_loss

V = 1000
FAMILIES = {
    "bert": ("tiny", {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}),
    "roberta": ("tiny-roberta", {MLM: HeadSpec("mlm")}),
    "albert": ("tiny-albert", {MLM: HeadSpec("mlm"), SOP: HeadSpec("sequence", 2)}),
    "ernie": ("tiny-ernie", {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}),
    "electra": ("tiny-electra", None),
}


def config(family, pad=64):
    return get_preset(FAMILIES[family][0], vocab_size=V, pad_vocab_to=pad, dropout=0.0, attention_dropout=0.0)


def build(family, cfg):
    heads = FAMILIES[family][1]
    return ElectraPretrainingModel(cfg) if heads is None else PretrainingModel(cfg, heads)


def perturb_real_rows(model, seed=0):
    """Random weights everywhere (biases, LayerNorms too) except the padding rows, which a trained model keeps at 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.05
            if name.endswith(("embeddings.word.weight", "decoder.bias")):
                noise[V:] = 0
            p.add_(noise)
    return model.eval()


def batch(cfg, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = cfg.pad_token_id
    positions = torch.tensor([1, 2, 5, 13, 14, 26, 27])  # flat indices into 3 x 12, real tokens
    labels = torch.randint(5, V, positions.shape, generator=g)
    return ids, mask, positions, labels


def mlm_logits(model, family, ids, mask, positions):
    if family == "electra":
        return model.generator_logits(ids, mask, None, positions)
    return model(ids, mask, mlm_positions=positions)[MLM]


def test_padded_rows_are_zero_and_logits_have_the_vocabulary_width():
    cfg = config("bert")
    assert (cfg.vocab_size, cfg.padded_vocab_size) == (1000, 1024)
    assert (get_preset("bert-base").padded_vocab_size, get_preset("roberta-base").padded_vocab_size,
            get_preset("albert-base").padded_vocab_size) == (30528, 50304, 30016)
    assert config("bert", pad=1).padded_vocab_size == 1000
    model = build("bert", cfg)
    word = model.encoder.embeddings.word.weight
    assert word.shape == (1024, cfg.emb_size) and model.heads[MLM].decoder.weight is word
    assert (word[V:] == 0).all() and (word[:V].abs().sum(1) > 0).sum() == V - 1  # all but the pad row
    ids, mask, positions, _ = batch(cfg)
    assert mlm_logits(model, "bert", ids, mask, positions).shape == (7, V)
    assert model(ids, mask)[MLM].shape == (3, 12, V)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loss_and_training_equal_the_unpadded_model(family):
    """Same real-row weights -> equal logits and loss; three AdamW steps (weight decay on) keep them equal and the
    padding rows at zero with zero gradient (so LAMB's per-tensor norms and gradient clipping see no difference)."""
    torch.manual_seed(0)
    plain = perturb_real_rows(build(family, config(family, pad=1))).train()
    padded = build(family, config(family)).train()
    padded.load_state_dict(fit_to_config(plain.state_dict(), padded.cfg))
    ids, mask, positions, labels = batch(padded.cfg)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (plain, padded)]
    for step in range(3):
        losses = []
        for model, opt in zip((plain, padded), opts):
            loss, _ = mlm_loss(mlm_logits(model, family, ids, mask, positions), labels)
            if family == "electra":
                loss = loss + model.discriminator_logits(ids, mask).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-6, abs=1e-7), f"step {step}"
    word = padded.discriminator.encoder if family == "electra" else padded.encoder
    word = word.embeddings.word.weight
    assert (word[V:] == 0).all() and (word.grad[V:] == 0).all()
    for name, p in padded.named_parameters():
        if name.endswith("decoder.bias"):
            assert (p[V:] == 0).all(), name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_drops_the_padding_with_equal_logits(family, tmp_path):
    """Our padded model -> ``python -m trainer.export_hf`` -> transformers: vocab_size 1000, tensors of 1000 rows and
    our logits on the real vocabulary; importing it back restores the zero padding rows and the same logits."""
    import transformers

    cfg = config(family)
    model = perturb_real_rows(build(family, cfg))
    save_model_folder(model, cfg, tmp_path / "ours")
    assert cli.main(["--checkpoint", str(tmp_path / "ours"), "--output", str(tmp_path / "hf")]) == 0
    ids, mask, _, _ = batch(cfg)
    folders = {"": None} if family != "electra" else {"": "disc", "generator": "gen"}
    for sub, part in folders.items():
        folder = tmp_path / "hf" / sub
        arch = json.loads((folder / "config.json").read_text())["architectures"][0]
        hf = getattr(transformers, arch).from_pretrained(folder, local_files_only=True).eval()
        assert hf.config.vocab_size == V and hf.get_input_embeddings().weight.shape[0] == V
        kwargs = {"task_type_ids": torch.zeros_like(ids)} if family == "ernie" else {}
        with torch.no_grad():
            theirs = hf(input_ids=ids, attention_mask=mask, **kwargs)
            if part == "disc":
                ours, theirs = model.discriminator_logits(ids, mask), theirs.logits
            elif part == "gen":
                ours, theirs = model.generator_logits(ids, mask), theirs.logits
            else:
                ours = model(ids, mask)[MLM]
                theirs = getattr(theirs, "prediction_logits", None) if arch.endswith("PreTraining") else theirs.logits
        assert theirs.shape == ours.shape
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    cfg2, state2 = import_hf(tmp_path / "hf")
    assert cfg2.padded_vocab_size == 1024
    back = build(family, cfg2).eval()
    back.load_state_dict(state2)
    with torch.no_grad():
        torch.testing.assert_close(mlm_logits(back, family, ids, mask, None), mlm_logits(model, family, ids, mask,
                                                                                          None), rtol=0, atol=1e-5)


def test_weights_saved_without_padding_load_into_a_padded_model(tmp_path):
    """A model folder written before pad_vocab_to existed (no such key, 1000 rows) loads into the padded model with
    the same logits; weights of a smaller vocabulary are refused, naming the tensor."""
    cfg_old = config("bert", pad=1)
    old = perturb_real_rows(build("bert", cfg_old))
    save_model_folder(old, cfg_old, tmp_path / "old")
    raw = json.loads((tmp_path / "old" / "model_config.json").read_text())
    del raw["pad_vocab_to"]
    (tmp_path / "old" / "model_config.json").write_text(json.dumps(raw))
    cfg, state = load_model_folder(tmp_path / "old")
    assert cfg.padded_vocab_size == 1024 and state["encoder.embeddings.word.weight"].shape[0] == 1024
    new = build("bert", cfg).eval()
    new.load_state_dict(state)
    ids, mask, positions, _ = batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(mlm_logits(new, "bert", ids, mask, positions),
                                   mlm_logits(old, "bert", ids, mask, positions), rtol=0, atol=0)
    with pytest.raises(ValueError, match="encoder.embeddings.word.weight has 900 vocabulary rows, fewer than"):
        fit_rows(torch.zeros(900, 4), 1024, 1000, "encoder.embeddings.word.weight")


def test_parameter_counts_leave_the_padding_out_unless_asked():
    cfg = get_preset("bert-base")
    with torch.device("meta"):
        model = PretrainingModel(cfg, FAMILIES["bert"][1])
    pad = cfg.padded_vocab_size - cfg.vocab_size  # 6 rows of the word embedding, 6 decoder bias entries
    assert count_parameters(model, padding=True) - count_parameters(model) == pad * cfg.hidden_size + pad


def test_resume_across_padding_is_refused_with_the_setting_to_use():
    """DeepSpeed's optimizer state cannot be padded, so ``trainer.pretrain`` refuses (before loading) a resume whose
    recorded config stored other row counts. This checks the decision on recorded configs; the call in
    pretrain._run_locked is not run here (a full trainer run per case)."""
    from trainer.models.vocab_padding import resume_padding_error

    cfg = config("bert")  # 1000 -> 1024 rows
    old = {"model": config("bert", pad=1).model_dump()}
    del old["model"]["pad_vocab_to"]  # a checkpoint from before the field: no padding
    why = resume_padding_error(old, cfg, "ckpt/global_step5")
    assert "ckpt/global_step5 was saved with 1000 vocabulary rows" in why and "--set model.pad_vocab_to=1" in why
    assert resume_padding_error(old, cfg.replace(pad_vocab_to=1), "x") is None
    assert resume_padding_error({"model": cfg.model_dump()}, cfg, "x") is None
    assert resume_padding_error({"model": cfg.replace(pad_vocab_to=256).model_dump()}, cfg, "x") is None  # 1024 too
    assert "pad_vocab_to=8" in resume_padding_error({"model": cfg.replace(pad_vocab_to=8).model_dump()}, cfg, "x")


@pytest.mark.slow  # three one-rank trainer launches (the stand-in objective), ~10 s each alone
def test_trainer_refuses_to_resume_across_padding_and_resumes_with_the_recorded_setting(tmp_path):
    """Through trainer.pretrain (one rank, the stand-in objective of test_trainer_standin.py, whose tiny model does
    not use the encoder: what is checked is the refusal before DeepSpeed loads anything)."""
    from test_trainer_multiproc import make_config, run

    def launch(pad, steps):
        cfg = make_config(tmp_path, "run", model={"pad_vocab_to": pad},
                          train={"steps": steps, "eval_every": 0}, schedule={"decay_steps": steps})
        return run(cfg, 1, "--resume", "auto", expect=None)

    first = launch(1, 2)
    assert first.returncode == 0, first.stderr[-2000:]
    refused = launch(64, 4)
    assert refused.returncode != 0
    assert "was saved with 97 vocabulary rows (model.pad_vocab_to 1), this config stores 128" in refused.stderr
    assert "--set model.pad_vocab_to=1" in refused.stderr
    resumed = launch(1, 4)
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout + resumed.stderr, resumed.stderr[-2000:]
