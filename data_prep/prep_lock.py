"""One ``build_indexed`` run per output prefix at a time: a lock held by rank 0 for the whole run.

Two runs on one ``--output-prefix`` (a job submitted twice, a resubmission while the first still runs) would both open
the same ``PREFIX.work/piece_*.bin`` for writing: the second's truncation punches a hole of zeros into the file the
first is writing, and the first then records (and the manifest verifies) the holed bytes. So a run takes
``OUT/.NAME.lock/run.lock`` before it reads or writes anything of the output (the up-to-date check included) and
holds it until it exits; a second launch is refused with a message naming the prefix and the holder (host, pid, start
time, command).

The lock is trainer/run_lock.py's ``RunLock`` (standard library only; see its docstring): created atomically, with a
heartbeat file the holder rewrites every ``stale_s / 6``. A lock whose holder died (SIGKILL, a lost node) is taken
over: at once when the holder ran on this host and its pid is gone, otherwise once its heartbeat has not changed for
``--lock-stale-s`` (default 60 s) of the contender's own watching. The folder is hidden (``.NAME.lock``), so an
output lying inside an ``--input`` folder never feeds its lock files to the next run (hidden entries are not walked),
and it is removed when the run ends.

MPI: only rank 0 takes the lock. The other ranks must not write into the work folder of a run that is not theirs (a
refused launch's rank 1 would otherwise tokenize into the live run's files before the launcher stops it), and they
cannot ask rank 0 (mpi4py is imported only after the worker pool is gone, see build_indexed.py). So each waits, before
it touches the work folder, until the lock names its own launch (``launch_id``: Slurm's job and step, Open MPI's job
or PMIx namespace, all shared by the ranks of one launch and by no other). A refused rank 0 exits with an error, and
the launcher (srun --kill-on-bad-exit, mpirun) stops the waiting ranks; a rank that waits longer than
``rank_wait_s`` stops by itself, saying why. Under a launcher that sets none of those variables (MPICH's hydra outside
Slurm) the ranks accept any lock whose holder had none either: weaker, as another such launch's lock passes too.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from trainer.run_lock import LOCK_NAME, RunLock, RunLockedError

STALE_S = 60.0


class PrefixLockedError(RunLockedError):
    """The output prefix is being built by another live run (or this run lost its lock)."""


def lock_dir(prefix: str | os.PathLike) -> Path:
    """``OUT/.NAME.lock`` for ``--output-prefix OUT/NAME``, by the real path of OUT (``data/c`` and ``./data/c``, or a
    symlinked OUT, are one output)."""
    prefix = str(prefix)
    return Path(os.path.realpath(os.path.dirname(prefix) or ".")) / f".{os.path.basename(prefix)}.lock"


def launch_id() -> str:
    """What the ranks of this launch share with each other and with no other launch ("" without a launcher)."""
    from trainer.data.cache_file import launch_id as trainer_launch_id  # Slurm job.step, torchrun, Open MPI job id

    return trainer_launch_id()


def describe(info: dict) -> str:
    """The holder, for people: host, pid, start time (the holder's clock, UTC), Slurm job, command."""
    started = info.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float))
            else "unknown")
    return (f"host {info.get('host')}, pid {info.get('pid')}, started {when}, Slurm job "
            f"{info.get('slurm_job_id') or 'none'}, command: {info.get('command') or 'unknown'}")


class PrefixLock(RunLock):
    """``RunLock`` in ``lock_dir(prefix)``, with build_indexed's refusal message."""

    STALE_SETTING = "--lock-stale-s"

    def __init__(self, prefix: str | os.PathLike, stale_s: float = STALE_S):
        super().__init__(lock_dir(prefix), stale_s)
        self.prefix = str(prefix)
        self.info.update(launch=launch_id(), command=" ".join(sys.argv), output_prefix=self.prefix)

    def _refusal(self, info: dict) -> PrefixLockedError:
        return PrefixLockedError(
            f"--output-prefix {self.prefix} is being built by another live run ({describe(info)}; lock file "
            f"{self.path}, its heartbeat is moving). Two runs on one prefix would write the same work files and "
            f"corrupt each other's shards: wait for that run to end (or stop it: scancel its job, or kill the pid), "
            f"then rerun this command, or give this one another --output-prefix. A lock whose run died is taken "
            f"over by the next run: at once on the same machine (host, boot id, pid namespace), elsewhere once "
            f"its heartbeat has not moved for "
            f"--lock-stale-s ({self.stale_s:g} s).")

    def check_held(self) -> None:
        """Before finalize: still ours and the heartbeat alive, else ``PrefixLockedError`` (nothing is renamed)."""
        trouble = self.trouble
        if trouble is None:
            try:
                self.check()
                return
            except (RunLockedError, OSError) as err:
                trouble = str(err)
        raise PrefixLockedError(f"this run no longer holds the lock of --output-prefix {self.prefix} ({trouble}); "
                                f"it does not finalize. Make sure no other run builds this prefix, then rerun this "
                                f"command: finished pieces are kept")


def take(prefix: str | os.PathLike, stale_s: float, rank: int) -> PrefixLock | None:
    """Rank 0: the lock, or ``PrefixLockedError`` naming the live holder. Other ranks: None (see ``wait_for_rank0``)."""
    if rank != 0:
        return None
    for _ in range(10):
        lock = PrefixLock(prefix, stale_s)
        try:
            return lock.acquire()
        except FileNotFoundError:  # a run that just ended removed the (empty) lock folder under us: make it again
            time.sleep(0.05)
    return PrefixLock(prefix, stale_s).acquire()


def release(lock: PrefixLock | None) -> None:
    """Give the lock back and remove its folder when empty (another run's files there keep it)."""
    if lock is None:
        return
    lock.release()
    try:
        os.rmdir(lock.path.parent)
    except OSError:
        pass


def wait_for_rank0(prefix: str | os.PathLike, rank: int, stale_s: float, rank_wait_s: float | None = None,
                   poll_s: float = 0.2) -> None:
    """Ranks other than 0: return once the lock of ``prefix`` is held by this launch's rank 0 (see the module);
    ``PrefixLockedError`` after ``rank_wait_s`` (default 3 x stale_s + 10 min: rank 0 may watch a stale lock for
    up to about twice stale_s before it takes it over)."""
    if rank == 0:
        return
    path, mine = lock_dir(prefix) / LOCK_NAME, launch_id()
    limit = 3 * stale_s + 600 if rank_wait_s is None else rank_wait_s
    deadline, info = time.monotonic() + limit, None
    while True:
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and info.get("launch", "") == mine:
            return
        if time.monotonic() > deadline:
            held = f"held by {describe(info)}" if isinstance(info, dict) else "not held"
            raise PrefixLockedError(
                f"rank {rank} on {socket.gethostname()}: waited {limit:g} s for rank 0 of this launch to take the lock "
                f"of --output-prefix {prefix} ({path}: {held}); rank 0 was refused or failed (its log says why), or "
                f"the ranks do not share the output folder's filesystem. Nothing was written by this rank")
        time.sleep(poll_s)


@contextmanager
def holding(prefix: str | os.PathLike, stale_s: float, rank: int):
    """``take`` ... ``release`` around a run (the lock on rank 0, None elsewhere)."""
    lock = take(prefix, stale_s, rank)
    try:
        yield lock
    finally:
        release(lock)
