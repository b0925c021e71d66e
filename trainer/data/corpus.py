"""Read a prepared corpus: ``PREFIX.manifest.json`` plus megatron-core indexed shards, as one sentence/document space.

Global numbering concatenates the shards in manifest order:

    shard 0: documents [0, D0), sentences [0, S0)
    shard 1: documents [D0, D0 + D1), sentences [S0, S0 + S1)

``doc_starts`` has ``num_documents + 1`` entries (like megatron's ``document_indices``); document ``d`` holds
sentences ``[doc_starts[d], doc_starts[d + 1])``. Token positions come from each shard's own ``.idx`` arrays
(``sequence_lengths``, ``sequence_pointers``), mapped as megatron-core's ``IndexedDataset`` maps them: sentences of
one shard are contiguous in its ``.bin``, so any sentence range inside a shard is one slice of its map, and
``read(s, e)`` costs one read per shard it touches. No chunk, document or sample crosses a shard, so token offsets
are only ever needed relative to a sentence of the same shard (``offsets``).

Memory: nothing per sentence is private, and nothing per sentence is copied: ``doc_starts`` (8 bytes per document)
is a view of one cache file (trainer/data/cache_file.py) written once, shard by shard, and the ``.idx``/``.bin`` maps
are opened lazily by the process that reads them; every rank and worker of a node shares one page-cache copy. A
process keeps at most ``open_maps.max_open_shards`` shards mapped (least recently used dropped first), so a corpus of
thousands of shards stays inside the open-file limit and ``vm.max_map_count`` (trainer/data/open_maps.py).
Pickling (DataLoader workers under ``spawn``/``forkserver``) sends the paths, and the worker maps the files again.

File-system metadata at start: the builder (global rank 0) checks every shard against the manifest (two ``stat``
calls and one 34-byte read per shard, ``check_shard``) at every open; every other rank takes the shard counts from
the manifest and the token dtypes from the corpus cache file, and touches a shard's files only when it first reads
from it (at 128 ranks x 1,000 shards that is 1,000 checks instead of ~400,000 metadata operations in a burst).
(An earlier version also cached global token offsets, 8 bytes per sentence: writing them was most of the build time
at 100M sentences, and they duplicate what the ``.idx`` holds.)

The ``.idx`` arrays are mapped with numpy at the offsets of megatron-core's documented layout (``idx_arrays``)
instead of through ``IndexedDataset``: importing megatron.core costs seconds in every index-builder process, and the
layout is checked against ``IndexedDataset`` in tests/test_scale.py.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.manifest import manifest_path, read_manifest

from .cache_file import CacheInvalid, CachePolicy, CacheWriter, code_hash, ensure, launcher_rank, settings_hash
from .open_maps import OpenShards

CORPUS_CACHE_VERSION = 4
"""Bump when the corpus arrays change on purpose; the key also holds ``code_hash(LAYOUT_SOURCES)``."""
LAYOUT_SOURCES = (Path(__file__),)
IDX_MAGIC = b"MMIDIDX\x00\x00"  # megatron-core's _INDEX_HEADER
IDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
              8: np.uint16}  # megatron-core's DType codes


@dataclass
class IdxHeader:
    dtype: np.dtype
    sequences: int
    documents: int  # entries of document_indices (documents + 1)
    offset: int  # where sequence_lengths start
    last_document_end: int | None = None  # document_indices[-1] (read with ``tail=True``): the sentence count


def idx_header(shard_prefix: str, tail: bool = False) -> IdxHeader:
    """The counts and token dtype of a shard's ``.idx`` (34 bytes read, nothing mapped; ``tail``: also its last 8
    bytes, the end of its last document, in the same open)."""
    for suffix in (".bin", ".idx"):
        if not os.path.exists(shard_prefix + suffix):
            raise FileNotFoundError(f"{shard_prefix}{suffix} is missing: the manifest lists it; rebuild the corpus")
    last = None
    with open(shard_prefix + ".idx", "rb") as f:
        head = f.read(34)
        if tail and f.seek(0, os.SEEK_END) >= 42:
            f.seek(-8, os.SEEK_END)
            last = struct.unpack("<q", f.read(8))[0]
    if len(head) < 34 or head[:9] != IDX_MAGIC or struct.unpack("<Q", head[9:17])[0] != 1:
        raise ValueError(f"{shard_prefix}.idx is not a megatron-core indexed dataset index (version 1)")
    code = head[17]
    if code not in IDX_DTYPES:
        raise ValueError(f"{shard_prefix}.idx: unknown token dtype code {code}")
    seqs, docs = struct.unpack("<QQ", head[18:34])
    return IdxHeader(np.dtype(IDX_DTYPES[code]), seqs, docs, 34, last)


def idx_arrays(shard_prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequence_lengths int32 [S], sequence_pointers int64 [S], document_indices int64 [D + 1]) of a shard, as
    read-only maps of its ``.idx`` (the arrays ``IndexedDataset`` exposes)."""
    h = idx_header(shard_prefix)
    if h.sequences == 0 and h.documents <= 1:
        return np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(max(h.documents, 1), np.int64)
    mm = np.memmap(shard_prefix + ".idx", dtype=np.uint8, mode="r")
    o = h.offset
    lengths = np.frombuffer(mm, np.int32, h.sequences, o)
    pointers = np.frombuffer(mm, np.int64, h.sequences, o + 4 * h.sequences)
    docs = np.frombuffer(mm, np.int64, h.documents, o + 12 * h.sequences)
    return lengths, pointers, docs


