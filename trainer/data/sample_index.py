"""The sample index: sample id -> the sentence ranges it is built from, built once per corpus and settings, mapped.

A *chunk* is a contiguous sentence range ``[start, end)`` with a target length; a *sample* (one row of a batch) is
one chunk, or for packed doc-sentences several chunks of different documents. Arrays (int64, views of one cache
file, trainer/data/cache_file.py):

    chunks   [C, 3]  (start_sentence, end_sentence, target_tokens)
    row_ptr  [N + 1] sample i is chunks[row_ptr[i] : row_ptr[i + 1]]   (packed doc-sentences only; else sample i
                                                                      is chunk i)

The layout rules, sentence by sentence (``cost`` = its tokens, plus 1 for the last sentence of a document in
``full-sentences``, where a separator follows it):

- ``target(s)``: ``budget`` tokens, or with probability ``short_seq_prob`` uniform in ``[2, budget]`` (BERT); a
  pure function of ``(data.index_seed, s)`` (a splitmix64 hash), so any block of sentences gets its targets alone.
- ``next(s)``: the largest ``e`` with ``cost(s..e) <= target(s)`` (in full-sentences not counting the [SEP] of a
  document end that ends the chunk: the row's final [SEP] closes it), at least ``s + 2`` for segment/SOP pairs and
  ``s + 1`` otherwise, at most ``s + budget`` sentences; ``s + 2`` for sentence-pair. Formats other than
  full-sentences stop at the document end, and a 1-sentence remainder of a document (2 for pairs) joins the chunk.
  No chunk crosses a shard boundary (a shard holds ~1M sentences, so that is a loss of one sample in ~10^5).
- With ``data.valid_split`` > 0 (heldout.py) the walk reads only the chosen documents of a shard (training: the
  kept ones; the held-out index: the held-out ones), one maximal run of consecutive chosen documents at a time, as if
  each run were a shard: a full-sentences chunk never crosses a held-out document. With 0 the run is the shard.
- The chunks of a shard are the chain ``first sentence -> next(.) -> ...``, keeping those with tokens (and two
  sentences for pair formats). Packed doc-sentences fill rows next-fit within a shard (``_Packer``).
- NSP formats (segment-pair, sentence-pair) decide here whether a chunk is a negative (``data.nsp_negative_prob``,
  a hash of ``(index_seed, s)``), as BERT's ``create_instances_from_document`` decides when it writes instances: a
  negative keeps only its A sentences ``[s, s + a)`` (``a`` uniform in ``[1, k - 1]``; 1 for sentence-pair), is
  written with ``-target``, and the chain goes on from ``s + a``, so the sentences it leaves unused start the next
  chunk (BERT's ``i -= num_unused_segments``); a lone sentence that this leaves in the middle of a document is a
  negative of its own (BERT's rule for a one-segment chunk). An epoch thus reads every sentence of every document
  with two or more; the labels are fixed per index, as in BERT's prepared data (the B side is drawn per epoch).

Worked example, budget 10 tokens, ``full-sentences``, sentence lengths ``[4, 3, 5 | 6, 2]`` (``|`` = document end):
costs ``[4, 3, 6, 6, 3]``; chunks ``[0, 2)`` (7 tokens, adding sentence 2 would make 13) and ``[2, 4)`` (12 > 10:
one sentence at least, so ``[2, 3)``), then ``[3, 5)``. With ``doc-sentences`` the walk stops at the document end.

Building: shard by shard (in parallel threads, ``workers``), each shard in one pass over its mapped ``.idx`` lengths
(index_kernels.py: compiled by numba for corpora of 200k sentences or more, however they are sharded), emitting ``block`` chunks at a time, so a
builder holds one shard's chunks (~5 MB per 1M sentences at T = 128), whatever the corpus size; shard results are
appended to the cache file in shard order (workers change only the speed). tests/test_scale.py checks the result
against a one-shot numpy build over whole-corpus arrays. Why our own walk and not megatron-core's
``helpers.build_mapping``: that one silently drops every document holding a sentence longer than 512 tokens, cannot
cross documents (full-sentences), shuffles the result (our order is a keyed bijection, order.py) and needs
whole-corpus arrays in memory.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache_file import CachePolicy, CacheWriter, code_hash, ensure, fit_name, settings_hash  # noqa: F401 (settings_hash re-exported)
from .corpus import IndexedCorpus, idx_arrays, idx_header
from .heldout import ROLES, held_out_mask, shard_key
from .order import M64, mix64

INDEX_VERSION = 3
"""Bump when the index layout changes on purpose; the key also holds ``code_hash(LAYOUT_SOURCES)``."""
LAYOUT_SOURCES = (Path(__file__).with_name("sample_index.py"), Path(__file__).with_name("index_kernels.py"),
                  Path(__file__).with_name("heldout.py"))
"""The modules whose code decides the chunks: any change to them keys a new index (cache_file.code_hash)."""
WITHIN_DOCUMENT = ("segment-pair", "sentence-pair", "doc-sentences", "sop-pair")
BLOCK = 1 << 20


class SampleIndex:
    """Chunks (and row pointers when packed) of every sample; mapped from the cache file when it came from one."""

    def __init__(self, chunks: np.ndarray, row_ptr: np.ndarray | None = None, path: Path | None = None,
                 key: str | None = None):
        self.chunks, self.row_ptr, self.path, self.key = chunks, row_ptr, path, key

    def __len__(self) -> int:
        return len(self.chunks) if self.row_ptr is None else len(self.row_ptr) - 1

    def sample_chunks(self, i: int) -> np.ndarray:
        if self.row_ptr is None:
            return self.chunks[i:i + 1]
        return self.chunks[self.row_ptr[i]:self.row_ptr[i + 1]]

    def __getstate__(self):
        if self.path is None:
            return self.__dict__
        return {"path": self.path, "key": self.key}  # a spawned worker maps the file again

    def __setstate__(self, state):
        if "chunks" in state:
            self.__dict__.update(state)
        else:
            self.__init__(**_open_index(state["path"], state["key"]), path=state["path"], key=state["key"])


def content_budget(fmt: str, max_seq_length: int) -> int:
    """Tokens available to sentences: T minus [CLS] and one [SEP] per segment."""
    return max_seq_length - (3 if fmt in ("segment-pair", "sentence-pair", "sop-pair") else 2)


@dataclass(frozen=True)
class Layout:
    """The settings the index depends on, besides the corpus."""

    fmt: str
    max_seq_length: int
    short_seq_prob: float
    index_seed: int
    pack: bool
    nsp_prob: float = 0.0
    """NSP formats: probability that a chunk is a negative (decided here, so that its unused sentences go back to
    the chain); 0 for the other formats"""
    valid_split: float = 0.0
    """data.valid_split: the share of documents held out (heldout.py); 0 reads every document"""
    role: str = "train"
    """train: the documents kept for training; heldout: only the held-out ones (evaluation)"""
    single_segment: bool = False
    """sop-pair without swaps (data.nsp_negative_prob 0, ELECTRA's recipes): a chunk of one sentence (a one-sentence
    document) is a row of one segment, as ELECTRA's ExampleBuilder writes a document's end, instead of unread"""

    @property
    def budget(self) -> int:
        return content_budget(self.fmt, self.max_seq_length)

    @property
    def min_sent(self) -> int:
        return 2 if self.fmt in ("segment-pair", "sop-pair") else 1

    @property
    def min_tail(self) -> int:
        # sentence-pair: a lone last sentence joins the pair before it (and goes unread), unless NSP negatives put
        # sentences back, where it becomes a negative of its own (BERT's one-segment rule)
        return max(self.min_sent, 2 if self.fmt == "sentence-pair" and not self.nsp_prob else 1)

    @property
    def packed(self) -> bool:
        return self.pack and self.fmt == "doc-sentences"


NSP_FORMATS = ("segment-pair", "sentence-pair")


def nsp_share(fmt: str, nsp_prob: float) -> float:
    """The negative probability the index of ``fmt`` holds: ``nsp_prob`` for NSP formats, 0 for the others."""
    return float(nsp_prob) if fmt in NSP_FORMATS else 0.0


def single_segment(fmt: str, nsp_prob: float) -> bool:
    """Whether one-sentence chunks are rows of their own: sop-pair with no swaps (Layout.single_segment)."""
    return fmt == "sop-pair" and float(nsp_prob) == 0.0


def index_settings(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, index_seed: int,
                   pack: bool, nsp_prob: float = 0.0, valid_split: float = 0.0, role: str = "train") -> dict:
    """Everything the index depends on (and nothing else: not the training seed); its hash keys the cache file."""
    return {"version": INDEX_VERSION, "code": code_hash(LAYOUT_SOURCES), "corpus": corpus.fingerprint(), "format": fmt,
            "max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "index_seed": index_seed,
            "pack": bool(pack and fmt == "doc-sentences"), "nsp_prob": nsp_share(fmt, nsp_prob),
            "valid_split": float(valid_split), "role": role,
            **({"single_segment": True} if single_segment(fmt, nsp_prob) else {})}


def index_path(corpus: IndexedCorpus, fmt: str, key: str, cache_dir, role: str = "train") -> Path:
    part = "-heldout" if role == "heldout" else ""
    return Path(cache_dir) / f"index-{Path(corpus.prefix).name}-{fmt}{part}-{key}.bfc"


def _open_index(path, key) -> dict:
    from .cache_file import open_cache  # noqa: PLC0415

    arrays, meta = open_cache(path, "sample-index", key)
    return {"chunks": arrays["chunks"], "row_ptr": arrays["row_ptr"] if meta.get("packed") else None}


def load_or_build(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, index_seed: int,
                  pack: bool, cache: CachePolicy | str | os.PathLike, nsp_prob: float = 0.0,
                  valid_split: float = 0.0, role: str = "train") -> SampleIndex:
    """The mapped index of this corpus and layout, built first if missing (by the policy's builder; the other ranks
    wait for the finished file, cache_file.ensure). ``nsp_prob``: data.nsp_negative_prob (NSP formats);
    ``valid_split``, ``role``: the held-out split (heldout.py) and which side of it the index reads."""
    if not isinstance(cache, CachePolicy):
        cache = CachePolicy(Path(cache))
    layout = Layout(fmt, max_seq_length, short_seq_prob, index_seed, pack, nsp_share(fmt, nsp_prob),
                    float(valid_split), role, single_segment(fmt, nsp_prob))
    _check(layout)
    settings = index_settings(corpus, fmt, max_seq_length, short_seq_prob, index_seed, pack, nsp_prob,
                              valid_split, role)
    key = settings_hash(settings)
    path = index_path(corpus, fmt, key, cache.dir, role)

    def build(p: Path) -> None:
        write_index(corpus, layout, p, key, settings, cache.workers, budget=cache.memory)

    arrays, meta = ensure(path, "sample-index", key, build, cache, f"the '{fmt}' sample index of {corpus.prefix}")
    return SampleIndex(arrays["chunks"], arrays["row_ptr"] if meta.get("packed") else None, path, key)


def build_index(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, seed: int,
                pack: bool = True, block: int = BLOCK, compiled: bool | None = None,
                nsp_prob: float = 0.0, valid_split: float = 0.0, role: str = "train") -> SampleIndex:
    """The index in memory (tests, small corpora): the same blocks as ``write_index``, concatenated; ``compiled``
    forces the walk compiled or interpreted (default: by shard size, index_kernels.kernels)."""
    layout = Layout(fmt, max_seq_length, short_seq_prob, seed, pack, nsp_share(fmt, nsp_prob), float(valid_split),
                    role, single_segment(fmt, nsp_prob))
    _check(layout)
    parts = [_shard_chunks((p, first, layout, block, compiled)) for p, first, _ in corpus.shards]
    chunks = np.concatenate([c for c, _ in parts]) if parts else np.zeros((0, 3), np.int64)
    _check_nonempty(corpus, layout, len(chunks))
    if not layout.packed:
        return SampleIndex(chunks)
    sizes = np.concatenate([r for _, r in parts])
    return SampleIndex(chunks, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


def write_index(corpus: IndexedCorpus, layout: Layout, path: Path, key: str, settings: dict, workers: int = 1,
                block: int = BLOCK, budget: int | None = None) -> None:
    """Build shard by shard (``workers`` threads, capped by the memory ``budget``: ``threads_for``) and stream the
    shards' chunks into the cache file in order."""
    from . import index_kernels  # noqa: PLC0415 (only builders need it)

    sizes_of = [count for _, _, count in corpus.shards]
    # compiled or interpreted for the whole corpus, by its size: chosen per shard, a corpus of many small shards was
    # walked all interpreted (~3.6 µs per sentence: 1,000 shards of 2,000 sentences took 7.3 s, 47x megatron-core's
    # build_mapping, bench/scale.py --io), where loading the compiled walk once costs 1-4 s
    compiled = sum(sizes_of) >= index_kernels.COMPILE_FROM
    tasks = [(p, first, layout, block, compiled) for p, first, _ in corpus.shards]
    total = 0
    # The packed rows' sizes wait in a file of this builder's own, beside the cache (8 bytes a sample: too many to
    # hold at 2B sentences): anonymous (TemporaryFile: O_TMPFILE, or a random name unlinked at once), so two builders
    # on one shared cache never meet in it, even with one pid on two hosts or containers (Kubernetes pods: each
    # builder PID 1), and a killed builder leaves nothing. It was `.NAME.rows-PID`: such twins truncated and removed
    # each other's, and one failed with FileNotFoundError. Read back through the open handle, never by name.
    with CacheWriter(path, "sample-index", key, [("chunks", "<i8", (3,)), ("row_ptr", "<i8", ())]) as w, \
            tempfile.TemporaryFile(dir=path.parent, prefix=f".{path.name}.rows-{_builder_id()}-") as rows:
        for chunks, sizes in _run(tasks, workers, sizes_of, budget):
            w.append("chunks", chunks)
            total += len(chunks)
            if layout.packed:
                rows.write(np.asarray(sizes, np.int64).tobytes())
        _check_nonempty(corpus, layout, total)
        if layout.packed:
            rows.flush()
            w.append("row_ptr", np.zeros(1, np.int64))
            n = os.fstat(rows.fileno()).st_size // 8
            sizes = np.memmap(rows, np.int64, mode="r", shape=(n,)) if n else np.zeros(0, np.int64)
            base = 0
            for lo in range(0, n, BLOCK):  # running sum block by block: bounded memory
                ptr = np.cumsum(sizes[lo:lo + BLOCK]) + base
                w.append("row_ptr", ptr)
                base = int(ptr[-1])
            del sizes
        # the settings themselves go beside the file (the header has a fixed size; a corpus of thousands of shards
        # has a fingerprint of hundreds of kB)
        w.commit({"packed": layout.packed, "format": layout.fmt, "samples": int(total)})
    _write_description(path, settings)


