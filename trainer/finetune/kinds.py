"""The task registry: which kind of task each ``--task`` name is.

GLUE's tasks and ``tsv`` (``trainer/finetune/tasks.py``) are sentence/pair classification; this module adds
``jsonl`` (the same, from JSON lines), ``ner`` (token classification), ``squad`` (span extraction) and ``race`` /
``swag`` (multiple choice). A kind is an object with the methods of ``kind_base.TaskKind``: ``read`` (every split,
validated before any training), ``encode`` (token ids), ``build_model`` (encoder + the Hugging Face head),
``collate``, ``loss``, ``outputs`` (per-example predictions, gathered over ranks) and ``score`` (the split's metrics).
The run (``trainer/finetune/run.py``) is the same for every kind: data parallel, seeds, sweeps, results.json.
Adding a task: one module with its kind, one line in ``KINDS``.
"""
from __future__ import annotations

from typing import Callable


def _jsonl(task_cfg):
    from trainer.finetune.jsonl import jsonl_spec, read_jsonl_split
    from trainer.finetune.run import ClassificationKind
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


def task_kind(task_cfg):
    """The kind of the task section's ``name``, or None for GLUE's tasks and tsv (tasks.py)."""
    factory = KINDS.get((task_cfg.name or "").lower())
    return factory(task_cfg) if factory else None