class CorpusChanged(ValueError):
    """The corpus's manifest changed under a running job in a way that touches a shard it is about to map."""


def _file_id(path) -> tuple[int, int, int] | None:
    """(inode, size, mtime_ns) of ``path``; None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _same_shard(shards: list[dict], spec: dict) -> bool:
    """Whether the manifest entries ``shards`` still hold ``spec``'s shard with the same content."""
    keys = ("prefix", "bin_sha256", "idx_sha256", "bin_bytes", "sentences", "documents")
    return any(all(s.get(key) == spec.get(key) for key in keys) for s in shards)


class ShardMismatch(ValueError):
    """A shard's files disagree with the manifest (sizes or counts): cut short, extended or rewritten."""


def check_shard(shard_prefix: str, spec: dict, prefix: str, manifest: dict) -> IdxHeader:
    """The shard's ``.idx`` header, after checking both files against the manifest entry ``spec``: the ``.bin``
    size (``bin_bytes``), the ``.idx`` size its counts imply, and the header's counts. Costs two ``stat`` calls and
    one 34-byte read per shard (what opening needed anyway), never a checksum (``inspect_indexed`` does that).

    Without it, a ``.bin`` cut short by an interrupted copy is read as empty samples (numpy clamps a slice past the
    end of a map) and the run trains on ``[CLS] [SEP]`` rows."""
    from data_prep.manifest import idx_bytes, manifest_path  # noqa: PLC0415
    from data_prep.prep_work import rebuild_command  # noqa: PLC0415

    def refuse(problem: str) -> ShardMismatch:
        return ShardMismatch(
            f"shard {shard_prefix}: {problem} (manifest {manifest_path(prefix)}): the shard was cut short, extended "
            f"or rewritten after the manifest (an interrupted copy?). Copy it again from the source, or rebuild the "
            f"corpus with\n    {rebuild_command(prefix, manifest)}\n(check a corpus with python -m "
            f"data_prep.inspect_indexed {prefix})")

    sizes = {}
    for suffix in (".bin", ".idx"):
        try:
            sizes[suffix] = os.stat(shard_prefix + suffix).st_size
        except FileNotFoundError:
            raise refuse(f"{Path(shard_prefix).name}{suffix} is missing") from None
    if sizes[".bin"] != spec["bin_bytes"]:
        raise refuse(f".bin is {sizes['.bin']:,} bytes, the manifest says {spec['bin_bytes']:,}")
    want_idx = idx_bytes(spec["sentences"], spec["documents"])
    if sizes[".idx"] != want_idx:
        raise refuse(f".idx is {sizes['.idx']:,} bytes, {spec['sentences']:,} sentences in {spec['documents']:,} "
                     f"documents (the manifest) make {want_idx:,}")
    h = idx_header(shard_prefix, tail=True)
    if h.documents > 1 and h.last_document_end != h.sequences:
        raise refuse(f".idx's last document ends at sentence {h.last_document_end:,}, not at its {h.sequences:,} "
                     "sentences (a document pointer is off)")
    if (h.sequences, h.documents - 1) != (spec["sentences"], spec["documents"]):
        raise refuse(f".idx holds {h.sequences:,} sentences in {h.documents - 1:,} documents, the manifest says "
                     f"{spec['sentences']:,} in {spec['documents']:,}")
    if h.dtype.itemsize * spec["tokens"] != spec["bin_bytes"]:
        raise refuse(f"the manifest's {spec['tokens']:,} tokens of {h.dtype} are not its {spec['bin_bytes']:,} "
                     ".bin bytes")
    return h


