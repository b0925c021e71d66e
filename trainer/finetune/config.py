"""The fine-tuning config: YAML (``--config FILE``) + ``--set KEY=VALUE``, validated by pydantic before any work.

Defaults are the papers' GLUE practice (BERT, section 4.1 and appendix A.3; RoBERTa, appendix C): batch 32, 3 epochs,
linear warmup over the first 10 % then linear decay to 0, AdamW with weight decay 0.01, sequences of 128. ELECTRA adds
layer-wise learning-rate decay (``optim.layer_decay``: 0.8 base, 0.9 large). Every section forbids unknown keys.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainer.config_error import ConfigError
from trainer.config_sections import DeepSpeedConfig
from trainer.config_sets import apply_override
from trainer.optim import OptimConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskSection(_Section):
    name: str | None = None
    """A GLUE task (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli), tsv, jsonl, ner, squad, race or swag;
    normally given as --task."""
    data: str | None = None
    """The task's folder in GLUE's layout (train.tsv, dev.tsv; MNLI dev_matched/dev_mismatched); normally --data."""
    train_file: str = "train.tsv"
    """tsv only: the training split's file in the data folder."""
    dev_files: dict[str, str] = Field(default_factory=lambda: {"dev": "dev.tsv"})
    """tsv only: evaluation splits, name -> file; the first one's main metric chooses the best learning rate."""
    text_a: str | int = "sentence"
    """tsv only: the column of the first text (header name, or 0-based index)."""
    text_b: str | int | None = None
    """tsv only: the column of the second text of a pair (None: single-sentence task)."""
    label: str | int = "label"
    """tsv only: the label column."""
    labels: list[str] | None = None
    """tsv, jsonl: every class as written in the files (its order = the classifier's outputs); None = regression.
    Numbers are taken as their text (``[0, 1]`` = ``["0", "1"]``: YAML reads unquoted labels as numbers)."""

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, value):
        return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value] \
            if isinstance(value, list) else value
    metrics: list[Literal["accuracy", "f1", "f1_macro", "f1_micro", "matthews", "pearson", "spearman", "mrr",
                          "mrr_answerable"]] | None = None
    """tsv, jsonl, GLUE: metrics to report; the first is the main score, which selects the best setting. None = the
    task's own (GLUE's, e.g. f1 then accuracy for MRPC/QQP; accuracy for tsv/jsonl); RoBERTa and ELECTRA select
    MRPC/QQP by accuracy: [accuracy, f1]. ``f1`` is binary (F1 of the second label, as GLUE's MRPC/QQP): with more
    than 2 labels use ``f1_macro`` or ``f1_micro``. ``mrr`` / ``mrr_answerable`` rank the pairs of each question
    (``task.group``) by the second label's score (ERNIE's NLPCC-DBQA: ``[mrr, f1]``; trainer/finetune/ranking.py)."""
    group: str | int | None = None
    """tsv, jsonl: the column (field) of the question id that ``mrr`` groups the pairs by (ERNIE's DBQA: qid)."""
    test_files: dict[str, str] = Field(default_factory=dict)
    """tsv, jsonl, GLUE: unlabelled splits (name -> file in the data folder) that every run predicts and that are
    never scored; their predictions are written as GLUE submission files (``train.predictions``). GLUE tasks read
    them in GLUE's test layout (``{test: test.tsv}``; MNLI ``{test_matched: test_matched.tsv, test_mismatched:
    test_mismatched.tsv}``); tsv/jsonl with the task's text columns, no label. Costs a forward pass per example per
    run (QQP's test split is 390k pairs: ~10x its dev split)."""
    header: bool = True
    """tsv only: the files start with a header line."""
    skip_malformed: bool = False
    """tsv, jsonl, ner, squad, race, swag: skip (and count) malformed lines or records instead of stopping."""
    scheme: Literal["bio", "iob1", "bioes"] = "bio"
    """ner: the tag scheme of the CoNLL files (a tag outside it stops the run)."""
    token_column: int = Field(default=0, ge=0)
    """ner: the column of the token (the tag is always the last column)."""
    doc_stride: int = Field(default=128, gt=0)
    """squad: tokens between the starts of a context's windows (BERT: 128)."""
    max_query_length: int = Field(default=64, gt=0)
    """squad: questions are cut to this many tokens (BERT: 64)."""
    max_answer_length: int = Field(default=30, gt=0)
    """squad: longest predicted answer, in tokens (BERT: 30)."""
    n_best_size: int = Field(default=20, gt=0)
    """squad: best starts and ends per window considered when predicting (BERT: 20)."""
    answer_metric: Literal["auto", "squad", "cmrc"] = "auto"
    """squad: SQuAD's official scores, or CMRC 2018's (Chinese: character-level F1); auto = cmrc when the dev
    contexts are mostly CJK characters."""

    @model_validator(mode="after")
    def _binary_f1(self):
        # scikit-learn's binary F1 raises on a multi-class task only when scoring, after the whole training
        if self.metrics is not None and not self.metrics:
            raise ValueError("task.metrics: list at least one metric (or leave it out: the task's own)")
        if "f1" in (self.metrics or ()) and self.labels is not None and len(self.labels) > 2:
            raise ValueError(f"task.metrics: f1 is the binary F1 of label {self.labels[1]!r}, but task.labels has "
                             f"{len(self.labels)} classes; use f1_macro (unweighted mean over classes) or f1_micro")
        ranking = [m for m in self.metrics or () if m in ("mrr", "mrr_answerable")]
        if ranking and self.group is None:
            raise ValueError(f"task.metrics: {ranking[0]} ranks the pairs of each question: set task.group (the "
                             "question id column; tsv and jsonl tasks)")
        clash = sorted({"train", *self.dev_files} & set(self.test_files))
        if clash:
            raise ValueError(f"task.test_files: {clash} name(s) a training or dev split; name test splits apart "
                             "(e.g. test, test_matched)")
        return self


