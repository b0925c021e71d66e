"""Prediction files (trainer/finetune/predictions.py) read back by the reference scorers: SQuAD v2.0's
``predictions.json`` + ``null_odds.json`` by the official evaluate script's functions (transcribed below) give our six
v2.0 scores exactly; NER's ``predictions.txt`` parsed as conlleval reads its input gives our scores; GLUE's
``<TASK>.tsv`` (dev and the unlabelled test split) from a real sweep: the best setting's best seed, label names and
the test file's indices, scored back with scikit-learn / scipy to the run's own figures."""
from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.finetune.config import TaskSection
from trainer.finetune.kinds import task_kind
from trainer.finetune.ner import EncodedTags
from trainer.finetune.predictions import submission_name
from trainer.finetune.squad import Question, Windows

REPO = Path(__file__).resolve().parents[1]


# ---- the official SQuAD v2.0 evaluate script's functions, transcribed (evaluate-v2.0.py) ----
def normalize_answer(s):
    def remove_articles(text):
        return re.sub(re.compile(r'\b(a|an|the)\b', re.UNICODE), ' ', text)

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)
    return ' '.join(remove_articles(remove_punc(s.lower())).split())


def get_tokens(s):
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold, a_pred):
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
    gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
    num_same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision, recall = 1.0 * num_same / len(pred_toks), 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def get_raw_scores(qas, preds):
    exact_scores, f1_scores = {}, {}
    for qid, answers in qas.items():
        gold_answers = [a for a in answers if normalize_answer(a)] or ['']
        exact_scores[qid] = max(compute_exact(a, preds[qid]) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, preds[qid]) for a in gold_answers)
    return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    return {qid: float(not qid_to_has_ans[qid]) if na_probs[qid] > na_prob_thresh else s for qid, s in scores.items()}


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = best_score = num_no_ans
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        diff = scores[qid] if qid_to_has_ans[qid] else (-1 if preds[qid] else 0)
        cur_score += diff
        if cur_score > best_score:
            best_score, best_thresh = cur_score, na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


# ---- SQuAD ----
WORDS = ["the", "a", "An", "cat", "Paris,", "1990s", "$1,000.50", "O'Neil", "café", "x-ray.", "(1998)", "blue"]


def squad_case(rng: random.Random, n: int) -> tuple[Windows, list, dict[str, list[str]]]:
    """``n`` questions over random contexts, 1-3 windows each with random logits; about a third unanswerable, the
    others with 1-3 gold spans (some, like "the", normalise to nothing)."""
    w = Windows()
    outputs, qas = [], {}
    for qi in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 10))]
        context, spans, pos = " ".join(words), [], 0
        for word in words:
            spans.append((pos, pos + len(word)))
            pos += len(word) + 1
        answers = []
        if rng.random() > 0.35:
            for _ in range(rng.randint(1, 3)):
                s = rng.randrange(len(words))
                e = min(len(words) - 1, s + rng.randrange(3))
                answers.append(context[spans[s][0]:spans[e][1]])
        qid = f"q{qi}"
        w.questions.append(Question(qid, "what", context, answers, spans[0][0] if answers else None, not answers))
        qas[qid] = answers
        for _ in range(rng.randint(1, 3)):
            lo = rng.randrange(len(words))
            hi = rng.randint(lo + 1, len(words))
            c0 = 3
            w.question.append(qi)
            w.ctx_start.append(c0)
            w.offsets.append(spans[lo:hi])
            length = c0 + (hi - lo) + 1
            outputs.append(([rng.gauss(0, 2) for _ in range(length)], [rng.gauss(0, 2) for _ in range(length)]))
    return w, outputs, qas


def test_squad_v2_files_score_as_the_official_script(tmp_path):
    kind = task_kind(TaskSection(name="squad"))
    kind.version2, kind.style = True, "squad"
    rng = random.Random(0)
    for case in range(30):
        windows, outputs, qas = squad_case(rng, 40)
        ours, predictions = kind.scored(outputs, windows)
        folder = tmp_path / f"case{case}"
        kind.write_predictions(predictions, windows, folder, "dev")
        preds = json.loads((folder / "predictions.json").read_text(encoding="utf-8"))
        na_probs = json.loads((folder / "null_odds.json").read_text())
        has_ans = {qid: bool(a) for qid, a in qas.items()}
        exact_raw, f1_raw = get_raw_scores(qas, preds)
        best_exact, exact_thresh = find_best_thresh(preds, exact_raw, na_probs, has_ans)
        best_f1, f1_thresh = find_best_thresh(preds, f1_raw, na_probs, has_ans)
        assert (100 * ours["exact_match"], 100 * ours["f1"]) == pytest.approx((best_exact, best_f1), abs=1e-9), case
        assert (ours["exact_match_null_threshold"], ours["f1_null_threshold"]) == (exact_thresh, f1_thresh), case
        at0 = [apply_no_ans_threshold(s, na_probs, has_ans, 0.0) for s in (exact_raw, f1_raw)]  # --na-prob-thresh 0
        assert 100 * ours["exact_match_threshold0"] == pytest.approx(100 * sum(at0[0].values()) / len(qas)), case
        assert 100 * ours["f1_threshold0"] == pytest.approx(100 * sum(at0[1].values()) / len(qas)), case
        assert all(isinstance(preds[q], str) for q in qas) and set(na_probs) == set(qas)


