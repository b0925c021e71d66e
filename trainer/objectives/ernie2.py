"""ERNIE 2.0 objective: the tasks of the continual multi-task plan, each a head and a loss, summed in one step.

Heads (one per task in ``objective.continual.tasks``): ``mlm`` (vocabulary logits at the masked positions),
``capitalization`` and ``token_document`` (2-way per token), ``sentence_reorder`` (k = 1! + ... + m! classes),
``sentence_distance`` (3), ``discourse`` and ``ir_relevance`` (their label lists). A batch carries the labels of the
tasks its step trains (``trainer/ernie/data.py``); the loss is the weighted sum of those tasks' losses, and each task's
loss and accuracy are reported as ``<task>_loss`` / ``<task>_acc``. Task embeddings: the model needs
``extra_embeddings.task`` with at least ``len(trainer.ernie.tasks.TASKS)`` rows. Registry name: ``ernie2``; recipe:
``objective: {name: ernie2, options: {continual: {...}, ...}}`` (``Ernie2Options``).
"""
from __future__ import annotations

import torch

from trainer.ernie import tasks as T
from trainer.ernie.config import Ernie2Options
from trainer.models import MLM, HeadSpec, ModelConfig

from .base import masked_positions, mlm_loss, packing, pooled, prediction_count
from .ernie import ErnieSamplesObjective, classification_loss

TOKEN_LABELS = {"capitalization": "capitalization_labels", "token_document": "token_document_labels"}
SENTENCE_LABELS = {"sentence_reorder": "sentence_reorder_label", "sentence_distance": "sentence_distance_label",
                   "discourse": "discourse_label", "ir_relevance": "ir_relevance_label"}


class Ernie2Objective(ErnieSamplesObjective):
    name = "ernie2"
    Options = Ernie2Options

    def __init__(self, options: Ernie2Options | dict):
        super().__init__(options)  # Ernie2Options refuses unknown tasks
        num_labels = {name: len(getattr(self.options, name).labels) for name in ("discourse", "ir_relevance")
                      if getattr(self.options, name) is not None}
        reorder_max_pieces = self.options.reorder_max_pieces
        self.tasks = {t.name: t for t in self.options.continual.tasks}
        self.num_labels = {"capitalization": 2, "token_document": 2,
                           "sentence_reorder": T.num_reorder_classes(reorder_max_pieces), "sentence_distance": 3,
                           **(num_labels or {})}

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        if model_cfg.extra_embeddings.get("task", 0) < len(T.TASKS):
            raise ValueError(f"ernie2 needs model.extra_embeddings.task >= {len(T.TASKS)} (one row per ERNIE task id "
                             f"in trainer/ernie/tasks.TASKS), got {model_cfg.extra_embeddings.get('task')}")
        heads = {}
        for name in self.tasks:
            if name == "mlm":
                heads[MLM] = HeadSpec("mlm")
            elif name in TOKEN_LABELS:
                heads[name] = HeadSpec("token", 2)
            else:
                heads[name] = HeadSpec("sequence", self.num_labels[name])
        return heads

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        has_mlm = "mlm_labels" in batch
        positions = labels = None
        if has_mlm:
            positions, labels = masked_positions(batch)
        out = model(ids, batch["attention_mask"], batch.get("token_type_ids"), {"task": batch["task_ids"]},
                    positions if has_mlm else torch.zeros(0, dtype=torch.long, device=ids.device), **packing(batch))
        total = None
        metrics: dict[str, torch.Tensor] = {}

        def add(name, labels, loss, acc):
            nonlocal total
            weighted = loss * self.tasks[name].loss_weight
            total = weighted if total is None else total + weighted
            n = prediction_count(labels)
            metrics[f"{name}_loss"] = pooled(loss, n)
            metrics[f"{name}_acc"] = pooled(acc, n)

        if has_mlm:
            add("mlm", labels, *mlm_loss(out[MLM], labels))
        for name, key in {**TOKEN_LABELS, **SENTENCE_LABELS}.items():
            if key in batch:
                add(name, batch[key], *classification_loss(out[name], batch[key]))
        if total is None:
            raise ValueError(f"batch has no labels of the objective's tasks {sorted(self.tasks)}: keys {sorted(batch)}")
        # Heads of tasks this step does not train still get a (zero) gradient, so every parameter takes part in
        # every step: DeepSpeed's ZeRO reduction and the optimizer see the same set on every rank and step.
        trained = {f"{n}_loss" for n in self.tasks} & set(metrics)
        idle = [out[MLM if n == "mlm" else n] for n in self.tasks if f"{n}_loss" not in trained]
        if idle:
            total = total + sum(x.sum() for x in idle) * 0.0
        return total, metrics
