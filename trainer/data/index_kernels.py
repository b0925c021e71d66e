"""The sample index's sentence walk and packing as compiled loops (numba), one pass over a shard's ``.idx`` lengths.

The rules are sample_index.py's (its docstring): a chunk's end ``next(s)`` depends on where the previous chunk
ended, so the walk is a chain, sequential by nature. numpy can only vectorise it by computing ``next`` for whole
frontiers and stepping many documents at once: ~20 array passes and a Python tail per block, 0.10-0.17 CPU-s per
1M sentences measured (bench/scale.py, BENCHMARKS.md). The loop itself reads each length once or twice: compiled, it
is a few ns per sentence. No library has this walk (megatron-core's C++ ``build_mapping`` is the closest and it
drops documents with a sentence over 512 tokens, never crosses documents and shuffles its output), so we write the
loop and let numba compile it: a library on PyPI for all our platforms, no compiler needed at install, and the
compiled code is cached on disk (``cache=True``: ``__pycache__`` beside this file, or numba's user cache when that
is read-only), so a process pays the ~5 s compilation once per machine. Where neither is writable (a read-only
checkout in a container and a read-only HOME), every process compiles it, with a warning naming NUMBA_CACHE_DIR.

Loading the compiled code still costs a process 1-4 s (numba's import and LLVM), more than a small shard's walk
takes in plain Python (~5 µs per sentence: the functions below are ordinary Python that numba compiles unchanged),
so ``kernels(n)`` runs shards of fewer than ``COMPILE_FROM`` sentences as Python and compiles for larger ones: the
same code either way (tests/test_scale.py checks both against a numpy reference). A rank that only maps a prebuilt
index imports none of this.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

COMPILE_FROM = 200_000  # sentences in a shard: from here on the compiled walk is cheaper than loading it

# modes of the walk
FULL_SENTENCES, WITHIN_DOCUMENT, SENTENCE_PAIR = 0, 1, 2

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NSP = np.uint64(0xD6E8FEB86659FD93)


def mix1(x):
    """splitmix64's finaliser on one uint64 (wrapping): order.mix64, in numba's types."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def target1(sentence, seed_mix, budget, short_seq_prob):
    """Target tokens of one global sentence (sample_index.py, ``target(s)``): ``budget``, or with probability
    ``short_seq_prob`` uniform in [2, budget]; ``seed_mix`` = order.mix64(index_seed), precomputed."""
    h = mix1(np.uint64(sentence) * _GOLDEN + seed_mix)
    if np.float64(h >> np.uint64(11)) * 2.0 ** -53 < short_seq_prob:
        return np.int64(2) + np.int64(mix1(h ^ _M2) % np.uint64(budget - 1))
    return np.int64(budget)


def nsp1(sentence, seed_mix, nsp_prob, span):
    """The NSP decision of the pair chunk that starts at global ``sentence`` and spans ``span`` sentences: -1 for a
    positive, else the sentences its A keeps (1 .. span - 1) when it is a negative (probability ``nsp_prob``,
    sample_index.py). A hash of (sentence, seed) independent of ``target1``'s."""
    h = mix1(mix1(np.uint64(sentence) * _GOLDEN + seed_mix) ^ _NSP)
    if np.float64(h >> np.uint64(11)) * 2.0 ** -53 >= nsp_prob:
        return np.int64(-1)
    return np.int64(1) + np.int64(mix1(h ^ _M1) % np.uint64(span - 1))


def cost1(lengths, docs, dd, e, mode):
    """(tokens sentence ``e`` adds to a chunk, the document of ``e``): its length, plus 1 in full-sentences for a
    document's last sentence (the [SEP] that follows it); ``dd`` is a document at or before ``e``'s."""
    c = np.int64(lengths[e])
    if mode == FULL_SENTENCES:
        while docs[dd + 1] <= e:
            dd += 1
        if docs[dd + 1] - 1 == e:
            c += 1
    return c, dd


