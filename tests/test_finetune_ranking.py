"""MRR for answer selection (trainer/finetune/ranking.py), as ERNIE scores NLPCC-DBQA: against a direct computation
(rank = 1 + the candidates scored higher + the equal ones earlier in the file) and against ERNIE's own
``evaluate_mrr`` transcribed below, with ties and questions that have no correct answer; the tsv reader's question
ids, and the settings refused before training."""
from __future__ import annotations

import random

import pytest

from trainer.config import ConfigError
from trainer.finetune.config import load_finetune_config
from trainer.finetune.metrics import compute
from trainer.finetune.ranking import mrr, mrr_answerable


def ernie_mrr(qids, scores, labels) -> float:
    """ERNIE's finetune/classifier.py: ``sorted(zip(qids, scores, labels), key=(qid, -score))`` then
    ``evaluate_mrr`` (transcribed)."""
    preds = sorted(zip(qids, scores, labels), key=lambda elem: (elem[0], -elem[1]))
    last_qid, total_mrr, qnum, rank, correct = None, 0.0, 0.0, 0.0, False
    for qid, _, label in preds:
        if qid != last_qid:
            rank, correct, last_qid = 0.0, False, qid
            qnum += 1
        rank += 1
        if not correct and label != 0:
            total_mrr += 1.0 / rank
            correct = True
    return total_mrr / qnum


def direct(qids, scores, labels, answerable_only: bool) -> float:
    """Per question: the first correct answer's rank, counting the candidates scored higher and the equal ones
    that come earlier in the file."""
    rr = []
    for q in dict.fromkeys(qids):
        idx = [i for i, g in enumerate(qids) if g == q]
        ranks = [1 + sum(scores[j] > scores[i] or (scores[j] == scores[i] and j < i) for j in idx)
                 for i in idx if labels[i] == 1]
        if ranks:
            rr.append(1 / min(ranks))
        elif not answerable_only:
            rr.append(0.0)
    return sum(rr) / len(rr)


def test_hand_computed_ties_and_unanswered():
    qids = ["a", "a", "a", "b", "b", "c", "c", "a"]  # question a is not contiguous
    scores = [0.9, 0.5, 0.5, 0.2, 0.2, 0.7, 0.1, 0.5]
    labels = [0, 0, 1, 0, 1, 0, 0, 1]
    # a: 0.9 (wrong), then the tie at 0.5 in file order: line 1 (wrong), line 2 (correct) -> rank 3
    # b: tie at 0.2, the wrong one first in the file -> rank 2; c: no correct answer
    assert mrr(scores, labels, qids) == pytest.approx((1 / 3 + 1 / 2 + 0) / 3)
    assert mrr_answerable(scores, labels, qids) == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert ernie_mrr(qids, scores, labels) == pytest.approx(mrr(scores, labels, qids))


def test_random_cases_match_ernie_and_the_direct_computation():
    rng = random.Random(0)
    for case in range(500):
        n = rng.randint(1, 40)
        qids = [rng.randrange(8) for _ in range(n)]
        scores = [rng.choice([0.1, 0.2, 0.5, 0.9]) if case % 2 else rng.random() for _ in range(n)]  # ties half
        labels = [int(rng.random() < 0.25) for _ in range(n)]
        ours = mrr(scores, labels, qids)
        assert ours == pytest.approx(ernie_mrr(qids, scores, labels), abs=1e-12), case
        assert ours == pytest.approx(direct(qids, scores, labels, False), abs=1e-12), case
        if any(labels):
            assert mrr_answerable(scores, labels, qids) == pytest.approx(direct(qids, scores, labels, True)), case


def test_compute_takes_scores_and_question_ids():
    out = compute(["mrr", "f1"], [0, 1, 1, 0], [0, 1, 0, 1], [0.1, 0.8, 0.9, 0.2], ["q1", "q1", "q2", "q2"])
    assert out == {"mrr": pytest.approx((1 + 0.5) / 2), "f1": 0.5}
    with pytest.raises(ValueError, match="question id"):
        compute(["mrr"], [0], [0])


def test_a_dbqa_tsv_task_reads_question_ids_and_scores_mrr(tmp_path):
    from trainer.finetune.__main__ import task_spec
    from trainer.finetune.run import ClassificationKind, Encoded
    from trainer.finetune.tasks import read_task
    rows = "qid\ttext_a\ttext_b\tlabel\n0\t谁\t他是\t1\n0\t谁\t不是\t0\n1\t哪\t那里\t0\n1\t哪\t这里\t1\n"
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text(rows, encoding="utf-8")
    cfg = load_finetune_config(None, ["task.name=tsv", "task.text_a=text_a", "task.text_b=text_b", "task.group=qid",
                                      "task.labels=[0, 1]", "task.metrics=[mrr, f1]"])
    spec = task_spec(cfg)
    dev = read_task(spec, tmp_path)["dev"]
    assert [e.group for e in dev.examples] == ["0", "0", "1", "1"]
    kind = ClassificationKind(spec)
    data = Encoded([[0]] * 4, [[0]] * 4, [e.label for e in dev.examples], [e.group for e in dev.examples])
    # (class id, positive score) per pair, as ClassificationKind.outputs gives them
    scores = kind.score([(1, -0.1), (0, -2.0), (1, -0.5), (0, -0.9)], data)
    assert scores == {"mrr": pytest.approx((1 + 0.5) / 2), "f1": pytest.approx(0.5)}


@pytest.mark.parametrize("sets, match", [
    (["task.metrics=[mrr]"], "set task.group"),
    (["task.name=tsv", "task.metrics=[mrr]", "task.group=qid"], "list the labels"),
    (["task.name=rte", "task.metrics=[mrr]", "task.group=qid"], "rte has no question ids"),
])
def test_ranking_settings_refused_before_training(sets, match):
    from trainer.finetune.__main__ import task_spec
    with pytest.raises((ConfigError, ValueError), match=match):
        task_spec(load_finetune_config(None, sets))
