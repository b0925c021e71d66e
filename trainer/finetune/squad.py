"""``squad``: span extraction from SQuAD's JSON (v1.1, v2.0, and CMRC 2018 / DRCD, which ship in its layout).

Layout: ``{"data": [{"paragraphs": [{"context": ..., "qas": [{"id", "question", "answers": [{"text",
"answer_start"}], "is_impossible"}]}]}]}``. Files: ``task.train_file`` / ``task.dev_files`` if set, else the first
present of train-v2.0.json, train-v1.1.json, train.json, cmrc2018_train.json, DRCD_training.json (dev likewise).
v2.0 is detected from the data (any ``is_impossible`` question); then "no answer" is a prediction. Before training,
a record without context, question or id, a question whose id repeats an earlier one's (scores are kept per id,
as in the official scripts, so the two would be merged), or a training answer whose text is not at its
``answer_start``, stops the run naming the file and question id (``skip_malformed`` skips and counts them).

Features (BERT's run_squad / Hugging Face's run_qa): the question cut to ``max_query_length`` tokens, the context in
windows of what is left of the sequence, each window starting ``doc_stride`` tokens after the last; answers are
mapped to tokens through the tokenizer's character offsets (any tokenizer: WordPiece, byte-level BPE, SentencePiece,
Chinese characters); a window that does not contain the whole answer (and an unanswerable question) points at
[CLS]. Predictions: the ``n_best_size`` best starts and ends of every window, pairs with start <= end and at most
``max_answer_length`` tokens, best by start + end logit across windows; the null score is the smallest [CLS] score
over the windows. Metrics (squad_metrics.py): ``f1`` and ``exact_match``; Chinese contexts are scored as CMRC 2018. Prediction files
(``predictions.json``, v2.0's ``null_odds.json``): trainer/finetune/predictions.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.finetune.kind_base import run_model, TaskKind, pad_rows, pair_overhead
from trainer.finetune.squad_metrics import CJK, squad_scores
from trainer.finetune.tasks import TaskDataError

TRAIN_FILES = ("train-v2.0.json", "train-v1.1.json", "train.json", "cmrc2018_train.json", "DRCD_training.json")
DEV_FILES = ("dev-v2.0.json", "dev-v1.1.json", "dev.json", "cmrc2018_dev.json", "DRCD_dev.json")


@dataclass
class Question:
    qid: str
    question: str
    context: str
    answers: list[str]
    start: int | None
    """Character offset of the first answer in the context (None: unanswerable)."""
    impossible: bool = False


@dataclass
class Questions:
    path: Path
    questions: list[Question] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def version2(self) -> bool:
        return any(q.impossible for q in self.questions)

    def describe(self) -> str:
        extra = f" ({len(self.skipped)} malformed questions skipped, first: {self.skipped[:5]})" if self.skipped else ""
        n_imp = sum(q.impossible for q in self.questions)
        return f"{self.path}: {len(self.questions)} questions, {n_imp} unanswerable{extra}"


def read_squad(path: Path, training: bool, skip_malformed: bool = False) -> Questions:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TaskDataError(f"{path}: not valid JSON ({err}); SQuAD's layout is one JSON document") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise TaskDataError(f"{path}: no top-level 'data' list (SQuAD layout: {{'data': [{{'paragraphs': ...}}]}})")
    out = Questions(path)
    seen: dict[str, str] = {}  # id -> where it first occurs: scores are kept per id, a repeat would be merged
    for a, article in enumerate(data["data"]):
        for p, para in enumerate(article.get("paragraphs", []) if isinstance(article, dict) else []):
            where = f"data[{a}].paragraphs[{p}]"
            context = para.get("context") if isinstance(para, dict) else None
            for i, qa in enumerate(para.get("qas", []) if isinstance(para, dict) else []):
                qid = qa.get("id", f"{where}.qas[{i}]") if isinstance(qa, dict) else f"{where}.qas[{i}]"
                problem, q = _question(qa, context, training)
                if q is not None and q.qid in seen:
                    problem = (f"the id repeats that of {seen[q.qid]} (scores are kept per id: the two would be "
                               "merged into one)")
                if problem:
                    if skip_malformed:
                        out.skipped.append(str(qid))
                        continue
                    raise TaskDataError(f"{path}: question {qid} ({where}.qas[{i}]): {problem}; fix the record, or "
                                        "set task.skip_malformed: true to skip and count such questions")
                seen[q.qid] = f"{where}.qas[{i}]"
                out.questions.append(q)
    if not out.questions:
        raise TaskDataError(f"{path}: no questions (an empty split cannot train or evaluate)")
    return out


def _question(qa, context, training: bool) -> tuple[str | None, Question | None]:
    if not isinstance(qa, dict):
        return "not a JSON object", None
    if not isinstance(context, str) or not context.strip():
        return "its paragraph has no context", None
    if "id" not in qa or not str(qa.get("question", "")).strip():
        return "no id or an empty question", None
    impossible = bool(qa.get("is_impossible", False))
    answers = qa.get("answers") or []
    if not isinstance(answers, list) or not all(isinstance(x, dict) and "text" in x for x in answers):
        return "'answers' must be a list of {text, answer_start}", None
    start = None
    if not impossible:
        if not answers:
            return "no answers and not is_impossible", None
        first = answers[0]
        start = first.get("answer_start")
        if training and (not isinstance(start, int) or context[start:start + len(first["text"])] != first["text"]):
            found = context.find(first["text"])
            hint = f" (the text occurs at {found})" if found >= 0 else " (the text is not in the context)"
            return f"answer {first['text']!r} is not at answer_start {start}{hint}", None
    return None, Question(str(qa["id"]), str(qa["question"]), context, [str(x["text"]) for x in answers], start,
                          impossible)


def token_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character spans of ``text``'s tokens, from the fast tokenizer's offset mapping."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        enc = backend.encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]
    enc = tokenizer._tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


@dataclass
class Windows:
    ids: list[list[int]] = field(default_factory=list)
    types: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    question: list[int] = field(default_factory=list)
    """Index (in ``questions``) of each window's question."""
    ctx_start: list[int] = field(default_factory=list)
    """Sequence position of each window's first context token."""
    offsets: list[list[tuple[int, int]]] = field(default_factory=list)
    """Character spans (in the context) of each window's context tokens."""
    questions: list[Question] = field(default_factory=list)


