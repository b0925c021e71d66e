"""Logged losses and accuracies pooled by their prediction counts (trainer/objectives/base.py ``pooled``,
trainer/loop.py): one set scores the same at any micro-batch size, so at any world size."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from test_objectives import _model_cfg, split_corpus  # noqa: F401  (fixture)
from test_samples import data_config, en_tokenizer  # noqa: F401  (fixture)
from trainer.data.dataset import PretrainingDataset
from trainer.data.loader import Collator
from trainer.loop import _to_device
from trainer.objectives import get_objective
from trainer.objectives.base import metric_value


class _StandInEngine:
    """Calls the loss as DeepSpeed's engine forward does (``engine(fn, batch)`` -> ``fn(module, batch)``)."""

    device = "cpu"

    def __init__(self, model):
        self.model = model

    def __call__(self, fn, batch):
        return fn(self.model, batch)

    def train(self, mode):
        self.model.train(mode)


@pytest.mark.parametrize("name,fmt,preset", [("mlm", "full-sentences", "tiny-roberta"),
                                             ("mlm+nsp", "segment-pair", "tiny"),
                                             ("electra", "full-sentences", "tiny-electra")])
def test_evaluation_scores_a_set_the_same_at_any_micro_batch_size(name, fmt, preset, split_corpus, en_tokenizer):
    """The trainer's evaluation (``Trainer._evaluate``, run here on a stand-in engine) pools each loss and accuracy
    by its prediction count: one set of 16 rows scores the same in 1 micro-batch of 16 as in 8 micro-batches of 2
    (world size 1 at micro-batch 16, or 8 at micro-batch 2). The stand-in cannot see DeepSpeed's forward itself; the
    gloo runs in test_trainer_multiproc.py go through it."""
    from types import SimpleNamespace

    from trainer.loop import Trainer

    cfg = data_config(split_corpus[1], format=fmt, max_seq_length=64, masking={"max_predictions_per_seq": 20})
    ds = PretrainingDataset(cfg, en_tokenizer, seed=0)
    whole = Collator(en_tokenizer.pad_id, 64, 20)([ds[i] for i in range(16)])
    torch.manual_seed(0)
    objective = get_objective({"name": name})
    model = objective.build_model(_model_cfg(preset, en_tokenizer))
    with torch.no_grad():  # sharper than at initialisation, so that rows' losses differ as a trained model's do
        for p in model.parameters():
            p.mul_(4.0)
    engine = _StandInEngine(model)

    def split(micro: int) -> list:
        # the rows of each micro-batch, its packing (the real tokens) computed again for them, as the loader does
        return [_to_device({k: v[i:i + micro] for k, v in whole.items() if k != "packing"}, "cpu")
                for i in range(0, 16, micro)]

    def evaluate(micro: int) -> dict:
        batches = split(micro)
        trainer = SimpleNamespace(engine=engine, comps=SimpleNamespace(eval_batches=lambda: iter(batches),
                                                                       loss=objective.loss),
                                  cfg=SimpleNamespace(train=SimpleNamespace(eval_batches=1)),
                                  grad_accum=len(batches), world_size=1)
        return Trainer._evaluate(trainer)

    big, small = evaluate(16), evaluate(2)
    prefix = "gen_" if name == "electra" else ""
    keys = [f"{prefix}mlm_loss", f"{prefix}mlm_acc"] + (["nsp_loss", "nsp_acc"] if name == "mlm+nsp" else [])
    for key in keys:
        assert big[key] == pytest.approx(small[key], abs=1e-5), (key, big, small)
    # what was logged before: the mean of the per-micro-batch means moves with the split (the test's teeth)
    engine.train(False)
    with torch.no_grad():
        means = [metric_value(objective.loss(engine.model, b)[1][keys[0]]) for b in split(2)]
    assert abs(float(np.mean(means)) - small[keys[0]]) > 1e-3, (means, small)