def walk(lengths, docs, first, s, d, stop, mode, budget, min_sent, min_tail, keep_min, seed_mix, short_seq_prob,
         nsp_prob, out, row_tokens):
    """Chunks of one shard from chain position ``s`` (shard-local; ``d``: its document, ``docs[d] <= s <
    docs[d + 1]``), while ``s < stop`` and ``out`` has room. ``docs`` ends with the shard's sentence count.

    Writes (start, end, target) rows in global sentence numbers to ``out`` and each row's packed size
    (min(tokens, budget) + 2) to ``row_tokens``; returns (rows written, next s, its document). ``nsp_prob`` > 0
    (NSP formats): a pair chunk is a negative with that probability, written as (start, start + A's sentences,
    -target), and the chain goes on from the end of A (BERT's unused segments put back); a lone sentence left in
    the middle of a document by that, or a document of one sentence, is a negative too (BERT's rule for a
    one-segment chunk: create_instances_from_document never drops one)."""
    n = len(lengths)
    cap = len(out)
    k = 0
    while s < stop and k < cap:
        while docs[d + 1] <= s:  # skip to s's document (empty documents have docs[d] == docs[d + 1])
            d += 1
        de = docs[d + 1]
        t = target1(first + s, seed_mix, budget, short_seq_prob)
        if mode == SENTENCE_PAIR:
            nxt = s + 2
        else:
            # the largest e with cost(s..e-1) <= t, at most s + budget; a document's last sentence costs one more in
            # full-sentences (the [SEP] that follows it). Formats within a document stop scanning at its end (the
            # chunk is clamped there anyway): one-sentence documents cost one step each, not ``budget``
            e, acc, dd = s, 0, d
            limit = n if mode == FULL_SENTENCES else de
            while e < limit and e - s < budget:
                c, dd = cost1(lengths, docs, dd, e, mode)
                # a document's last sentence may end the chunk without its [SEP]: the row's final [SEP] closes it
                last = c - 1 if mode == FULL_SENTENCES and docs[dd + 1] - 1 == e else c
                if acc + last > t:
                    break
                acc += c
                e += 1
            nxt = min(max(e, s + min_sent), s + budget)
        if mode != FULL_SENTENCES:
            nxt = min(nxt, de)
            if 0 < de - nxt < min_tail:  # a remainder too short to be a chunk joins this one
                nxt = de
        nxt = min(nxt, n)
        tokens, dd = np.int64(0), d
        for e in range(s, nxt):
            c, dd = cost1(lengths, docs, dd, e, mode)
            tokens += c
        # (a one-sentence document is a one-segment chunk too: BERT makes it a negative, never drops it)
        if nsp_prob > 0 and tokens > 0:
            a = nsp1(first + s, seed_mix, nsp_prob, nxt - s) if nxt - s >= 2 else np.int64(1)
            if mode == SENTENCE_PAIR and a > 1:
                a = np.int64(1)  # one natural sentence each side
            if a > 0:  # a negative: A = [s, s + a), the rest goes back to the chain
                out[k, 0] = first + s
                out[k, 1] = first + s + a
                out[k, 2] = -t
                row_tokens[k] = min(tokens, budget) + 2
                k += 1
                s = s + a
                continue
        if tokens > 0 and nxt - s >= keep_min:
            out[k, 0] = first + s
            out[k, 1] = first + nxt
            out[k, 2] = t
            row_tokens[k] = min(tokens, budget) + 2
            k += 1
        s = nxt
    return k, s, d


def walk_runs(lengths, docs, runs, first, r, s, d, mode, budget, min_sent, min_tail, keep_min, seed_mix,
              short_seq_prob, nsp_prob, out, row_tokens):
    """``walk`` over the runs ``runs[r:]`` (int64 [R, 2]: ``[lo, hi)`` of consecutive chosen documents, as
    sample_index.py's held-out split gives them), each walked as if it were a shard of its own: chunks never cross a
    run's end. Resumes at run ``r``, shard-local chain position ``s`` and its document ``d`` (at a run's start: ``s
    = docs[lo]``, ``d = lo``) while ``out`` has room. -> (rows written, next r, s, d).

    The loop over runs is here, not in Python: at ``valid_split`` 0.2 a shard of 1M documents has ~160K runs, and a
    Python call per run cost ~10 us (most of the build at 400M documents). The walk over a run sees the shard's arrays
    cut at the run's end (views, no copy), so its chunks, targets and NSP draws are those of the run walked alone."""
    cap = len(out)
    k = 0
    while r < len(runs) and k < cap:
        hi = runs[r, 1]
        stop = docs[hi]
        if s < stop:
            got, s, d = walk(lengths[:stop], docs[:hi + 1], first, s, d, stop, mode, budget, min_sent, min_tail,
                             keep_min, seed_mix, short_seq_prob, nsp_prob, out[k:], row_tokens[k:])
            k += got
        if s >= stop:
            r += 1
            if r < len(runs):
                s, d = docs[runs[r, 0]], runs[r, 0]
    return k, r, s, d