class FinetuneTrain(_Section):
    epochs: float = Field(default=3.0, gt=0)
    """Passes over the training split (fractions allowed); steps = ceil(epochs x examples / global batch)."""
    global_batch_size: int = Field(default=32, gt=0)
    micro_batch_size: int = Field(default=32, gt=0)
    """Most examples per forward/backward on one rank (a ceiling: the largest micro-batch up to it that divides each
    rank's share of the global batch is used, the rest accumulated; ``batch_split``)."""
    max_seq_length: int | None = Field(default=None, gt=2)
    """Pairs are truncated longest-first to fit, [CLS]/[SEP] included; None = the task's default as in the papers
    (128; squad 384; race 512)."""
    eval_batch_size: int = Field(default=64, gt=0)
    seeds: int = Field(default=1, gt=0)
    """Runs per setting, with seeds seed, seed+1, ...; the median of each metric is reported (papers: 5)."""
    from_scratch: bool = False
    """Same architecture and tokenizer with random weights: the baseline that shows what pretraining adds."""
    dropout: float | None = Field(default=None, ge=0, lt=1)
    """Hidden and attention dropout while fine-tuning; None = the checkpoint's (ALBERT v2 pretrains without any)."""
    classifier_dropout: float = Field(default=0.1, ge=0, lt=1)
    """Dropout before the classifier (BERT, ALBERT and ELECTRA use 0.1)."""
    predictions: Literal["best", "all", "none"] = "best"
    """Prediction files (trainer/finetune/predictions.py) for every dev and test split: ``best`` = of the best
    setting's best seed on the selection split (the run BERT submits), under ``RUN_DIR/finetune/<task>/predictions/``;
    ``all`` = of every run, under ``predictions/<run #>_seed<seed>/``; ``none``."""
    export_dir: str | None = None
    """Write each run's fine-tuned model here (``<setting #>_seed<seed>/``) as a Hugging Face folder that
    ``transformers`` loads (trainer/finetune/heads.py); None = no export."""


class FinetuneOptim(OptimConfig):
    lr: float = Field(default=2e-5, gt=0)
    """Peak learning rate (sweep it: --sweep optim.lr=1e-5,2e-5,3e-5)."""
    layer_decay: float = Field(default=1.0, gt=0, le=1)
    """ELECTRA's layer-wise decay: layer i of L gets lr x decay^(L+1-i), the embeddings lr x decay^(L+2), the head
    lr (ELECTRA: 0.8 base/small, 0.9 large). 1.0 = off. Not for shared layers (ALBERT)."""


class FinetuneSchedule(_Section):
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    """Linear warmup over this fraction of the steps, then linear decay to 0."""


class FinetuneDeepSpeed(DeepSpeedConfig):
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """auto = bf16 on a GPU that supports it, fp32 otherwise (on CPU bf16 matmul is ~250x slower)."""


class FinetuneConfig(_Section):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    task: TaskSection = Field(default_factory=TaskSection)
    train: FinetuneTrain = Field(default_factory=FinetuneTrain)
    optim: FinetuneOptim = Field(default_factory=FinetuneOptim)
    schedule: FinetuneSchedule = Field(default_factory=FinetuneSchedule)
    deepspeed: FinetuneDeepSpeed = Field(default_factory=FinetuneDeepSpeed)
    seed: int = Field(default=1234, ge=0, lt=2**32)
    """Below 2**32 (numpy's legacy seeding); runs of a sweep use seed, seed + 1, ..."""
    run_dir: str | None = None
    """Results go to RUN_DIR/finetune/<task>/; None = the checkpoint's run folder (or the model folder)."""
    tokenizer: str | None = None
    """Tokenizer folder; None = the checkpoint's own (a run's corpus tokenizer, or the files in a model folder)."""


def batch_split(cfg: FinetuneConfig, world_size: int) -> tuple[int, int]:
    """(micro-batch, accumulation) on ``world_size`` ranks: global = micro x accumulation x ranks, exactly.
    ``train.micro_batch_size`` is a per-rank ceiling, as in pretraining (``trainer.config.batch_plan``): the largest
    micro-batch not above it that divides each rank's share of the global batch, so the defaults (32 and 32) run
    under ``torchrun --nproc_per_node 8`` unchanged (they were refused on any world size above 1)."""
    g, ceiling = cfg.train.global_batch_size, cfg.train.micro_batch_size
    if g % world_size:
        raise ConfigError(f"train.global_batch_size={g} cannot be split evenly over {world_size} ranks; use a "
                          f"multiple of {world_size} (or another number of ranks)")
    share = g // world_size
    micro = max(m for m in range(1, min(ceiling, share) + 1) if share % m == 0)
    return micro, share // micro


def accumulation(cfg: FinetuneConfig, world_size: int) -> int:
    """Micro-batches per step on each rank (``batch_split``)."""
    return batch_split(cfg, world_size)[1]


def load_finetune_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> FinetuneConfig:
    raw: dict = {}
    source = "fine-tuning config"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as err:
            raise ConfigError(f"--config {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections")
    for override in overrides:
        apply_override(raw, override)
    try:
        return FinetuneConfig.model_validate(raw)
    except ValidationError as err:
        lines = [f"{source}: invalid config ({err.error_count()} error(s)):"]
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "(top level)"
            hint = " (unknown key: check its spelling, or remove it)" if e["type"] == "extra_forbidden" else ""
            lines.append(f"  {key}: {e['msg']}{hint}")
        raise ConfigError("\n".join(lines)) from None
