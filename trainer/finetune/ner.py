"""``ner``: token classification (named entities) from CoNLL column files, scored as conlleval does.

Layout: ``train.txt``, ``dev.txt`` and, if present, ``test.txt`` in the data folder. One token per line, columns
separated by ASCII spaces or tabs (a token may be a no-break or ideographic space), the token in column
``task.token_column`` (0) and its tag in the last column; sentences are separated by blank lines; ``-DOCSTART-``
lines (CoNLL-2003's document marks) are skipped. A Chinese file of one
character per line (MSRA-NER, People's Daily) is the same layout. Tags follow ``task.scheme`` (bio, iob1 or bioes;
bio by default); a tag outside it stops the run naming file and line. The label set is every tag of every split,
``O`` first then sorted.

Encoding (BERT section 5.3): each word is tokenized on its own (RoBERTa's byte-level BPE with a leading space, as
``add_prefix_space``); its label goes on its first sub-token, the others get -100 and no loss. A sentence longer
than the sequence is cut before the first word that does not fit; its cut words (and words that tokenize to nothing)
are predicted ``O`` when scoring, so the score stays over every gold entity, and each split's cut sentences, words
and entities are counted and said (a warning naming the file). Metrics (conlleval.py): entity-level micro ``f1``,
``precision``, ``recall``, token ``accuracy``, and ``f1_<TYPE>`` for every entity type of the label set (0 where a
split has none and none is predicted), so every run of a sweep reports the same keys. Prediction file
(``predictions.txt``, token / gold / predicted as conlleval reads them): trainer/finetune/predictions.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.finetune.conlleval import check_tag, chunks, evaluate, split_tag
from trainer.finetune.kind_base import run_model, IGNORE, TaskKind, pad_rows
from trainer.finetune.tasks import TaskDataError, read_lines

FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}
_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")
"""Column separators: ASCII spaces and tabs as conlleval splits, not ``str.split``'s Unicode whitespace, which would
take a token that is a no-break or ideographic space (U+00A0, U+3000: in Chinese corpora) for a missing column."""


@dataclass
class Sentences:
    path: Path
    words: list[list[str]] = field(default_factory=list)
    tags: list[list[str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    """Line number of each sentence's first token."""
    skipped: list[int] = field(default_factory=list)
    docstarts: int = 0

    def describe(self) -> str:
        extra = [f"{self.docstarts} -DOCSTART- lines skipped"] if self.docstarts else []
        if self.skipped:
            extra.append(f"{len(self.skipped)} malformed lines skipped (first: {self.skipped[:5]})")
        tokens = sum(len(w) for w in self.words)
        return f"{self.path}: {len(self.words)} sentences, {tokens} tokens" + (f" ({'; '.join(extra)})" if extra
                                                                                 else "")


def read_conll(path: Path, scheme: str = "bio", token_column: int = 0, skip_malformed: bool = False) -> Sentences:
    """Every sentence of a CoNLL column file, every tag checked against ``scheme``."""
    path = Path(path)
    lines = read_lines(path)
    out = Sentences(path)
    words: list[str] = []
    tags: list[str] = []
    first = 0

    def flush():
        nonlocal words, tags
        if words:
            out.words.append(words)
            out.tags.append(tags)
            out.lines.append(first)
        words, tags = [], []

    for number, line in enumerate(lines, start=1):
        cols = [c for c in _ASCII_SPACE.split(line) if c]
        if not cols:
            flush()
            continue
        if cols[0] == "-DOCSTART-":
            out.docstarts += 1
            flush()
            continue
        problem = None
        if len(cols) < 2 or len(cols) <= token_column:
            problem = (f"{len(cols)} column(s); expected the token in column {token_column} and the tag last "
                       "(separated by ASCII spaces or tabs)")
        else:
            problem = check_tag(cols[-1], scheme)
            if problem:
                problem += " (set task.scheme to the files' scheme: bio, iob1 or bioes)"
        if problem:
            if skip_malformed:
                out.skipped.append(number)
                continue
            raise TaskDataError(f"{path}:{number}: {problem}; fix the line, or set task.skip_malformed: true to skip "
                                "and count such lines")
        if not words:
            first = number
        words.append(cols[token_column])
        tags.append(cols[-1])
    flush()
    if not out.words:
        raise TaskDataError(f"{path}: no sentences (an empty split cannot train or evaluate)")
    return out


@dataclass
class EncodedTags:
    ids: list[list[int]]
    types: list[list[int]]
    labels: list[list[int]]
    """Per token: the word's label id on its first sub-token, -100 elsewhere."""
    first: list[list[int]]
    """Per sentence: the token position of each word's first sub-token, -1 for a word cut or tokenized to nothing."""
    gold: list[list[str]]
    cut_sentences: int = 0
    """Sentences cut at the sequence length (``encode_tags``)."""
    cut_words: int = 0
    cut_entities: int = 0
    """Gold entities (conlleval chunks) with at least one word cut: they count as missed."""
    words: list[list[str]] = field(default_factory=list)
    """The sentences' words (the prediction file's first column)."""


