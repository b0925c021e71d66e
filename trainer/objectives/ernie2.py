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

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainer.ernie import tasks as T
from trainer.ernie.continual import ContinualConfig
from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig
from trainer.models import MLM, HeadSpec, ModelConfig, PretrainingModel, flat_positions
from trainer.objectives.ernie import PairTaskConfig, classification_loss, mlm_loss

TOKEN_LABELS = {"capitalization": "capitalization_labels", "token_document": "token_document_labels"}
SENTENCE_LABELS = {"sentence_reorder": "sentence_reorder_label", "sentence_distance": "sentence_distance_label",
                   "discourse": "discourse_label", "ir_relevance": "ir_relevance_label"}


class Ernie2Options(BaseModel):
    """``objective.options`` of ``name: ernie2``."""

    model_config = ConfigDict(extra="forbid")

    continual: ContinualConfig
    """The tasks, their iterations and the schedule."""
    knowledge_masking: KnowledgeMaskingConfig = Field(default_factory=KnowledgeMaskingConfig)
    reorder_max_pieces: int = Field(3, ge=1, le=5)
    """Sentence reordering: at most m pieces, k = 1! + ... + m! classes."""
    discourse: PairTaskConfig | None = None
    ir_relevance: PairTaskConfig | None = None
    token_document_max_tokens: int = Field(4096, ge=1)
    """Token-document relation looks at up to this many tokens of the rest of the document."""

    @model_validator(mode="after")
    def _pair_files_given(self):
        for task in ("discourse", "ir_relevance"):
            if any(t.name == task for t in self.continual.tasks) and getattr(self, task) is None:
                raise ValueError(f"continual.tasks lists {task}: give objective.options.{task} (path, labels)")
        return self


class Ernie2Objective:
    name = "ernie2"
    Options = Ernie2Options

    def __init__(self, options: Ernie2Options | dict):
        self.options = options if isinstance(options, BaseModel) else self.Options.model_validate(options)
        continual = self.options.continual
        num_labels = {name: len(getattr(self.options, name).labels) for name in ("discourse", "ir_relevance")
                      if getattr(self.options, name) is not None}
        reorder_max_pieces = self.options.reorder_max_pieces
        self.tasks = {t.name: t for t in continual.tasks}
        unknown = set(self.tasks) - set(T.TASKS) - {"dlm"}
        if unknown or "dlm" in self.tasks:
            raise ValueError(f"objective.continual.tasks: unknown task(s) {sorted(unknown | ({'dlm'} & set(self.tasks)))}"
                             f"; ERNIE 2.0 tasks are {[t for t in T.TASKS if t != 'dlm']}")
        self.num_labels = {"capitalization": 2, "token_document": 2,
                           "sentence_reorder": T.num_reorder_classes(reorder_max_pieces), "sentence_distance": 3,
                           **(num_labels or {})}

    def build_components(self, cfg, rank: int, world_size: int, device: str):
        """Model, loss and ERNIE 2.0 batches for ``trainer.pretrain`` (its ``Components``)."""
        from trainer.ernie.components import ernie_components

        return ernie_components(cfg, rank, world_size, device, objective=self)

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

    def build_model(self, model_cfg: ModelConfig) -> torch.nn.Module:
        return PretrainingModel(model_cfg, self.heads(model_cfg))

    def data_requirements(self) -> dict:
        return {"formats": ("doc-sentences",), "masking": "knowledge", "tasks": list(self.tasks)}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        has_mlm = "mlm_labels" in batch
        positions = labels = None
        if has_mlm:
            positions, labels = flat_positions(batch["mlm_positions"], batch["mlm_labels"], ids.shape[1])
        out = model(ids, batch["attention_mask"], batch.get("token_type_ids"), {"task": batch["task_ids"]},
                    positions if has_mlm else torch.zeros(0, dtype=torch.long, device=ids.device))
        total = None
        metrics: dict[str, torch.Tensor] = {}

        def add(name, loss, acc):
            nonlocal total
            weighted = loss * self.tasks[name].loss_weight
            total = weighted if total is None else total + weighted
            metrics[f"{name}_loss"] = loss.detach()
            metrics[f"{name}_acc"] = acc

        if has_mlm:
            add("mlm", *mlm_loss(out[MLM], labels))
        for name, key in {**TOKEN_LABELS, **SENTENCE_LABELS}.items():
            if key in batch:
                add(name, *classification_loss(out[name], batch[key]))
        if total is None:
            raise ValueError(f"batch has no labels of the objective's tasks {sorted(self.tasks)}: keys {sorted(batch)}")
        # Heads of tasks this step does not train still get a (zero) gradient, so every parameter takes part in
        # every step: DeepSpeed's ZeRO reduction and the optimizer see the same set on every rank and step.
        trained = {f"{n}_loss" for n in self.tasks} & set(metrics)
        idle = [out[MLM if n == "mlm" else n] for n in self.tasks if f"{n}_loss" not in trained]
        if idle:
            total = total + sum(x.sum() for x in idle) * 0.0
        return total, metrics
