"""Objectives: the registry and config checks, loss/label semantics (ELECTRA sampling), and tiny models that learn."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from test_samples import (data_config, en_tokenizer, encode_docs, read_documents,  # noqa: F401 (fixtures)
                          write_shards)
from trainer.data.dataset import PretrainingDataset
from trainer.data.loader import Collator
from trainer.loop import _to_device
from trainer.models import get_preset
from trainer.objectives import ObjectiveConfig, check_data_requirements, get_objective
from trainer.objectives.base import metric_value
from trainer.objectives.electra import ElectraObjective, gumbel_sample


@pytest.fixture(scope="module")
def split_corpus(en_corpus, en_tokenizer, tmp_path_factory):
    """Train and held-out corpora from disjoint documents of the English corpus (the last tenth held out)."""
    docs = encode_docs(en_tokenizer, read_documents(en_corpus))
    root = tmp_path_factory.mktemp("split")
    cut = len(docs) - len(docs) // 10
    return (write_shards(docs[:cut], root / "train", en_tokenizer.vocab_size),
            write_shards(docs[cut:], root / "valid", en_tokenizer.vocab_size))


def _batches(prefix, tok, fmt, seq, batch, n, start=0, seed=0, **masking):
    cfg = data_config(prefix, format=fmt, max_seq_length=seq, masking={"max_predictions_per_seq": 20, **masking})
    ds = PretrainingDataset(cfg, tok, seed=seed)
    collate = Collator(tok.pad_id, seq, 20)
    # as the trainer's loop hands them to the objectives: compact loader dtypes widened, packing attached
    return [_to_device(collate([ds[start + i * batch + j] for j in range(batch)]), "cpu") for i in range(n)]


def _model_cfg(preset, tok):
    return get_preset(preset, vocab_size=tok.vocab_size, dropout=0.0, attention_dropout=0.0)


def test_registry_and_config_errors():
    for name in ("mlm", "mlm+nsp", "mlm+sop", "electra"):
        assert get_objective({"name": name}).name == name
    with pytest.raises(ValueError, match="not registered.*mlm\\+sop"):
        ObjectiveConfig(name="sop")
    with pytest.raises(ValueError, match="objective.options.lamda"):
        ObjectiveConfig(name="electra", options={"lamda": 50})
    with pytest.raises(ValueError, match="mlm\\+sop.*sop-pair.*full-sentences"):
        check_data_requirements(ObjectiveConfig(name="mlm+sop"), data_config("x", format="full-sentences"))
    check_data_requirements(ObjectiveConfig(name="mlm+nsp"), data_config("x", format="sentence-pair"))


@pytest.mark.parametrize("name,fmt,preset", [("mlm", "full-sentences", "tiny-roberta"),
                                             ("mlm+nsp", "segment-pair", "tiny"),
                                             ("mlm+sop", "sop-pair", "tiny-albert")])
def test_losses_match_a_direct_computation(name, fmt, preset, split_corpus, en_tokenizer):
    torch.manual_seed(0)
    batch = _batches(split_corpus[1], en_tokenizer, fmt, 64, 8, 1)[0]
    objective = get_objective({"name": name})
    model = objective.build_model(_model_cfg(preset, en_tokenizer))
    loss, metrics = objective.loss(model, batch)
    loss.backward()
    # reference: full-vocabulary logits at every position, cross-entropy where labels are set
    with torch.no_grad():
        hidden = model.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        logits = model.heads["mlm"](hidden)  # [B, T, V]
        B, T = batch["input_ids"].shape
        labels = torch.full((B, T), -100)
        rows = torch.arange(B)[:, None].expand_as(batch["mlm_positions"])
        keep = batch["mlm_labels"] != -100
        labels[rows[keep], batch["mlm_positions"][keep]] = batch["mlm_labels"][keep]
        ref = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), labels.reshape(-1))
        if name != "mlm":
            head = "nsp" if name == "mlm+nsp" else "sop"
            ref = ref + torch.nn.functional.cross_entropy(model.heads[head](hidden), batch["sentence_label"])
    assert torch.allclose(loss.detach(), ref, atol=1e-5)
    assert abs(metric_value(metrics["mlm_loss"]) - math.log(en_tokenizer.vocab_size)) < 1.5  # untrained: ~uniform
    assert all(p.grad is not None for p in model.heads.parameters())


def _unpack(batch):
    """The samples of a packed batch, one per row, as the collator would batch them unpacked."""
    samples = []
    for r in range(batch["input_ids"].shape[0]):
        pack = batch["pack_ids"][r]
        keep = batch["mlm_labels"][r] != -100
        pos, lab = batch["mlm_positions"][r][keep], batch["mlm_labels"][r][keep]
        for k in range(1, int(pack.max()) + 1):
            cols = (pack == k).nonzero().squeeze(1)
            lo, hi = int(cols[0]), int(cols[-1]) + 1
            inside = (pos >= lo) & (pos < hi)
            samples.append({"input_ids": batch["input_ids"][r, lo:hi].numpy(),
                            "token_type_ids": batch["token_type_ids"][r, lo:hi].numpy(),
                            "mlm_positions": (pos[inside] - lo).numpy(), "mlm_labels": lab[inside].numpy()})
    return samples


@pytest.mark.parametrize("name,preset", [("mlm", "tiny-roberta"), ("electra", "tiny-electra")])
def test_packed_doc_sentences_give_the_loss_of_their_samples_unpacked(name, preset, split_corpus, en_tokenizer):
    cfg = data_config(split_corpus[1], format="doc-sentences", max_seq_length=64, pack_doc_sentences=True,
                      masking={"max_predictions_per_seq": 40})
    ds = PretrainingDataset(cfg, en_tokenizer, seed=0)
    rows = np.argsort(-np.diff(ds.builders[0].index.row_ptr))[:6]  # the most packed rows
    packed = Collator(en_tokenizer.pad_id, 64, 40)([ds.build(0, 0, int(i)) for i in rows])
    assert int(packed["pack_ids"].max()) >= 3
    samples = _unpack(packed)
    unpacked = Collator(en_tokenizer.pad_id, 64, 40)(samples)
    objective = get_objective({"name": name, "options": {"rtd_weight": 0.0} if name == "electra" else {}})
    torch.manual_seed(0)
    model = objective.build_model(_model_cfg(preset, en_tokenizer))
    model.eval()
    with torch.no_grad():
        a = objective.loss(model, _to_device(packed, "cpu"))[1]
        b = objective.loss(model, _to_device(unpacked, "cpu"))[1]
    key = "gen_mlm_loss" if name == "electra" else "mlm_loss"
    assert metric_value(a[key]) == pytest.approx(metric_value(b[key]), abs=1e-4), (a, b)


def test_gumbel_sampling_follows_the_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(40000, 4)
    counts = torch.bincount(gumbel_sample(logits), minlength=4).double() / 40000
    p = torch.softmax(logits[0].double(), 0)
    assert torch.all((counts - p).abs() < 4 * torch.sqrt(p * (1 - p) / 40000))


class _OracleElectra(torch.nn.Module):
    """A generator that always predicts the original token (so every sample equals it) and a zero discriminator."""

    def __init__(self, labels):
        super().__init__()
        self.labels, self.w = labels, torch.nn.Parameter(torch.zeros(()))
        self.seen = None

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None, part="discriminator"):
        if part == "generator":
            logits = torch.full((len(positions), 50), -1e4)
            logits[torch.arange(len(positions)), self.labels] = 1e4
            return logits + self.w
        self.seen = input_ids
        return torch.zeros(input_ids.shape) + self.w


def test_electra_labels_samples_equal_to_the_original_as_original():
    ids = torch.tensor([[2, 4, 4, 9, 3, 0]])
    batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]]),
             "token_type_ids": torch.zeros_like(ids), "mlm_positions": torch.tensor([[1, 2]]),
             "mlm_labels": torch.tensor([[7, 8]])}
    model = _OracleElectra(torch.tensor([7, 8]))
    loss, metrics = ElectraObjective({"rtd_weight": 50}).loss(model, batch)
    assert model.seen.tolist() == [[2, 7, 8, 9, 3, 0]]  # the discriminator sees the original sequence
    assert metric_value(metrics["replaced_frac"]) == 0.0
    assert metric_value(metrics["rtd_acc"]) == 1.0  # logit 0 = "original" for every real token
    # discriminator loss is BCE(0, label 0) = log 2 on each of the 5 real tokens
    assert loss.item() == pytest.approx(50 * math.log(2), rel=1e-5)


class _FixedElectra(torch.nn.Module):
    """A generator that always samples token 5, and a discriminator that knows the original sequence and calls a
    token replaced iff it differs from it."""

    def __init__(self, original):
        super().__init__()
        self.original, self.seen = original, None

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None, part="discriminator"):
        if part == "generator":
            logits = torch.full((len(positions), 50), -1e4)
            logits[:, 5] = 1e4
            return logits
        self.seen = input_ids
        return (input_ids != self.original).float() * 40.0 - 20.0


def test_electra_labels_replaced_tokens_at_their_positions():
    ids = torch.tensor([[2, 4, 4, 9, 3, 0], [2, 4, 4, 8, 7, 3]])  # 4 = [MASK]
    original = torch.tensor([[2, 7, 4, 9, 3, 0], [2, 6, 5, 8, 8, 3]])
    batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1] * 6]),
             "token_type_ids": torch.zeros_like(ids), "mlm_positions": torch.tensor([[1, 0, 0], [2, 4, 1]]),
             "mlm_labels": torch.tensor([[7, -100, -100], [5, 8, 6]])}  # row 1, position 2 holds 5 already
    model = _FixedElectra(original)
    loss, metrics = ElectraObjective({"rtd_weight": 1}).loss(model, batch)
    assert model.seen.tolist() == [[2, 5, 4, 9, 3, 0], [2, 5, 5, 8, 5, 3]]
    assert metric_value(metrics["replaced_frac"]) == pytest.approx(3 / 11)
    # the discriminator is right at every real token iff the labels mark exactly the replaced positions
    assert metric_value(metrics["rtd_acc"]) == 1.0 and metric_value(metrics["rtd_precision"]) == 1.0
    assert metric_value(metrics["rtd_recall"]) == 1.0 and metric_value(metrics["rtd_loss"]) < 1e-6


def test_electra_sampling_passes_no_gradient_to_the_generator(split_corpus, en_tokenizer):
    torch.manual_seed(0)
    batch = _batches(split_corpus[1], en_tokenizer, "full-sentences", 64, 4, 1)[0]
    objective = ElectraObjective({"sharing": "none", "rtd_weight": 50})
    model = objective.build_model(_model_cfg("tiny-electra", en_tokenizer))
    loss, metrics = objective.loss(model, batch)
    # The generator's gradient from the total loss equals its gradient from its own MLM loss alone: the
    # 50 x RTD term reaches it through no path (sampling is detached).
    gen_params = list(model.generator.parameters())
    grads = torch.autograd.grad(loss, gen_params, allow_unused=True)
    gen_loss_grads = torch.autograd.grad(_gen_loss(model, batch), gen_params, allow_unused=True)
    for g, h in zip(grads, gen_loss_grads):
        assert (g is None and h is None) or torch.allclose(g, h, atol=1e-6)
    assert metric_value(metrics["rtd_loss"]) > 0 and 0.0 < metric_value(metrics["replaced_frac"]) < 0.2


def _gen_loss(model, batch):
    from trainer.objectives.base import masked_positions, mlm_loss

    positions, labels = masked_positions(batch)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                   token_type_ids=batch["token_type_ids"], positions=positions, part="generator")
    return mlm_loss(logits, labels)[0]


@pytest.mark.parametrize("variant", ["electra", "electra-15", "replace-mlm", "all-tokens-mlm"])
def test_electra_ablations_put_their_loss_where_the_paper_does(variant, split_corpus, en_tokenizer):
    """Which positions of the main model carry a loss, and with which labels (Clark et al. 2020, table 5), read
    from the gradient at the main model's outputs: a position with no loss gets an exactly zero gradient; for a
    softmax cross-entropy the label is the one logit whose gradient is negative."""
    from trainer.objectives.base import masked_positions

    torch.manual_seed(0)
    batch = _batches(split_corpus[1], en_tokenizer, "full-sentences", 32, 4, 1)[0]
    objective = ElectraObjective({"variant": variant})
    model = objective.build_model(_model_cfg("tiny-electra", en_tokenizer))
    seen = {}
    forward = model.forward

    def spy(*args, part=None, **kw):
        out = forward(*args, part=part, **kw)
        if part in ("discriminator", "discriminator_heads"):
            seen.update(input=args[0].clone(), positions=kw.get("positions"), out=out)
            for t in (out.values() if isinstance(out, dict) else [out]):
                t.retain_grad()
        return out

    model.forward = spy
    loss, metrics = objective.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.discriminator.encoder.embeddings.word.weight.grad is not None
    positions, labels = masked_positions(batch)  # all B*P targets; the padding ones have label -100
    positions, labels = positions[labels != -100], labels[labels != -100]
    real = batch["attention_mask"].reshape(-1).bool()
    original = batch["input_ids"].reshape(-1).clone()
    original[positions] = labels
    main_in = seen["input"].reshape(-1)
    # the main model reads the generator's corruption: the original outside the masked positions, no [MASK]
    keep = torch.ones_like(real)
    keep[positions] = False
    assert torch.equal(main_in[keep], original[keep]) and not (main_in == en_tokenizer.mask_id).any()
    if variant in ("electra", "electra-15"):
        grad = seen["out"].grad.reshape(-1)
        carries = grad != 0
        if variant == "electra":  # RTD on every real token
            assert torch.equal(carries, real)
        else:  # electra-15: RTD only at the masked ~15 %
            want = torch.zeros_like(real)
            want[positions] = True
            assert torch.equal(carries, want)
        assert "rtd_acc" in metrics
        return
    from trainer.objectives.electra import MLM
    grad = seen["out"][MLM].grad
    # the head may score extra rows (padding targets, label -100): only the rows with a gradient carry a loss
    carrying = (grad != 0).any(-1)
    predicted = seen["positions"][carrying]
    if variant == "replace-mlm":  # MLM at the masked positions only, labels the original tokens
        assert torch.equal(predicted.sort().values, positions.sort().values)
    else:  # all-tokens-mlm: every real token, labels the original tokens (copy mechanism for the unchanged ones)
        assert torch.equal(predicted.sort().values, real.nonzero().squeeze(1))
    rows = (grad[carrying] < 0).sum(-1)
    assert (rows == 1).all()
    assert torch.equal(grad[carrying].argmin(-1), original[predicted])
    assert "mlm_acc" in metrics


def _train(objective, model, train, valid, steps, lr):
    """A plain torch loop (the DeepSpeed trainer is tested elsewhere); one thread: the CI machine is shared and
    two threads fighting other jobs' processes cost far more than they gain on a model this small."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_loop(objective, model, train, valid, steps, lr)
    finally:
        torch.set_num_threads(threads)


