"""The papers' protocol over runs: a grid of settings (``--sweep optim.lr=1e-5,2e-5,3e-5``), several seeds each,
the median of every score per setting, the best setting by its median main score on the first dev split.

BERT (section 4.1) picks the best learning rate on dev; RoBERTa (section 5) and ELECTRA (section 3.1) report the
median of 5 seeds, which is less sensitive to the occasional degenerate run than the best seed. The result record is
what ``RUN_DIR/finetune/<task>/results.json`` holds (DESIGN.md "Fine-tuning").
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
from pathlib import Path

from trainer.config_error import ConfigError


def parse_sweep(items: list[str]) -> list[list[str]]:
    """``["optim.lr=1e-5,2e-5", "train.epochs=2,3"]`` -> every combination as ``--set`` overrides (4 here)."""
    axes = []
    for item in items:
        key, sep, values = item.partition("=")
        choices = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not choices:
            raise ConfigError(f"--sweep {item!r}: expected KEY=V1,V2,..., e.g. --sweep optim.lr=1e-5,2e-5,3e-5")
        axes.append([f"{key.strip()}={v}" for v in choices])
    return [list(point) for point in itertools.product(*axes)] if axes else [[]]


def _union(dicts) -> list[str]:
    """The keys of all ``dicts``, first-seen order."""
    return list(dict.fromkeys(k for d in dicts for k in d))


def summarize(task: str, main_metric: str, runs: list[dict]) -> dict:
    """Medians per setting over its seeds, and the best setting. ``runs``: {"setting", "seed", "metrics": {split:
    {metric: v}}} each. Runs may report different metrics (an older NER run's ``f1_<TYPE>`` only for the types it
    met): each median is over the runs that report it, and a setting without the main score is never best."""
    settings: dict[str, list[dict]] = {}
    for run in runs:
        settings.setdefault(run["setting"], []).append(run)
    medians = {}
    for name, group in settings.items():
        medians[name] = {}
        for split in _union(r["metrics"] for r in group):
            per = [r["metrics"].get(split, {}) for r in group]
            medians[name][split] = {m: statistics.median(p[m] for p in per if m in p) for m in _union(per)}
    first_split = next(iter(runs[0]["metrics"]))
    best = max(medians, key=lambda s: medians[s].get(first_split, {}).get(main_metric, float("-inf")))
    return {"task": task, "main_metric": main_metric, "selection_split": first_split, "settings": medians,
            "best_setting": best, "best": medians[best], "runs": runs}


def format_table(summary: dict) -> str:
    """One line per setting: the median of each score x100 over its seeds; '*' marks the best; '-' where a setting
    has no such score."""
    lines = []
    settings = summary["settings"]
    splits = _union(settings.values())
    cols = [(split, m) for split in splits for m in _union(scores.get(split, {}) for scores in settings.values())]
    names = [f"{split}/{m}" if len(splits) > 1 else m for split, m in cols]
    width = max(len(s) for s in settings) + 2
    seeds = {s: sum(1 for r in summary["runs"] if r["setting"] == s) for s in settings}
    lines.append(f"{summary['task']}: median over seeds (x100), best by {summary['selection_split']} "
                 f"{summary['main_metric']}")
    lines.append(f"  {'setting':<{width}}{'seeds':>6}" + "".join(f"{n:>16}" for n in names))
    for s, scores in settings.items():
        mark = "*" if s == summary["best_setting"] else " "
        cells = [scores.get(sp, {}).get(m) for sp, m in cols]
        lines.append(f"{mark} {s:<{width}}{seeds[s]:>6}" + "".join(f"{'-':>16}" if v is None else f"{100 * v:>16.2f}"
                                                                    for v in cells))
    return "\n".join(lines)


def write_json(path: Path, record: dict) -> None:
    """Atomic: a reader (the pretraining run, a plot) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