@dataclass
class _Shard:
    prefix: str
    first_sentence: int
    dtype: np.dtype | None  # None until checked (builder) or read from the corpus cache
    tokens: np.ndarray | None = None  # the .bin as a flat token array (mmap), opened on first read
    lengths: np.ndarray | None = None  # the .idx sequence lengths and pointers (mmap), opened on first use
    pointers: np.ndarray | None = None


class IndexedCorpus:
    """Documents and sentences of one prepared corpus (all its shards).

    ``doc_starts`` (int64 [D + 1]) is a memory-mapped view of the corpus cache file in ``cache.dir`` (default:
    ``index_cache/`` beside the manifest), built on first use by the policy's builder; token positions come from the
    shards' mapped ``.idx`` arrays.
    """

    def __init__(self, prefix: str | os.PathLike, cache: CachePolicy | None = None):
        self.prefix = str(prefix)
        self._manifest_id = _file_id(manifest_path(prefix))  # before the read: a change after it is seen (_unchanged)
        self.manifest = read_manifest(prefix)
        root = manifest_path(prefix).parent
        self.cache = cache or CachePolicy(root / "index_cache", builder=launcher_rank() == 0)
        self._shards: list[_Shard] = []
        self._shard_docs: list[int] = []
        first = 0
        for spec in self.manifest["shards"]:  # counts from the manifest: no shard file is touched here
            self._shards.append(_Shard(str(root / spec["prefix"]), first, None))
            self._shard_docs.append(int(spec["documents"]))
            first += int(spec["sentences"])
        self._shard_starts = np.array([s.first_sentence for s in self._shards] + [first], dtype=np.int64)
        self._open = OpenShards(2, self._close_shard)  # .idx and .bin
        self.vocab_size = int((self.manifest.get("tokenizer") or {}).get("vocab_size", 0)) or None
        if self.cache.builder:
            # the builder (global rank 0) checks every shard's files against the manifest at every open: a .bin cut
            # by an interrupted copy stops the run here, with its name, whether or not the cache entry exists
            for shard, spec in zip(self._shards, self.manifest["shards"]):
                shard.dtype = check_shard(shard.prefix, spec, self.prefix, self.manifest).dtype
        self._open_arrays()

    # -- the mapped arrays -----------------------------------------------------------------------------------------
    def cache_key(self) -> str:
        """The corpus cache file's key: computed once and pickled with the corpus, so a worker started after the
        source changed on disk still opens the file its parent opened."""
        if getattr(self, "_cache_key", None) is None:
            self._cache_key = settings_hash({"version": CORPUS_CACHE_VERSION, "code": code_hash(LAYOUT_SOURCES),
                                             "corpus": self.fingerprint()})
        return self._cache_key

    @property
    def cache_path(self) -> Path:
        return Path(self.cache.dir) / f"corpus-{Path(self.prefix).name}-{self.cache_key()}.bfc"

    def _open_arrays(self) -> None:
        arrays, _ = ensure(self.cache_path, "corpus", self.cache_key(), self._write_arrays, self.cache,
                           f"the corpus arrays of {self.prefix}")
        self.doc_starts = arrays["doc_starts"]
        # every shard's token dtype, as the builder read it from the .idx headers: the other ranks and the loader
        # workers open no shard file until they read from it (no per-shard metadata burst on a shared filesystem)
        codes = arrays["shard_dtypes"]
        if len(codes) != len(self._shards):
            raise CacheInvalid(f"{self.cache_path}: {len(codes)} shard dtypes for {len(self._shards)} shards")
        for shard, code in zip(self._shards, codes.tolist()):
            if shard.dtype is None:
                shard.dtype = np.dtype(IDX_DTYPES[code])

    def _write_arrays(self, path: Path) -> None:
        """One streaming pass over the shards' ``.idx`` maps; peak memory is one shard's arrays. Written by the
        builder, which checked every shard against the manifest when it opened the corpus."""
        codes = {np.dtype(v): k for k, v in IDX_DTYPES.items()}
        with CacheWriter(path, "corpus", self.cache_key(), [("doc_starts", "<i8", ()),
                                                             ("shard_dtypes", "u1", ())]) as w:
            w.append("doc_starts", np.zeros(1, np.int64))
            for shard in self._shards:
                lengths, pointers, docs = idx_arrays(shard.prefix)
                _check_back_to_back(shard, lengths, pointers)
                w.append("doc_starts", np.asarray(docs[1:], np.int64) + shard.first_sentence)
            w.append("shard_dtypes", np.array([codes[s.dtype] for s in self._shards], np.uint8))
            w.commit({"prefix": self.prefix})

    # -- sizes -----------------------------------------------------------------------------------------------------
    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_sentences(self) -> int:
        return int(self._shard_starts[-1])

    @property
    def shards(self) -> list[tuple[str, int, int]]:
        """(shard prefix, first global sentence, sentences) of every shard, in order."""
        return [(s.prefix, s.first_sentence, int(self._shard_starts[k + 1] - s.first_sentence))
                for k, s in enumerate(self._shards)]

    def fingerprint(self) -> dict:
        """What identifies this corpus's content for cache keys: shard checksums if the manifest has them, and the
        counts of every shard (the manifest's, which the builder checked against each ``.idx``)."""
        shards = [(s.get("prefix"), s.get("bin_sha256"), s.get("idx_sha256"), s.get("tokens")) for s in
                  self.manifest["shards"]]
        counts = np.diff(self._shard_starts).tolist()
        return {"shards": shards, "sentences": self.num_sentences, "documents": int(sum(self._shard_docs)),
                "per_shard": [counts, self._shard_docs]}

    def document_of(self, sentences: np.ndarray | int) -> np.ndarray:
        """Document index of each global sentence index (vectorised binary search)."""
        return np.searchsorted(self.doc_starts, sentences, side="right") - 1

    def shard_of(self, sentence: int) -> int:
        return int(np.searchsorted(self._shard_starts, sentence, side="right") - 1)

    def _idx(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, pointers) of shard ``k``, mapped on first use."""
        shard = self._shards[k]
        self._open.touch(k)
        if shard.lengths is None:
            self._unchanged(k)
            shard.lengths, shard.pointers, _ = idx_arrays(shard.prefix)
        return shard.lengths, shard.pointers

    def _unchanged(self, k: int) -> None:
        """Refuse to map shard ``k`` from a corpus rebuilt in place since this process opened it. Shards are mapped
        on first read and again after ``OpenShards`` evicts them, by every rank and loader worker; a rebuild under the
        same prefix replaced the files under a running job, which then read the new shards through its old sample
        index: every sample built after it differed, nothing said (measured by the mixtures review). One ``stat`` of
        the manifest per map (~2 us; a map costs 30-50 us). A manifest rewritten with this shard's entry unchanged
        (``data_prep.annotate`` recording side-cars) passes; gone (a rebuild's finalize removes it before it renames
        the first new shard) or naming other content for the shard, it stops the run."""
        path = manifest_path(self.prefix)
        now = _file_id(path)
        if now == self._manifest_id:
            return
        spec = self.manifest["shards"][k]
        try:
            same = now is not None and _same_shard(read_manifest(self.prefix)["shards"], spec)
        except (OSError, ValueError):
            same = False
        if same:
            self._manifest_id = now
            return
        raise CorpusChanged(
            f"{self.prefix}: the corpus was rebuilt or replaced in place while this run reads it ({path} "
            f"{'is gone' if now is None else 'changed'} since this process opened it, and shard {spec['prefix']} with "
            "it): the run's sample index does not fit the new shards. Build a new version under another "
            "--output-prefix and point the next launch at it (docs/cluster_operations.md, \"Preparing data\"); "
            "this run resumes from its last checkpoint once the corpus it started on is back in place")

    def _close_shard(self, k: int) -> None:
        """Drop shard ``k``'s maps (``OpenShards`` evicted it); its next read maps it again."""
        shard = self._shards[k]
        shard.tokens = shard.lengths = shard.pointers = None

    def sentence_lengths(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """Lengths (int64) of sentences ``[start, end)``, which may span shards (a private array: for ranges, not the
        whole corpus)."""
        end = self.num_sentences if end is None else end
        pieces = []
        while start < end:
            k = self.shard_of(start)
            stop = min(end, int(self._shard_starts[k + 1]))
            first = self._shards[k].first_sentence
            pieces.append(self._idx(k)[0][start - first:stop - first])
            start = stop
        return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)

    def offsets(self, start: int, end: int) -> np.ndarray:
        """Token offsets of sentences ``start..end`` (inclusive; one shard) relative to ``start``'s: int64 [end -
        start + 1], ``offsets[i]`` = tokens of sentences ``[start, start + i)``."""
        out = np.zeros(end - start + 1, np.int64)
        np.cumsum(self.sentence_lengths(start, end), out=out[1:])
        return out

    def end_reaching(self, first: int, want: int, limit: int) -> int:
        """The smallest ``last`` in ``(first, limit]`` with at least ``want`` tokens in sentences ``[first, last)``, or
        ``limit`` when they hold fewer. Reads a window of lengths at a time (a sentence has >= 1 token but may have
        0), never the whole document."""
        got, lo, width = 0, first, max(want, 1)
        while lo < limit:
            hi = min(limit, lo + width)
            cum = np.cumsum(self.sentence_lengths(lo, hi)) + got
            j = int(np.searchsorted(cum, want, side="left"))
            if j < len(cum):
                return max(lo + j + 1, first + 1)
            got, lo, width = int(cum[-1]), hi, width * 2
        return limit

    # -- reading ---------------------------------------------------------------------------------------------------
    def read(self, start: int, end: int, limit: int | None = None) -> np.ndarray:
        """Tokens of sentences ``[start, end)`` concatenated (int32; one slice of a shard's map per shard touched);
        with ``limit``, only their first ``limit`` tokens are read (the slice stops there, whatever the sentences'
        lengths: a caller that keeps a prefix of a long document or sentence copies no more than it keeps)."""
        pieces = []
        left = None if limit is None else max(int(limit), 0)
        while start < end and left != 0:
            k = self.shard_of(start)
            shard = self._shards[k]
            stop = min(end, int(self._shard_starts[k + 1]))
            lengths, pointers = self._idx(k)
            tokens = shard.tokens if shard.tokens is not None else self._map(k)
            a, b = start - shard.first_sentence, stop - 1 - shard.first_sentence
            size = shard.dtype.itemsize
            lo, hi = int(pointers[a]) // size, int(pointers[b]) // size + int(lengths[b])
            if left is not None:
                hi = min(hi, lo + left)
                left -= hi - lo
            pieces.append(tokens[lo:hi])
            start = stop
        if len(pieces) == 1:
            return pieces[0].astype(np.int32)
        return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)

    def _map(self, k: int) -> np.ndarray:
        """Shard ``k``'s .bin as one token array (the layout was checked when the corpus cache was built)."""
        shard = self._shards[k]
        self._unchanged(k)
        if os.path.getsize(shard.prefix + ".bin") == 0:
            shard.tokens = np.zeros(0, shard.dtype)  # numpy cannot map an empty file
        else:
            shard.tokens = np.memmap(shard.prefix + ".bin", dtype=shard.dtype, mode="r").view(np.ndarray)
        return shard.tokens

    def __getstate__(self):
        # Workers re-open their own maps: a mapped file does not survive pickling (it would be sent as a copy).
        state = dict(self.__dict__)
        state["_shards"] = [_Shard(s.prefix, s.first_sentence, s.dtype) for s in self._shards]
        del state["doc_starts"]
        del state["_open"]
        state["cache"] = CachePolicy(self.cache.dir, builder=False, timeout=0.0)  # the file exists by now
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open = OpenShards(2, self._close_shard)  # this process's own limit
        self._open_arrays()


def _check_back_to_back(shard: _Shard, lengths: np.ndarray, pointers: np.ndarray) -> None:
    """``read`` slices a sentence range as one piece of the ``.bin``, which needs the sentences back to back as
    megatron-core's builder writes them: checked once, at the cache build, on every 1024th sentence and the last (a
    builder that reorders writes shows up there; checking all of them would read 8 bytes per sentence more)."""
    n = len(lengths)
    if n < 2:
        return
    # tokens before sentences 1, 1025, 2049, ... and before the last one: sums of 1024-sentence blocks (one read of
    # the lengths, no per-sentence array)
    check = np.arange(1, n, 1024)
    sums = np.cumsum(np.add.reduceat(lengths, np.r_[0, check], dtype=np.int64))
    want = np.r_[sums[:-1], sums[-1] - int(lengths[-1])]
    if not np.array_equal(pointers[np.r_[check, n - 1]], want * shard.dtype.itemsize):
        raise ValueError(f"{shard.prefix}.bin does not hold its sentences back to back as the .idx pointers say; it "
                         "was not written by megatron-core's IndexedDatasetBuilder: rebuild the corpus")
