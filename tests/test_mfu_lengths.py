"""The logged MFU counts the FLOPs of the rows as computed (trainer/flops.py's split, trainer/loop.py's
``attended_squares``): attention at each attended segment's own length -- a padded row's real length, each packed
sample of a packed row -- not at the batch's or ``max_seq_length`` for every token.

The reference is independent of the loop, of ``Packing`` and of ``train_flops``' second difference: torch's
``FlopCounterMode`` counts each model's encoder on every segment of the batches alone (a meta row of that segment's
length, built from the samples' own lengths and pack ids), plus the heads at their full-row rate per token (what
``train_flops`` keeps in ``per_token``: the MLM head at P predictions per ``T``-token row). The loop runs real
forward/backward steps of a tiny model on a stand-in engine (DeepSpeed's own step is not what is measured here).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer.checkpoint import TrainState
from trainer.data.loader import Collator
from trainer.flops import _pretraining_models, train_flops
from trainer.loop import Components, Trainer
from trainer.models import get_preset
from trainer.models.kernels import attach_packing
from trainer.objectives import get_objective

T, P, MICRO, ACCUM, STEPS = 32, 6, 2, 2, 2
PEAK = 1e12  # any positive figure: the test recovers the FLOPs from mfu x peak x seconds


class _Engine:
    """What the loop calls of DeepSpeed's engine, on the CPU model: a real forward and backward, no update."""

    device = torch.device("cpu")
    zero_stage = 1  # the loop measures no gradient norm of its own

    def __init__(self, model):
        self.model = model

    def __call__(self, fn, batch):
        return fn(self.model, batch)

    def backward(self, loss):
        loss.backward()

    def step(self):
        pass

    def unhandled_nonfinite_step(self):
        return False

    def lr(self):
        return 1e-3

    def grad_norm(self):
        return 0.0

    def loss_scale(self):
        return None


class _Records:
    def __init__(self):
        self.records = []

    def log(self, step, record, split="train"):
        self.records.append(record)

    def advance(self, steps, loss):
        pass

    def message(self, text):
        pass


def samples(vocab: int, packed: bool, seed: int) -> list[list[dict]]:
    """Micro-batches of rows of 12-32 tokens (padded to the batch's longest); with ``packed`` 2-3 samples per row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS * ACCUM):
        rows = []
        for _ in range(MICRO):
            n = int(rng.integers(12, T + 1))
            ids = rng.integers(5, vocab, n).astype(np.int32)
            pos = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(1, P + 1)), replace=False)).astype(np.int32)
            row = {"input_ids": ids, "token_type_ids": np.zeros(n, np.int8), "mlm_positions": pos,
                   "mlm_labels": ids[pos].copy()}
            if packed:
                cut = sorted(rng.choice(np.arange(2, n - 1), size=int(rng.integers(1, 3)), replace=False))
                row["pack_ids"] = np.searchsorted(np.asarray(cut), np.arange(n), side="right").astype(np.int8) + 1
            rows.append(row)
        out.append(rows)
    return out


def segment_lengths(row: dict) -> list[int]:
    """The row's attended segments, from the sample itself: each packed sample, else the whole row."""
    if "pack_ids" not in row:
        return [len(row["input_ids"])]
    return np.bincount(row["pack_ids"])[1:].tolist()


def reference_flops(model, rows: list[dict]) -> float:
    """Training FLOPs of ``rows`` counted by FlopCounterMode segment by segment (module docstring)."""
    total = 0.0
    for part in _pretraining_models(model):
        @functools.cache
        def encoder(n: int) -> int:  # forward FLOPs of the encoder on one segment of n tokens
            from trainer.models.heads import PretrainingModel
            with torch.device("meta"):
                shadow = PretrainingModel(part.cfg, part.head_specs)
                ids = torch.zeros(1, n, dtype=torch.long)
            with FlopCounterMode(display=False) as counter:
                shadow.encoder(ids)
            return counter.get_total_flops()

        with torch.device("meta"):
            from trainer.models.heads import PretrainingModel
            shadow = PretrainingModel(part.cfg, part.head_specs)
            ids, positions = torch.zeros(1, T, dtype=torch.long), torch.arange(P)
        with FlopCounterMode(display=False) as counter:
            shadow(ids, mlm_positions=positions)
        heads_per_token = (counter.get_total_flops() - encoder(T)) / T
        for row in rows:
            total += sum(encoder(n) for n in segment_lengths(row)) + heads_per_token * len(row["input_ids"])
    return 3.0 * total


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("objective_name,preset", [("mlm", "tiny-roberta"), ("electra", "tiny-electra")])
def test_logged_mfu_counts_the_flops_of_the_rows_as_computed(objective_name, preset, packed, tmp_path):
    torch.manual_seed(0)
    cfg = get_preset(preset, max_position_embeddings=T + 8)
    objective = get_objective({"name": objective_name})
    model = objective.build_model(cfg)
    micro_batches = samples(cfg.vocab_size, packed, seed=1)
    collate = Collator(cfg.pad_token_id, T, P)
    stream = iter([attach_packing(collate(rows)) for rows in micro_batches])
    flops = train_flops(model, T, P)
    comps = Components(model=model, loss=objective.loss, train_batches=lambda consumed, end: stream,
                       flops_per_token=flops.per_token, attention_flops=flops.per_square)
    run = SimpleNamespace(train=SimpleNamespace(stop_at_step=0, steps=STEPS, global_batch_size=MICRO * ACCUM,
                                                eval_every=0),
                          logging=SimpleNamespace(every_steps=STEPS),  # one record over both steps' window
                          checkpoint=SimpleNamespace(every_steps=0, save_at_end=False), run_dir=tmp_path)
    records = _Records()
    trainer = Trainer(cfg=run, engine=_Engine(model), comps=comps, state=TrainState(), rank=0, world_size=1,
                      grad_accum=ACCUM, metrics=records, preempt=SimpleNamespace(requested=False), peak_flops=PEAK)
    trainer.train()

    (record,) = records.records
    rows = [row for rows in micro_batches for row in rows]
    tokens = sum(len(row["input_ids"]) for row in rows)
    seconds = tokens / record["tokens_per_s"]
    logged = record["mfu"] * PEAK * seconds
    expected = reference_flops(model, rows)
    assert logged == pytest.approx(expected, rel=1e-9)
    # the teeth: attention at the full row for every token (the count before the split) is more
    assert flops.full_row_per_token * tokens > expected * (1.005 if packed else 1.001)