def word_pieces(tokenizer, words: list[str]) -> list[list[int]]:
    bbpe = getattr(tokenizer, "kind", "") == "bbpe"
    texts = [(" " + w) if bbpe else w for w in words]
    enc = getattr(tokenizer, "encode_batch", None)
    return [list(x) for x in (enc(texts) if enc else [tokenizer.encode(t) for t in texts])]


def encode_tags(tokenizer, split: Sentences, label_ids: dict[str, int], max_len: int) -> EncodedTags:
    """[CLS] words [SEP], cut before the first word whose sub-tokens do not fit: that word and every later one get
    position -1 (a word cut out of the middle would join its neighbours into one entity), and are counted."""
    out = EncodedTags([], [], [], [], [])
    for words, tags in zip(split.words, split.tags):
        ids, labels, first = [tokenizer.cls_id], [IGNORE], []
        for pieces, tag in zip(word_pieces(tokenizer, words), tags):
            if len(ids) + len(pieces) > max_len - 1:
                break
            first.append(len(ids) if pieces else -1)
            ids += pieces
            labels += ([label_ids[tag]] + [IGNORE] * (len(pieces) - 1)) if pieces else []
        if len(first) < len(words):
            out.cut_sentences += 1
            out.cut_words += len(words) - len(first)
            out.cut_entities += sum(1 for _, end, _ in chunks(tags) if end >= len(first))
            first += [-1] * (len(words) - len(first))
        ids.append(tokenizer.sep_id)
        labels.append(IGNORE)
        out.ids.append(ids)
        out.types.append([0] * len(ids))
        out.labels.append(labels)
        out.first.append(first)
        out.gold.append(tags)
        out.words.append(words)
    return out


def cut_warning(path, data: EncodedTags, max_len: int) -> str | None:
    """The line that says how much of a split the sequence length cut (None: nothing)."""
    if not data.cut_sentences:
        return None
    return (f"{path}: {data.cut_sentences} of {len(data.ids)} sentences cut at {max_len} tokens ({data.cut_words} "
            f"words predicted O, {data.cut_entities} gold entities lose words and count as missed); raise "
            "train.max_seq_length (ERNIE used 256 for MSRA-NER)")


class NerKind(TaskKind):
    name = "ner"
    metrics = ("f1", "precision", "recall", "accuracy")
    head = "token"

    def __init__(self, task_cfg):
        super().__init__(task_cfg)
        self.labels: list[str] = []

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def read(self, data_dir):
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise TaskDataError(f"--data {data_dir}: no such folder (a folder with train.txt and dev.txt)")
        missing = [FILES[s] for s in ("train", "dev") if not (data_dir / FILES[s]).is_file()]
        if missing:
            raise TaskDataError(f"task ner: {data_dir} lacks {missing} (CoNLL layout: train.txt, dev.txt, optional "
                                "test.txt)")
        t = self.cfg
        splits = {s: read_conll(data_dir / f, t.scheme, t.token_column, t.skip_malformed) for s, f in FILES.items()
                  if (data_dir / f).is_file()}
        tags = {tag for sp in splits.values() for sent in sp.tags for tag in sent}
        self.labels = ["O"] + sorted(tags - {"O"})
        return splits

    def encode(self, tokenizer, split, max_len, family, types):
        from trainer.log import warn0
        data = encode_tags(tokenizer, split, {t: i for i, t in enumerate(self.labels)}, max_len)
        if (warning := cut_warning(split.path, data, max_len)) is not None:
            warn0(warning)
        return data

    def collate(self, data, idx, pad_id):
        ids = pad_rows([data.ids[i] for i in idx], pad_id)
        return {"input_ids": ids, "attention_mask": (pad_rows([[1] * len(data.ids[i]) for i in idx], 0, ids.shape[1])),
                "token_type_ids": pad_rows([data.types[i] for i in idx], 0, ids.shape[1]),
                "labels": pad_rows([data.labels[i] for i in idx], IGNORE, ids.shape[1]),
                "index": torch.tensor(idx)}

    def loss(self, model, batch):
        logits = run_model(model, batch).float()
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)

    def outputs(self, model, batch):
        pred = run_model(model, batch).argmax(-1).tolist()
        return [row for row in pred]

    def predictions(self, outputs, data):
        """Each sentence's predicted tag per word (``O`` for a word cut at the sequence length)."""
        return [[self.labels[row[p]] if p >= 0 else "O" for p in first] for row, first in zip(outputs, data.first)]

    def score(self, outputs, data):
        return evaluate(data.gold, self.predictions(outputs, data), self.types)

    def write_predictions(self, predictions, data, folder, split):
        from trainer.finetune.predictions import write_conll
        words = data.words or [[f"w{i}" for i in range(len(g))] for g in data.gold]
        return [write_conll(folder / "predictions.txt", words, data.gold, predictions)]

    @property
    def types(self) -> list[str]:
        """The entity types of the label set (every split's tags): each run reports ``f1_<TYPE>`` for all of them."""
        return sorted({split_tag(t)[1] for t in self.labels if t != "O"})