def make_windows(tokenizer, split: Questions, max_len: int, family: str, type_vocab_size: int, doc_stride: int,
                 max_query_length: int) -> Windows:
    out = Windows(questions=split.questions)
    cache: dict[str, tuple] = {}
    seg = 1 if type_vocab_size > 1 else 0
    for qi, q in enumerate(split.questions):
        if q.context not in cache:
            cache.clear()  # questions of one paragraph come together: keep one
            cache[q.context] = token_offsets(tokenizer, q.context)
        ctx_ids, ctx_off = cache[q.context]
        q_ids = tokenizer.encode(q.question)[:max_query_length]
        head = [tokenizer.cls_id] + q_ids + [tokenizer.sep_id] * (2 if family == "roberta" else 1)
        room = max_len - len(q_ids) - pair_overhead(family, True)
        if room < 1:
            raise TaskDataError(f"train.max_seq_length {max_len} leaves no room for the context after a "
                                f"{len(q_ids)}-token question: raise it or lower task.max_query_length")
        tok_start = tok_end = None
        if q.start is not None:
            a_end = q.start + len(q.answers[0])
            inside = [t for t, (s, e) in enumerate(ctx_off) if s < a_end and e > q.start]
            if inside:
                tok_start, tok_end = inside[0], inside[-1]
        begin = 0
        while True:
            length = min(len(ctx_ids) - begin, room)
            ids = head + ctx_ids[begin:begin + length] + [tokenizer.sep_id]
            out.ids.append(ids)
            out.types.append([0] * len(head) + [seg] * (length + 1))
            c0 = len(head)
            if tok_start is not None and begin <= tok_start and tok_end < begin + length:
                out.starts.append(c0 + tok_start - begin)
                out.ends.append(c0 + tok_end - begin)
            else:
                out.starts.append(0)
                out.ends.append(0)
            out.question.append(qi)
            out.ctx_start.append(c0)
            out.offsets.append(ctx_off[begin:begin + length])
            if begin + length >= len(ctx_ids):
                break
            begin += min(length, doc_stride)
    return out


