"""``jsonl``: sentence and pair classification from JSON lines, the layout CLUE and most Chinese benchmarks ship.

One JSON object per line, e.g. ``{"sentence": ..., "label": ...}`` or ``{"sentence1": ..., "sentence2": ...,
"label": ...}``; the field names are the task section's ``text_a`` / ``text_b`` / ``label`` (as for ``tsv``), labels
are compared as strings (``1`` and ``"1"`` are the same class). Files default to CLUE's ``train.json`` and ``dev.json``.
A line that is not a JSON object, lacks a field or has an empty text stops the run before training with the file,
line and field; with ``skip_malformed`` such lines are skipped and counted instead. A label outside ``task.labels``
always stops (a skipped label would silently change the task).
"""
from __future__ import annotations

import json
from pathlib import Path

from trainer.finetune.tasks import INDEX_COLUMNS, Example, Split, TaskDataError, TaskSpec, check_ranking, read_lines


def read_jsonl_split(spec: TaskSpec, path: Path) -> Split:
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"task jsonl: split file {path} does not exist (set task.train_file / task.dev_files)")
    lines = read_lines(path)
    label_index = {name: i for i, name in enumerate(spec.labels or ())}
    split = Split(path, [])
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            split.blank_lines += 1
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
            missing = [f for f in (spec.text_a, spec.text_b, spec.label, spec.group) if f is not None
                       and f not in record]
            if missing:
                raise ValueError(f"no field {missing[0]!r} (fields: {sorted(record)}; set task.text_a / text_b / "
                                 "label to the names your files use)")
            text_a = str(record[spec.text_a])
            text_b = str(record[spec.text_b]) if spec.text_b is not None else None
            if not text_a.strip() or (text_b is not None and not text_b.strip()):
                raise ValueError(f"empty text in field {spec.text_a if not text_a.strip() else spec.text_b!r}")
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            if spec.skip_malformed:
                split.skipped.append(number)
                continue
            raise TaskDataError(f"{path}:{number}: {err} (fix the line, or set task.skip_malformed: true to skip "
                                "and count such lines)") from None
        group = str(record[spec.group]) if spec.group is not None else None
        index = next((str(record[n]) for n in INDEX_COLUMNS if n in record), None)
        if spec.label is None:  # an unlabelled (test) split
            split.examples.append(Example(text_a, text_b, None, group, index))
            continue
        raw = record[spec.label]
        raw = str(raw).strip() if not isinstance(raw, float) or not raw.is_integer() else str(int(raw))
        if spec.labels is None:
            try:
                label: int | float = float(raw)
            except ValueError:
                raise TaskDataError(f"{path}:{number}: label {raw!r} is not a number (no task.labels: "
                                    "regression)") from None
        else:
            if raw not in label_index:
                raise TaskDataError(f"{path}:{number}: label {raw!r} is not in task.labels {list(spec.labels)}")
            label = label_index[raw]
        split.examples.append(Example(text_a, text_b, label, group, index))
    if not split.examples:
        raise TaskDataError(f"{path}: no examples (an empty split cannot train or evaluate)")
    return split


def jsonl_spec(t) -> TaskSpec:
    """The TaskSpec of a ``jsonl`` task section: tsv's fields, with CLUE's file names where tsv's defaults stand."""
    train = "train.json" if t.train_file == "train.tsv" else t.train_file
    dev = {"dev": "dev.json"} if dict(t.dev_files) == {"dev": "dev.tsv"} else dict(t.dev_files)
    return check_ranking(TaskSpec("jsonl", train, dev, t.text_a, t.text_b, t.label, tuple(t.labels) if t.labels
                                  else None, tuple(t.metrics or ("accuracy",)), False, t.skip_malformed, t.group,
                                  dict(t.test_files)))
