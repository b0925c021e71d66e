"""ERNIE 1.0 objective: MLM over knowledge-masked batches, jointly with the dialogue language model (DLM).

Recipe: ``objective: {name: ernie, options: {knowledge_masking: {...}, dlm: {...}}}`` (``ErnieOptions``).

Batches are knowledge-masked by the data side (``trainer/ernie/knowledge_masking.py``), so the loss here is BERT's
masked-LM cross-entropy. A batch that carries ``role_ids`` is a DLM batch: the roles go to the encoder as
``extra_ids["role"]`` (in place of segment embeddings, see ``ModelConfig.segment_alternatives``) and the real/fake
head adds its loss; any other batch is an MLM batch with segment ids and no roles. So the role table is trained only
by DLM batches and the segment table only by MLM batches. Registry name: ``ernie``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig
from trainer.models import MLM, HeadSpec, ModelConfig, PretrainingModel, flat_positions

DLM = "dlm"
ROLE = "role"


class DlmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    """Dialogue jsonl: {"turns": ["q", "r", ...]} or {"turns": [{"role": "Q"|"R", "text": ...}, ...]} per line."""
    every: int = Field(4, ge=1)
    """Every N-th step is a DLM step (all its micro-batches on all ranks); the others are MLM steps."""
    num_turns: int = Field(3, ge=2)
    fake_prob: float = Field(0.5, ge=0.0, le=1.0)
    """Probability that one turn of a sample is replaced by a turn of another dialogue (label: fake)."""
    annotate: str | None = None
    """Annotator for knowledge masking inside turns (jieba | gazetteer:FILE | jsonl:FILE); None = basic units."""
    valid_path: str | None = None
    """Held-out dialogues (same format) for evaluation's DLM batches (with data.valid_corpora and train.eval_every);
    without it evaluation has MLM batches only: the training dialogues are not held out."""


class PairTaskConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    """jsonl with {"text_a", "text_b", "label"} per line (IR relevance: query and title)."""
    labels: list[str | int] = Field(min_length=2)
    """Every class, in the order of the classifier's outputs."""


class ErnieOptions(BaseModel):
    """``objective.options`` of ``name: ernie`` (ERNIE 1.0)."""

    model_config = ConfigDict(extra="forbid")

    knowledge_masking: KnowledgeMaskingConfig = Field(default_factory=KnowledgeMaskingConfig)
    dlm: DlmConfig | None = None
    """The dialogue language model, trained jointly with MLM (None = MLM only)."""


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
    """ERNIE 1.0: knowledge-masked MLM, plus DLM when ``options.dlm`` is set (the model then needs a ``role`` table
    listed in ``segment_alternatives``). Its batches come from ``trainer/ernie/data.py``: ``build_components``."""

    name = "ernie"
    Options = ErnieOptions

    def __init__(self, options: ErnieOptions | dict | None = None):
        self.options = options if isinstance(options, BaseModel) else self.Options.model_validate(options or {})
        self.dlm = getattr(self.options, "dlm", None) is not None

    def build_components(self, cfg, rank: int, world_size: int, device: str):
        """Model, loss and ERNIE batches for ``trainer.pretrain`` (its ``Components``)."""
        from trainer.ernie.components import ernie_components

        return ernie_components(cfg, rank, world_size, device, objective=self)

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
        return {"formats": ("doc-sentences",), "masking": "knowledge",
                "labels": ["mlm_positions", "mlm_labels"] + (["role_ids", "dlm_label"] if self.dlm else [])}

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
            # DLM steps log their masked-LM part under its own name: it is measured on dialogue text, not corpus text
            metrics = {"dlm_loss": dlm_loss.detach(), "dlm_acc": dlm_acc, "dlm_mlm_loss": metrics["mlm_loss"],
                       "dlm_mlm_acc": acc}
        return loss, metrics
