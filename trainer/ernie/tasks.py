"""ERNIE 2.0 pretraining tasks as pure labelers: token ids / sentence indices in, model inputs and labels out.

Word-aware: capitalization prediction (per token), token-document relation (per token). Structure-aware: sentence
reordering (k = sum_{n=1..m} n! classes), sentence distance (3 classes: adjacent, same document, other document). Semantic-aware: discourse relation and IR
relevance from user-supplied labelled jsonl (``PairTaskFile``). Each function is deterministic given its ``rng``, so a
sample stays a pure function of (seed, epoch, index); labels use -100 where a position has no label (the value torch's
cross-entropy ignores). Task ids for ERNIE 2.0's task embeddings are the order of ``TASKS``.
"""
from __future__ import annotations

import json
import math
from itertools import permutations
from pathlib import Path
from typing import Sequence

import numpy as np

from trainer.ernie.config import TASKS

# Task embedding ids (the ``task`` extra embedding). Order is part of checkpoints: append, never reorder.
TASK_ID = {name: i for i, name in enumerate(TASKS)}
IGNORE = -100

# --- capitalization ------------------------------------------------------------------------------------------------


def capitalization_tables(tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """From a *cased* vocabulary: ``lower_id`` [V] (the id of the token's lower-cased spelling, itself when that is
    not in the vocabulary) and ``capital`` [V] bool (the token's first letter is upper-case).

    The model reads lower-cased ids and predicts the case, which is how ERNIE 2.0 gives an uncased model the cased
    model's knowledge; only a share of the rows is lower-cased (``Ernie2Options.capitalization_lowercase_share``), so
    the model also reads cased text, as fine-tuning gives it. WordPiece's ``##`` and byte-level BPE's ``Ġ`` / SentencePiece's ``▁`` prefixes are skipped
    when looking for the first letter. Example: ["[CLS]", "Paris", "paris", "##Ab"] -> lower_id [0, 2, 2, 3],
    capital [F, T, F, T].
    """
    index = {t: i for i, t in enumerate(tokens)}
    lower_id = np.arange(len(tokens), dtype=np.int64)
    capital = np.zeros(len(tokens), bool)
    for i, tok in enumerate(tokens):  # once per vocabulary (~30k entries, ~20 ms), then table lookups
        if tok.startswith("[") and tok.endswith("]"):
            continue
        body = tok[2:] if tok.startswith("##") else tok.lstrip("Ġ▁")
        prefix = tok[:len(tok) - len(body)]  # not lower-cased itself: "Ġ".lower() is "ġ", another token
        capital[i] = bool(body) and body[0].isupper()
        lower_id[i] = index.get(prefix + body.lower(), i)
    return lower_id, capital


def case_revealing(tokens: Sequence[str]) -> np.ndarray:
    """Bool [V]: the token's spelling has an upper-case letter (past its ``##`` / ``Ġ`` / ``▁`` prefix). Looked up at
    a lower-cased row's ids, it marks the tokens that kept their case because the vocabulary has no lower-case twin
    ("NASA" without "nasa"): their word's capitalization label can be read from the input."""
    out = np.zeros(len(tokens), bool)
    for i, tok in enumerate(tokens):
        if tok.startswith("[") and tok.endswith("]"):
            continue
        body = tok[2:] if tok.startswith("##") else tok.lstrip("Ġ▁")
        out[i] = any(ch.isupper() for ch in body)
    return out


def capitalization_labels(ids: np.ndarray, candidate: np.ndarray, word_start: np.ndarray,
                          lower_id: np.ndarray, capital: np.ndarray, revealing: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Per token of a row/batch ``[..., T]``: (lower-cased ids, label 1 if the token's word is capitalized, 0 if
    not, -100 for special/pad). Continuation pieces take their word's label, so "Pa ##ris" is 1 1.

    ``revealing`` (``case_revealing`` of the vocabulary): a word any of whose pieces still shows an upper-case letter
    after lower-casing gets -100 on every piece, so no label is one the model can copy from its input ("NASA" with
    no "nasa" in the vocabulary stays "NASA": about 1.3 % of English tokens)."""
    ids = np.asarray(ids)
    starts = word_start.astype(bool) | ~candidate
    idx = np.where(starts, np.arange(ids.shape[-1]), 0)
    first = np.maximum.accumulate(idx, axis=-1)  # position of each token's word start
    cap = np.take_along_axis(capital[ids], first, axis=-1)
    lowered = lower_id[ids]
    labels = np.where(candidate, cap.astype(np.int64), IGNORE)
    if revealing is not None:
        T = ids.shape[-1]
        shows = (revealing[lowered] & candidate).reshape(-1, T)
        # word number of every token, unique over the whole batch: a word is hidden if any of its pieces shows case
        word = np.cumsum(starts.reshape(-1, T), axis=-1) + np.arange(shows.shape[0])[:, None] * (T + 1)
        hidden = np.bincount(word[shows], minlength=shows.shape[0] * (T + 1)) > 0
        labels = np.where(hidden[word].reshape(ids.shape), IGNORE, labels)
    return lowered, labels


# --- token-document relation -----------------------------------------------------------------------------------------


def token_document_labels(segment: np.ndarray, rest_of_document: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """1 where a token of ``segment`` also occurs in the other segments of its document, 0 where not, -100 for
    special tokens. Example: segment [7, 8, 9], rest [9, 3, 7] -> [1, 0, 1]."""
    hit = np.isin(segment, rest_of_document)
    return np.where(candidate, hit.astype(np.int64), IGNORE)


# --- sentence reordering ---------------------------------------------------------------------------------------------


def num_reorder_classes(max_pieces: int) -> int:
    """k = 1! + 2! + ... + m! (m = 3: 9 classes, m = 4: 33)."""
    return sum(math.factorial(n) for n in range(1, max_pieces + 1))


def permutation_class(perm: Sequence[int]) -> int:
    """Class of a permutation of n pieces: sum_{j<n} j! plus its lexicographic rank among the n! permutations.

    ``perm[i]`` is the original index of the piece shown at position i. Example: (0,) -> 0; (0, 1) -> 1; (1, 0) -> 2;
    (0, 1, 2) -> 3; (2, 1, 0) -> 8."""
    n = len(perm)
    rank, remaining = 0, sorted(perm)
    if remaining != list(range(n)):
        raise ValueError(f"{list(perm)} is not a permutation of 0..{n - 1}")
    for i, p in enumerate(perm):  # Lehmer code: at most m = 4 or 5 pieces
        j = remaining.index(p)
        rank += j * math.factorial(n - 1 - i)
        remaining.pop(j)
    return num_reorder_classes(n - 1) + rank


def class_permutation(label: int, max_pieces: int) -> tuple[int, ...]:
    """Inverse of ``permutation_class``."""
    for n in range(1, max_pieces + 1):
        if label < num_reorder_classes(n):
            rank = label - num_reorder_classes(n - 1)
            return next(p for i, p in enumerate(permutations(range(n))) if i == rank)
    raise ValueError(f"class {label} out of range for {max_pieces} pieces ({num_reorder_classes(max_pieces)} classes)")


def reorder_sample(sentences: Sequence[np.ndarray], max_pieces: int, rng: np.random.Generator
                   ) -> tuple[list[np.ndarray], int]:
    """Split a paragraph (consecutive sentences of one document, as token arrays) into n = 1..m pieces, shuffle them,
    return (pieces in shown order, class). n is uniform over what the paragraph allows; cuts fall on sentence
    boundaries when there are enough sentences, else anywhere between tokens; the permutation is uniform over n!."""
    tokens = np.concatenate([np.asarray(s) for s in sentences]) if len(sentences) else np.zeros(0, np.int64)
    if len(tokens) == 0:
        raise ValueError("sentence reordering needs a non-empty paragraph")
    n = int(rng.integers(1, min(max_pieces, len(tokens)) + 1))
    bounds = np.cumsum([len(s) for s in sentences])[:-1]
    bounds = bounds[(bounds > 0) & (bounds < len(tokens))]
    pool = np.unique(bounds) if len(np.unique(bounds)) >= n - 1 else np.arange(1, len(tokens))
    cuts = np.sort(rng.choice(pool, size=n - 1, replace=False)) if n > 1 else np.zeros(0, np.int64)
    pieces = np.split(tokens, cuts)
    perm = tuple(int(x) for x in rng.permutation(n))
    return [pieces[p] for p in perm], permutation_class(perm)


# --- sentence distance -----------------------------------------------------------------------------------------------

ADJACENT, SAME_DOCUMENT, OTHER_DOCUMENT = 0, 1, 2
# ERNIE 2.0 (Sun et al. 2020, "Sentence Distance Task") defines three classes: 0 the two sentences are adjacent in
# the same document, 1 they are in the same document but not adjacent, 2 they come from two different documents.
# Adjacent has no direction, so B right before A is class 0 as B right after A is, and the sampler draws both orders.


def sentence_distance_label(i: int, j: int, doc_of: np.ndarray) -> int:
    """0: A and B are adjacent sentences (either order); 1: same document, not adjacent; 2: different documents."""
    if doc_of[i] != doc_of[j]:
        return OTHER_DOCUMENT
    return ADJACENT if abs(j - i) == 1 else SAME_DOCUMENT


def sentence_distance_pair(i: int, doc_bounds: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int]:
    """Pick a partner for sentence ``i`` with a uniformly drawn class; returns (i, j, label).

    ``doc_bounds`` [D + 1]: sentence index where each document starts, then the total (the corpus index's layout).
    Adjacent partners are i - 1 or i + 1 with probability 1/2 each when both exist. When the drawn class is
    impossible for ``i`` (a one-sentence document; a document of <= 3 sentences around i; one document), the next
    possible class is used, and the label is always the true relation (``sentence_distance_label``)."""
    doc_bounds = np.asarray(doc_bounds)
    d = int(np.searchsorted(doc_bounds, i, side="right")) - 1
    start, stop, total = int(doc_bounds[d]), int(doc_bounds[d + 1]), int(doc_bounds[-1])
    lo, hi = max(start, i - 1), min(stop - 1, i + 1)  # i and its neighbours: the sentences class 1 must avoid
    neighbours = [k for k in (i - 1, i + 1) if lo <= k <= hi and k != i]
    others = (stop - start) - (hi - lo + 1)
    want = int(rng.integers(0, 3))
    for label in [want, (want + 1) % 3, (want + 2) % 3]:
        if label == ADJACENT and neighbours:
            j = neighbours[int(rng.integers(0, len(neighbours)))]
        elif label == SAME_DOCUMENT and others > 0:
            # any sentence of the document outside [lo, hi]: draw k among the others and skip over that block
            k = start + int(rng.integers(0, others))
            j = k if k < lo else k + (hi - lo + 1)
        elif label == OTHER_DOCUMENT and stop - start < total:
            k = int(rng.integers(0, total - (stop - start)))
            j = k if k < start else k + (stop - start)
        else:
            continue
        return i, j, label
    raise ValueError(f"sentence {i}: the corpus has a single one-sentence document; sentence distance needs more")


# --- discourse relation and IR relevance from user jsonl ------------------------------------------------------------


class PairTaskFile:
    """Labelled text pairs from a user's jsonl: ``{"text_a": ..., "text_b": ..., "label": L}`` per line.

    Discourse relation (ERNIE 2.0 uses discourse-marker classes) and IR relevance (query, title; 0 strong, 1 weak,
    2 irrelevant in the paper) both take this shape; ``labels`` fixes the class order (strings or ints as in the
    file). Pairs are tokenized once at load with the run's tokenizer (``encode``); at the scale of these labelled sets
    (millions of pairs at most) that fits in memory."""

    def __init__(self, path: str | Path, labels: Sequence, encode, keys: tuple[str, str] = ("text_a", "text_b")):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"labelled pair file {path} not found")
        self.labels = list(labels)
        label_index = {lab: i for i, lab in enumerate(self.labels)}
        self.a: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        ys = []
        texts_a, texts_b = [], []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    ta, tb, lab = rec[keys[0]], rec[keys[1]], rec["label"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{lineno}: expected {{\"{keys[0]}\": ..., \"{keys[1]}\": ..., "
                                     f"\"label\": ...}} ({e})") from None
                if lab not in label_index:
                    raise ValueError(f"{path}:{lineno}: label {lab!r} is not one of {self.labels}; "
                                     "list every class in the task's `labels`")
                texts_a.append(str(ta))
                texts_b.append(str(tb))
                ys.append(label_index[lab])
        if not ys:
            raise ValueError(f"{path} has no labelled pairs")
        self.a = [np.asarray(x, np.int64) for x in _encode_all(encode, texts_a)]
        self.b = [np.asarray(x, np.int64) for x in _encode_all(encode, texts_b)]
        self.y = np.asarray(ys, np.int64)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        return self.a[k], self.b[k], int(self.y[k])


def _encode_all(encode, texts: list[str]) -> list[list[int]]:
    batch = getattr(encode, "__self__", None)
    if batch is not None and hasattr(batch, "encode_batch"):
        return batch.encode_batch(texts)
    return [encode(t) for t in texts]


def pair_row(a: np.ndarray, b: np.ndarray, max_len: int, cls_id: int, sep_id: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] a [SEP] b [SEP]`` truncated to ``max_len`` (the longer side loses tokens first, as BERT's
    ``truncate_seq_pair``) -> (input_ids, token_type_ids)."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_len - 3:
        (a if len(a) >= len(b) else b).pop()
    ids = [cls_id] + a + [sep_id] + b + [sep_id]
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    return np.asarray(ids, np.int64), np.asarray(types, np.int64)
