"""Data-loader worker processes that leave stop signals to their rank, and are ended with it.

Slurm (preemption, ``scontrol requeue``, ``scancel``) sends SIGTERM to every process of the job, torchrun forwards the
signals it handles to each rank's whole process group, and Ctrl-C sends SIGINT to the terminal's process group: the
loader workers get the signal too. Their default action ends them, and the rank then fails at its next batch with
"DataLoader worker (pid ...) exited unexpectedly" instead of saving the preemption checkpoint. The rank decides what
a signal means (``trainer.loop.PreemptionFlag``), so the workers ignore SIGTERM, SIGINT and SIGUSR1.

Setting SIG_IGN in ``worker_init_fn`` alone leaves a window (fork -> ``worker_init_fn``) in which a signal still
kills a new worker, so the rank blocks the signals while the DataLoader forks its workers: a forked (or spawned)
process inherits the blocked mask, sets SIG_IGN, then unblocks (a signal that arrived meanwhile is discarded). The
rank's own mask is restored at once; a signal sent to it meanwhile stays pending and is handled on restore, not lost.
(Workers of a ``forkserver`` context are forked by the server, not the rank: there only the SIG_IGN applies, with
the short window before it. Linux's default start method up to Python 3.13, ``fork``, is the one used here.)

Workers end with their loader (``shutdown_workers`` at the end of a run): ``trainer.pretrain`` leaves the process
with ``os._exit``, which skips the DataLoader's own clean-up, and a worker that ignores SIGTERM would otherwise live
until its parent-death check (every 5 s) notices. A script that ends with a plain interpreter exit (a benchmark, a
user's own loop over ``build_dataloader``) gets the same clean-up from an ``atexit`` hook: without it, Python's exit
sends SIGTERM to the daemonic workers and then joins them, and workers that ignore SIGTERM made the exit hang forever
(found by review). The hook is registered after multiprocessing's own, so it runs first.
"""
from __future__ import annotations

import atexit
import signal
import weakref

import torch

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_live_iterators: weakref.WeakSet = weakref.WeakSet()


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """``worker_init_fn``: SIGTERM, SIGINT and SIGUSR1 are the rank's to handle; then accept other signals again."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class WorkerSafeDataLoader(torch.utils.data.DataLoader):
    """A DataLoader whose worker processes ignore the stop signals from their first instruction on (module docstring)
    and are tracked for ``shutdown_workers``."""

    def __init__(self, *args, worker_init_fn=None, **kwargs):
        if worker_init_fn is not None:
            raise ValueError("WorkerSafeDataLoader installs its own worker_init_fn")
        super().__init__(*args, worker_init_fn=ignore_stop_signals, **kwargs)

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        # Workers start in the iterator's constructor (and persist with persistent_workers: later iter() reuse them).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            iterator = super()._get_iterator()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _live_iterators.add(iterator)
        return iterator


def shutdown_workers() -> int:
    """End the worker processes of every loader iterator still alive in this process; returns how many iterators.
    Uses the iterator's own ``_shutdown_workers`` (what its ``__del__`` calls: tells workers to stop, joins them,
    terminates stragglers)."""
    iterators = list(_live_iterators)
    for iterator in iterators:
        iterator._shutdown_workers()
    _live_iterators.clear()
    return len(iterators)


atexit.register(shutdown_workers)
