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

Metrics are detached 0-dim tensors (no ``.item()``: that would be a device sync per metric per step; the trainer
reduces and reads them when it logs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel

from trainer.models import HeadSpec, ModelConfig, PretrainingModel, flat_positions
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
    """``{"pack_ids": ...}`` for packed doc-sentences batches (the encoder then attends within each packed sample
    and restarts its positions), else nothing, so models without the keyword keep working."""
    return {"pack_ids": batch["pack_ids"]} if "pack_ids" in batch else {}


def masked_positions(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat positions [N] into B*T, labels [N]) of the real predictions of a batch."""
    return flat_positions(batch["mlm_positions"], batch["mlm_labels"], batch["input_ids"].shape[1])


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the N predictions (computed in fp32) and accuracy. No prediction in the batch:
    a zero loss still connected to the graph, so every rank runs the same backward."""
    if labels.numel() == 0:
        zero = logits.sum() * 0.0
        return zero, zero.detach()
    loss = F.cross_entropy(logits.float(), labels)
    return loss, (logits.argmax(-1) == labels).float().mean().detach()


def sentence_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NSP / SOP: cross-entropy over [B, 2] logits and accuracy."""
    loss = F.cross_entropy(logits.float(), labels)
    return loss, (logits.argmax(-1) == labels).float().mean().detach()


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, prefix: str) -> dict:
    """Accuracy over weighted tokens, precision and recall of the positive ('replaced') class."""
    with torch.no_grad():
        pred = (logits > 0) & (weight > 0)
        pos = (labels > 0.5) & (weight > 0)
        w = weight.float()
        tp = (pred & pos).float().sum()
        acc = ((pred == pos).float() * w).sum() / w.sum().clamp(min=1)
        precision = tp / pred.float().sum().clamp(min=1)
        recall = tp / pos.float().sum().clamp(min=1)
    return {f"{prefix}_acc": acc, f"{prefix}_precision": precision, f"{prefix}_recall": recall}