# ---- NER ----
def read_as_conlleval(path: Path) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """conlleval's input rules: fields split at single spaces, the last two the gold and guessed tags, an empty line
    (or a -X- line) ends a sentence, and every line has the same number of fields."""
    words, gold, pred, sent, n_features = [], [], [], None, None
    for line in path.read_text(encoding="utf-8").split("\n"):
        features = line.split(" ")
        if line == "" or features[0] == "-X-":
            if sent:
                for store, column in ((words, 0), (gold, 1), (pred, 2)):
                    store.append([f[column] for f in sent])
            sent = []
            continue
        assert n_features in (None, len(features)), f"unexpected number of features in line {line!r}"
        n_features = len(features)
        sent = (sent or []) + [[" ".join(features[:-2]), features[-2], features[-1]]]
    return words, gold, pred


def test_ner_file_reads_back_as_conlleval_reads_it(tmp_path):
    from trainer.finetune.conlleval import evaluate
    kind = task_kind(TaskSection(name="ner"))
    kind.labels = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    rng = random.Random(0)
    words = [[rng.choice(["Paris", "北", "\u00a0", "O'Neil", "x-ray."]) for _ in range(rng.randint(1, 8))]
             for _ in range(50)]
    gold = [[rng.choice(kind.labels) for _ in s] for s in words]
    first = [[(i + 1 if rng.random() > 0.1 else -1) for i in range(len(s))] for s in words]  # some words cut
    data = EncodedTags([], [], [], first, gold, words=words)
    outputs = [[rng.randrange(len(kind.labels)) for _ in range(len(s) + 2)] for s in words]
    ours = kind.score(outputs, data)
    kind.write_predictions(kind.predictions(outputs, data), data, tmp_path / "dev", "dev")
    w, g, p = read_as_conlleval(tmp_path / "dev" / "predictions.txt")
    assert (w, g) == (words, gold)
    assert all(t == "O" for s, f in zip(p, first) for t, i in zip(s, f) if i < 0)  # cut words: O, as scored
    assert evaluate(g, p, kind.types) == ours


def test_glue_submission_names():
    assert [submission_name(t, s) for t, s in [("rte", "test"), ("mnli", "test_matched"), ("mnli", "mismatched"),
                                               ("cola", "dev"), ("sts-b", "test"), ("tsv", "test")]] == \
        ["RTE.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "CoLA.tsv", "STS-B.tsv", "tsv.tsv"]


# ---- GLUE, end to end ----
@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory, en_corpus) -> Path:
    """A tiny BERT model folder with a WordPiece tokenizer trained on a few thousand lines."""
    from data_prep.tokenizer import load_tokenizer
    from trainer.models import PretrainingModel, get_preset
    from trainer.models.model_folder import save_model_folder
    from trainer.models.presets import BERT_HEADS
    out = tmp_path_factory.mktemp("pred")
    text = out / "en.txt"
    text.write_text("\n".join(en_corpus.read_text(encoding="utf-8").splitlines()[:3000]) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", "wordpiece", "--input", str(text),
                           "--vocab-size", "600", "--output", str(out / "tok")], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tok = load_tokenizer(out / "tok")
    cfg = get_preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id)
    torch.manual_seed(0)
    folder = out / "bert"
    save_model_folder(PretrainingModel(cfg, BERT_HEADS), cfg, folder)
    for f in (out / "tok").iterdir():
        shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture
def clean_env():
    saved, grouped, threads = dict(os.environ), torch.distributed.is_initialized(), torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(saved)
    if torch.distributed.is_initialized() and not grouped:  # fine-tuning leaves its 1-rank group up on purpose
        import deepspeed.comm
        deepspeed.comm.destroy_process_group()


