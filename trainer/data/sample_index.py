"""The sample index: sample id -> the sentence ranges it is built from, computed once and cached on disk.

A *chunk* is a contiguous sentence range ``[start, end)`` with a target length; a *sample* (one row of a batch) is
one chunk, or for packed doc-sentences several chunks of different documents. Arrays (all int64):

    chunks   [C, 3]  (start_sentence, end_sentence, target_tokens)
    row_ptr  [N + 1] sample i is chunks[row_ptr[i] : row_ptr[i + 1]]

Worked example, budget 10 tokens, ``full-sentences`` (a separator after each document's last sentence counts as a
token), sentence lengths ``[4, 3, 5 | 6, 2]`` (``|`` = document end): costs ``[4, 3, 6, 6, 3]``; greedy filling
gives chunks ``[0, 2)`` (7 tokens, adding sentence 2 would make 13) and ``[2, 4)`` (12 > 10: one sentence at least,
so ``[2, 3)``), then ``[3, 5)``. With ``doc-sentences`` the same walk stops at the document end instead.

Why our own walk and not megatron-core's ``helpers.build_mapping``: that one silently drops every document holding a
sentence longer than 512 tokens (line-per-paragraph corpora lose most of their text), cannot cross documents
(full-sentences) and shuffles the result (our order lives in ``order.py``, per epoch). The walk is vectorised
except for one Python step per *sample* (not per sentence or token): ~0.2 µs each, ~20 s for 100M samples, once.
Building holds ~64 bytes per sentence of int64 work arrays at its peak (a 2B-sentence corpus: ~130 GB), so split a
corpus that large into several prepared corpora and blend them.

Each sample's target length is a pure function of its start sentence (short with probability ``short_seq_prob``,
drawn from a generator seeded by the index seed), so the index depends only on the settings hashed into its name.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpus import IndexedCorpus

INDEX_VERSION = 1
WITHIN_DOCUMENT = ("segment-pair", "sentence-pair", "doc-sentences", "sop-pair")


@dataclass
class SampleIndex:
    chunks: np.ndarray
    row_ptr: np.ndarray

    def __len__(self) -> int:
        return len(self.row_ptr) - 1

    def sample_chunks(self, i: int) -> np.ndarray:
        return self.chunks[self.row_ptr[i]:self.row_ptr[i + 1]]


def content_budget(fmt: str, max_seq_length: int) -> int:
    """Tokens available to sentences: T minus [CLS] and one [SEP] per segment."""
    return max_seq_length - (3 if fmt in ("segment-pair", "sentence-pair", "sop-pair") else 2)


def index_settings(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, seed: int,
                   pack: bool) -> dict:
    """Everything the index depends on; its hash names the cache files."""
    return {"version": INDEX_VERSION, "corpus": corpus.fingerprint(), "format": fmt,
            "max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "seed": seed,
            "pack": bool(pack and fmt == "doc-sentences")}


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def load_or_build(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, seed: int,
                  pack: bool, cache_dir: str | os.PathLike) -> SampleIndex:
    """The cached index, built by the first process to get the lock (others wait, then map the files).

    Safe when every rank of every node calls it at once on a shared filesystem with working ``flock``; files are
    written under a temporary name and renamed, so a killed build never leaves a file that looks finished.
    """
    settings = index_settings(corpus, fmt, max_seq_length, short_seq_prob, seed, pack)
    key = settings_hash(settings)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    paths = {name: cache / f"{key}-{fmt}-{name}.npy" for name in ("chunks", "row_ptr")}
    if not all(p.exists() for p in paths.values()):
        with open(cache / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another process builds the same index
            if not all(p.exists() for p in paths.values()):
                index = build_index(corpus, fmt, max_seq_length, short_seq_prob, seed, pack)
                (cache / f"{key}-description.json").write_text(json.dumps(settings, indent=1, sort_keys=True))
                for name, path in paths.items():
                    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
                    np.save(tmp, getattr(index, name))
                    os.replace(tmp, path)
    # plain ndarray views of the maps: numpy.memmap's per-slice __getitem__/__array_finalize__ cost ~10 µs a sample
    return SampleIndex(*(np.load(paths[name], mmap_mode="r").view(np.ndarray) for name in ("chunks", "row_ptr")))


def build_index(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, seed: int,
                pack: bool = True) -> SampleIndex:
    lengths = corpus.sentence_lengths.astype(np.int64)
    num_sentences = len(lengths)
    budget = content_budget(fmt, max_seq_length)
    if budget < 2:
        raise ValueError(f"data.max_seq_length={max_seq_length} leaves {budget} tokens for text; use at least 8")
    doc_of = corpus.document_of(np.arange(num_sentences))
    doc_end = corpus.doc_starts[doc_of + 1]

    cost = lengths.copy()
    if fmt == "full-sentences":
        cost[doc_end - 1] += 1  # the separator RoBERTa puts after a document's last sentence
    cum = np.concatenate([[0], np.cumsum(cost)])

    rng = np.random.Generator(np.random.PCG64(seed))
    target = np.full(num_sentences, budget, np.int64)
    short = rng.random(num_sentences) < short_seq_prob
    target[short] = rng.integers(2, budget + 1, size=int(short.sum()))

    starts = np.arange(num_sentences)
    min_sent = 2 if fmt in ("segment-pair", "sop-pair") else 1
    if fmt == "sentence-pair":
        nxt = starts + 2
    else:
        fit = np.searchsorted(cum, cum[:-1] + target, side="right") - 1  # last e with cost(s..e) <= target
        nxt = np.maximum(fit, starts + min_sent)
    if fmt in WITHIN_DOCUMENT:
        nxt = np.minimum(nxt, doc_end)
        # A remainder too small to make a sample of its own joins this one (BERT keeps a document's tail).
        tail = doc_end - nxt
        nxt = np.where((tail > 0) & (tail < max(min_sent, 2 if fmt == "sentence-pair" else 1)), doc_end, nxt)
    nxt = np.minimum(nxt, num_sentences)

    chunk_starts = _walk(nxt, num_sentences)
    chunk_ends = nxt[chunk_starts]
    n_sent = chunk_ends - chunk_starts
    tokens = cum[chunk_ends] - cum[chunk_starts]
    keep = tokens > 0
    if fmt in ("segment-pair", "sop-pair", "sentence-pair"):
        keep &= n_sent >= 2  # a pair needs two sentences (single-sentence documents cannot make one)
    chunks = np.stack([chunk_starts, chunk_ends, target[chunk_starts]], axis=1)[keep].astype(np.int64)
    if len(chunks) == 0:
        raise ValueError(
            f"{corpus.prefix}: no '{fmt}' sample can be built ({corpus.num_documents} documents, "
            f"{num_sentences} sentences); pair formats need documents of two or more sentences")
    if fmt == "doc-sentences" and pack:
        return _pack(chunks, np.minimum(tokens[keep], budget) + 2, max_seq_length)
    return SampleIndex(chunks, np.arange(len(chunks) + 1, dtype=np.int64))


def _walk(nxt: np.ndarray, end: int) -> np.ndarray:
    """Start sentences of the chain 0 -> nxt[0] -> ...; one Python step per sample (see the module docstring).
    ``ndarray.item`` and a typed ``array`` keep memory at 8 bytes per sample (a ``tolist()`` of the sentences
    would hold ~30 bytes per *sentence* as Python ints)."""
    out, s, step = array("q"), 0, nxt.item
    while s < end:
        out.append(s)
        s = step(s)
    return np.frombuffer(out, dtype=np.int64).copy()


def _pack(chunks: np.ndarray, row_tokens: np.ndarray, max_seq_length: int) -> SampleIndex:
    """Next-fit packing of short doc-sentences samples into rows of at most ``max_seq_length`` tokens.

    Samples longer than half a row stay alone (they rarely pair up); the short ones, mostly document tails that
    follow each other in corpus order, share rows. One Python step per short sample.
    """
    long_rows = row_tokens * 2 > max_seq_length
    order, ptr = [], [0]
    open_row: list[int] = []
    open_tokens = 0
    is_long_at, tokens_at = long_rows.item, row_tokens.item
    for i in range(len(row_tokens)):
        is_long, n = is_long_at(i), tokens_at(i)
        if is_long:
            order.append(i)
            ptr.append(len(order))
            continue
        if open_tokens + n > max_seq_length:
            order.extend(open_row)
            ptr.append(len(order))
            open_row, open_tokens = [], 0
        open_row.append(i)
        open_tokens += n
    if open_row:
        order.extend(open_row)
        ptr.append(len(order))
    return SampleIndex(chunks[np.asarray(order, dtype=np.int64)], np.asarray(ptr, dtype=np.int64))