def pack(row_tokens, T):
    """Next-fit packing of rows of ``row_tokens`` tokens into rows of at most ``T``: a row over half of ``T`` stays
    alone (emitted in place), the short ones fill the open row in order. -> (order of the rows, sizes of the packed
    rows)."""
    m = len(row_tokens)
    order = np.empty(m, np.int64)
    sizes = np.empty(m, np.int64)
    held = np.empty(m, np.int64)  # the open row's members
    n_order, n_sizes, n_held, used = 0, 0, 0, 0
    for i in range(m):
        size = row_tokens[i]
        if size * 2 > T:
            order[n_order] = i
            n_order += 1
            sizes[n_sizes] = 1
            n_sizes += 1
            continue
        if used + size > T:
            for j in range(n_held):
                order[n_order] = held[j]
                n_order += 1
            sizes[n_sizes] = n_held
            n_sizes += 1
            n_held, used = 0, 0
        held[n_held] = i
        n_held += 1
        used += size
    if n_held:
        for j in range(n_held):
            order[n_order] = held[j]
            n_order += 1
        sizes[n_sizes] = n_held
        n_sizes += 1
    return order, sizes[:n_sizes].copy()


_PYTHON = SimpleNamespace(mix1=mix1, target1=target1, nsp1=nsp1, cost1=cost1, walk=walk, walk_runs=walk_runs,
                          pack=pack)


@functools.cache
def _compiled() -> SimpleNamespace:
    """The functions compiled by numba (in dependency order: a compiled function calls the module-level names, so
    each name is rebound to its compiled version before the functions that call it are compiled)."""
    from numba import njit  # noqa: PLC0415

    g = globals()
    names = ("mix1", "target1", "nsp1", "cost1", "walk", "walk_runs", "pack")
    cache = True
    for name in names:
        try:
            g[name] = njit(cache=cache, nogil=True)(getattr(_PYTHON, name))
        except RuntimeError as err:  # numba: "cannot cache function 'mix1': no locator available for file ..."
            if not cache or "cannot cache" not in str(err):
                raise
            cache = False
            g[name] = njit(nogil=True)(getattr(_PYTHON, name))
            import sys  # noqa: PLC0415
            print(f"warning: numba cannot cache the compiled index walk ({err}): neither __pycache__ beside "
                  f"{__file__} nor numba's user cache under HOME is writable. This process compiles it (~5 s); set "
                  "NUMBA_CACHE_DIR to a writable folder to compile it once per machine", file=sys.stderr, flush=True)
    return SimpleNamespace(**{name: g[name] for name in names})


class _Interpreted:
    """The Python functions, with numpy's overflow warnings off (the hash wraps on purpose, as compiled code does)."""

    @staticmethod
    def walk(*args):
        with np.errstate(over="ignore"):
            return _PYTHON.walk(*args)

    @staticmethod
    def walk_runs(*args):
        with np.errstate(over="ignore"):
            return _PYTHON.walk_runs(*args)

    @staticmethod
    def pack(*args):
        return _PYTHON.pack(*args)

    @staticmethod
    def target1(*args):
        with np.errstate(over="ignore"):
            return _PYTHON.target1(*args)


def kernels(sentences: int, compiled: bool | None = None):
    """``walk``/``walk_runs``/``pack``/``target1`` for a shard of ``sentences``: compiled from ``COMPILE_FROM`` on (or as
    ``compiled`` says)."""
    if compiled is None:
        compiled = sentences >= COMPILE_FROM
    return _compiled() if compiled else _Interpreted
