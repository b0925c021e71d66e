"""One launch per run folder: ``RUN_DIR/run.lock``, taken by rank 0 before the run touches anything else.

Two launches on one folder (a double ``sbatch``, a requeued job while the old processes linger) would otherwise both
train, write the same ``metrics.jsonl`` and prune each other's checkpoints. The lock file is JSON naming its holder
(host, pid, Slurm job id, a random token) and a ``heartbeat`` time that a daemon thread rewrites every
``interval_s`` while the run lives; the run removes it at exit.

Why not ``flock``/``fcntl``: shared filesystems (NFS, Lustre, GPFS) may ignore them or honour them per node only.
The file is created by ``os.link`` of a complete temporary file (atomic, fails if the name exists, also on NFS: the
classic NFS lock-file recipe), so a reader never sees a half-written lock; heartbeats replace it with ``os.replace``.

A lock is **stale** when its heartbeat is older than ``stale_s`` by this machine's clock (node clocks must agree to
well under ``stale_s``, as Slurm needs anyway), or when its holder is on this host and its pid is gone. A stale lock
is taken over with a warning: it is renamed to a unique name (only one contender's rename succeeds), checked to be
the lock judged stale, and removed; then the taker creates its own. A live lock is refused with a message naming
its holder, except when the holder belongs to the same Slurm job (a requeue whose old processes have not exited
yet): then the launch waits for it to be released or to go stale, at most ``2 * stale_s``, and refuses after that,
so a requeue never hangs forever. A holder whose heartbeat finds another token in the file has lost the folder: it
says so on stderr, and the training loop stops every rank at the next step with ``RunLockLostError`` (no metrics,
checkpoint or status written after that).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

LOCK_NAME = "run.lock"


class RunLockedError(RuntimeError):
    """The run folder is held by another live launch."""


class RunLockLostError(RunLockedError):
    """This run's lock was taken over by another launch while the run lived: it stops and writes nothing more."""


def describe(info: dict, now: float | None = None) -> str:
    age = (now or time.time()) - float(info.get("heartbeat", 0))
    job = info.get("slurm_job_id") or "none"
    return f"host {info.get('host')}, pid {info.get('pid')}, Slurm job {job}, last heartbeat {age:.0f} s ago"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    def __init__(self, run_dir: str | Path, stale_s: float = 60.0, interval_s: float | None = None):
        self.path = Path(run_dir) / LOCK_NAME
        self.stale_s = float(stale_s)
        self.interval_s = float(interval_s) if interval_s else max(0.2, min(10.0, self.stale_s / 6))
        self.info = {"host": socket.gethostname(), "pid": os.getpid(),
                     "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "token": uuid.uuid4().hex,
                     "started": time.time(), "heartbeat": time.time()}
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading and judging ---------------------------------------------------------------------------------------
    def _read(self, path: Path | None = None) -> dict | None:
        """The lock's content; None if there is no lock; {} if it cannot be parsed (damaged by hand)."""
        try:
            return json.loads((path or self.path).read_text())
        except FileNotFoundError:
            return None
        except (ValueError, OSError):
            return {}

    def stale_reason(self, info: dict) -> str | None:
        now = time.time()
        if not info:  # unreadable: judged by the file's age instead of its heartbeat
            try:
                age = now - self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            return f"unreadable lock file, {age:.0f} s old" if age > self.stale_s else None
        age = now - float(info.get("heartbeat", 0))
        if age > self.stale_s:
            return f"last heartbeat {age:.0f} s ago (> checkpoint.lock_stale_s = {self.stale_s:g})"
        if info.get("host") == self.info["host"] and not _pid_alive(int(info.get("pid", -1))):
            return f"its process {info.get('pid')} on this host is gone"
        return None

    # -- taking and giving back ------------------------------------------------------------------------------------
    def _write_tmp(self) -> Path:
        self.info["heartbeat"] = time.time()
        tmp = self.path.with_name(f"{LOCK_NAME}.{self.info['token']}.tmp")
        tmp.write_text(json.dumps(self.info))
        return tmp

    def _create(self) -> bool:
        tmp = self._write_tmp()
        try:
            os.link(tmp, self.path)  # atomic; EEXIST when another launch holds it
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _take_over(self, judged: dict) -> None:
        """Move the stale lock out of the way, unless another contender was faster (then the loop looks again)."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{self.info['token']}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if (self._read(aside) or {}).get("token") != judged.get("token"):
            # another contender replaced the stale lock with its own in the meantime: put that one back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = None
        while True:
            if self._create():
                self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
                self._thread.start()
                return self
            info = self._read()
            if info is None:  # released between our attempt and the read: try again
                continue
            reason = self.stale_reason(info)
            if reason:
                print(f"warning: taking over the stale lock of {self.path.parent} ({reason}); it was held by "
                      f"{describe(info) if info else 'an unknown launch'}", file=sys.stderr, flush=True)
                self._take_over(info)
                continue
            if not info:  # unreadable but fresh (being written by a tool that does not replace atomically?):
                time.sleep(self.interval_s)  # look again; it is taken over once it is older than stale_s
                continue
            same_job = info.get("slurm_job_id") and info.get("slurm_job_id") == self.info["slurm_job_id"]
            if same_job:
                if deadline is None:
                    deadline = time.time() + 2 * self.stale_s
                    print(f"run folder {self.path.parent} is still held by an earlier launch of this Slurm job "
                          f"({describe(info)}); waiting up to {2 * self.stale_s:.0f} s for it to exit or go stale",
                          file=sys.stderr, flush=True)
                if time.time() < deadline:
                    time.sleep(self.interval_s)
                    continue
            raise RunLockedError(
                f"run folder {self.path.parent} is in use by a live launch ({describe(info)}; lock file "
                f"{self.path}). Two launches on one folder would overwrite each other's metrics and checkpoints: "
                f"stop that launch, or use another run_dir. A holder that died without removing the lock is taken "
                f"over automatically {self.stale_s:g} s after its last heartbeat (checkpoint.lock_stale_s).")

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            current = self._read()
            if current is not None and current.get("token") not in (None, self.info["token"]):
                self.lost = True
                print(f"error: the lock of {self.path.parent} was taken over by another launch "
                      f"({describe(current)}) while this run is alive: this run's heartbeats stopped "
                      f"(stalled for > {self.stale_s:g} s?); two runs now write to one folder",
                      file=sys.stderr, flush=True)
                return
            try:
                os.replace(self._write_tmp(), self.path)
            except OSError as err:  # a transient filesystem error: the next beat tries again
                print(f"warning: run lock heartbeat failed: {err}", file=sys.stderr, flush=True)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if not self.lost and (self._read() or {}).get("token") == self.info["token"]:
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def take_run_folder(run_dir: str | Path, stale_s: float, rank: int, device: str) -> RunLock | None:
    """Rank 0 takes the lock; every rank learns the outcome (one broadcast) and raises ``RunLockedError`` with rank
    0's message when it was refused. Returns the lock on rank 0 (release it at exit), None elsewhere."""
    import torch
    import torch.distributed as dist

    lock, error = None, None
    if rank == 0:
        try:
            lock = RunLock(run_dir, stale_s).acquire()
        except RunLockedError as err:
            error = str(err)
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0, device=torch.device(device))
        error = box[0]
    if error:
        raise RunLockedError(error)
    return lock
