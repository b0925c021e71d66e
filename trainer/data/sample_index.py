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
- ``next(s)``: the largest ``e`` with ``cost(s..e) <= target(s)``, at least ``s + 2`` for segment/SOP pairs and
  ``s + 1`` otherwise, at most ``s + budget`` sentences; ``s + 2`` for sentence-pair. Formats other than
  full-sentences stop at the document end, and a 1-sentence remainder of a document (2 for pairs) joins the chunk.
  No chunk crosses a shard boundary (a shard holds ~1M sentences, so that is a loss of one sample in ~10^5).
- The chunks of a shard are the chain ``first sentence -> next(.) -> ...``, keeping those with tokens (and two
  sentences for pair formats). Packed doc-sentences fill rows next-fit within a shard (``_Packer``).

Worked example, budget 10 tokens, ``full-sentences``, sentence lengths ``[4, 3, 5 | 6, 2]`` (``|`` = document end):
costs ``[4, 3, 6, 6, 3]``; chunks ``[0, 2)`` (7 tokens, adding sentence 2 would make 13) and ``[2, 4)`` (12 > 10:
one sentence at least, so ``[2, 3)``), then ``[3, 5)``. With ``doc-sentences`` the walk stops at the document end.

Building: shard by shard (in parallel worker processes, ``workers``), each shard in blocks of ``block`` sentences
with the chain's position and the open packed row carried from block to block, so a builder holds ~100 bytes per
sentence of *one block* (~100 MB at 1M), whatever the corpus size; shard results are appended to the cache file in
shard order (workers change only the speed). tests/test_scale.py checks the result against a one-shot build over
whole-corpus arrays. Why our own walk and not megatron-core's ``helpers.build_mapping``: that one silently drops
every document holding a sentence longer than 512 tokens, cannot cross documents (full-sentences), shuffles the
result (our order is a keyed bijection, order.py) and needs whole-corpus arrays in memory.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache_file import CachePolicy, CacheWriter, ensure, settings_hash  # noqa: F401 (settings_hash re-exported)
from .corpus import IndexedCorpus, idx_arrays

INDEX_VERSION = 2
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

    @property
    def budget(self) -> int:
        return content_budget(self.fmt, self.max_seq_length)

    @property
    def min_sent(self) -> int:
        return 2 if self.fmt in ("segment-pair", "sop-pair") else 1

    @property
    def min_tail(self) -> int:
        return max(self.min_sent, 2 if self.fmt == "sentence-pair" else 1)

    @property
    def packed(self) -> bool:
        return self.pack and self.fmt == "doc-sentences"


def index_settings(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, index_seed: int,
                   pack: bool) -> dict:
    """Everything the index depends on (and nothing else: not the training seed); its hash keys the cache file."""
    return {"version": INDEX_VERSION, "corpus": corpus.fingerprint(), "format": fmt,
            "max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "index_seed": index_seed,
            "pack": bool(pack and fmt == "doc-sentences")}


def index_path(corpus: IndexedCorpus, fmt: str, key: str, cache_dir) -> Path:
    return Path(cache_dir) / f"index-{Path(corpus.prefix).name}-{fmt}-{key}.bfc"


def _open_index(path, key) -> dict:
    from .cache_file import open_cache  # noqa: PLC0415

    arrays, meta = open_cache(path, "sample-index", key)
    return {"chunks": arrays["chunks"], "row_ptr": arrays["row_ptr"] if meta.get("packed") else None}


def load_or_build(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, index_seed: int,
                  pack: bool, cache: CachePolicy | str | os.PathLike) -> SampleIndex:
    """The mapped index of this corpus and layout, built first if missing (by the policy's builder; the other ranks
    wait for the finished file, cache_file.ensure)."""
    if not isinstance(cache, CachePolicy):
        cache = CachePolicy(Path(cache))
    layout = Layout(fmt, max_seq_length, short_seq_prob, index_seed, pack)
    _check(layout)
    settings = index_settings(corpus, fmt, max_seq_length, short_seq_prob, index_seed, pack)
    key = settings_hash(settings)
    path = index_path(corpus, fmt, key, cache.dir)

    def build(p: Path) -> None:
        write_index(corpus, layout, p, key, settings, cache.workers)

    arrays, meta = ensure(path, "sample-index", key, build, cache, f"the '{fmt}' sample index of {corpus.prefix}")
    return SampleIndex(arrays["chunks"], arrays["row_ptr"] if meta.get("packed") else None, path, key)