def _builder_id() -> str:
    """HOST-PID-RANDOM: what makes this builder's temporary names its own on a cache shared by hosts, containers
    and PID namespaces (the CacheWriter temporaries' scheme, trainer/data/cache_file.py)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _write_description(path: Path, settings: dict) -> None:
    """``NAME.json`` beside a cache file: what it was built from, for people (nothing reads it back)."""
    # HOST-PID-RANDOM: two builders with one pid (two pods) wrote and renamed one `.NAME.json.tmpPID`, and the
    # second rename failed with FileNotFoundError
    suffix = f".json.tmp-{_builder_id()}"
    tmp = path.with_name(f".{fit_name(path.name, len(os.fsencode(suffix)) + 1)}{suffix}")  # a long corpus name
    try:
        tmp.write_text(json.dumps(settings, indent=1, sort_keys=True))
        os.replace(tmp, path.with_name(path.name + ".json"))
    finally:
        tmp.unlink(missing_ok=True)


BUILD_MEMORY = 2 << 30  # bytes the shards in flight may hold together (see ``threads_for``)
SHARD_BYTES_PER_SENTENCE = 56  # a shard in flight: 32 B/sentence of walk buffers (out, rows) + 24 B/chunk kept


def threads_for(workers: int, largest: int, tasks: int, budget: int | None = None) -> int:
    """Threads for ``workers`` requested: at most ``2 * threads`` shards are in flight, each holding up to
    ``SHARD_BYTES_PER_SENTENCE`` bytes per sentence of the ``largest`` shard, so the threads are capped to keep that
    under ``budget`` (1M-sentence shards at 2 GiB: 19 threads, however many CPUs ``--workers`` names; 224 threads
    would hold ~25 GB). At least one (a single shard larger than the budget is still built, alone)."""
    budget = BUILD_MEMORY if budget is None else budget
    per_shard = SHARD_BYTES_PER_SENTENCE * max(int(largest), 1)
    return max(1, min(int(workers), int(tasks), budget // (2 * per_shard)))


def _run(tasks: list, workers: int, shard_sizes: list[int], budget: int | None = None):
    """Shard results in shard order (each shard's chunks whole, or in pieces for a large one): inline with one
    worker, else from ``workers`` threads. Threads, not processes: the compiled walk releases the GIL
    (index_kernels.py, ``nogil``), and a thread needs no start-up, where a spawned process paid 1-4 s of imports and
    numba loading and sent every chunk back through a pipe (24 bytes per sample: measured at 200M sentences, 2
    spawned workers took more CPU and more wall time than one). At most ``2 * workers`` shards are in flight, so
    memory stays bounded when the writer falls behind.

    A shard whose walk would hold more than half the ``budget`` (``SHARD_BYTES_PER_SENTENCE`` per sentence: a
    single-file corpus of 2B sentences would need ~100 GB) is walked in the writer's thread instead, after the
    shards before it, and handed over ``block`` chunks at a time as the walk emits them: memory stays at one block
    (~32 MB) whatever the shard's size. Packed doc-sentences need a whole shard's row sizes to pack it, so their
    large shards are still held whole (one at a time)."""
    budget = BUILD_MEMORY if budget is None else int(budget)
    large = [SHARD_BYTES_PER_SENTENCE * n > budget // 2 for n in shard_sizes]
    small = [n for n, big in zip(shard_sizes, large) if not big]
    workers = threads_for(workers, max(small, default=0), len(small), budget) if small else 1
    if workers <= 1:
        for task, big in zip(tasks, large):
            yield from (_shard_pieces(task) if big else [_shard_chunks(task)])
        return
    from collections import deque  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from . import index_kernels  # noqa: PLC0415

    if any(index_kernels.COMPILE_FROM <= n if task[4] is None else task[4] for task, n in zip(tasks, shard_sizes)):
        index_kernels.kernels(0, compiled=True)  # load the compiled code once, before the threads
    with ThreadPoolExecutor(workers, thread_name_prefix="index") as pool:
        pending = deque()
        for task, big in zip(tasks, large):
            if big:  # the shards before it first (order), then this one in pieces, here
                while pending:
                    yield pending.popleft().result()
                yield from _shard_pieces(task)
                continue
            pending.append(pool.submit(_shard_chunks, task))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _check(layout: Layout) -> None:
    if layout.role not in ROLES:
        raise ValueError(f"index role {layout.role!r}: one of {ROLES}")
    if not 0.0 <= layout.valid_split < 0.5:
        raise ValueError(f"data.valid_split={layout.valid_split}: the share of documents held out must be in [0, 0.5)")
    if layout.role == "heldout" and layout.valid_split <= 0:
        raise ValueError("a held-out index needs data.valid_split > 0")
    if layout.budget < 2:
        raise ValueError(f"data.max_seq_length={layout.max_seq_length} leaves {layout.budget} tokens for text; "
                         "use at least 8")


def _check_nonempty(corpus: IndexedCorpus, layout: Layout, n: int) -> None:
    if n == 0 and layout.role == "heldout":
        raise ValueError(
            f"{corpus.prefix}: data.valid_split={layout.valid_split} holds out no document that gives a "
            f"'{layout.fmt}' sample ({corpus.num_documents} documents in all); raise data.valid_split or evaluate on "
            "data.valid_corpora instead")
    if n == 0:
        raise ValueError(
            f"{corpus.prefix}: no '{layout.fmt}' sample can be built ({corpus.num_documents} documents, "
            f"{corpus.num_sentences} sentences); pair formats need documents of two or more sentences")


def _document_runs(prefix: str, documents: int, layout: Layout) -> np.ndarray:
    """int64 [R, 2]: the maximal runs ``[lo, hi)`` of consecutive documents of a shard that the index reads: all of
    them without a held-out split, else the kept ones (train) or the held-out ones (heldout), by heldout.py's hash."""
    if layout.valid_split <= 0:
        return np.array([[0, documents]] if documents else [], np.int64).reshape(-1, 2)
    chosen = held_out_mask(shard_key(prefix), documents, layout.valid_split)
    if layout.role == "train":
        chosen = ~chosen
    edges = np.flatnonzero(np.diff(np.concatenate([[0], chosen.astype(np.int8), [0]])))
    return edges.astype(np.int64).reshape(-1, 2)


# -- one shard, block by block -------------------------------------------------------------------------------------------
def _shard_chunks(task) -> tuple[np.ndarray, np.ndarray]:
    """(chunks int64 [c, 3] in global sentence numbers, row sizes for packed doc-sentences) of one shard: the walk
    of index_kernels.py over the shard's mapped ``.idx`` lengths, ``block`` chunks at a time (the chain position
    carries over), so a builder holds the shard's chunks and one block of work memory."""
    layout = task[2]
    parts = list(_walk(task))
    chunks = np.concatenate([c for c, _ in parts]) if parts else np.zeros((0, 3), np.int64)
    if not layout.packed:
        return chunks, np.zeros(0, np.int64)
    from . import index_kernels as K  # noqa: PLC0415

    sizes = np.concatenate([r for _, r in parts]) if parts else np.zeros(0, np.int64)
    order, row_sizes = K.kernels(idx_header(task[0]).sequences, task[4]).pack(sizes, layout.max_seq_length)
    return chunks[order], row_sizes


def _shard_pieces(task):
    """One shard's chunks as the walk emits them, ``block`` at a time (``_run``'s large shards); the same chunks
    as ``_shard_chunks``. Packed layouts cannot pack a piece alone: their shard comes whole."""
    if task[2].packed:
        yield _shard_chunks(task)
        return
    for chunks, _ in _walk(task):
        yield chunks, np.zeros(0, np.int64)


def _walk(task):
    """(chunks, row sizes) blocks of one shard's walk, in order, each a fresh array of at most ``block`` rows."""
    from . import index_kernels as K  # noqa: PLC0415 (only builders need it)

    prefix, first, layout, block, compiled = task
    lengths, _, docs = idx_arrays(prefix)
    n = len(lengths)
    run = K.kernels(n, compiled)
    docs = np.asarray(docs, np.int64)
    if len(docs) == 0 and n == 0:
        docs = np.zeros(1, np.int64)
    if docs[-1] != n:  # checked when the corpus was opened (corpus.check_shard); a builder never patches it quietly
        raise ValueError(f"{prefix}.idx: the last document ends at sentence {int(docs[-1])}, the shard holds {n}")
    mode = {"full-sentences": K.FULL_SENTENCES, "sentence-pair": K.SENTENCE_PAIR}.get(layout.fmt, K.WITHIN_DOCUMENT)
    keep_min = 2 if layout.fmt in ("segment-pair", "sop-pair", "sentence-pair") else 1  # a pair needs 2 sentences
    if layout.single_segment:
        keep_min = 1  # one-sentence documents are one-segment rows (formats.py)
    seed_mix = np.uint64(mix64(layout.index_seed & M64))
    # (a shard has at most n chunks: buffers of one block or the shard, whichever is smaller)
    out, rows = np.empty((max(1, min(block, n)), 3), np.int64), np.empty(max(1, min(block, n)), np.int64)
    # the walk over each run of chosen documents [lo, hi) as if it were a shard of its own: full-sentences chunks
    # never cross a held-out document; with valid_split 0 the one run is the whole shard (the same chunks as before).
    # The loop over runs is compiled with the walk (walk_runs): one call per block, not per run
    runs = _document_runs(prefix, len(docs) - 1, layout)
    r, s, d = 0, (int(docs[runs[0, 0]]) if len(runs) else 0), (int(runs[0, 0]) if len(runs) else 0)
    while r < len(runs):
        k, r, s, d = run.walk_runs(lengths, docs, runs, first, r, s, d, mode, layout.budget, layout.min_sent,
                                   layout.min_tail, keep_min, seed_mix, float(layout.short_seq_prob),
                                   float(layout.nsp_prob), out, rows)
        if k:
            yield out[:k].copy(), rows[:k].copy()
