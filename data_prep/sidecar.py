"""The ERNIE span side-car: one span file per shard, its writer and its reader, and moving spans into samples.

ERNIE 1.0's phrase- and entity-level masking needs, for every sequence in the shards, which token ranges form a
phrase or a named entity. They are computed once at data-prep time and stored beside each shard:

``PREFIX_00000.spans.npy``  int32 ``[M, 4]`` rows ``(sequence, token_start, token_end, kind)``, ``token_end``
                            exclusive, ``sequence`` the index of the sequence (sentence) inside the shard, exactly as
                            megatron-core's ``IndexedDataset(PREFIX_00000)[sequence]`` numbers them; ``kind`` 0 =
                            entity, 1 = phrase. Rows sorted by (sequence, token_start). Opened with ``mmap_mode="r"``.
``PREFIX_00000.spans.ptr.npy`` int64 ``[N + 1]`` row pointers: the spans of sequence ``s`` are rows
                            ``ptr[s]:ptr[s + 1]``. Written at annotation time and memory-mapped, so a reader holds
                            nothing per sequence (side-cars written before it existed get it on first open:
                            ``SidecarReader``).
``PREFIX_00000.spans.json`` ``{"format": "bertfamily-spans", "version": 1, "annotator": SPEC, "sequences": N,
                            "spans": M, "kinds": ["entity", "phrase"], "row_pointers": "NAME.spans.ptr.npy",
                            "lengths_sha256": H, "bin_sha256": B, "stats": {...}}``; written last, so its presence
                            marks a complete side-car. ``lengths_sha256`` is the sha256
                            of the token count of every sequence (int64, little-endian, in order) the spans were made
                            for: the reader compares it with the shard's ``.idx``, so a side-car left beside a shard
                            rebuilt with another tokenizer (same sentence count, other tokens) is refused instead of
                            masking the wrong tokens. ``bin_sha256`` is the sha256 of the shard's ``.bin`` the spans
                            were made from (the manifest's ``bin_sha256`` of that shard): token counts do not identify
                            the text (a shard rebuilt from the same text converted to simplified characters has the
                            same counts and other ids), the checksum does. Side-cars written before 2026-12-06 lack
                            it: the trainer refuses them and ``python -m data_prep.annotate --keep-complete``
                            spot-checks and keys them (data_prep/annotate.py ``complete_sidecars``) or re-annotates
                            them.

Spans never cross a sequence boundary (a sample is built from whole sequences, so such a span could not be masked
whole anyway). Spans of one kind do not overlap; an entity and a phrase may. The hook for ``build_indexed.py``
(annotators: data_prep/annotators.py):

    annotator = DocumentAnnotator(make_annotator("jieba"), tokenizer_dir)  # once per process (data_prep.annotators)
    writer = SidecarWriter(shard_prefix, annotator)              # beside each shard's IndexedDatasetBuilder
    writer.add_document(sentences, ids_per_sentence)             # with every document added to the shard
    writer.finalize()                                            # when the shard is finalized

The trainer only reads (``SidecarReader``, ``place_spans``). This module imports no annotator code: the writer is
handed its annotator, and ``data_prep/annotators.py`` imports the span kinds from here.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

KINDS = ("entity", "phrase")
ENTITY, PHRASE = 0, 1
FORMAT = "bertfamily-spans"
VERSION = 1
PTR_SUFFIX = ".spans.ptr.npy"


def _dedupe_kind_overlaps(spans: np.ndarray) -> np.ndarray:
    """Sort by (start, kind) and drop a span overlapping an earlier one of its kind (keeps the format's promise)."""
    if len(spans) < 2:
        return spans
    spans = spans[np.lexsort((-spans[:, 1], spans[:, 0], spans[:, 2]))]
    keep = np.ones(len(spans), bool)
    last_end = {ENTITY: -1, PHRASE: -1}
    for i, (s, e, k) in enumerate(spans.tolist()):  # k spans per sentence, a handful: a loop is cheapest here
        if s < last_end[k]:
            keep[i] = False
        else:
            last_end[k] = e
    spans = spans[keep]
    return spans[np.lexsort((spans[:, 2], spans[:, 0]))]


class SidecarWriter:
    """Writes ``SHARD.spans.npy`` and ``SHARD.spans.json`` atomically (temporary names, then ``os.replace``)."""

    def __init__(self, shard_prefix: str | Path,
                 annotator: Callable[[Sequence[str], Sequence[Sequence[int]] | None], list[np.ndarray]] | None = None,
                 spec: str | None = None):
        """``annotator``: a ``data_prep.annotators.DocumentAnnotator`` (sentences of a document -> token spans per
        sentence), for ``add_document``; without it only ``add_document_spans`` works."""
        self.prefix = str(shard_prefix)
        self.spec = spec or (annotator.annotator.spec if annotator is not None else "external")
        self._doc = annotator
        self._chunks: list[np.ndarray] = []
        self._sequences = 0
        self._lengths = hashlib.sha256()  # of every sequence's token count, while all callers give them
        self._lengths_known = True
        self.stats: Counter = Counter()

    def add_document(self, sentences: Sequence[str], ids_per_sentence: Sequence[Sequence[int]] | None = None):
        """The sentences of one document as build_indexed adds them; sentences with no tokens are skipped, as
        build_indexed skips them (they never become sequences)."""
        if self._doc is None:
            raise RuntimeError("SidecarWriter was made without an annotator; use add_document_spans")
        if ids_per_sentence is not None:
            keep = [i for i, ids in enumerate(ids_per_sentence) if len(ids)]
            sentences = [sentences[i] for i in keep]
            ids_per_sentence = [ids_per_sentence[i] for i in keep]
        lengths = None if ids_per_sentence is None else [len(ids) for ids in ids_per_sentence]
        self.add_document_spans(self._doc(sentences, ids_per_sentence), lengths)

    def add_document_spans(self, spans_per_sentence: Sequence[np.ndarray], lengths: Sequence[int] | None = None):
        """One ``[k, 3]`` array (token_start, token_end, kind) per sequence, in the order they enter the shard;
        ``lengths``: each sequence's token count (recorded as ``lengths_sha256``; without it, none is recorded)."""
        if lengths is None or len(lengths) != len(spans_per_sentence):
            self._lengths_known = False
        else:
            self._lengths.update(np.asarray(lengths, dtype="<i8").tobytes())
        for spans in spans_per_sentence:
            spans = _dedupe_kind_overlaps(np.asarray(spans, dtype=np.int32).reshape(-1, 3))
            if len(spans):
                seq = np.full((len(spans), 1), self._sequences, np.int32)
                self._chunks.append(np.concatenate([seq, spans], axis=1))
            self._sequences += 1

    def finalize(self, bin_sha256: str | None = None) -> dict:
        """Write the side-car; ``bin_sha256``: the checksum of the shard's ``.bin`` the spans were made from (the
        caller hashed it before reading it); without it the ``.bin`` beside the side-car, if any, is hashed now
        (one read of the shard, ~1 GB/s)."""
        if bin_sha256 is None and os.path.exists(self.prefix + ".bin"):
            from data_prep.manifest import sha256_file

            bin_sha256 = sha256_file(self.prefix + ".bin")
        arr = np.concatenate(self._chunks) if self._chunks else np.zeros((0, 4), np.int32)
        stats = dict(self.stats)
        if self._doc is not None:
            stats.update(self._doc.stats)
            misses = getattr(self._doc.annotator, "misses", None)
            if misses is not None:
                stats["unannotated_sequences"] = misses
        npy, js, ptr = self.prefix + ".spans.npy", self.prefix + ".spans.json", self.prefix + PTR_SUFFIX
        header = {"format": FORMAT, "version": VERSION, "annotator": self.spec, "sequences": self._sequences,
                  "spans": int(len(arr)), "kinds": list(KINDS), "row_pointers": os.path.basename(ptr),
                  "stats": stats}
        if self._lengths_known:
            header["lengths_sha256"] = self._lengths.hexdigest()
        if bin_sha256 is not None:
            header["bin_sha256"] = bin_sha256
        with open(npy + ".tmp", "wb") as f:
            np.save(f, arr)
        os.replace(npy + ".tmp", npy)
        _save_atomic(ptr, row_pointers(arr, self._sequences))
        with open(js + ".tmp", "w", encoding="utf-8") as f:
            json.dump(header, f, indent=1, ensure_ascii=False)
        os.replace(js + ".tmp", js)
        return header


class SidecarReader:
    """Spans of one shard, memory-mapped. ``reader[seq]`` -> ``int32 [k, 3]`` (token_start, token_end, kind)."""

    def __init__(self, shard_prefix: str | Path, expect_sequences: int | None = None, verify: bool = True):
        """``verify``: compare the header's ``lengths_sha256`` with the shard's ``.idx`` (reads and hashes every
        sequence length of the shard); the trainer verifies once per corpus cache entry (trainer/ernie/sidecars.py)
        and opens with ``verify=False`` afterwards, as do the copies a reader pickles into loader workers."""
        self.prefix = str(shard_prefix)
        js = self.prefix + ".spans.json"
        if not os.path.exists(js):
            raise FileNotFoundError(f"{js} not found: build the shards with `build_indexed.py --annotate SPEC` "
                                    "(ERNIE phrase/entity masking needs them)")
        with open(js, encoding="utf-8") as f:
            self.header = json.load(f)
        if self.header.get("format") != FORMAT or self.header.get("version") != VERSION:
            raise ValueError(f"{js}: format {self.header.get('format')!r} v{self.header.get('version')} is not "
                             f"{FORMAT} v{VERSION}")
        self.sequences = int(self.header["sequences"])
        if expect_sequences is not None and expect_sequences != self.sequences:
            raise ValueError(f"{js} covers {self.sequences} sequences but the shard has {expect_sequences}: "
                             "the side-car belongs to another build; rebuild with --annotate")
        want = self.header.get("lengths_sha256")
        if verify and want is not None and os.path.exists(self.prefix + ".idx"):
            got = hashlib.sha256(shard_sequence_lengths(self.prefix).astype("<i8").tobytes()).hexdigest()
            if got != want:
                raise ValueError(f"{js} was made for other tokens than {self.prefix}.bin holds (the sequences' token "
                                 "counts differ: the shard was rebuilt after it was annotated); rebuild the side-car "
                                 "with `python -m data_prep.annotate` or build_indexed.py --annotate")
        self.spans = np.load(self.prefix + ".spans.npy", mmap_mode="r").view(np.ndarray)
        if self.spans.shape != (self.header["spans"], 4):
            raise ValueError(f"{self.prefix}.spans.npy has shape {self.spans.shape}, header says "
                             f"({self.header['spans']}, 4): the file is truncated or from another build")
        self._ptr = self._row_pointers()

    def _row_pointers(self) -> np.ndarray:
        """The mapped row pointers; a side-car written before they existed gets them computed once and saved
        beside it (8 bytes per sequence in memory only if its folder is read-only)."""
        path = self.prefix + PTR_SUFFIX
        if os.path.exists(path):
            ptr = np.load(path, mmap_mode="r")
            if ptr.shape == (self.sequences + 1,) and int(ptr[-1]) == len(self.spans):
                return ptr.view(np.ndarray)
            warnings.warn(f"{path} does not match {self.prefix}.spans.json ({ptr.shape[0]} pointers for "
                          f"{self.sequences} sequences): recomputing it", stacklevel=3)
        ptr = row_pointers(self.spans, self.sequences)
        try:
            _save_atomic(path, ptr)
        except OSError as err:
            warnings.warn(f"{self.prefix}: cannot save the side-car's row pointers ({err}); each process holds "
                          f"them in memory (8 bytes per sequence). Re-annotate with `python -m data_prep.annotate "
                          f"PREFIX --annotate SPEC` into a writable folder to have them written", stacklevel=3)
            return ptr
        return np.load(path, mmap_mode="r").view(np.ndarray)

    def __getstate__(self):
        return {"prefix": self.prefix, "sequences": self.sequences}  # workers map the files again

    def __setstate__(self, state):
        # the parent's open checked (or was told the cache entry checked) the lengths: a worker does not hash again
        self.__init__(state["prefix"], state["sequences"], verify=False)

    def __len__(self) -> int:
        return self.sequences

    def __getitem__(self, seq: int) -> np.ndarray:
        return np.asarray(self.spans[self._ptr[seq]:self._ptr[seq + 1], 1:])

    def range(self, first: int, stop: int) -> np.ndarray:
        """All spans of sequences ``[first, stop)``, ``int32 [k, 4]`` with the sequence index in column 0."""
        return np.asarray(self.spans[self._ptr[first]:self._ptr[stop]])


def header_record(header: dict) -> dict:
    """The fields of a side-car header that identify it, as ``data_prep/annotate.py`` records them in the corpus
    manifest (``ShardInfo.sidecar``) and the trainer compares them."""
    return {"annotator": header.get("annotator"), "sequences": int(header["sequences"]), "spans": int(header["spans"]),
            "lengths_sha256": header.get("lengths_sha256")}


def content_mismatch(header: dict, bin_sha256: str, where: str) -> str | None:
    """Why a side-car header does not belong to the shard whose ``.bin`` has checksum ``bin_sha256`` (the manifest's),
    or None when it does. ``where``: the prefix to name in the commands."""
    made_for = header.get("bin_sha256")
    spec = header.get("annotator", "SPEC")
    if made_for is None:
        return (f"it has no shard checksum (written before 2026-12-06), so it cannot be told apart from a side-car "
                f"left beside a shard rebuilt from other text with the same token counts. Run `python -m "
                f"data_prep.annotate {where} --annotate {spec} --keep-complete` (under mpirun to use several nodes): "
                f"it checks a sample of every such side-car against its shard and adds the checksum (seconds per "
                f"shard), or annotates a stale one again")
    if made_for != bin_sha256:
        return (f"it was made from a shard with .bin sha256 {made_for[:12]}..., the manifest's shard is "
                f"{bin_sha256[:12]}... (the shard was rebuilt after it was annotated). Annotate again: "
                f"`python -m data_prep.annotate {where} --annotate {spec}`")
    return None


def row_pointers(spans: np.ndarray, sequences: int) -> np.ndarray:
    """CSR pointers of rows sorted by sequence: int64 [sequences + 1]. Computed in blocks of sequences so that the
    sorted column is read once and the work memory stays bounded."""
    ptr = np.empty(sequences + 1, np.int64)
    col = spans[:, 0] if len(spans) else np.zeros(0, np.int32)
    step = 1 << 20
    for lo in range(0, sequences + 1, step):
        ptr[lo:lo + step] = np.searchsorted(col, np.arange(lo, min(lo + step, sequences + 1)), side="left")
    return ptr


def _save_atomic(path: str, arr: np.ndarray) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def shard_sequence_lengths(shard_prefix: str | Path) -> np.ndarray:
    """Every sequence's token count from a shard's ``.idx`` (megatron-core's index layout: 9-byte magic, u64
    version, u8 dtype code, u64 sequence count, u64 document count, then int32 lengths), read without megatron's
    slow import; only the header and the lengths are read."""
    path = f"{shard_prefix}.idx"
    with open(path, "rb") as f:
        head = f.read(34)
        if len(head) < 34 or head[:9] != b"MMIDIDX\x00\x00":
            raise ValueError(f"{path}: not a megatron-core index file")
        (count,) = struct.unpack("<Q", head[18:26])
        return np.frombuffer(f.read(4 * count), dtype="<i4", count=count)


def place_spans(spans_per_sequence: Sequence[np.ndarray], starts: Sequence[int], lengths: Sequence[int]
                ) -> np.ndarray:
    """Move per-sequence token spans into sample coordinates: sequence i was copied to ``[starts[i], starts[i] +
    lengths[i])`` of the sample (``lengths`` < the sequence's length when a sample truncates it). Spans cut by the
    truncation are dropped, not shortened: half an entity is not a knowledge unit. Returns ``int32 [k, 3]``."""
    out = []
    for spans, start, length in zip(spans_per_sequence, starts, lengths):
        spans = np.asarray(spans).reshape(-1, 3)
        spans = spans[spans[:, 1] <= length]
        if len(spans):
            out.append(spans + np.array([start, start, 0], dtype=spans.dtype))
    return np.concatenate(out).astype(np.int32) if out else np.zeros((0, 3), np.int32)
