"""Global data order: stream position -> (corpus, epoch, sample id), blending, and the per-rank batch sampler.

One corpus of N samples: position ``g`` is epoch ``g // N``, sample ``P_e(g % N)`` where ``P_e`` is a keyed
pseudo-random permutation of ``[0, N)``: a Feistel network over the smallest even number of bits covering N, with
cycle walking (re-encrypt while the value is >= N) to stay inside [0, N). Nothing is materialised: O(1) memory and
~5 µs per position in Python (``EpochOrder.__call__``), or vectorised over a batch of positions (``.batch``), so an
epoch boundary costs nothing and no file exists per epoch. The order is a pure function of (seed, epoch, position).
Why our own and not ``numpy.random.permutation``: that materialises 4-8 bytes per sample per epoch (9 s at 87M
samples, 46 s at 400M, at every epoch boundary); no library we use offers a keyed bijection over an arbitrary range.
Example: N = 5; the 4-bit domain (2-bit halves) is walked until a value < 5 comes out, so P_e is a permutation of
[0, 5) and position 7 is epoch 1, slot 2, sample P_1(2).

Several corpora with weights: megatron-core's ``build_blending_indices`` (the greedy "largest deficit first" rule
Megatron uses) fills a pattern of ``period`` positions; position ``g`` is pattern slot ``g % period`` in repetition
``g // period``, so corpus ``c``'s own stream position is ``(g // period) * count_c + slot_index_c``, which maps on
through that corpus's permutations as above. O(1) per position, unbounded length, weights exact per period.

Batches: step ``s`` with global batch ``G`` reads positions ``[s*G, (s+1)*G)``; micro-step ``a`` of ``A``
(gradient accumulation) reads ``[s*G + a*R*m, s*G + (a+1)*R*m)``, of which rank ``r`` of ``R`` takes its contiguous
slice of ``m``. Example: G = 8, R = 2, m = 2 (A = 2), step 3: rank 1 reads 26, 27 then 30, 31. Resuming is setting
``consumed_samples``; the positions read afterwards are exactly those an uninterrupted run reads, on any R and m that
keep G. A resume with another G continues from the same position, the new G at a time (then ``consumed_samples`` need
not be a multiple of the new G: G 16 -> 48 after 8 steps reads [128, 176) next).
"""
from __future__ import annotations

import numpy as np

M64 = (1 << 64) - 1
_C1, _C2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15
ROUNDS = 6


def mix64(z: int) -> int:
    """splitmix64's finaliser on a Python int (the scalar twin of ``mix64_many``; also the sample index's hash:
    sample_index.py, index_kernels.py)."""
    z = ((z ^ (z >> 30)) * _C1) & M64
    z = ((z ^ (z >> 27)) * _C2) & M64
    return z ^ (z >> 31)


def mix64_many(z: np.ndarray) -> np.ndarray:
    """``mix64`` of every uint64 of ``z`` (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
    return z ^ (z >> np.uint64(31))


class KeyedPermutation:
    """A pseudo-random bijection of ``[0, n)`` keyed by ``key`` (any int): ``p(x)`` for one, ``p.many(xs)`` for a
    numpy batch (same values). Balanced Feistel network of ROUNDS rounds over 2h bits (2^2h >= n, < 4n), round
    function splitmix64(right half ^ round key), cycle walking; expected < 4 walks per value."""

    def __init__(self, n: int, key: int):
        if n <= 0:
            raise ValueError("a permutation of an empty range")
        self.n = int(n)
        self.half = max(1, ((self.n - 1).bit_length() + 1) // 2)
        self.mask = (1 << self.half) - 1
        k = mix64((key & M64) ^ _GOLDEN)
        self.round_keys = [mix64((k + (r + 1) * _GOLDEN) & M64) for r in range(ROUNDS)]

    def _encrypt(self, x: int) -> int:
        h, mask = self.half, self.mask
        left, right = x >> h, x & mask
        for k in self.round_keys:
            left, right = right, left ^ (mix64(right ^ k) & mask)
        return (left << h) | right

    def __call__(self, x: int) -> int:
        if not 0 <= x < self.n:
            raise IndexError(f"{x} outside [0, {self.n})")
        if self.n == 1:
            return 0
        x = self._encrypt(x)
        while x >= self.n:
            x = self._encrypt(x)
        return x

    def many(self, xs) -> np.ndarray:
        xs = np.asarray(xs, dtype=np.int64)
        if xs.size and (xs.min() < 0 or xs.max() >= self.n):
            raise IndexError(f"positions outside [0, {self.n})")
        if self.n == 1:
            return np.zeros(xs.shape, np.int64)
        h, mask = np.uint64(self.half), np.uint64(self.mask)
        keys = [np.uint64(k) for k in self.round_keys]

        def encrypt(v: np.ndarray) -> np.ndarray:
            left, right = v >> h, v & mask
            for k in keys:
                left, right = right, left ^ (mix64_many(right ^ k) & mask)
            return (left << h) | right

        out = encrypt(xs.astype(np.uint64).ravel())
        todo = np.flatnonzero(out >= np.uint64(self.n))
        while len(todo):  # cycle walking, only on the values still outside [0, n)
            out[todo] = encrypt(out[todo])
            todo = todo[out[todo] >= np.uint64(self.n)]
        return out.astype(np.int64).reshape(xs.shape)


class EpochOrder:
    """Maps a corpus's own stream position to ``(epoch, sample_id)``: epoch e's order is ``KeyedPermutation(N,
    key(seed, e))``, built on demand (a few round keys, ~10 µs) and the last one kept."""

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True):
        if num_samples <= 0:
            raise ValueError("a corpus with no samples has no order")
        self.num_samples, self.seed, self.shuffle = int(num_samples), int(seed), shuffle
        self._perm: tuple[int, KeyedPermutation] | None = None

    def permutation(self, epoch: int) -> KeyedPermutation:
        if self._perm is None or self._perm[0] != epoch:
            key = mix64((mix64(self.seed & M64) + _GOLDEN * (epoch + 1)) & M64)
            self._perm = (epoch, KeyedPermutation(self.num_samples, key))
        return self._perm[1]

    def __call__(self, position: int) -> tuple[int, int]:
        epoch, slot = divmod(int(position), self.num_samples)
        if not self.shuffle:
            return epoch, slot
        return epoch, self.permutation(epoch)(slot)

    def batch(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised ``__call__`` over an array of positions -> (epochs, sample ids)."""
        epochs, slots = np.divmod(np.asarray(positions, dtype=np.int64), self.num_samples)
        if not self.shuffle:
            return epochs, slots
        ids = np.empty_like(slots)
        for e in np.unique(epochs).tolist():  # a micro-batch spans one epoch, or two at a boundary
            sel = epochs == e
            ids[sel] = self.permutation(e).many(slots[sel])
        return epochs, ids


