"""``race`` and ``swag``: multiple choice. Each choice is encoded with its context as a pair, the model gives one
score per choice (Hugging Face's ``*ForMultipleChoice``), softmax over the choices; metric ``accuracy`` (RACE also
``accuracy_high`` and ``accuracy_middle``, its two exam levels).

RACE: ``train/``, ``dev/`` and (optional) ``test/``, each with ``high/`` and ``middle/`` holding one JSON file per
article (``.txt`` as the release names them, or ``.json``): ``{"article", "questions": [...], "options": [[4 per
question]], "answers": ["A".."D"], "id"}``. The pair is (article, question + option), or the question with its
``_`` blank filled by the option (RoBERTa's and ALBERT's RACE code); the article is cut first when too long.

SWAG: ``train.csv`` and ``val.csv`` as released (header ``video-id, fold-ind, startphrase, sent1, sent2,
gold-source, ending0..3, label``): the pair is (sent1, sent2 + ending), as BERT's and Hugging Face's SWAG code.

Bad input stops before training naming file and record: invalid JSON, a missing field, an answer outside the
choices, or a choice count that differs from the first record's (``skip_malformed`` skips and counts instead).
"""
from __future__ import annotations

import csv
import json
import string
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer.finetune.kind_base import run_model, TaskKind, choice_loss, pad_rows, pair_ids, pair_overhead
from trainer.finetune.tasks import TaskDataError


@dataclass
class Choice:
    context: str
    endings: list[str]
    """The second text of each choice's pair."""
    label: int
    group: str = ""
    """RACE: 'high' or 'middle'."""


@dataclass
class Choices:
    path: Path
    items: list[Choice] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def describe(self) -> str:
        extra = f" ({len(self.skipped)} malformed records skipped, first: {self.skipped[:5]})" if self.skipped else ""
        return f"{self.path}: {len(self.items)} questions of {len(self.items[0].endings)} choices{extra}"


class _Reader:
    def __init__(self, path: Path, skip: bool):
        self.out, self.skip, self.n_choices = Choices(path), skip, None

    def add(self, where: str, item: Choice | str) -> None:
        if isinstance(item, Choice) and self.n_choices is not None and len(item.endings) != self.n_choices:
            item = (f"{len(item.endings)} choices where the first record has {self.n_choices} (every question needs "
                    "the same number)")
        if isinstance(item, str):
            if self.skip:
                self.out.skipped.append(where)
                return
            raise TaskDataError(f"{where}: {item}; fix the record, or set task.skip_malformed: true to skip and count "
                                "such records")
        self.n_choices = self.n_choices or len(item.endings)
        self.out.items.append(item)

    def done(self) -> Choices:
        if not self.out.items:
            raise TaskDataError(f"{self.out.path}: no questions (an empty split cannot train or evaluate)")
        return self.out


def race_choice(article: str, question: str, option: str) -> str:
    return question.replace("_", option) if "_" in question else f"{question} {option}"