def best_spans(windows: Windows, outputs: list, n_best: int, max_answer_length: int
               ) -> tuple[dict[str, str], dict[str, float]]:
    """Per question id: the best span's text, and null score - best span score (for v2.0's threshold)."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for w, (start, end) in enumerate(outputs):
        qi, c0, offs = windows.question[w], windows.ctx_start[w], windows.offsets[w]
        start, end = torch.tensor(start), torch.tensor(end)
        null[qi] = min(null.get(qi, float("inf")), float(start[0] + end[0]))
        ctx_s, ctx_e = start[c0:c0 + len(offs)], end[c0:c0 + len(offs)]
        for s in ctx_s.argsort(descending=True)[:n_best].tolist():
            for e in ctx_e.argsort(descending=True)[:n_best].tolist():
                if e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(ctx_s[s] + ctx_e[e])
                if qi not in best or score > best[qi][0]:
                    text = windows.questions[qi].context[offs[s][0]:offs[e][1]].strip()
                    best[qi] = (score, text)
    spans, margin = {}, {}
    for qi, q in enumerate(windows.questions):
        score, text = best.get(qi, (float("-inf"), ""))
        spans[q.qid] = text
        margin[q.qid] = null[qi] - score if qi in best else float("inf")
    return spans, margin


class SquadKind(TaskKind):
    name = "squad"
    metrics = ("f1", "exact_match")
    head = "span"
    max_seq_length = 384
    num_labels = 2

    def read(self, data_dir):
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise TaskDataError(f"--data {data_dir}: no such folder (SQuAD's train-v1.1.json and dev-v1.1.json)")
        t = self.cfg
        train = t.train_file if t.train_file != "train.tsv" else _first(data_dir, TRAIN_FILES)
        devs = dict(t.dev_files) if dict(t.dev_files) != {"dev": "dev.tsv"} else {"dev": _first(data_dir, DEV_FILES)}
        files = {"train": train, **devs}
        missing = [f"{s} ({f or ' / '.join(TRAIN_FILES if s == 'train' else DEV_FILES)})" for s, f in files.items()
                   if not f or not (data_dir / f).is_file()]
        if missing:
            raise TaskDataError(f"task squad: {data_dir} lacks {missing} (set task.train_file / task.dev_files)")
        splits = {s: read_squad(data_dir / f, s == "train", t.skip_malformed) for s, f in files.items()}
        self.version2 = any(sp.version2 for sp in splits.values())
        if self.version2:
            self.metrics = ("f1", "exact_match", "f1_threshold0", "exact_match_threshold0", "f1_null_threshold",
                            "exact_match_null_threshold")
        style = t.answer_metric
        if style == "auto":
            text = "".join(q.context for q in splits[next(iter(devs))].questions[:200])
            style = "cmrc" if len(CJK.findall(text)) > 0.3 * max(1, len(text)) else "squad"
        self.style = style
        return splits

    def encode(self, tokenizer, split, max_len, family, types):
        t = self.cfg
        return make_windows(tokenizer, split, max_len, family, types, t.doc_stride, t.max_query_length)

    def collate(self, data, idx, pad_id):
        ids = pad_rows([data.ids[i] for i in idx], pad_id)
        width = ids.shape[1]
        return {"input_ids": ids, "attention_mask": pad_rows([[1] * len(data.ids[i]) for i in idx], 0, width),
                "token_type_ids": pad_rows([data.types[i] for i in idx], 0, width),
                "start_positions": torch.tensor([data.starts[i] for i in idx]),
                "end_positions": torch.tensor([data.ends[i] for i in idx])}

    def loss(self, model, batch):
        logits = run_model(model, batch).float()
        start, end = logits.unbind(-1)
        return (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2

    def outputs(self, model, batch):
        logits = run_model(model, batch).float()
        lengths = batch["attention_mask"].sum(-1).tolist()
        return [(row[:n, 0].tolist(), row[:n, 1].tolist()) for row, n in zip(logits.cpu(), lengths)]

    def predictions(self, outputs, data):
        """({id: best span text}, {id: null score - best span score} on v2.0, else None)."""
        spans, margin = best_spans(data, outputs, self.cfg.n_best_size, self.cfg.max_answer_length)
        return spans, margin if self.version2 else None

    def scored(self, outputs, data, labelled=True):
        predictions = self.predictions(outputs, data)  # the best-span search once, for both
        return (self._score(predictions, data) if labelled else None), predictions

    def score(self, outputs, data):
        return self._score(self.predictions(outputs, data), data)

    def _score(self, predictions, data):
        golds = {q.qid: q.answers for q in data.questions}
        return squad_scores(golds, *predictions, self.style)

    def write_predictions(self, predictions, data, folder, split):
        from trainer.finetune.predictions import write_squad
        return write_squad(folder, *predictions)


def _first(folder: Path, names) -> str | None:
    return next((n for n in names if (folder / n).is_file()), None)
