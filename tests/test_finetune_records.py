"""Bad records of the RACE and SQuAD layouts stop before training, named by file and record (or are skipped and
counted with task.skip_malformed)."""
from __future__ import annotations

import json

import pytest

from trainer.finetune.multiple_choice import read_race
from trainer.finetune.tasks import TaskDataError


def _race(folder, answers):
    (folder / "high").mkdir(parents=True)
    (folder / "high" / "7.txt").write_text(json.dumps({
        "id": "high7.txt", "article": "The cat sat on the mat.", "questions": ["Who sat?", "Where?"],
        "options": [["a cat", "a dog", "a river", "Paris"], ["mat", "Paris", "river", "house"]], "answers": answers}))
    return folder


@pytest.mark.parametrize("answer", ["AB", "", "E", "a", 1])
def test_race_answer_that_is_not_one_option_letter_is_named(tmp_path, answer):
    folder = _race(tmp_path, ["A", answer])
    # before: "AB" raised an uncaught TypeError from ord()
    with pytest.raises(TaskDataError, match=rf"high/7\.txt question 1: answer {answer!r} is not one of the 4 options "
                                            r"\(one letter of ABCD\)"):
        read_race(folder)
    split = read_race(folder, skip_malformed=True)
    assert [c.label for c in split.items] == [0] and len(split.skipped) == 1
    assert [c.label for c in read_race(_race(tmp_path / "ok", ["D", " B "])).items] == [3, 1]


def test_duplicate_squad_question_ids_are_refused(tmp_path):
    from trainer.finetune.squad import read_squad

    def qa(qid, text):
        return {"id": qid, "question": "Where?", "answers": [{"text": text, "answer_start": 0}]}
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Paris is big.", "qas": [qa("q1", "Paris")]},
                                                         {"context": "Rome is old.", "qas": [qa("q2", "Rome"),
                                                                                             qa("q1", "Rome")]}]}]}))
    # before: both read, and the scores (kept per id) merged them into one question
    with pytest.raises(TaskDataError, match=r"dev-v1\.1\.json: question q1 \(data\[0\]\.paragraphs\[1\]\.qas\[1\]\): "
                                            r"the id repeats that of data\[0\]\.paragraphs\[0\]\.qas\[0\]"):
        read_squad(path, False)
    split = read_squad(path, True, skip_malformed=True)
    assert [q.qid for q in split.questions] == ["q1", "q2"] and split.skipped == ["q1"]
    assert "1 malformed questions skipped" in split.describe()
