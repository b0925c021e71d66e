"""Read a prepared corpus: ``PREFIX.manifest.json`` plus megatron-core indexed shards, as one sentence/document space.

Shards are opened with megatron-core's ``IndexedDataset`` (the ``.idx``: lengths, documents); a shard's tokens are
memory-mapped the first time a sentence in it is read, so a process that only needs the index arrays (rank 0
building the sample index) never maps the token files, and a DataLoader worker maps its own after fork.

Global numbering concatenates the shards in manifest order:

    shard 0: documents [0, D0), sentences [0, S0)
    shard 1: documents [D0, D0 + D1), sentences [S0, S0 + S1)

``doc_starts`` has ``num_documents + 1`` entries (like megatron's ``document_indices``); document ``d`` holds
sentences ``[doc_starts[d], doc_starts[d + 1])``. Sentences of one shard are contiguous in its ``.bin``, so any
sentence range inside a shard is one mmap slice: ``read(s, e)`` costs one read per shard it touches.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.manifest import manifest_path, read_manifest

@dataclass
class _Shard:
    prefix: str
    first_sentence: int
    tokens: np.ndarray | None = None  # the .bin as a flat token array (mmap), opened on first read


class IndexedCorpus:
    """Documents and sentences of one prepared corpus (all its shards).

    ``sentence_lengths`` (int32) and ``doc_starts`` (int64) are whole-corpus numpy arrays built from the ``.idx``
    files alone: 12 bytes per sentence in memory (a 40B-token corpus of ~2B sentences: ~24 GB; past that size,
    build the sample index once and keep only it).
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = str(prefix)
        self.manifest = read_manifest(prefix)
        root = manifest_path(prefix).parent
        self._shards: list[_Shard] = []
        lengths, doc_starts = [], [np.zeros(1, np.int64)]
        first = 0
        for spec in self.manifest["shards"]:
            shard_prefix = str(root / spec["prefix"])
            ds = _open(shard_prefix)
            # copies: the arrays are views of the .idx map, which closes when ds goes
            seq = np.array(ds.sequence_lengths, dtype=np.int32)
            docs = np.array(ds.document_indices, dtype=np.int64)
            if "sentences" in spec and spec["sentences"] != len(seq):
                raise ValueError(
                    f"{shard_prefix}.idx holds {len(seq)} sentences but the manifest says {spec['sentences']}: "
                    "the shard was rewritten after the manifest; rebuild the corpus"
                )
            lengths.append(seq)
            doc_starts.append(docs[1:] + first)
            self._shards.append(_Shard(shard_prefix, first))
            first += len(seq)
            del ds  # the token file is mapped again lazily, in the process that reads it
        self.sentence_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
        self.token_offsets = np.zeros(len(self.sentence_lengths) + 1, np.int64)  # sentence s starts at [s]
        np.cumsum(self.sentence_lengths, out=self.token_offsets[1:])
        self.doc_starts = np.concatenate(doc_starts)
        self._shard_starts = np.array([s.first_sentence for s in self._shards] + [first], dtype=np.int64)
        self.vocab_size = int((self.manifest.get("tokenizer") or {}).get("vocab_size", 0)) or None

    # -- sizes -----------------------------------------------------------------------------------------------------
    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_lengths)

    def fingerprint(self) -> dict:
        """What identifies this corpus's content for cache keys: shard checksums if the manifest has them."""
        shards = [(s.get("prefix"), s.get("bin_sha256"), s.get("idx_sha256"), s.get("tokens")) for s in
                  self.manifest["shards"]]
        return {"shards": shards, "sentences": self.num_sentences, "documents": self.num_documents}

    def document_of(self, sentences: np.ndarray | int) -> np.ndarray:
        """Document index of each global sentence index (vectorised binary search)."""
        return np.searchsorted(self.doc_starts, sentences, side="right") - 1

    # -- reading ---------------------------------------------------------------------------------------------------
    def read(self, start: int, end: int) -> np.ndarray:
        """Tokens of sentences ``[start, end)`` concatenated (int32; one slice of a shard's map per shard touched)."""
        k = int(np.searchsorted(self._shard_starts, start, side="right") - 1)
        pieces = []
        offsets = self.token_offsets
        while start < end:
            shard = self._shards[k]
            stop = min(end, int(self._shard_starts[k + 1]))
            tokens = shard.tokens if shard.tokens is not None else self._map(shard, k)
            base = offsets[shard.first_sentence]
            pieces.append(tokens[offsets[start] - base:offsets[stop] - base])
            start, k = stop, k + 1
        if len(pieces) == 1:
            return pieces[0].astype(np.int32)
        return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)

    def _map(self, shard: _Shard, k: int) -> np.ndarray:
        """The shard's .bin as one token array. megatron-core's builder writes sequences back to back, so sentence s
        starts at token ``token_offsets[s]`` of its shard; checked once against the .idx pointers, because a slice
        of one array costs ~1 µs where ``IndexedDataset.get`` costs ~20 µs a call."""
        ds = _open(shard.prefix)
        itemsize = np.dtype(ds.index.dtype).itemsize
        lo, hi = shard.first_sentence, int(self._shard_starts[k + 1])
        expected = (self.token_offsets[lo:hi] - self.token_offsets[lo]) * itemsize
        if not np.array_equal(np.asarray(ds.index.sequence_pointers, dtype=np.int64), expected):
            raise ValueError(f"{shard.prefix}.bin does not hold its sentences back to back as the .idx pointers "
                             "say; it was not written by megatron-core's IndexedDatasetBuilder: rebuild the corpus")
        if self.token_offsets[hi] == self.token_offsets[lo]:
            shard.tokens = np.zeros(0, ds.index.dtype)  # numpy cannot map an empty file
        else:
            shard.tokens = np.memmap(shard.prefix + ".bin", dtype=ds.index.dtype, mode="r").view(np.ndarray)
        return shard.tokens

    def __getstate__(self):
        # Workers re-open their own maps: a mapped file does not survive pickling to a spawned process.
        state = dict(self.__dict__)
        state["_shards"] = [_Shard(s.prefix, s.first_sentence) for s in self._shards]
        return state


def _open(shard_prefix: str):
    for suffix in (".bin", ".idx"):
        if not os.path.exists(shard_prefix + suffix):
            raise FileNotFoundError(f"{shard_prefix}{suffix} is missing: the manifest lists it; rebuild the corpus")
    # Imported here: megatron.core takes seconds to import and only readers need it.
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: PLC0415

    return IndexedDataset(shard_prefix)
