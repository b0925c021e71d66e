"""The ERNIE sections of a run config: ``objective.options`` of ``ernie`` (ERNIE 1.0) and ``ernie2`` (ERNIE 2.0),
knowledge masking and the continual multi-task plan.

Pydantic and the standard library only, so validating an ERNIE recipe imports neither numpy nor torch; the code that
uses these settings (``knowledge_masking.py``, ``continual.py``, ``data.py``, ``trainer/objectives/ernie*.py``)
imports them from here.
"""
from __future__ import annotations

import bisect
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TASKS = ("mlm", "capitalization", "token_document", "sentence_reorder", "sentence_distance", "discourse",
         "ir_relevance", "dlm")
"""Every ERNIE task; a task's id (ERNIE 2.0's ``task`` embeddings) is its index here. The order is part of
checkpoints: append, never reorder."""


# --- knowledge masking (ERNIE 1.0 and 2.0) ---------------------------------------------------------------------

class KnowledgeStage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: Literal["basic", "phrase", "entity"]
    start_step: int = Field(ge=0)
    """First optimizer step at which this level is used (the first stage must start at 0)."""


class KnowledgeMaskingConfig(BaseModel):
    """ERNIE 1.0 masking; rates as BERT's. ``stages`` are in step order and the first starts at step 0."""

    model_config = ConfigDict(extra="forbid")

    stages: list[KnowledgeStage] = Field(default_factory=lambda: [KnowledgeStage(level="basic", start_step=0)])
    rate: float = Field(0.15, gt=0.0, lt=1.0)
    """Fraction of candidate (non-special, non-pad) tokens selected for prediction."""
    mask_prob: float = Field(0.8, ge=0.0, le=1.0)
    random_prob: float = Field(0.1, ge=0.0, le=1.0)
    max_predictions_per_seq: int = Field(20, ge=1)
    """Cap per row, and the width P of ``mlm_positions``."""

    @model_validator(mode="after")
    def _ordered(self):
        if not self.stages or self.stages[0].start_step != 0:
            raise ValueError("knowledge masking: stages[0].start_step must be 0 (every step needs a level)")
        starts = [s.start_step for s in self.stages]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ValueError(f"knowledge masking: stages' start_step must increase strictly, got {starts}")
        if self.mask_prob + self.random_prob > 1 + 1e-9:
            raise ValueError(f"knowledge masking: mask_prob + random_prob = {self.mask_prob + self.random_prob} > 1")
        return self

    def level_at(self, step: int) -> str:
        """The masking level in force at optimizer step ``step``."""
        starts = [s.start_step for s in self.stages]
        return self.stages[bisect.bisect_right(starts, step) - 1].level


# --- the continual multi-task plan (ERNIE 2.0) -----------------------------------------------------------------

Mode = Literal["continual", "all-at-once", "sequential"]


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """A registered ERNIE task (trainer/ernie/tasks.TASKS), e.g. mlm, capitalization, sentence_reorder."""
    iterations: int = Field(gt=0)
    """N: the steps this task trains in, over the whole run."""
    level: Literal["token", "sentence"]
    """token: labels on the tokens of any batch (can share a step); sentence: decides the batch's format."""
    stage: int | None = Field(default=None, ge=0)
    """Stage that introduces the task (continual mode; default: its position in the list)."""
    loss_weight: float = Field(default=1.0, gt=0)


class ContinualConfig(BaseModel):
    """The ERNIE 2.0 multi-task schedule (``objective.continual`` in a recipe)."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = "continual"
    tasks: list[TaskSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self):
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"continual.tasks: a task is listed twice in {names}")
        if self.mode == "continual":
            stages = [self._stage(i) for i in range(len(self.tasks))]
            if sorted(set(stages)) != list(range(max(stages) + 1)):
                raise ValueError(f"continual.tasks[*].stage: stages {sorted(set(stages))} leave a gap; "
                                 "number them 0, 1, 2, ... without holes")
        elif any(t.stage is not None for t in self.tasks):
            raise ValueError(f"continual.tasks[*].stage is only meaningful with mode: continual, not {self.mode}")
        return self

    def _stage(self, i: int) -> int:
        stage = self.tasks[i].stage
        return i if stage is None else stage


# --- objective.options -----------------------------------------------------------------------------------------

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
    nsp: bool = False
    """Next-sentence prediction, as the released ERNIE 1.0 was trained (PaddlePaddle/ERNIE sums the masked-LM and
    next-sentence losses): corpus rows are ``[CLS] A [SEP] B [SEP]`` pairs (segment ids 0 / 1) of ``data.format:
    segment-pair``, B from another document at ``data.nsp_negative_prob`` (the reference: one negative per
    positive, 0.5), knowledge-masked across both segments (``trainer/ernie/pairs.py``). Off: single-segment
    ``doc-sentences`` rows, and fine-tuning on pairs meets an untrained segment-1 embedding."""


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
    capitalization_lowercase_share: float = Field(0.5, gt=0.0, le=1.0)
    """On steps that train capitalization prediction, the share of rows lower-cased (one draw per row); only those
    rows get capitalization labels, the others stay cased as fine-tuning input is. MLM labels stay cased on every
    row. The paper's aim is "to combine the advantages of cased and uncased models"; lower-casing every row (the
    old behaviour, 1.0) trained the model on lower-cased input for 75 % of ernie2_base and fine-tuned it on cased."""

    @model_validator(mode="after")
    def _pair_files_given(self):
        for task in ("discourse", "ir_relevance"):
            if any(t.name == task for t in self.continual.tasks) and getattr(self, task) is None:
                raise ValueError(f"continual.tasks lists {task}: give objective.options.{task} (path, labels)")
        names = {t.name for t in self.continual.tasks}
        unknown = names - set(TASKS) - {"dlm"}
        if unknown or "dlm" in names:
            raise ValueError(f"objective.continual.tasks: unknown task(s) {sorted(unknown | ({'dlm'} & names))}"
                             f"; ERNIE 2.0 tasks are {[t for t in TASKS if t != 'dlm']}")
        return self
