"""ERNIE 1.0 objective: MLM over knowledge-masked batches, jointly with the dialogue language model (DLM).

Batches are knowledge-masked by the data side (``trainer/ernie/knowledge_masking.py``), so the loss here is BERT's
masked-LM cross-entropy. A batch that carries ``role_ids`` is a DLM batch: the roles go to the encoder as
``extra_ids["role"]`` (in place of segment embeddings, see ``ModelConfig.segment_alternatives``) and the real/fake
head adds its loss; any other batch is an MLM batch with segment ids and no roles. So the role table is trained only
by DLM batches and the segment table only by MLM batches. Registry name: ``ernie``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.models import MLM, HeadSpec, ModelConfig, PretrainingModel, flat_positions

DLM = "dlm"
ROLE = "role"


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the N predicted tokens and their accuracy (a batch with no prediction gives 0)."""
    if labels.numel() == 0:
        zero = logits.sum() * 0.0  # keeps the graph connected so every rank runs the same backward
        return zero, zero.detach()
    loss = F.cross_entropy(logits.float(), labels)
    acc = (logits.argmax(-1) == labels).float().mean()
    return loss, acc.detach()


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy ignoring -100 and accuracy over labelled entries; logits [..., C], labels [...]."""
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = labels.reshape(-1)
    keep = labels != -100
    if not bool(keep.any()):
        zero = logits.sum() * 0.0
        return zero, zero.detach()
    loss = F.cross_entropy(logits, labels, ignore_index=-100)
    acc = (logits[keep].argmax(-1) == labels[keep]).float().mean()
    return loss, acc.detach()


class ErnieObjective:
    """ERNIE 1.0: knowledge-masked MLM, plus DLM when ``dlm=True`` (the model then needs a ``role`` table listed
    in ``segment_alternatives``)."""

    name = "ernie"

    def __init__(self, dlm: bool = False):
        self.dlm = dlm

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        heads = {MLM: HeadSpec("mlm")}
        if self.dlm:
            if ROLE not in model_cfg.extra_embeddings or ROLE not in model_cfg.segment_alternatives:
                raise ValueError("objective ernie with DLM needs model.extra_embeddings.role (e.g. 2: Q and R) and "
                                 "model.segment_alternatives: [role], so role embeddings replace segment embeddings")
            heads[DLM] = HeadSpec("sequence", 2)
        return heads

    def build_model(self, model_cfg: ModelConfig) -> torch.nn.Module:
        return PretrainingModel(model_cfg, self.heads(model_cfg))

    def data_requirements(self) -> dict:
        return {"masking": "knowledge", "labels": ["mlm_positions", "mlm_labels"] + (["role_ids", "dlm_label"]
                                                                                    if self.dlm else [])}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        positions, labels = flat_positions(batch["mlm_positions"], batch["mlm_labels"], ids.shape[1])
        is_dlm = "role_ids" in batch
        if is_dlm:
            out = model(ids, batch["attention_mask"], None, {ROLE: batch["role_ids"]}, positions)
        else:
            out = model(ids, batch["attention_mask"], batch.get("token_type_ids"), None, positions)
        loss, acc = mlm_loss(out[MLM], labels)
        metrics = {"mlm_loss": loss.detach(), "mlm_acc": acc}
        if is_dlm:
            dlm_loss, dlm_acc = classification_loss(out[DLM], batch["dlm_label"])
            loss = loss + dlm_loss
            metrics.update(dlm_loss=dlm_loss.detach(), dlm_acc=dlm_acc, dlm_mlm_loss=metrics.pop("mlm_loss"))
        return loss, metrics
