"""Readers and scores of the downstream formats beyond GLUE: SQuAD JSON (windows, offsets, v2.0), CoNLL columns
(schemes, first sub-token labels), RACE and SWAG, CLUE's JSON lines; conlleval's chunk rules, SQuAD's and CMRC 2018's
normalisation, the v2.0 null threshold, all against hand-computed cases. Small files in the real layouts, tokenizers
trained here on a few KB; no model: fast."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.finetune.conlleval import chunks, evaluate
from trainer.finetune.config import TaskSection
from trainer.finetune.jsonl import jsonl_spec, read_jsonl_split
from trainer.finetune.kind_base import IGNORE
from trainer.finetune.kinds import task_kind
from trainer.finetune.ner import read_conll
from trainer.finetune.squad import best_spans, make_windows, read_squad, token_offsets
from trainer.finetune.squad_metrics import best_threshold, f1_en, f1_zh, normalize_answer, score, squad_scores
from trainer.finetune.tasks import TaskDataError, read_task

REPO = Path(__file__).resolve().parents[1]
LONG = "housecatriverseine"  # not in the tokenizers' text: many sub-tokens
WORDS = ["the", "cat", "sat", "on", "mat", "Paris", "France", "capital", "of", "is", "in",
         "1990s", "river", "Seine", "a", "blue", "house"]
ZH = "北京大学是中国的一所著名高等学府位于海淀区长江黄河流经多个省份"


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    """WordPiece, byte-level BPE, SentencePiece (unigram) and Chinese tokenizers trained on a few KB (every word and
    character above)."""
    out = tmp_path_factory.mktemp("toks")
    rng = random.Random(0)
    (out / "en.txt").write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)) + "\n")
    (out / "zh.txt").write_text("\n".join("".join(rng.choice(ZH) for _ in range(20)) for _ in range(2000)) + "\n")
    from data_prep.tokenizer import load_tokenizer
    result = {}
    for kind, text, vocab in (("wordpiece", "en", 104), ("bbpe", "en", 300), ("unigram", "en", 40), ("zh", "zh", 120)):
        proc = subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", kind, "--input",
                               str(out / f"{text}.txt"), "--vocab-size", str(vocab), "--output", str(out / kind)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        result[kind] = load_tokenizer(out / kind)
    return result


# ------------------------------------------------------------------------------------------------------ conlleval
def test_conlleval_boundaries_and_counts():
    assert chunks(["I-PER", "I-PER", "O"]) == {(0, 1, "PER")}  # I- at a sentence start opens a chunk
    assert chunks(["B-PER", "I-LOC"]) == {(0, 0, "PER"), (1, 1, "LOC")}  # a type change closes one, opens another
    assert chunks(["I-PER", "B-PER", "I-PER"]) == {(0, 0, "PER"), (1, 2, "PER")}  # IOB1
    assert chunks(["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC"]) == {(0, 0, "PER"), (1, 3, "LOC"), (4, 4, "LOC")}
    assert chunks(["O", "I-ORG", "O", "I-ORG"]) == {(1, 1, "ORG"), (3, 3, "ORG")}
    # a chunk counts only with both boundaries and the type right (conlleval): gold PER 0-1, LOC 3; pred PER 0, LOC 3
    s = evaluate([["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]], [["B-PER", "O", "O", "B-LOC"], ["B-LOC"]])
    assert s["precision"] == pytest.approx(1 / 3) and s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(1 / 3) and s["accuracy"] == pytest.approx(3 / 5)
    assert (s["f1_PER"], s["f1_LOC"], s["f1_ORG"]) == (0.0, pytest.approx(2 / 3), 0.0)


# ---------------------------------------------------------------------------------------------- SQuAD / CMRC scores
def test_official_normalisation_and_f1():
    assert normalize_answer("The  Cat, sat!  ") == "cat sat"
    assert normalize_answer("an apple-pie") == "applepie"
    assert f1_en("the cat sat", "a cat sat down") == pytest.approx(0.8)  # P 2/3, R 1
    assert score(["Paris", "the city of Paris"], "paris.") == (1.0, 1.0)
    assert score([], "") == (1.0, 1.0) and score([], "Paris") == (0.0, 0.0)  # v2.0 unanswerable
    assert score(["a"], "") == (1.0, 1.0)  # a gold that normalises to nothing counts as no answer (official)
    # CMRC 2018: characters; F1 over the longest common substring; punctuation removed
    assert f1_zh("北京大学", "北京") == pytest.approx(2 / 3)
    assert f1_zh("北京大学", "大北京") == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert score(["北京。"], "北京", "cmrc") == (1.0, 1.0)
    assert f1_zh("1990年 Paris", "Paris") == pytest.approx(0.5)  # segments 1990 / 年 / paris: P 1, R 1/3



def _official_cmrc_f1(gold: str, pred: str) -> float:
    """CMRC 2018's evaluate script v5 (mixed_segmentation with rm_punc, find_lcs, calc_f1_score for one gold),
    transcribed; its nltk.word_tokenize as NLTKWordTokenizer (word_tokenize without punkt's data)."""
    import re

    from nltk.tokenize import NLTKWordTokenizer
    sp = ['-', ':', '_', '*', '^', '/', '\\', '~', '`', '+', '=', '，', '。', '：', '？', '！', '“', '”', '；', '’',
          '《', '》', '……', '·', '、', '「', '」', '（', '）', '－', '～', '『', '』']

    def segs(in_str):
        in_str, out, temp = str(in_str).lower().strip(), [], ""
        for char in in_str:
            if char in sp:
                continue
            if re.search(r"[\u4e00-\u9fa5]", char):
                if temp != "":
                    out.extend(NLTKWordTokenizer().tokenize(temp))
                    temp = ""
                out.append(char)
            else:
                temp += char
        return out + (NLTKWordTokenizer().tokenize(temp) if temp != "" else [])
    a, b = segs(gold), segs(pred)
    m = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    best = 0
    for i in range(len(a)):
        for j in range(len(b)):
            if a[i] == b[j]:
                m[i + 1][j + 1] = m[i][j] + 1
                best = max(best, m[i + 1][j + 1])
    if best == 0:
        return 0
    precision, recall = best / len(b), best / len(a)
    return 2 * precision * recall / (precision + recall)


def test_cmrc_f1_splits_words_as_the_official_script():
    # the review's examples (official F1 first): before, runs were split on whitespace: 0.667, 0, 0, 0.4
    for gold, pred, official in (("约20%", "20%", 0.8), ("100", "$100", 2 / 3), ("1998年", "(1998)", 0.4),
                                 ("3.5%", "3.5%的增长", 4 / 7)):
        assert f1_zh(gold, pred) == pytest.approx(official) == pytest.approx(_official_cmrc_f1(gold, pred))
    rng = random.Random(0)
    pieces = ["北", "京", "年", "约", "的", " ", "20", "3.5", "%", "$", "(", ")", "1998", "Paris", "u.s.", ",", ".",
              "'s", "-", "：", "（", "）", "\"", "n't", "x", "?"]
    for _ in range(2000):
        gold, pred = ("".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(2))
        assert f1_zh(gold, pred) == pytest.approx(_official_cmrc_f1(gold, pred)), (gold, pred)

def test_null_threshold_as_the_official_script():
    # q1 answerable, span right, margin 0.5; q2 unanswerable, span given, margin 2; q3 answerable, span wrong, margin 3
    golds = {"q1": ["Paris"], "q2": [], "q3": ["Seine"]}
    spans = {"q1": "Paris", "q2": "France", "q3": "river"}
    margin = {"q1": 0.5, "q2": 2.0, "q3": 3.0}
    best, thr = best_threshold({"q1": 1.0, "q2": 0.0, "q3": 0.0}, {"q1": True, "q2": False, "q3": True},
                               {q: True for q in golds}, margin)
    assert (best, thr) == (pytest.approx(2 / 3), 0.5)  # answer q1 only; at threshold 0 nothing is answered: 1/3
    s = squad_scores(golds, spans, margin)
    assert s["exact_match"] == pytest.approx(2 / 3) and s["exact_match_threshold0"] == pytest.approx(1 / 3)
    assert s["f1_null_threshold"] == 0.5
    assert squad_scores(golds, spans, None)["exact_match"] == pytest.approx(1 / 3)  # v1: spans as predicted


# ----------------------------------------------------------------------------------------------------- SQuAD files
def squad_file(path: Path, paragraphs: list[tuple[str, list[dict]]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": c, "qas": qas} for c, qas in paragraphs]}]}, ensure_ascii=False), encoding="utf-8")
    return path


def every_word_questions(context: str) -> list[dict]:
    out, pos = [], 0
    for i, w in enumerate(context.split(" ")):
        out.append({"id": f"q{i}", "question": "where is it", "answers": [{"text": w, "answer_start": pos}]})
        pos += len(w) + 1
    return out


@pytest.mark.parametrize("kind", ["wordpiece", "bbpe", "unigram"])
def test_squad_windows_map_answers_through_offsets(toks, tmp_path, kind):
    """An answer at every word of a long context (so at both edges of some windows; the last word is many
    sub-tokens): every window that holds the whole answer points at tokens whose offsets give back its text, the
    others at [CLS]; and the best-span search finds it again from logits peaked there."""
    tok = toks[kind]
    rng = random.Random(1)
    context = " ".join(rng.choice(WORDS) for _ in range(60)) + " " + LONG
    split = read_squad(squad_file(tmp_path / "train.json", [(context, every_word_questions(context))]), True)
    assert len(tok.encode(LONG)) > 3
    w = make_windows(tok, split, 32, "roberta" if kind == "bbpe" else "bert", 2, 8, 64)
    full = token_offsets(tok, context)[1]
    assert max(w.question) == len(split.questions) - 1 and len(w.ids) > 2 * len(split.questions)
    edges = {"first": 0, "last": 0}
    for i, qi in enumerate(w.question):
        q, c0, offs = split.questions[qi], w.ctx_start[i], w.offsets[i]
        assert len(w.ids[i]) <= 32 and w.ids[i][0] == tok.cls_id and w.ids[i][-1] == tok.sep_id
        lo, hi = q.start, q.start + len(q.answers[0])
        answer_tokens = [t for t, (a, b) in enumerate(full) if a < hi and b > lo]
        begin = next(b for b in range(len(full)) if full[b:b + len(offs)] == offs)  # the window's first token
        whole = begin <= answer_tokens[0] and answer_tokens[-1] < begin + len(offs)
        assert (w.starts[i] != 0) == whole, (kind, qi)
        if not whole:
            continue
        s, e = w.starts[i] - c0, w.ends[i] - c0
        assert q.context[offs[s][0]:offs[e][1]].strip() == q.answers[0], (kind, qi)
        edges["first"] += s == 0
        edges["last"] += e == len(offs) - 1
    assert edges["first"] and edges["last"], edges
    # every question is answerable in at least one window
    assert {w.question[i] for i in range(len(w.ids)) if w.starts[i]} == set(range(len(split.questions)))
    # logits peaked at the gold positions give back every answer text, across windows
    outputs = []
    for i in range(len(w.ids)):
        start, end = [0.0] * len(w.ids[i]), [0.0] * len(w.ids[i])
        start[w.starts[i]] += 5.0
        end[w.ends[i]] += 5.0
        outputs.append((start, end))
    spans, margin = best_spans(w, outputs, 20, 30)
    assert all(spans[q.qid] == q.answers[0] for q in split.questions)


def test_squad_chinese_offsets_and_v2(toks, tmp_path):
    context = "北京大学是中国的一所著名高等学府位于海淀区"
    qas = [{"id": "a", "question": "北京大学位于哪里", "answers": [{"text": "海淀区", "answer_start": context.index("海淀区")}]},
           {"id": "b", "question": "长江流经哪里", "answers": [], "is_impossible": True}]
    split = read_squad(squad_file(tmp_path / "train-v2.0.json", [(context, qas)]), True)
    assert split.version2
    w = make_windows(toks["zh"], split, 64, "bert", 2, 128, 64)
    (a, b) = range(2)
    c0, offs = w.ctx_start[a], w.offsets[a]
    assert context[offs[w.starts[a] - c0][0]:offs[w.ends[a] - c0][1]] == "海淀区"
    assert (w.starts[b], w.ends[b]) == (0, 0)  # unanswerable -> [CLS]
    kind = task_kind(TaskSection(name="squad"))
    (tmp_path / "dev-v2.0.json").write_text((tmp_path / "train-v2.0.json").read_text())
    splits = read_task(kind, tmp_path)
    assert kind.version2 and kind.style == "cmrc" and set(splits) == {"train", "dev"}
    assert kind.metrics[:2] == ("f1", "exact_match")


def test_squad_bad_records_are_named(tmp_path):
    context = "the cat sat on the mat"
    bad = [{"id": "good", "question": "who", "answers": [{"text": "cat", "answer_start": 4}]},
           {"id": "shifted", "question": "what", "answers": [{"text": "mat", "answer_start": 3}]}]
    path = squad_file(tmp_path / "train-v1.1.json", [(context, bad)])
    with pytest.raises(TaskDataError, match=r"question shifted .*answer 'mat' is not at answer_start 3 \(the text "
                                            r"occurs at 19\)"):
        read_squad(path, True)
    kept = read_squad(path, True, skip_malformed=True)
    assert [q.qid for q in kept.questions] == ["good"] and kept.skipped == ["shifted"]
    assert len(read_squad(path, False).questions) == 2  # dev answers are texts; their offsets are not used
    path = squad_file(tmp_path / "nocontext.json", [("", bad[:1])])
    with pytest.raises(TaskDataError, match="question good .*no context"):
        read_squad(path, False)
    (tmp_path / "broken.json").write_text("{\"data\": [")
    with pytest.raises(TaskDataError, match="broken.json: not valid JSON"):
        read_squad(tmp_path / "broken.json", False)


# ------------------------------------------------------------------------------------------------------------ NER
def test_conll_reader_and_first_subtoken_labels(toks, tmp_path):
    (tmp_path / "train.txt").write_text("-DOCSTART- -X- -X- O\n\nParis NNP I-NP I-LOC\nis VBZ I-VP O\n"
                                        + LONG + " RB I-ADVP O\n\nthe DT B-NP B-ORG\ncat NN I-NP I-ORG\n")
    s = read_conll(tmp_path / "train.txt")
    assert s.words == [["Paris", "is", LONG], ["the", "cat"]] and s.docstarts == 1
    assert s.tags[0] == ["I-LOC", "O", "O"]  # a sentence may start with I- (IOB1 files, conlleval reads it)
    kind = task_kind(TaskSection(name="ner"))
    (tmp_path / "dev.txt").write_text("cat O\nsat B-PER\n")
    splits = kind.read(tmp_path)
    assert kind.labels == ["O", "B-ORG", "B-PER", "I-LOC", "I-ORG"]
    tok = toks["wordpiece"]
    enc = kind.encode(tok, splits["train"], 64, "bert", 2)
    pieces = [len(tok.encode(w)) for w in ["Paris", "is", LONG]]
    assert pieces[2] > 2  # a word of many sub-tokens
    assert enc.labels[0] == [IGNORE, 3] + [IGNORE] * (pieces[0] - 1) + [0] + [IGNORE] * (pieces[1] - 1) + [0] + \
        [IGNORE] * (pieces[2] - 1) + [IGNORE]
    assert enc.first[0] == [1, 1 + pieces[0], 1 + pieces[0] + pieces[1]]
    # cut sentences: words that do not fit are predicted O, so every gold entity still counts
    short = kind.encode(tok, splits["train"], 2 + pieces[0], "bert", 2)
    assert short.first == [[1, -1, -1], [1, -1]]
    scores = kind.score([[0, 3] + [0] * 20, [0, 1, 4] + [0] * 20], short)
    # Paris I-LOC right; "the cat" B-ORG I-ORG predicted B-ORG O (cat cut): 1 of 2 chunks, 4 of 5 tokens
    assert (scores["precision"], scores["recall"], scores["accuracy"]) == (0.5, 0.5, 0.8)
    full = kind.score([[0, 3] + [0] * 20, [0, 1, 4] + [0] * 20], enc)
    assert full["f1"] == 1.0 and full["accuracy"] == 1.0


def test_conll_bad_tags_and_chinese(tmp_path):
    (tmp_path / "a.txt").write_text("Paris B-LOC\nis O\nnice E-LOC\n")
    with pytest.raises(TaskDataError, match=r"a\.txt:3: tag 'E-LOC' has prefix 'E', outside the BIO scheme"):
        read_conll(tmp_path / "a.txt")
    assert read_conll(tmp_path / "a.txt", "bioes").tags == [["B-LOC", "O", "E-LOC"]]
    assert read_conll(tmp_path / "a.txt", skip_malformed=True).skipped == [3]
    (tmp_path / "zh.txt").write_text("北 B-LOC\n京 I-LOC\n大 O\n\n长 B-LOC\n")
    assert read_conll(tmp_path / "zh.txt").words == [["北", "京", "大"], ["长"]]
    (tmp_path / "b.txt").write_text("Paris\n")
    with pytest.raises(TaskDataError, match=r"b\.txt:1: 1 column\(s\)"):
        read_conll(tmp_path / "b.txt")


# ------------------------------------------------------------------------------------------------ multiple choice
def race_folder(root: Path, n_options=4) -> Path:
    for split in ("train", "dev"):
        for group in ("high", "middle"):
            d = root / split / group
            d.mkdir(parents=True)
            (d / "1.txt").write_text(json.dumps({
                "id": f"{group}1.txt", "article": "The cat sat on the mat.",
                "questions": ["Where did the cat sit? _ .", "Who sat?"],
                "options": [["on the mat", "in Paris", "on a house", "in France"][:n_options],
                            ["a cat", "a river", "the Seine", "Paris"]], "answers": ["A", "A"]}))
    return root


def test_race_and_swag_layouts(toks, tmp_path):
    kind = task_kind(TaskSection(name="race"))
    splits = kind.read(race_folder(tmp_path / "race"))
    assert set(splits) == {"train", "dev"} and len(splits["dev"].items) == 4
    assert splits["train"].items[0].endings[0] == "Where did the cat sit? on the mat ."  # the blank filled
    assert splits["train"].items[1].endings[1] == "Who sat? a river"
    assert kind.metrics == ("accuracy", "accuracy_high", "accuracy_middle")
    enc = kind.encode(toks["wordpiece"], splits["dev"], 16, "bert", 2)
    assert all(len(r) <= 16 and r[0] == toks["wordpiece"].cls_id for rows in enc.ids for r in rows)
    batch = kind.collate(enc, [0, 1, 2], 0)
    assert tuple(batch["input_ids"].shape)[:2] == (3, 4) and batch["labels"].tolist() == [0, 0, 0]
    s = kind.score([0, 1, 0, 0], enc)
    assert s == {"accuracy": 0.75, "accuracy_high": 0.5, "accuracy_middle": 1.0}
    # a question with 3 options among 4-option ones
    bad = race_folder(tmp_path / "bad")
    rec = json.loads((bad / "dev" / "middle" / "1.txt").read_text())
    rec["options"][1] = rec["options"][1][:3]
    (bad / "dev" / "middle" / "1.txt").write_text(json.dumps(rec))
    with pytest.raises(TaskDataError, match=r"middle/1\.txt question 1: 3 choices where the first record has 4"):
        kind.read(bad)
    swag = tmp_path / "swag"
    swag.mkdir()
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
    (swag / "train.csv").write_text(header + '0,v,1,x,"The cat, tired,",sat,gold,on the mat.,in Paris.,a b.,c d.,0\n')
    (swag / "val.csv").write_text(header + "0,v,1,x,The cat,sat,gold,on the mat.,in Paris.,a b.,c d.,7\n")
    k = task_kind(TaskSection(name="swag"))
    with pytest.raises(TaskDataError, match=r"val\.csv:2: label 7 outside ending0\.\.3"):
        k.read(swag)
    (swag / "val.csv").write_text(header + "0,v,1,x,The cat,sat,gold,on the mat.,in Paris.,a b.,c d.,1\n")
    s = k.read(swag)
    assert s["train"].items[0].context == "The cat, tired," and s["dev"].items[0].endings[1] == "sat in Paris."


# ---------------------------------------------------------------------------------------------------------- jsonl
def test_jsonl_clue_layout(tmp_path):
    (tmp_path / "train.json").write_text('{"sentence1": "a", "sentence2": "b", "label": "1"}\n\n'
                                         '{"sentence1": "c", "sentence2": "d", "label": 0}\n')
    (tmp_path / "dev.json").write_text('{"sentence1": "a", "sentence2": "b", "label": "1"}\n{"sentence1": "a"}\n'
                                       'not json\n')
    t = TaskSection(name="jsonl", text_a="sentence1", text_b="sentence2", labels=[0, 1])  # YAML's unquoted labels
    assert t.labels == ["0", "1"]
    kind = task_kind(t)
    with pytest.raises(TaskDataError, match=r"dev\.json:2: no field 'sentence2'"):
        read_task(kind, tmp_path)
    t.skip_malformed = True
    splits = read_task(task_kind(t), tmp_path)
    assert [e.label for e in splits["train"].examples] == [1, 0] and splits["train"].blank_lines == 1
    assert splits["dev"].skipped == [2, 3] and splits["dev"].examples[0].text_b == "b"
    (tmp_path / "train.json").write_text('{"sentence1": "a", "sentence2": "b", "label": "2"}\n')
    with pytest.raises(TaskDataError, match=r"train\.json:1: label '2' is not in task\.labels"):
        read_jsonl_split(jsonl_spec(t), tmp_path / "train.json")
