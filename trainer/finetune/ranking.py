"""Ranking metrics for answer selection (ERNIE's NLPCC-DBQA; WikiQA and TREC-QA have the same shape): question-answer
pairs, a binary label each, grouped by question id (``task.group``); within a question the candidates are ranked by
the model's score of the positive class, and the question scores the reciprocal rank of its first correct answer.

``mrr`` is ERNIE's ``evaluate_mrr`` (the code behind ERNIE's NLPCC-DBQA figures, ``finetune/classifier.py``): every
question counts, and one without any correct answer scores 0 (its ``qnum`` counts every question id). ``mrr_answerable``
leaves those questions out of the mean, as WikiQA's and TREC-QA's evaluations do. Ties: ERNIE sorts the pairs by
(question id, -score) with Python's stable sort, so among equal scores the earlier line of the file ranks first; so
do we (evaluation keeps the file's order). Questions need not be contiguous in the file. The positive class is the
second label of ``task.labels`` (index 1, the class binary ``f1`` scores; ERNIE: any label != 0, the same for two
classes).
"""
from __future__ import annotations

from typing import Sequence

POSITIVE = 1
"""Label index of a correct answer (the second of ``task.labels``)."""


def reciprocal_ranks(scores: Sequence[float], gold: Sequence[int], groups: Sequence) -> dict:
    """{question id: 1 / rank of its first correct answer, or None when it has none}. Ranks by descending score;
    equal scores keep the input order."""
    if not len(scores) == len(gold) == len(groups):
        raise ValueError(f"{len(scores)} scores, {len(gold)} labels and {len(groups)} question ids")
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = {}
    for g, idx in members.items():
        ranked = sorted(idx, key=lambda i: -scores[i])  # stable: ties in file order, as ERNIE's sorted()
        out[g] = next((1.0 / r for r, i in enumerate(ranked, start=1) if gold[i] == POSITIVE), None)
    return out


def mrr(scores, gold, groups) -> float:
    """Mean over every question (0 for one without a correct answer): ERNIE's NLPCC-DBQA MRR."""
    rr = reciprocal_ranks(scores, gold, groups)
    return sum(v or 0.0 for v in rr.values()) / len(rr) if rr else 0.0


def mrr_answerable(scores, gold, groups) -> float:
    """Mean over the questions with at least one correct answer (WikiQA's and TREC-QA's convention)."""
    rr = [v for v in reciprocal_ranks(scores, gold, groups).values() if v is not None]
    return sum(rr) / len(rr) if rr else 0.0