def _train_loop(objective, model, train, valid, steps, lr, warmup=30):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))

    def evaluate():
        model.eval()
        with torch.no_grad():
            rows = [objective.loss(model, b)[1] for b in valid]
        model.train()
        return {k: float(np.mean([metric_value(r[k]) for r in rows])) for k in rows[0]}

    before = evaluate()
    for step in range(steps):
        loss, _ = objective.loss(model, train[step % len(train)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return before, evaluate()


def _generated_corpus(root, train: list[list[str]], valid: list[list[str]]):
    """A 400-token WordPiece tokenizer trained on the ``train`` documents of a generated language (it holds every
    token the language has) and train/held-out shards of both -> (tokenizer, train prefix, valid prefix)."""
    from test_samples import train_wordpiece

    text = root / "text.txt"
    text.write_text("\n\n".join("\n".join(d) for d in train) + "\n", encoding="utf-8")
    tok = train_wordpiece(text, root / "tok", vocab_size=400)
    return (tok, write_shards(encode_docs(tok, train), root / "train", tok.vocab_size),
            write_shards(encode_docs(tok, valid), root / "valid", tok.vocab_size))


@pytest.fixture(scope="module")
def six_topics(tmp_path_factory):
    """A WordPiece tokenizer and train/held-out shards of a generated language of 6 topics (tests/finetune_tasks.py
    ``topic_documents``): a random next segment comes from another topic 5 times in 6."""
    from finetune_tasks import topic_documents

    root = tmp_path_factory.mktemp("topics")
    train, valid = topic_documents(1500, seed=11, topics=6), topic_documents(200, seed=12, topics=6)
    return _generated_corpus(root, train, valid)


STEPS, BATCH = 300, 16


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_tiny_electra_learns(six_topics, seed):
    """ELECTRA on the generated 6-topic language (``six_topics``), where a replacement the generator samples is
    often of another topic than its context: 300 steps, two seeds. On Python's docstrings (the first version of this
    test) the discriminator beat its prior's entropy by 0.006-0.021 only (seeds 0-2)."""
    tok, train_prefix, valid_prefix = six_topics
    torch.manual_seed(seed)
    train = _batches(train_prefix, tok, "full-sentences", 64, BATCH, STEPS, seed=seed)
    valid = _batches(valid_prefix, tok, "full-sentences", 64, 32, 4, seed=1)
    objective = ElectraObjective({"rtd_weight": 50, "generator_fraction": 0.5})
    model = objective.build_model(_model_cfg("tiny-electra", tok))
    # lr 2e-4 (the paper's scale), not 1e-3: at 1e-3 the generator learns the topics within the 300 steps (MLM loss
    # 5.8 -> 3.7) and its samples fit their context, so the discriminator stays near its prior (RTD loss 0.375-0.381
    # against the prior's entropy 0.40, recall 0.05-0.08, seeds 0-2)
    before, after = _train(objective, model, train, valid, STEPS, 2e-4)
    # measured (2026-12-03), seeds 0 / 1 / 2: generator MLM loss 5.80 -> 4.38 / 4.41 / 4.33, accuracy +0.05 / +0.09
    # / +0.06; RTD loss 0.695 -> 0.287 / 0.277 / 0.287 (the prior's entropy is 0.408), accuracy +0.53 / +0.56 /
    # +0.60, recall 0.36 / 0.40 / 0.37 and precision 0.997 / 0.973 / 0.984 on replaced tokens (14 % of tokens)
    assert after["gen_mlm_loss"] < before["gen_mlm_loss"] - 1.0, (before, after)
    assert after["gen_mlm_acc"] > before["gen_mlm_acc"] + 0.03, (before, after)
    assert after["rtd_loss"] < 0.75 * before["rtd_loss"], (before, after)
    # more than the prior: a constant logit at best reaches the entropy of the replaced fraction, with recall 0, and
    # the accuracy of always answering "original" (1 - p). (The accuracy before training depends on the random
    # initial bias of the RTD head: about 0.3-0.4 with the 2026-12-03 inits, 0.72 for seed 0 once the vocabulary
    # padding changed the init, so the gain over it is no measure; the majority class is. Seed 0 then: 0.911 against
    # 1 - p = 0.858.)
    p = after["replaced_frac"]
    assert after["rtd_acc"] > (1 - p) + 0.03, (before, after, 1 - p)
    prior_entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert after["rtd_loss"] < prior_entropy - 0.08, (before, after, prior_entropy)
    assert after["rtd_recall"] > 0.2 and after["rtd_precision"] > 3 * p, (before, after)


@pytest.fixture(scope="module")
def ordered_language(tmp_path_factory):
    """A WordPiece tokenizer (all ~240 tokens the language has) and train/held-out shards of a generated language whose only signal is
    sentence order (tests/finetune_tasks.py ``ordered_documents``)."""
    from finetune_tasks import ordered_documents

    root = tmp_path_factory.mktemp("ordered")
    train, valid = ordered_documents(1200, seed=3), ordered_documents(150, seed=4)
    return _generated_corpus(root, train, valid)


@pytest.mark.slow
def test_tiny_albert_with_sop_and_ngram_masking_learns(ordered_language):
    """SOP where segment order is learnable: in the generated language sentence order is the only signal (each
    sentence opens with its ordinal word), so the SOP head must learn it from its labels; held-out documents, 1,000
    steps. SOP is learnt in a jump whose step varies with the seed: measured (2026-12-03, torch and batch seed s)
    held-out SOP accuracy 0.959 / 0.945 / 0.955 for s = 0 / 2 / 3 at 1,000 steps (loss 0.11-0.18); at 600 steps
    0.93 and 0.91 for s = 0 / 1 but 0.47 (still the prior) for s = 2; at 300 steps 0.535 for s = 0. On Python's docstrings (the first version of this test) the SOP head stayed at the prior: held-out loss
    0.692 -> 0.692 with accuracy at the majority class (0.527) after 300 and 2,000 steps, and the BERT tiny preset did
    the same at 1,000 (seeds 0-2; pairs, swap rate and labels are right: tests/test_samples.py); docstring segment
    order carries too little signal for a tiny model at any test budget."""
    tok, train_prefix, valid_prefix = ordered_language
    torch.manual_seed(0)
    steps = 1000
    train = _batches(train_prefix, tok, "sop-pair", 64, BATCH, steps, strategy="ngram")
    valid = _batches(valid_prefix, tok, "sop-pair", 64, 32, 16, seed=1, strategy="ngram")
    objective = get_objective({"name": "mlm+sop"})
    model = objective.build_model(_model_cfg("tiny-albert", tok))
    # lr 1e-3, not 3e-3: [CLS] starts almost constant across samples (std 0.013: a fixed token whose near-uniform
    # attention averages ~50 others); at 3e-3 it stayed so on the old corpus and the SOP head predicted the prior
    before, after = _train(objective, model, train, valid, steps, 1e-3)
    assert after["mlm_loss"] < before["mlm_loss"] - 0.4, (before, after)
    assert after["mlm_acc"] > before["mlm_acc"] + 0.02, (before, after)
    # SOP beats the majority class of the held-out pairs (512) by 25 points (measured: ~42)
    swapped = float(torch.cat([b["sentence_label"] for b in valid]).float().mean())
    assert 0.4 < swapped < 0.6, swapped  # the 50 % swap rate
    assert after["sop_acc"] > max(swapped, 1 - swapped) + 0.25, (before, after, swapped)
    assert after["sop_loss"] < before["sop_loss"] - 0.3, (before, after)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_tiny_bert_with_nsp_learns(six_topics, seed):
    """NSP where the next segment is recognisable: in a generated language of 6 topics a random segment comes from
    another topic 5 times in 6 (at best ~92 % accuracy from topics alone). 700 steps, two seeds. Measured
    (2026-12-05, the current inits) for torch and batch seeds 0 / 1 / 2, held-out NSP accuracy against the bound
    0.683 (the majority class + 0.15; one standard error is 0.022): at 500 steps 0.730 / 0.691 / 0.717, at 700
    0.758 / 0.730 / 0.746 (loss 0.539 / 0.551 / 0.542, MLM loss 5.8 -> 3.1-3.2), at 1,000 0.723 / 0.732 / 0.750: the
    accuracy has reached its plateau by 700 (the test ran 1,000 steps before 2026-12-05). On Python's docstrings (the
    first version of this test) 2,500 steps gave accuracy 0.613 and loss 0.676, 0.007 under the threshold: the
    docstrings' segments carry little topic signal."""
    tok, train_prefix, valid_prefix = six_topics
    torch.manual_seed(seed)
    steps = 700
    train = _batches(train_prefix, tok, "segment-pair", 64, BATCH, steps, seed=seed)
    valid = _batches(valid_prefix, tok, "segment-pair", 64, 32, 16, seed=1)
    objective = get_objective({"name": "mlm+nsp"})
    model = objective.build_model(_model_cfg("tiny", tok))
    before, after = _train(objective, model, train, valid, steps, 1e-3)
    assert after["mlm_loss"] < before["mlm_loss"] - 1.0, (before, after)
    # NSP beats the majority class of the held-out pairs (512: one standard error is 0.022) by 15 points
    random_next = float(torch.cat([b["sentence_label"] for b in valid]).float().mean())
    assert after["nsp_acc"] > max(random_next, 1 - random_next) + 0.15, (before, after, random_next)
    assert after["nsp_loss"] < math.log(2) - 0.1, (before, after)


def test_electra_sharing_and_generator_size(en_tokenizer):
    cfg = _model_cfg("tiny-electra", en_tokenizer)
    shared = ElectraObjective({"sharing": "all", "generator_fraction": 1.0}).build_model(cfg)
    assert shared.generator.encoder is shared.discriminator.encoder
    emb = ElectraObjective({"sharing": "embeddings", "generator_fraction": 0.5}).build_model(cfg)
    assert emb.generator.encoder.embeddings is emb.discriminator.encoder.embeddings
    assert emb.generator_cfg.hidden_size == cfg.hidden_size // 2
    none = ElectraObjective({"sharing": "none"}).build_model(cfg)  # fraction from the preset (1/4)
    assert none.generator.encoder.embeddings is not none.discriminator.encoder.embeddings
    assert none.generator_cfg.hidden_size == cfg.hidden_size // 4