class Blend:
    """Position -> (corpus index, that corpus's own stream position) for weighted corpora.

    The pattern (10 bytes per slot of ``period``) is computed in each process, not pickled to workers; one corpus
    needs none."""

    def __init__(self, weights: list[float], period: int = 1_000_000):
        w = np.asarray(weights, dtype=np.float64)
        if len(w) == 0 or (w <= 0).any():
            raise ValueError(f"blend weights must be positive, got {weights}")
        self.weights = w / w.sum()
        self.period = int(period)
        self._fill()

    def _fill(self) -> None:
        n = len(self.weights)
        if n == 1:
            self.corpus = self.local = None
            self.per_period = np.array([self.period], np.int64)
            return
        # Imported here: importing megatron.core costs seconds.
        from megatron.core.datasets import helpers_cpp  # noqa: PLC0415

        self.corpus = np.zeros(self.period, dtype=np.int16)
        self.local = np.zeros(self.period, dtype=np.int64)
        helpers_cpp.build_blending_indices(self.corpus, self.local, self.weights, n, self.period, False)
        self.per_period = np.bincount(self.corpus, minlength=n).astype(np.int64)
        if (self.per_period == 0).any():
            k = int(np.flatnonzero(self.per_period == 0)[0])
            raise ValueError(
                f"blend: corpus {k} has weight share {self.weights[k]:.3g}, under one slot in data.blend_period="
                f"{self.period:,} slots, so it would never be read; raise its weight or data.blend_period")

    def __call__(self, position: int) -> tuple[int, int]:
        if self.corpus is None:
            return 0, int(position)
        rep, slot = divmod(int(position), self.period)
        c = int(self.corpus[slot])
        return c, rep * int(self.per_period[c]) + int(self.local[slot])

    def read_before(self, position: int) -> np.ndarray:
        """int64 [corpora]: how many of positions ``[0, position)`` each corpus gives, i.e. where each corpus's own
        stream stands at ``position`` (the local position it reads next). Exact, O(period) at most: whole periods,
        then the slots of the last one. A resume with other weights compares two blends here (data_changes.py)."""
        if self.corpus is None:
            return np.array([int(position)], np.int64)
        reps, rest = divmod(int(position), self.period)
        return reps * self.per_period + np.bincount(self.corpus[:rest], minlength=len(self.weights)).astype(np.int64)

    def __getstate__(self):
        return {"weights": self.weights, "period": self.period}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._fill()


class PretrainingBatchSampler:
    """Yields, for one rank, the lists of global positions of its micro-batches from ``consumed_samples`` on.

    Pass it as ``batch_sampler`` to a DataLoader over a dataset indexed by global position. Stops after
    ``total_samples`` (the end of training), or never if that is None.
    """

    def __init__(self, consumed_samples: int, global_batch: int, micro_batch: int, rank: int, world_size: int,
                 total_samples: int | None = None):
        if global_batch % (micro_batch * world_size):
            raise ValueError(
                f"global batch {global_batch} is not a multiple of micro batch {micro_batch} x world size "
                f"{world_size}: set them so that global = micro x accumulation x data-parallel size")
        if consumed_samples < 0:
            raise ValueError(f"consumed_samples {consumed_samples} < 0")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.consumed, self.G, self.m, self.rank, self.R = consumed_samples, global_batch, micro_batch, rank, world_size
        self.total = total_samples

    def __iter__(self):
        start = self.consumed
        span = self.m * self.R
        while self.total is None or start + self.G <= self.total:
            for a in range(self.G // span):
                first = start + a * span + self.rank * self.m
                yield list(range(first, first + self.m))
            start += self.G

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("an endless sampler has no length")
        return max(0, (self.total - self.consumed) // self.G) * (self.G // (self.m * self.R))
