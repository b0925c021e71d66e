"""GLUE's metrics, computed by scikit-learn and scipy (the implementations GLUE's own evaluation and Hugging Face's
``glue`` metric call): Matthews correlation (CoLA), F1 of the positive class and accuracy (MRPC, QQP), Pearson and
Spearman correlation (STS-B), accuracy (the rest). For more than two classes, ``f1_macro`` (the unweighted mean of
the F1 of each class found in the gold labels or the predictions, scikit-learn's ``average="macro"``) and
``f1_micro`` (which equals accuracy for single-label data); the binary ``f1`` is refused there at config time.
Ranking (``mrr``, ``mrr_answerable``, trainer/finetune/ranking.py) needs each example's positive-class score and its
question id (``task.group``). Scores are fractions in [0, 1] (correlations in [-1, 1]); the summary table prints them x100 as the papers do.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence


def _accuracy(pred, gold) -> float:
    from sklearn.metrics import accuracy_score
    return float(accuracy_score(gold, pred))


def _f1(pred, gold) -> float:
    from sklearn.metrics import f1_score
    return float(f1_score(gold, pred, zero_division=0.0))  # binary: F1 of label 1 (paraphrase / duplicate)


def _f1_average(average: str) -> Callable:
    def f1(pred, gold) -> float:
        from sklearn.metrics import f1_score
        return float(f1_score(gold, pred, average=average, zero_division=0.0))  # over the classes in gold or pred
    return f1


def _matthews(pred, gold) -> float:
    from sklearn.metrics import matthews_corrcoef
    return float(matthews_corrcoef(gold, pred))


def _correlation(fn: str) -> Callable:
    def corr(pred, gold) -> float:
        import scipy.stats
        if len(set(pred)) < 2 or len(set(gold)) < 2:
            return 0.0  # undefined for constant inputs (scipy warns and returns nan); a collapsed model scores 0
        value = float(getattr(scipy.stats, fn)(pred, gold)[0])
        return 0.0 if math.isnan(value) else value
    return corr


METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": _accuracy, "f1": _f1, "f1_macro": _f1_average("macro"), "f1_micro": _f1_average("micro"),
    "matthews": _matthews,
    "pearson": _correlation("pearsonr"), "spearman": _correlation("spearmanr"),
}


RANKING = ("mrr", "mrr_answerable")
"""Metrics of (positive-class score, gold label, question id) triples: trainer/finetune/ranking.py."""


def compute(names: Sequence[str], predictions: Sequence, labels: Sequence, scores: Sequence[float] | None = None,
            groups: Sequence | None = None) -> dict[str, float]:
    """{name: score} for predicted class ids (or regression values) against the gold labels; the ranking metrics
    also take each example's positive-class ``scores`` and question id (``groups``)."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    out = {}
    for name in names:
        if name in RANKING:
            from trainer.finetune import ranking
            if scores is None or groups is None:
                raise ValueError(f"{name} needs each example's positive-class score and question id (task.group)")
            out[name] = getattr(ranking, name)(list(scores), list(labels), list(groups))
        else:
            out[name] = METRICS[name](list(predictions), list(labels))
    return out
