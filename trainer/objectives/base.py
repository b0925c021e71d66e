"""What every objective shares: the plug-in interface, the MLM and sentence-classification losses, RTD metrics.

An objective (DESIGN.md "Objectives") is a class with

- ``Options``: a pydantic model (``extra="forbid"``) of its own settings, filled from ``objective.options``; it
  lives in a torch-free module (``options.py``, ``trainer/ernie/config.py``) that the registry line names, with the
  sample formats the objective trains on (checked against the ``data`` section before anything is launched);
- ``heads(model_cfg) -> {name: HeadSpec}`` and ``build_model(model_cfg) -> nn.Module``;
- ``loss(model, batch) -> (loss, {metric: 0-dim tensor})``. ``model`` may be the module itself or a DeepSpeed
  engine wrapping it, so the module is only ever *called*, never reached into;
- optionally ``build_components(cfg, rank, world_size, device) -> trainer.loop.Components``, for an objective that
  builds its own samples (ERNIE); without it the trainer uses ``trainer/data``'s.

Metrics are detached device tensors (no ``.item()``: that would be a device sync per metric per step; the trainer
reduces and reads them when it logs). A metric is either a 0-dim tensor, averaged over micro-batches as it is, or
``pooled(mean, count)``, a ``[sum, count]`` pair: the trainer sums both over micro-batches and ranks and divides once,
so a loss or accuracy over masked tokens is the mean over every prediction, whatever micro-batch size each world size
takes (a mean of per-micro-batch means weighs a micro-batch with few predictions as much as one with many).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel

from trainer.models import HeadSpec, ModelConfig, PretrainingModel, mlm_targets
from trainer.objectives.options import NoOptions


class Objective:
    """Base class: a masked-LM objective over the batch contract (subclasses add heads and losses)."""

    name = "base"
    Options: type[BaseModel] = NoOptions

    def __init__(self, options: BaseModel | dict | None = None):
        self.options = options if isinstance(options, BaseModel) else self.Options.model_validate(options or {})

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        raise NotImplementedError

    def build_model(self, model_cfg: ModelConfig) -> torch.nn.Module:
        return PretrainingModel(model_cfg, self.heads(model_cfg))

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    # -- helpers for subclasses ------------------------------------------------------------------------------------
    @staticmethod
    def forward_heads(model, batch: dict, positions: torch.Tensor | None) -> dict:
        return model(batch["input_ids"], attention_mask=batch["attention_mask"],
                     token_type_ids=batch.get("token_type_ids"), mlm_positions=positions, **packing(batch))


def packing(batch: dict) -> dict:
    """The model keywords of a batch's packing: ``pack_ids`` for packed doc-sentences batches (the encoder then
    attends within each packed sample and restarts its positions) and ``packing``, the host-computed location of the
    real tokens the training loop attaches (``trainer.models.kernels.attach_packing``; it spares the model device
    syncs). A batch without them gives nothing, so models without the keywords keep working."""
    return {k: batch[k] for k in ("pack_ids", "packing") if k in batch}


def masked_positions(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat positions [B*P] into B*T, labels [B*P], -100 = no prediction) of a batch: ``mlm_targets``, so no
    device->host sync; ``mlm_loss`` ignores the -100 entries."""
    return mlm_targets(batch["mlm_positions"], batch["mlm_labels"], batch["input_ids"].shape[1])


def pooled(mean: torch.Tensor, count) -> torch.Tensor:
    """The metric ``mean`` over ``count`` items as ``[mean * count, count]`` (float32, detached, on mean's device). A
    count of 0 gives [0, 0]: the micro-batch does not dilute the pooled mean. ``count`` may be a device tensor or a
    host number (filled on the device: no host-to-device copy)."""
    mean = mean.detach().float()
    n = count.detach().float() if isinstance(count, torch.Tensor) else mean.new_full((), float(count))
    return torch.stack([mean * n, n])


def metric_parts(value) -> torch.Tensor:
    """``[sum, count]`` (float64, on the value's device) of a metric as objectives report it: a ``pooled`` pair as it
    is, a 0-dim mean as ``[mean, 1]`` (one micro-batch's worth)."""
    t = torch.as_tensor(value).detach().double()
    if t.numel() == 2:
        return t.reshape(2)
    return torch.stack([t.reshape(()), torch.ones((), dtype=torch.float64, device=t.device)])


def metric_value(value) -> float:
    """The value of one reported metric (host float; a sync: for tools and tests, not for the training step)."""
    s, n = metric_parts(value).tolist()
    return s / n if n else float("nan")


def prediction_count(labels: torch.Tensor) -> torch.Tensor:
    """How many entries of ``labels`` are predictions (not -100), as a device tensor."""
    return (labels != -100).sum()


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the predictions whose label is not -100 (computed in fp32) and their accuracy.
    Divides by the count on the device (no sync to look at it); a batch without predictions gives a zero loss still
    connected to the graph, so every rank runs the same backward."""
    valid = labels != -100
    count = valid.sum().clamp(min=1)
    loss = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum") / count
    acc = ((logits.argmax(-1) == labels) & valid).sum() / count
    return loss, acc.float().detach()


def sentence_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NSP / SOP: cross-entropy over [B, 2] logits and accuracy (both over the B rows: pool them by ``labels.numel()``)."""
    loss = F.cross_entropy(logits.float(), labels)
    return loss, (logits.argmax(-1) == labels).float().mean().detach()


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, prefix: str) -> dict:
    """Accuracy over weighted tokens, precision and recall of the positive ('replaced') class, each ``pooled`` by its
    own denominator (weight, predicted positives, actual positives), so they pool over micro-batches and ranks into the
    precision and recall of the whole set."""
    with torch.no_grad():
        pred = (logits > 0) & (weight > 0)
        pos = (labels > 0.5) & (weight > 0)
        w = weight.float()
        tp = (pred & pos).float().sum()
        n_pred, n_pos = pred.float().sum(), pos.float().sum()
        return {f"{prefix}_acc": torch.stack([((pred == pos).float() * w).sum(), w.sum()]),
                f"{prefix}_precision": torch.stack([tp, n_pred]), f"{prefix}_recall": torch.stack([tp, n_pos])}
