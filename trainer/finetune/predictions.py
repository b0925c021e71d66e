"""Prediction files: what a run predicted on each dev and test split, in the formats the official scorers and
leaderboards read, so a result can be checked outside this code and a test split submitted.

Layout: ``RUN_DIR/finetune/<task>/predictions/<split>/`` (``train.predictions: all``: ``predictions/<run #>_seed<seed>
/<split>/``), one folder per evaluation split (dev, MNLI's matched / mismatched, NER's test, the unlabelled
``task.test_files``), the files per task kind:

- GLUE, tsv, jsonl: ``<TASK>.tsv`` as GLUE's server takes it (``index<TAB>prediction`` header, then the line's
  ``index``/``id`` and the label as written in the files, STS-B a float; ``CoLA.tsv``, ``MNLI-m.tsv``,
  ``MNLI-mm.tsv``...). A GLUE submission is the ``test*/`` files of every task, zipped together.
- squad: ``predictions.json`` ({question id: answer text}, what ``evaluate-v2.0.py`` / ``evaluate-v1.1.py`` and CMRC
  2018's script read) and, for v2.0, ``null_odds.json`` ({id: null score - best span score}, its ``--na-prob-file``).
  Each answer is the question's best span, never "": ``evaluate-v2.0.py dev-v2.0.json predictions.json
  --na-prob-file null_odds.json`` gives our ``exact_match`` / ``f1`` as its best_exact / best_f1 (and their
  thresholds), and with ``--na-prob-thresh 0`` our ``*_threshold0`` as its exact / f1. For a file that answers ""
  itself (a leaderboard's form), blank each answer whose null odds exceed the threshold chosen on dev
  (``f1_null_threshold``, as BERT does). A question without any valid span has null odds ``Infinity`` (Python's
  json reads it).
- ner: ``predictions.txt`` in CoNLL's layout as conlleval reads it: ``token gold predicted`` per word, separated by
  single spaces, a blank line between sentences (``perl conlleval.pl < predictions.txt``). A word cut at the sequence
  length is predicted ``O``, as it is scored.

The files are written by rank 0 into a fresh folder that then replaces ``predictions/`` whole, so a folder never
mixes the files of two invocations.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

GLUE_NAMES = {"cola": "CoLA", "sst-2": "SST-2", "mrpc": "MRPC", "sts-b": "STS-B", "qqp": "QQP", "mnli": "MNLI",
              "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
"""Task -> the file name GLUE's server expects (``<NAME>.tsv``)."""


def submission_name(task: str, split: str) -> str:
    """GLUE's file name for a split's predictions: MNLI's matched and mismatched splits are MNLI-m and MNLI-mm."""
    name = GLUE_NAMES.get(task, task)
    if task == "mnli":
        name += "-mm" if "mismatched" in split else "-m" if "matched" in split else ""
    return f"{name}.tsv"


def write_glue(path: Path, index: list[str], predictions: list, labels: list[str] | None) -> Path:
    """``index<TAB>prediction`` lines: class ids as their label names, regression values as Python floats (repr:
    the file reads back to the scored values exactly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = (labels[p] if labels else repr(float(p)) for p in predictions)
    path.write_text("index\tprediction\n" + "".join(f"{i}\t{r}\n" for i, r in zip(index, rows, strict=True)),
                    encoding="utf-8")
    return path


def write_squad(folder: Path, spans: dict[str, str], null_odds: dict[str, float] | None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = [folder / "predictions.json"]
    out[0].write_text(json.dumps(spans, ensure_ascii=False, indent=1), encoding="utf-8")
    if null_odds is not None:
        out.append(folder / "null_odds.json")
        out[1].write_text(json.dumps(null_odds, indent=1), encoding="utf-8")
    return out


def write_conll(path: Path, words: list[list[str]], gold: list[list[str]], predicted: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for w, g, p in zip(words, gold, predicted, strict=True):
            f.writelines(f"{a} {b} {c}\n" for a, b, c in zip(w, g, p, strict=True))
            f.write("\n")
    return path


def write_splits(kind, predictions: dict, data: dict, folder: Path) -> list[Path]:
    """Every split's files under ``folder/<split>/`` (``kind.write_predictions``; a kind without files writes none)."""
    return [p for split, preds in predictions.items()
            for p in kind.write_predictions(preds, data[split], folder / split, split)]


def staging(task_dir: Path) -> Path:
    """A fresh folder beside ``predictions/`` to write into (``publish`` puts it in place)."""
    tmp = task_dir / f".predictions.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, task_dir: Path) -> Path:
    """``tmp`` becomes ``task_dir/predictions`` (the previous one removed first)."""
    final = task_dir / "predictions"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


class BestPredictions:
    """Per setting, the predictions of its best seed so far by the main metric on the selection split (the first
    dev split); once the sweep is summarized, ``of(best_setting)`` is the run BERT would submit. Holds one run's
    predictions per setting, not every run's."""

    def __init__(self, main_metric: str):
        self.metric, self.kept = main_metric, {}

    def offer(self, setting: str, run_index: int, seed: int, scores: dict, predictions: dict) -> None:
        first = next(iter(scores.values()), {})
        value = first.get(self.metric, float("-inf"))
        if setting not in self.kept or value > self.kept[setting][0]:
            self.kept[setting] = (value, run_index, seed, predictions)

    def of(self, setting: str) -> tuple[int, int, dict] | None:
        """(run index, seed, predictions) of the setting's best seed; None if it kept none."""
        kept = self.kept.get(setting)
        return kept[1:] if kept else None