def build_index(corpus: IndexedCorpus, fmt: str, max_seq_length: int, short_seq_prob: float, seed: int,
                pack: bool = True, block: int = BLOCK) -> SampleIndex:
    """The index in memory (tests, small corpora): the same blocks as ``write_index``, concatenated."""
    layout = Layout(fmt, max_seq_length, short_seq_prob, seed, pack)
    _check(layout)
    parts = [_shard_chunks((p, first, layout, block)) for p, first, _ in corpus.shards]
    chunks = np.concatenate([c for c, _ in parts]) if parts else np.zeros((0, 3), np.int64)
    _check_nonempty(corpus, layout, len(chunks))
    if not layout.packed:
        return SampleIndex(chunks)
    sizes = np.concatenate([r for _, r in parts])
    return SampleIndex(chunks, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


def write_index(corpus: IndexedCorpus, layout: Layout, path: Path, key: str, settings: dict, workers: int = 1,
                block: int = BLOCK) -> None:
    """Build shard by shard (``workers`` processes) and stream the shards' chunks into the cache file in order."""
    tasks = [(p, first, layout, block) for p, first, _ in corpus.shards]
    total = 0
    rows_tmp = path.parent / f".{path.name}.rows-{os.getpid()}"
    with CacheWriter(path, "sample-index", key, [("chunks", "<i8", (3,)), ("row_ptr", "<i8", ())]) as w, \
            open(rows_tmp, "wb") as rows:
        try:
            for chunks, sizes in _run(tasks, workers):
                w.append("chunks", chunks)
                total += len(chunks)
                if layout.packed:
                    rows.write(np.asarray(sizes, np.int64).tobytes())
            _check_nonempty(corpus, layout, total)
            if layout.packed:
                rows.flush()
                w.append("row_ptr", np.zeros(1, np.int64))
                n = os.path.getsize(rows_tmp) // 8
                sizes = np.memmap(rows_tmp, np.int64, mode="r", shape=(n,)) if n else np.zeros(0, np.int64)
                base = 0
                for lo in range(0, n, BLOCK):  # running sum block by block: bounded memory
                    ptr = np.cumsum(sizes[lo:lo + BLOCK]) + base
                    w.append("row_ptr", ptr)
                    base = int(ptr[-1])
                del sizes
            # the settings themselves go beside the file (the header has a fixed size; a corpus of thousands of shards
            # has a fingerprint of hundreds of kB)
            w.commit({"packed": layout.packed, "format": layout.fmt, "samples": int(total)})
        finally:
            rows_tmp.unlink(missing_ok=True)
    _write_description(path, settings)


def _write_description(path: Path, settings: dict) -> None:
    """``NAME.json`` beside a cache file: what it was built from, for people (nothing reads it back)."""
    tmp = path.with_name(f".{path.name}.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(settings, indent=1, sort_keys=True))
    os.replace(tmp, path.with_name(path.name + ".json"))


def _run(tasks: list, workers: int):
    """Shard results in shard order: inline with one worker, else from a pool of spawned processes (spawn: the
    builder may run inside a trainer process that holds threads, where fork is unsafe)."""
    if workers <= 1 or len(tasks) <= 1:
        yield from map(_shard_chunks, tasks)
        return
    with mp.get_context("spawn").Pool(min(workers, len(tasks))) as pool:
        yield from pool.imap(_shard_chunks, tasks)


def _check(layout: Layout) -> None:
    if layout.budget < 2:
        raise ValueError(f"data.max_seq_length={layout.max_seq_length} leaves {layout.budget} tokens for text; "
                         "use at least 8")


def _check_nonempty(corpus: IndexedCorpus, layout: Layout, n: int) -> None:
    if n == 0:
        raise ValueError(
            f"{corpus.prefix}: no '{layout.fmt}' sample can be built ({corpus.num_documents} documents, "
            f"{corpus.num_sentences} sentences); pair formats need documents of two or more sentences")


# -- targets -----------------------------------------------------------------------------------------------------------
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a bijective, well-mixing hash."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def sentence_targets(index_seed: int, sentences: np.ndarray, budget: int, short_seq_prob: float) -> np.ndarray:
    """Target tokens of the given global sentence indices: a pure function of (seed, sentence)."""
    s = np.asarray(sentences, dtype=np.uint64)
    h = mix64(s * _GOLDEN + mix64(np.array([index_seed], np.uint64)))
    u = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    target = np.full(len(s), budget, np.int64)
    short = u < short_seq_prob
    if short.any():
        h2 = mix64(h[short] ^ _M2)
        target[short] = 2 + (h2 % np.uint64(budget - 1)).astype(np.int64)
    return target


_MASK64 = (1 << 64) - 1


def _mix1(x: int) -> int:
    """``mix64`` of one Python int (the same bits)."""
    x = ((x ^ (x >> 30)) * int(_M1)) & _MASK64
    x = ((x ^ (x >> 27)) * int(_M2)) & _MASK64
    return x ^ (x >> 31)


def _target1(layout: Layout, sentence: int) -> int:
    """``sentence_targets`` of one global sentence, in Python (tested equal)."""
    h = _mix1((sentence * int(_GOLDEN) + _mix1(layout.index_seed)) & _MASK64)
    if (h >> 11) * 2.0 ** -53 < layout.short_seq_prob:
        return 2 + _mix1(h ^ int(_M2)) % (layout.budget - 1)
    return layout.budget


# -- one shard, block by block -------------------------------------------------------------------------------------------
def _shard_chunks(task) -> tuple[np.ndarray, np.ndarray]:
    """(chunks int64 [c, 3] in global sentence numbers, row sizes for packed doc-sentences) of one shard."""
    prefix, first, layout, block = task
    lengths, _, docs = idx_arrays(prefix)
    n = len(lengths)
    docs = np.asarray(docs, np.int64)
    if len(docs) == 0 or docs[-1] != n:
        docs = np.concatenate([docs[:1] if len(docs) else [0], docs[1:][docs[1:] < n], [n]]).astype(np.int64)
    L = layout.budget + 2  # the farthest next(s) - s can reach
    out, packer = [], _Packer(layout.max_seq_length) if layout.packed else None
    walk = _walk if layout.fmt == "full-sentences" else _walk_documents
    s = 0
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        if s >= b1:
            continue
        w = _Window(lengths, docs, b0, min(n, b1 + L), n, first, layout)
        starts, ends = walk(w, s, b1)
        s = int(ends[-1])  # where the chain goes on, in a later block
        tokens = w.cum[ends - b0] - w.cum[starts - b0]
        keep = tokens > 0
        if layout.fmt in ("segment-pair", "sop-pair", "sentence-pair"):
            keep &= ends - starts >= 2  # a pair needs two sentences (single-sentence documents cannot make one)
        target = sentence_targets(layout.index_seed, starts[keep] + first, layout.budget, layout.short_seq_prob)
        chunks = np.stack([starts[keep] + first, ends[keep] + first, target], axis=1)
        if packer is not None:
            packer.add(chunks, np.minimum(tokens[keep], layout.budget) + 2)
        else:
            out.append(chunks)
    if packer is not None:
        return packer.finish()
    return (np.concatenate(out) if out else np.zeros((0, 3), np.int64)), np.zeros(0, np.int64)


class _Window:
    """Sentences [b0, w1) of a shard: document ends, cumulative costs from b0; ``next(s)`` for any s in it."""

    def __init__(self, lengths, docs, b0: int, w1: int, n: int, first: int, layout: Layout):
        self.b0, self.n, self.first, self.layout = b0, n, first, layout
        i0 = int(np.searchsorted(docs, b0, side="right")) - 1
        i1 = int(np.searchsorted(docs, w1 - 1, side="right"))
        bounds = np.clip(docs[i0:i1 + 1], b0, w1)
        self.docs = docs[i0:i1 + 1]
        self.dend = np.repeat(docs[i0 + 1:i1 + 1], np.diff(bounds))  # end of each sentence's document
        cost = np.asarray(lengths[b0:w1], np.int64)
        if layout.fmt == "full-sentences":
            cost = cost.copy()
            cost[self.dend - 1 - b0 == np.arange(w1 - b0)] += 1  # the separator after a document's last sentence
        self.cum = np.zeros(w1 - b0 + 1, np.int64)
        np.cumsum(cost, out=self.cum[1:])

    def next(self, s: np.ndarray, scattered: bool = True) -> np.ndarray:
        """next(s) of the module docstring for shard-local sentences ``s`` (>= b0, < the window's end - budget);
        ``scattered``: a sparse subset (chain nodes) rather than every sentence in order."""
        lay, local = self.layout, s - self.b0
        if lay.fmt == "sentence-pair":
            nxt = s + 2
        else:
            target = sentence_targets(lay.index_seed, s + self.first, lay.budget, lay.short_seq_prob)
            if scattered:
                fit = _fit(self.cum, local, target) + self.b0
            else:  # ascending queries: numpy's binary search starts from the previous answer
                fit = np.searchsorted(self.cum, self.cum[local] + target, side="right") - 1 + self.b0
            nxt = np.minimum(np.maximum(fit, s + lay.min_sent), s + lay.budget)
        if lay.fmt in WITHIN_DOCUMENT:
            de = self.dend[local]
            nxt = np.minimum(nxt, de)
            tail = de - nxt
            nxt = np.where((tail > 0) & (tail < lay.min_tail), de, nxt)
        return np.minimum(nxt, self.n)

    def next1(self, s: int) -> int:
        """``next`` of one sentence in plain Python (~2 µs): for the few long documents left at the end of a block,
        where a numpy call per step would cost more than the step."""
        lay, local = self.layout, s - self.b0
        if lay.fmt == "sentence-pair":
            nxt = s + 2
        else:
            cum, e, last = self.cum, local, len(self.cum) - 1
            limit = int(cum[local]) + _target1(lay, s + self.first)
            while e < last and e - local < lay.budget and cum[e + 1] <= limit:
                e += 1
            nxt = min(max(e + self.b0, s + lay.min_sent), s + lay.budget)
        if lay.fmt in WITHIN_DOCUMENT:
            de = int(self.dend[local])
            nxt = min(nxt, de)
            if 0 < de - nxt < lay.min_tail:
                nxt = de
        return min(nxt, self.n)


_K = np.arange(1, 17)


def _fit(cum: np.ndarray, local: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The largest e with ``cum[e] - cum[s] <= target`` for each s of ``local``. Chunks hold a handful of
    sentences, so comparing the next 16 cumulative costs of each s (neighbouring memory) answers almost all of them;
    the rest take a binary search over the window (3x slower per query on 1M sentences: cache misses)."""
    last = len(cum) - 1
    out = np.empty(len(local), np.int64)
    for lo in range(0, len(local), 1 << 16):  # 16 x 64k entries at a time: ~8 MB of work memory
        s, t = local[lo:lo + (1 << 16)], target[lo:lo + (1 << 16)]
        limit = cum[s] + t
        count = (cum[np.minimum(s[:, None] + _K, last)] <= limit[:, None]).sum(axis=1)
        fit = np.minimum(s + count, last)
        far = count == len(_K)
        if far.any():
            fit[far] = np.searchsorted(cum, limit[far], side="right") - 1
        out[lo:lo + len(s)] = fit
    return out


def _walk(w: _Window, s: int, b1: int) -> tuple[np.ndarray, np.ndarray]:
    """The chain s -> next(s) -> ... while < b1, for full-sentences, whose chain crosses documents: next() for every
    sentence of the block, then one Python step per sample (~0.1 µs; ``ndarray.item`` and a typed ``array`` keep
    memory at 8 bytes per sample). -> (starts, ends)."""
    nxt = w.next(np.arange(w.b0, b1), scattered=False)
    out, step, b0 = array("q"), nxt.item, w.b0
    while s < b1:
        out.append(s)
        s = step(s - b0)
    starts = np.frombuffer(out, dtype=np.int64).copy()
    return starts, nxt[starts - b0]


def _walk_documents(w: _Window, s: int, b1: int) -> tuple[np.ndarray, np.ndarray]:
    """The same chain for formats that never cross a document, vectorised: every document's chain starts at the
    document's first sentence, so all documents of the block advance together, one numpy step per chunk *within*
    a document (tens of steps), computing next() only for the sentences on the chain (1 in ~5 at T = 128)."""
    d = w.docs[(w.docs >= s) & (w.docs < b1)]
    frontier = np.unique(np.concatenate([[s], d])).astype(np.int64)
    starts, ends = [], []
    while len(frontier) > 64:  # numpy steps while many documents are still open ...
        nxt = w.next(frontier)
        starts.append(frontier)
        ends.append(nxt)
        go_on = (nxt < w.dend[frontier - w.b0]) & (nxt < b1)  # still inside its document and this block
        frontier = nxt[go_on]
    tail_starts, tail_ends = array("q"), array("q")
    for x in frontier.tolist():  # ... then the few long ones in Python
        end = int(w.dend[x - w.b0])
        while True:
            y = w.next1(x)
            tail_starts.append(x)
            tail_ends.append(y)
            if y >= end or y >= b1:
                break
            x = y
    starts.append(np.frombuffer(tail_starts, np.int64) if len(tail_starts) else np.zeros(0, np.int64))
    ends.append(np.frombuffer(tail_ends, np.int64) if len(tail_ends) else np.zeros(0, np.int64))
    starts, ends = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(starts, kind="stable")
    return starts[order], ends[order]


class _Packer:
    """Next-fit packing of short doc-sentences samples into rows of at most ``max_seq_length`` tokens, fed block by
    block. Samples longer than half a row stay alone (they rarely pair up); the short ones, mostly document tails
    that follow each other in corpus order, share rows. One Python step per sample."""

    def __init__(self, max_seq_length: int):
        self.T = max_seq_length
        self.chunks: list[np.ndarray] = []
        self.order, self.sizes = array("q"), array("q")
        self.open: list[int] = []
        self.open_tokens = 0
        self.seen = 0

    def add(self, chunks: np.ndarray, row_tokens: np.ndarray) -> None:
        self.chunks.append(chunks)
        long_rows = (row_tokens * 2 > self.T).tolist()
        order, sizes = self.order, self.sizes
        for i, (is_long, n) in enumerate(zip(long_rows, row_tokens.tolist()), start=self.seen):
            if is_long:
                order.append(i)
                sizes.append(1)
                continue
            if self.open_tokens + n > self.T:
                order.extend(self.open)
                sizes.append(len(self.open))
                self.open, self.open_tokens = [], 0
            self.open.append(i)
            self.open_tokens += n
        self.seen += len(chunks)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        if self.open:
            self.order.extend(self.open)
            self.sizes.append(len(self.open))
        chunks = np.concatenate(self.chunks) if self.chunks else np.zeros((0, 3), np.int64)
        order = np.frombuffer(self.order, np.int64) if len(self.order) else np.zeros(0, np.int64)
        sizes = np.frombuffer(self.sizes, np.int64).copy() if len(self.sizes) else np.zeros(0, np.int64)
        return chunks[order], sizes
