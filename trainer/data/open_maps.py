"""How many shards one process keeps mapped, and the least-recently-used bookkeeping that keeps it there.

A mapped file holds one file descriptor and one memory map for as long as the map lives (numpy's ``memmap``, which
megatron-core's ``IndexedDataset`` uses too, keeps the descriptor ``mmap`` duplicates). A 160 GB corpus has 600 to
2,600 shards (one per input file at least, so a corpus kept as many small files has tens of thousands), with two
mapped files each (``.idx``, ``.bin``) and two more for ERNIE's side-cars. Random sample order reaches most shards in
every loader worker within a few thousand samples: kept open, 2,000 shards pass the common 1,024 open-file limit
("Too many open files", which a loader worker reports to the rank as an empty EOFError; measured by review at sample
385 of one process), tens of thousands pass any limit and ``vm.max_map_count`` (65,530), and each mapped GiB read
across costs ~1.8 MiB of page tables per worker that the kernel keeps while the map lives.

So each reader keeps at most ``max_open_shards`` shards mapped and drops the least recently used one's maps when it
opens another. Reopening a dropped shard costs an ``open`` and an ``mmap`` (tens of microseconds; its pages stay in
the page cache). ``functools.lru_cache`` cannot do this: an evicted entry must release its maps, and the readers keep
their maps in their own per-shard slots, which pickling to loader workers resets. A map a caller still holds a view
of stays valid (numpy keeps it alive) until the view is dropped.
"""
from __future__ import annotations

import os
import resource
from collections import OrderedDict
from typing import Callable

ENV = "BERTFAMILY_MAX_OPEN_SHARDS"
LIMIT_SHARE = 4
"""A reader's maps take at most 1/LIMIT_SHARE of the process's open-file limit (the rest: the other readers, loader
pipes, shared-memory tensors, checkpoints, logs)."""
CEILING = 4096
"""No more than this many shards per reader whatever the limit: 4,096 x 2 maps stays far below vm.max_map_count."""


def raise_open_file_limit(most: int = 65536) -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (at most ``most``: 4 x ``CEILING`` shards of 2
    files and room for the rest; a far higher soft limit slows code that closes every possible descriptor before an
    exec, as some MPI launchers do); returns (before, after).
    The soft limit is often 1,024 where the hard one allows far more (the kernel's per-process file table grows as
    needed), and a training rank maps many shards; loader workers forked later inherit it. A process that may not
    raise it keeps its limit (the bound below then follows the soft one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = most if hard == resource.RLIM_INFINITY else min(hard, most)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, want
    return soft, soft


def max_open_shards(files_per_shard: int) -> int:
    """Shards one reader may keep mapped: ``BERTFAMILY_MAX_OPEN_SHARDS`` if set, else a quarter of the soft
    ``RLIMIT_NOFILE`` divided by the files each shard maps, between 16 and ``CEILING`` (1,024 open files: 128 shards
    of 2 files)."""
    value = os.environ.get(ENV)
    if value:
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV}={value!r}: give a whole number of shards >= 1 (or unset it for the default, "
                             "a quarter of the open-file limit)")
        return n
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CEILING
    return max(16, min(CEILING, soft // (LIMIT_SHARE * max(files_per_shard, 1))))


class OpenShards:
    """The shards a reader has mapped, least recently used first. ``touch(k)`` before each use of shard ``k``; when a
    new shard makes more than ``limit`` open, ``close(j)`` is called for the least recently used ``j`` (it must drop
    the reader's references to ``j``'s maps) and ``j`` leaves the set."""

    def __init__(self, files_per_shard: int, close: Callable[[int], None], limit: int | None = None):
        self.limit = limit if limit is not None else max_open_shards(files_per_shard)
        self._close = close
        self._open: OrderedDict[int, None] = OrderedDict()

    def touch(self, k: int) -> None:
        if k in self._open:
            self._open.move_to_end(k)
            return
        self._open[k] = None
        while len(self._open) > self.limit:
            j, _ = self._open.popitem(last=False)
            self._close(j)

    def __len__(self) -> int:
        return len(self._open)
