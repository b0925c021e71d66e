"""ERNIE 1.0 objective: MLM over knowledge-masked batches, jointly with the dialogue language model (DLM).

Recipe: ``objective: {name: ernie, options: {knowledge_masking: {...}, dlm: {...}}}`` (``ErnieOptions``).

Batches are knowledge-masked by the data side (``trainer/ernie/knowledge_masking.py``), so the loss here is BERT's
masked-LM cross-entropy. A batch that carries ``role_ids`` is a DLM batch: the roles go to the encoder as
``extra_ids["role"]`` (in place of segment embeddings, see ``ModelConfig.segment_alternatives``) and the real/fake
head adds its loss; any other batch is an MLM batch with segment ids and no roles. So the role table is trained only
by DLM batches and the segment table only by MLM batches. With ``options.nsp`` the MLM batches are sentence pairs
(segment ids 0 / 1, ``sentence_label``) and the NSP head's loss is added to the masked-LM loss, as the released
ERNIE 1.0's (PaddlePaddle/ERNIE ``ernie_v1.py``: ``mask_lm_loss + next_sent_loss``); the head is named ``nsp`` and
exports to Hugging Face's ``ErnieForPreTraining`` ``cls.seq_relationship``. Registry name: ``ernie``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.ernie.components import ernie_components
from trainer.ernie.config import ErnieOptions
from trainer.models import MLM, NSP, HeadSpec, ModelConfig

from .base import Objective, masked_positions, mlm_loss, packing, pooled, prediction_count, sentence_loss

DLM = "dlm"
ROLE = "role"


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy ignoring -100 and accuracy over labelled entries; logits [..., C], labels [...]. Both are 0 when
    nothing is labelled (pool them by ``prediction_count(labels)``). No host sync: the count of labelled entries stays on the device (a Python test on it would
    wait for the GPU once per task and micro-batch)."""
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = labels.reshape(-1)
    keep = labels != -100
    n = keep.sum().clamp(min=1)
    loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / n
    acc = ((logits.argmax(-1) == labels) & keep).sum() / n
    return loss, acc.float().detach()


class ErnieSamplesObjective(Objective):
    """An objective trained on ERNIE's own batches (knowledge masking, DLM, ERNIE 2.0's task labels) from
    ``trainer/ernie/data.py``, rather than ``trainer/data``'s."""

    def build_components(self, cfg, rank: int, world_size: int, device: str):
        """Model, loss and ERNIE batches for ``trainer.pretrain`` (its ``Components``)."""
        return ernie_components(cfg, rank, world_size, device, objective=self)


class ErnieObjective(ErnieSamplesObjective):
    """ERNIE 1.0: knowledge-masked MLM, plus DLM when ``options.dlm`` is set (the model then needs a ``role`` table
    listed in ``segment_alternatives``). Its batches come from ``trainer/ernie/data.py``: ``build_components``."""

    name = "ernie"
    Options = ErnieOptions

    def __init__(self, options: ErnieOptions | dict | None = None):
        super().__init__(options)
        self.dlm = self.options.dlm is not None

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        heads = {MLM: HeadSpec("mlm")}
        if self.options.nsp:
            heads[NSP] = HeadSpec("sequence", 2)
        if self.dlm:
            if ROLE not in model_cfg.extra_embeddings or ROLE not in model_cfg.segment_alternatives:
                raise ValueError("objective ernie with DLM needs model.extra_embeddings.role (e.g. 2: Q and R) and "
                                 "model.segment_alternatives: [role], so role embeddings replace segment embeddings")
            heads[DLM] = HeadSpec("sequence", 2)
        return heads

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        positions, labels = masked_positions(batch)
        is_dlm = "role_ids" in batch
        if is_dlm:
            out = model(ids, batch["attention_mask"], None, {ROLE: batch["role_ids"]}, positions, **packing(batch))
        else:
            out = model(ids, batch["attention_mask"], batch.get("token_type_ids"), None, positions, **packing(batch))
        loss, acc = mlm_loss(out[MLM], labels)
        n = prediction_count(labels)
        metrics = {"mlm_loss": pooled(loss, n), "mlm_acc": pooled(acc, n)}
        if "sentence_label" in batch:  # options.nsp: corpus rows are sentence pairs
            nsp_loss, nsp_acc = sentence_loss(out[NSP], batch["sentence_label"])
            loss = loss + nsp_loss
            rows = batch["sentence_label"].numel()
            metrics.update({f"{NSP}_loss": pooled(nsp_loss, rows), f"{NSP}_acc": pooled(nsp_acc, rows)})
        if is_dlm:
            dlm_loss, dlm_acc = classification_loss(out[DLM], batch["dlm_label"])
            dlm_n = prediction_count(batch["dlm_label"])
            loss = loss + dlm_loss
            # DLM steps log their masked-LM part under its own name: it is measured on dialogue text, not corpus text
            metrics = {"dlm_loss": pooled(dlm_loss, dlm_n), "dlm_acc": pooled(dlm_acc, dlm_n),
                       "dlm_mlm_loss": metrics["mlm_loss"], "dlm_mlm_acc": metrics["mlm_acc"]}
        return loss, metrics