def read_submission(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "index\tprediction"
    return [tuple(line.split("\t")) for line in lines[1:]]


def test_glue_dev_and_test_files_of_the_best_run(bert_folder, en_corpus, tmp_path, clean_env):
    from sklearn.metrics import accuracy_score
    from scipy.stats import spearmanr

    from finetune_tasks import corpus_documents, write_pairs, write_sts
    from trainer.finetune.__main__ import main as finetune_main
    docs = corpus_documents(en_corpus, 6000, 8000)
    rte = write_pairs("rte", docs, tmp_path / "rte", 32, 24)
    dev_rows = (rte / "dev.tsv").read_text().splitlines()[1:]
    # GLUE's test layout: index, the texts, no label; indices need not be positions
    (rte / "test.tsv").write_text("index\tsentence1\tsentence2\n" + "".join(
        f"{100 + i}\t{r.split(chr(9))[1]}\t{r.split(chr(9))[2]}\n" for i, r in enumerate(dev_rows[:10])))
    common = ["--set", "train.epochs=1", "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=8",
              "--set", "train.max_seq_length=64", "--set", "deepspeed.config=ds_configs/zero0.json"]
    out = tmp_path / "out"
    assert finetune_main(["--checkpoint", str(bert_folder), "--task", "rte", "--data", str(rte), "--seeds", "2",
                          "--sweep", "optim.lr=1e-4,1e-3", "--set", f"run_dir={out}",
                          "--set", "task.test_files.test=test.tsv", *common]) == 0
    res = json.loads((out / "finetune" / "rte" / "results.json").read_text())
    chosen = res["predictions"]
    assert chosen["setting"] == res["best_setting"] and chosen["splits"] == ["dev", "test"]
    mine = [r for r in res["runs"] if r["setting"] == res["best_setting"]]
    best_run = max(mine, key=lambda r: r["metrics"]["dev"]["accuracy"])  # the first of equals, as kept
    assert chosen["seed"] == best_run["seed"] and res["runs"][chosen["run"]] == best_run
    pred = read_submission(out / "finetune" / "rte" / "predictions" / "dev" / "RTE.tsv")
    gold = [r.split("\t")[-1] for r in dev_rows]
    assert [i for i, _ in pred] == [r.split("\t")[0] for r in dev_rows]  # the dev file's own index column
    assert {p for _, p in pred} <= {"entailment", "not_entailment"}
    assert accuracy_score(gold, [p for _, p in pred]) == best_run["metrics"]["dev"]["accuracy"]
    test = read_submission(out / "finetune" / "rte" / "predictions" / "test" / "RTE.tsv")
    assert [i for i, _ in test] == [str(100 + i) for i in range(10)] and "test" not in best_run["metrics"]
    # the test rows are the first dev rows: the same model predicts them alike
    assert [p for _, p in test] == [p for _, p in pred[:10]]

    sts = write_sts(docs, tmp_path / "sts", 32, 24)
    out = tmp_path / "sts_out"
    assert finetune_main(["--checkpoint", str(bert_folder), "--task", "sts-b", "--data", str(sts), "--seeds", "2",
                          "--set", f"run_dir={out}", "--set", "train.predictions=all", *common]) == 0
    res = json.loads((out / "finetune" / "sts-b" / "results.json").read_text())
    assert res["predictions"]["runs"] == ["0_seed1234", "1_seed1235"]
    gold = [float(r.split("\t")[-1]) for r in (sts / "dev.tsv").read_text().splitlines()[1:]]
    for run, folder in zip(res["runs"], res["predictions"]["runs"]):
        values = [float(v) for _, v in read_submission(out / "finetune" / "sts-b" / "predictions" / folder / "dev" /
                                                        "STS-B.tsv")]
        assert spearmanr(values, gold)[0] == pytest.approx(run["metrics"]["dev"]["spearman"], abs=1e-12)
    assert not list((out / "finetune" / "sts-b").glob(".predictions.tmp*"))


# ---- SQuAD v1.1: the official v1.1 evaluate script's functions, transcribed (evaluate-v1.1.py) ----
def v11_f1_score(prediction, ground_truth):
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)).values())
    if num_same == 0:
        return 0
    precision, recall = 1.0 * num_same / len(prediction_tokens), 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def v11_exact_match_score(prediction, ground_truth):
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def v11_evaluate(qas, predictions):
    f1 = exact_match = total = 0
    for qid, gts in qas.items():
        total += 1
        exact_match += max(v11_exact_match_score(predictions[qid], gt) for gt in gts)
        f1 += max(v11_f1_score(predictions[qid], gt) for gt in gts)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def test_squad_v11_files_score_as_the_v11_script(tmp_path):
    from trainer.finetune.squad_metrics import score
    assert score(["the", "cat"], "a", version2=False) == (1.0, 0.0)  # v1.1 keeps the gold "the"; its F1 of two
    assert score(["the", "cat"], "a") == (0.0, 0.0)  # empty answers is 0; v2.0 drops "the", leaving "cat"
    assert score(["the"], "a") == (1.0, 1.0)  # v2.0: no gold left, [""] matches an empty prediction
    kind = task_kind(TaskSection(name="squad"))
    kind.version2, kind.style = False, "squad"
    rng = random.Random(1)
    differ = 0
    for case in range(30):
        windows, outputs, qas = squad_case(rng, 40)
        for q in windows.questions:  # v1.1: every question answered; some golds normalise to nothing
            q.answers = qas[q.qid] = qas[q.qid] or [rng.choice(["the", "a", "...", "An"])]
            q.impossible = False
        ours, predictions = kind.scored(outputs, windows)
        kind.write_predictions(predictions, windows, tmp_path / f"v1_{case}", "dev")
        assert not (tmp_path / f"v1_{case}" / "null_odds.json").exists()
        preds = json.loads((tmp_path / f"v1_{case}" / "predictions.json").read_text(encoding="utf-8"))
        official = v11_evaluate(qas, preds)
        assert (100 * ours["exact_match"], 100 * ours["f1"]) == pytest.approx(
            (official["exact_match"], official["f1"]), abs=1e-9), case
        v2_exact, _ = get_raw_scores(qas, preds)
        differ += sum(v2_exact.values()) != round(ours["exact_match"] * len(qas))
    assert differ  # the cases hold answers on which v2.0's rules would score differently