def read_race(folder: Path, skip_malformed: bool = False) -> Choices:
    reader = _Reader(folder, skip_malformed)
    for group in ("high", "middle"):
        files = sorted(p for p in (folder / group).glob("*") if p.suffix in (".txt", ".json")) \
            if (folder / group).is_dir() else []
        for path in files:
            try:
                rec = json.loads(path.read_text(encoding="utf-8-sig"))
                article, questions, options, answers = (rec[k] for k in ("article", "questions", "options",
                                                                         "answers"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                reader.add(str(path), f"not valid JSON ({err})")
                continue
            except (KeyError, TypeError) as err:
                reader.add(str(path), f"missing field {err} (RACE: article, questions, options, answers)")
                continue
            if not (len(questions) == len(options) == len(answers)):
                reader.add(str(path), f"{len(questions)} questions, {len(options)} option lists, {len(answers)} "
                                      "answers")
                continue
            for i, (q, opts, ans) in enumerate(zip(questions, options, answers)):
                letters = string.ascii_uppercase[:len(opts)]
                label = letters.find(str(ans).strip()) if len(str(ans).strip()) == 1 else -1  # "AB" would crash ord()
                if label < 0:
                    reader.add(f"{path} question {i}", f"answer {ans!r} is not one of the {len(opts)} options (one "
                                                       f"letter of {letters})")
                    continue
                reader.add(f"{path} question {i}", Choice(article, [race_choice(article, q, o) for o in opts], label,
                                                          group))
    return reader.done()


def read_swag(path: Path, skip_malformed: bool = False) -> Choices:
    reader = _Reader(path, skip_malformed)
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = csv.DictReader(f)
        need = {"sent1", "sent2", "label"}
        if not need <= set(rows.fieldnames or ()):
            raise TaskDataError(f"{path}:1: header lacks {sorted(need - set(rows.fieldnames or ()))} (SWAG's csv: "
                                "sent1, sent2, ending0..3, label)")
        endings = sorted((c for c in rows.fieldnames if c.startswith("ending")), key=lambda c: int(c[6:] or 0))
        for row in rows:
            where = f"{path}:{rows.line_num}"
            try:
                label = int(row["label"])
            except (TypeError, ValueError):
                reader.add(where, f"label {row['label']!r} is not a choice number")
                continue
            if not 0 <= label < len(endings) or not (row["sent1"] or "").strip():
                reader.add(where, f"label {label} outside ending0..{len(endings) - 1}, or an empty sent1")
                continue
            reader.add(where, Choice(row["sent1"], [f"{row['sent2']} {row[e]}" for e in endings], label))
    return reader.done()


@dataclass
class EncodedChoices:
    ids: list[list[list[int]]]
    types: list[list[list[int]]]
    labels: list[int]
    groups: list[str]


def encode_choices(tokenizer, split: Choices, max_len: int, family: str, type_vocab_size: int) -> EncodedChoices:
    enc = getattr(tokenizer, "encode_batch", None) or (lambda ts: [tokenizer.encode(t) for t in ts])
    contexts = enc([c.context for c in split.items])
    out = EncodedChoices([], [], [], [])
    budget = max_len - pair_overhead(family, True)
    for item, ctx in zip(split.items, contexts):
        rows, types = [], []
        for ending in enc(item.endings):
            a, b = list(ctx), list(ending)
            while len(a) + len(b) > budget:
                (a if len(a) >= len(b) else b).pop()
            ids, ty = pair_ids(tokenizer.cls_id, tokenizer.sep_id, a, b, family, type_vocab_size)
            rows.append(ids)
            types.append(ty)
        out.ids.append(rows)
        out.types.append(types)
        out.labels.append(item.label)
        out.groups.append(item.group)
    return out


class _ChoiceKind(TaskKind):
    head = "choice"
    metrics = ("accuracy",)

    def encode(self, tokenizer, split, max_len, family, types):
        return encode_choices(tokenizer, split, max_len, family, types)

    def collate(self, data, idx, pad_id):
        flat = [r for i in idx for r in data.ids[i]]
        ids = pad_rows(flat, pad_id)
        n = len(data.ids[idx[0]])
        shape = (len(idx), n, ids.shape[1])
        return {"input_ids": ids.view(shape),
                "attention_mask": pad_rows([[1] * len(r) for r in flat], 0, ids.shape[1]).view(shape),
                "token_type_ids": pad_rows([t for i in idx for t in data.types[i]], 0, ids.shape[1]).view(shape),
                "labels": torch.tensor([data.labels[i] for i in idx])}

    def loss(self, model, batch):
        return choice_loss(run_model(model, batch),
                           batch["labels"])

    def outputs(self, model, batch):
        return run_model(model, batch).argmax(-1).tolist()

    def score(self, outputs, data):
        right = [int(p == y) for p, y in zip(outputs, data.labels, strict=True)]
        out = {"accuracy": sum(right) / len(right)}
        for group in sorted({g for g in data.groups if g}):
            mine = [r for r, g in zip(right, data.groups) if g == group]
            out[f"accuracy_{group}"] = sum(mine) / len(mine)
        return out


class RaceKind(_ChoiceKind):
    name = "race"
    metrics = ("accuracy", "accuracy_high", "accuracy_middle")
    max_seq_length = 512

    def read(self, data_dir):
        data_dir = Path(data_dir)
        missing = [s for s in ("train", "dev") if not (data_dir / s).is_dir()]
        if missing:
            raise TaskDataError(f"task race: {data_dir} lacks {missing} (RACE layout: train/, dev/, optional test/, "
                                "each with high/ and middle/)")
        splits = {s: read_race(data_dir / s, self.cfg.skip_malformed) for s in ("train", "dev", "test")
                  if (data_dir / s).is_dir()}
        groups = {c.group for c in splits["dev"].items}
        self.metrics = ("accuracy",) + tuple(f"accuracy_{g}" for g in sorted(groups))
        return splits


class SwagKind(_ChoiceKind):
    name = "swag"

    def read(self, data_dir):
        data_dir = Path(data_dir)
        files = {"train": "train.csv", "dev": "val.csv"}
        missing = [f for f in files.values() if not (data_dir / f).is_file()]
        if missing:
            raise TaskDataError(f"task swag: {data_dir} lacks {missing} (SWAG layout: train.csv, val.csv)")
        return {s: read_swag(data_dir / f, self.cfg.skip_malformed) for s, f in files.items()}
