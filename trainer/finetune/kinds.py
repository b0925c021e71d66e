"""The task registry: which kind of task each ``--task`` name is, and what a kind must provide.

GLUE's tasks and ``tsv`` (``trainer/finetune/tasks.py``) are sentence/pair classification; this module adds
``jsonl`` (the same, from JSON lines), ``ner`` (token classification), ``squad`` (span extraction) and ``race`` /
``swag`` (multiple choice). A kind is an object with the methods of ``TaskKind``: ``read`` (every split, validated
before any training), ``encode`` (token ids), ``build_model`` (encoder + the Hugging Face head), ``collate``,
``loss``, ``outputs`` (per-example predictions, gathered over ranks) and ``score`` (the split's metrics). The run
(``trainer/finetune/run.py``) is the same for every kind: data parallel, seeds, sweeps, results.json.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

IGNORE = -100
"""Label of positions that take no loss (sub-tokens after a word's first; padding)."""


def pair_ids(cls: int, sep: int, a: list[int], b: list[int] | None, family: str, type_vocab_size: int
             ) -> tuple[list[int], list[int]]:
    """[CLS] A [SEP] (B [SEP]) with segment ids 0/1; RoBERTa: <s> A </s></s> B </s>, segment ids 0."""
    ids = [cls] + a + [sep]
    types = [0] * len(ids)
    if b is not None:
        tail = ([sep] if family == "roberta" else []) + b + [sep]
        ids += tail
        types += [1 if type_vocab_size > 1 else 0] * len(tail)
    return ids, types


def pair_overhead(family: str, pair: bool) -> int:
    return (4 if family == "roberta" else 3) if pair else 2


def pad_rows(rows: list[list[int]], value: int, width: int | None = None) -> torch.Tensor:
    width = width or max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


class TaskKind:
    """What a task kind provides (see the module docstring). ``metrics[0]`` is the main score (best setting)."""

    name: str
    metrics: tuple[str, ...]
    head: str
    """'sequence', 'span', 'token' or 'choice' (trainer/finetune/heads.py)."""
    max_seq_length: int = 128
    """Used when train.max_seq_length is not set (SQuAD 384, RACE 512, as the papers)."""
    num_labels: int = 1

    def __init__(self, task_cfg):
        self.cfg = task_cfg

    def build_model(self, source, cfg):
        from trainer.finetune.heads import build_task_model
        return build_task_model(source, self.head, self.num_labels, cfg.train.dropout, cfg.train.classifier_dropout,
                                cfg.train.from_scratch)

    def collate(self, data, idx, pad_id: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model, batch) -> torch.Tensor:
        raise NotImplementedError

    def outputs(self, model, batch) -> list:
        raise NotImplementedError

    def score(self, outputs: list, data) -> dict[str, float]:
        raise NotImplementedError

    def size(self, data) -> int:
        return len(data.ids)


class ClassificationKind(TaskKind):
    """GLUE, tsv and jsonl: the existing classifier (trainer/finetune/model.py) and GLUE's metrics."""

    head = "sequence"

    def __init__(self, spec, reader: Callable | None = None):
        self.spec, self.reader = spec, reader
        self.name, self.metrics, self.num_labels = spec.name, spec.metrics, spec.num_labels

    def read(self, data_dir):
        from trainer.finetune.tasks import read_task
        return read_task(self.spec, data_dir, self.reader)

    def encode(self, tokenizer, split, max_len, family, types):
        from trainer.finetune.run import encode
        return encode(tokenizer, split.examples, max_len, family, types)

    def build_model(self, source, cfg):
        from trainer.finetune.model import build_classifier
        return build_classifier(source, self.spec.num_labels, cfg.train.dropout, cfg.train.classifier_dropout,
                                cfg.train.from_scratch)

    def collate(self, data, idx, pad_id):
        from trainer.finetune.run import collate
        return collate(data, idx, pad_id, self.spec.is_regression)

    def loss(self, model, batch):
        from trainer.finetune.run import task_loss
        return task_loss(model, batch)

    def outputs(self, model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).float()
        return logits.squeeze(-1).tolist() if self.spec.is_regression else logits.argmax(-1).tolist()

    def score(self, outputs, data):
        from trainer.finetune.metrics import compute
        return compute(self.spec.metrics, outputs, data.labels)


def choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def _jsonl(task_cfg):
    from trainer.finetune.jsonl import jsonl_spec, read_jsonl_split
    return ClassificationKind(jsonl_spec(task_cfg), read_jsonl_split)


def _ner(task_cfg):
    from trainer.finetune.ner import NerKind
    return NerKind(task_cfg)


def _squad(task_cfg):
    from trainer.finetune.squad import SquadKind
    return SquadKind(task_cfg)


def _race(task_cfg):
    from trainer.finetune.multiple_choice import RaceKind
    return RaceKind(task_cfg)


def _swag(task_cfg):
    from trainer.finetune.multiple_choice import SwagKind
    return SwagKind(task_cfg)


KINDS: dict[str, Callable] = {"jsonl": _jsonl, "ner": _ner, "squad": _squad, "race": _race, "swag": _swag}
"""Task name -> factory(task section) of its kind. Adding a task: one module, one line here."""


def task_kind(task_cfg) -> TaskKind | None:
    """The kind of the task section's ``name``, or None for GLUE's tasks and tsv (tasks.py)."""
    factory = KINDS.get((task_cfg.name or "").lower())
    return factory(task_cfg) if factory else None


def as_kind(spec) -> TaskKind:
    """A registered kind as is; a GLUE/tsv TaskSpec as the classification kind."""
    return spec if isinstance(spec, TaskKind) else ClassificationKind(spec)
