"""The held-out split (``data.valid_split``): whole documents taken out of the training stream by a keyed hash.

Document ``j`` (numbered within its shard) of the shard named ``NAME`` (its file name, e.g. ``wiki_00003``) is held
out when ``u(NAME, j) < valid_split``, where ``u`` is splitmix64 of ``shard_key(NAME) + j * golden`` read as a number
in [0, 1) and ``shard_key`` is a BLAKE2b hash of the name and ``HELDOUT_KEY``. The split is a pure function of the
shard names and document numbers: the same at any world size, on every rank and worker, across resumes and training
seeds, and a corpus extended by new shards keeps the split of its old ones. Nothing is stored per document: the
sample index walks the chosen documents only (sample_index.py), and a training NSP negative redraws its other
document while the draw is held out (formats.py, ``O(1)`` per draw: fewer than 2 draws on average at < 0.5).

Example: ``valid_split: 0.005`` holds out about 1 document in 200; the training index never reads them, the
held-out index reads only them, and evaluation reads a fixed shuffled set of the held-out samples (pretrain.py).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .order import mix64, mix64_many

HELDOUT_KEY = b"bertfamily-valid-split-1"
"""Fixed: changing it changes every corpus's split (and keys new indexes through the code hash)."""
_GOLDEN = 0x9E3779B97F4A7C15
ROLES = ("train", "heldout")
"""Which documents a sample index reads: the kept ones (training) or the held-out ones (evaluation)."""


def shard_key(shard_prefix: str) -> int:
    """The shard's 64-bit key: a hash of its file name (not its folder, so a moved corpus keeps its split)."""
    digest = hashlib.blake2b(Path(shard_prefix).name.encode(), digest_size=8, key=HELDOUT_KEY).digest()
    return int.from_bytes(digest, "little")


def held_out_mask(key: int, documents: int, fraction: float) -> np.ndarray:
    """bool [documents]: which documents of the shard with ``key`` are held out (8 bytes per document while it runs:
    one shard's documents, never the corpus's)."""
    if fraction <= 0 or documents == 0:
        return np.zeros(documents, bool)
    j = np.arange(documents, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = mix64_many(j * np.uint64(_GOLDEN) + np.uint64(key))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < fraction


def held_out_one(key: int, document: int, fraction: float) -> bool:
    """``held_out_mask(key, ...)[document]`` for one document (the scalar twin, checked against it in the tests)."""
    if fraction <= 0:
        return False
    h = mix64((key + document * _GOLDEN) & ((1 << 64) - 1))
    return (h >> 11) * 2.0 ** -53 < fraction


class DocumentSplit:
    """``held_out(global document)`` of one corpus in O(1) memory per shard (the shard's key and first document)."""

    def __init__(self, corpus, fraction: float):
        self.fraction = float(fraction)
        self.keys = [shard_key(prefix) for prefix, _, _ in corpus.shards]
        # documents per shard come from the shards' .idx headers, read when the corpus was opened
        self.first_docs = np.concatenate([[0], np.cumsum(corpus._shard_docs)]).astype(np.int64)

    def held_out(self, document: int) -> bool:
        k = int(np.searchsorted(self.first_docs, document, side="right") - 1)
        return held_out_one(self.keys[k], int(document - self.first_docs[k]), self.fraction)
