"""Global data order: stream position -> (corpus, epoch, sample id), blending, and the per-rank batch sampler.

One corpus of N samples: position ``g`` is epoch ``g // N``, sample ``perm_e[g % N]`` where ``perm_e`` is a
permutation seeded by ``(seed, e)``, built once per epoch and cached on disk (4 or 8 bytes per sample, memory-mapped
by every rank and worker). Example: N = 5, perm_0 = [3, 0, 4, 1, 2]; position 7 is epoch 1, slot 2 of perm_1.

Several corpora with weights: megatron-core's ``build_blending_indices`` (the greedy "largest deficit first" rule
Megatron uses) fills a pattern of ``period`` positions; position ``g`` is pattern slot ``g % period`` in repetition
``g // period``, so corpus ``c``'s own stream position is ``(g // period) * count_c + slot_index_c``, which maps on
through that corpus's permutations as above. O(1) per position, unbounded length, weights exact per period.

Batches: step ``s`` with global batch ``G`` reads positions ``[s*G, (s+1)*G)``; micro-step ``a`` of ``A``
(gradient accumulation) reads ``[s*G + a*R*m, s*G + (a+1)*R*m)``, of which rank ``r`` of ``R`` takes its contiguous
slice of ``m``. Example: G = 8, R = 2, m = 2 (A = 2), step 3: rank 1 reads 26, 27 then 30, 31. Resuming is setting
``consumed_samples``; the positions read afterwards are exactly those an uninterrupted run reads, on any R and m that
keep G.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np


ORDER_VERSION = 1  # of the permutation _build computes; part of the cache key


class EpochOrder:
    """Maps a corpus's own stream position to ``(epoch, sample_id)`` through cached per-epoch permutations."""

    def __init__(self, num_samples: int, seed: int, cache_dir: str | os.PathLike | None = None, key: str = "",
                 shuffle: bool = True, keep_in_memory: int = 2):
        if num_samples <= 0:
            raise ValueError("a corpus with no samples has no order")
        self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.key = key
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()
        self._keep = keep_in_memory

    def __call__(self, position: int) -> tuple[int, int]:
        epoch, slot = divmod(int(position), self.num_samples)
        if not self.shuffle:
            return epoch, slot
        return epoch, int(self.permutation(epoch)[slot])

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = self._load_or_build(epoch)
            self._perms[epoch] = perm
            while len(self._perms) > self._keep:
                self._perms.popitem(last=False)
        return perm

    def _build(self, epoch: int) -> np.ndarray:
        dtype = np.int32 if self.num_samples < 2**31 else np.int64
        rng = np.random.Generator(np.random.PCG64([self.seed, epoch, 0x5EED]))
        return rng.permutation(self.num_samples).astype(dtype)

    def _load_or_build(self, epoch: int) -> np.ndarray:
        if self.cache_dir is None:
            return self._build(epoch)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # the key names what the file holds: the caller's key (the sample index's hash), the size, the seed and the
        # version of _build's algorithm (bump ORDER_VERSION when it changes, or old files would be read as new)
        digest = hashlib.sha256(json.dumps([ORDER_VERSION, self.key, self.num_samples, self.seed]).encode()
                                ).hexdigest()[:16]
        path = self.cache_dir / f"{digest}-perm-epoch{epoch}.npy"
        if not path.exists():
            with open(self.cache_dir / f"{digest}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not path.exists():
                    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
                    np.save(tmp, self._build(epoch))
                    os.replace(tmp, path)
        return np.load(path, mmap_mode="r").view(np.ndarray)  # see sample_index.load_or_build

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_perms"] = OrderedDict()  # workers map the cached files themselves
        return state


class Blend:
    """Position -> (corpus index, that corpus's own stream position) for weighted corpora."""

    def __init__(self, weights: list[float], period: int = 1_000_000):
        w = np.asarray(weights, dtype=np.float64)
        if len(w) == 0 or (w <= 0).any():
            raise ValueError(f"blend weights must be positive, got {weights}")
        self.weights = w / w.sum()
        self.period = int(period)
        if len(w) == 1:
            self.corpus = np.zeros(self.period, np.int16)
            self.local = np.arange(self.period, dtype=np.int64)
        else:
            # Imported here: importing megatron.core costs seconds.
            from megatron.core.datasets import helpers_cpp  # noqa: PLC0415

            self.corpus = np.zeros(self.period, dtype=np.int16)
            self.local = np.zeros(self.period, dtype=np.int64)
            helpers_cpp.build_blending_indices(self.corpus, self.local, self.weights, len(w), self.period, False)
        self.per_period = np.bincount(self.corpus, minlength=len(w)).astype(np.int64)

    def __call__(self, position: int) -> tuple[int, int]:
        rep, slot = divmod(int(position), self.period)
        c = int(self.corpus[slot])
        return c, rep * int(self.per_period[c]) + int(self.local[slot])


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
        if consumed_samples % global_batch:
            raise ValueError(f"consumed_samples {consumed_samples} is not at a step boundary of global batch "
                             f"{global_batch}; a checkpoint is taken between steps only")
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
