"""One launch per run folder: ``RUN_DIR/run.lock``, taken by rank 0 before the run touches anything else.

Two launches on one folder (a double ``sbatch``, a requeued job while the old processes linger) would otherwise both
train, write the same ``metrics.jsonl`` and prune each other's checkpoints. ``checkpoint.dir`` outside the run
folder gets a lock of its own the same way (``take_run_folder``).

Files (all in the locked folder; the holder's token is a random UUID):

    run.lock                  JSON naming the holder (host, pid, Slurm job id, token, heartbeat interval). Created
                              once by ``os.link`` of a complete temporary file (atomic, fails if the name exists,
                              also on NFS: the classic lock-file recipe); never rewritten by its holder. Where the
                              filesystem has no hard links (gcsfuse, blobfuse2, many SMB mounts: ``link`` raises
                              EPERM/EOPNOTSUPP/ENOSYS), by ``O_CREAT|O_EXCL`` instead, said once (see
                              ``_create_exclusive``).
    run.lock.<token>.hb       the holder's heartbeat: a counter it rewrites (temp file + ``os.replace``) every
                              ``interval_s``. Only the holder writes it, so a stalled holder that wakes up can never
                              overwrite another launch's lock.
    run.lock.<token>.takeover made by the one contender that wins the right to replace a stale lock of ``token``.

**Staleness without clocks.** A contender never compares a time written by another host with its own clock. It
watches the lock and its heartbeat file (content and modification time) and calls the lock stale only once they
have not changed for ``stale_s`` of the contender's own ``time.monotonic()``; a change means the holder is alive and
the launch is refused (a live holder beats every ``interval_s``, a sixth of ``stale_s`` by default, so a refusal
takes about one interval). A lock whose holder ran on this machine (same host name, boot id and pid namespace) with
its pid gone is stale at once. A contender whose
clock runs minutes ahead therefore refuses a live run like any other.

**Taking over** a stale lock: the contender links its own file to ``run.lock.<stale token>.takeover`` (only one
contender succeeds, however many judged it stale at once), checks that ``run.lock`` still names the stale token,
replaces it with its own (``os.replace``) and removes the takeover file. The losers look again, see a live holder and
are refused. A launch of the same Slurm job as the holder (a requeue whose old processes have not exited) waits for
the lock to be released or to go stale, at most ``2 * stale_s``.

**Fencing.** A holder whose heartbeat finds another token in ``run.lock`` (or none) has lost the folder: ``lost``
is set and the training loop stops every rank at the next step with ``RunLockLostError``. Every write the run makes
into the folder after that point (a save, pruning, ``latest``, ``status.json``) first calls ``check()``, which reads
``run.lock`` and raises ``RunLockLostError`` unless it still names this holder. An exception in the heartbeat thread
(any ``Exception``, or ``OSError`` for longer than ``stale_s / 2``, after which contenders would soon see a stale
lock) sets ``heartbeat_error`` and the loop stops the run the same way.

**NFS.** A ``link`` whose reply was lost can be retransmitted and answered EEXIST although the first one succeeded;
the link count of our temporary file (2 when our link exists) tells the two apart.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
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


def describe(info: dict) -> str:
    job = info.get("slurm_job_id") or "none"
    return f"host {info.get('host')}, pid {info.get('pid')}, Slurm job {job}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _boot_id() -> str | None:
    """This machine's boot id (Linux): another machine, or this one booted again, has another."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _pid_ns() -> int | None:
    """The inode of this process's pid namespace (Linux): containers on one machine each have their own pids."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}
"""What ``link`` raises on a filesystem without hard links (FUSE object stores, SMB/CIFS)."""
_said_no_hard_links = False


def _create_exclusive(dst: Path, data: bytes) -> bool:
    """``dst`` holding ``data``, made by ``open(O_CREAT|O_EXCL)``: True if we made it (the name did not exist).

    The fallback for filesystems without hard links. The exclusive create is as atomic as ``link`` on local
    filesystems, NFSv3+ (the server checks a create verifier, so a retransmission is no EEXIST) and FUSE mounts
    that pass O_EXCL on. Unlike a link, the file is visible before its bytes are: a contender reading it then sees
    an empty lock, which it treats like an unreadable one (watched, never stale before ``stale_s``), and a moment
    later the holder's JSON (a new signature, watched again). Reading it back afterwards is the check that the name
    holds our bytes."""
    try:
        fd = os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        dst.unlink(missing_ok=True)  # ours (O_EXCL): an empty lock would block the folder for stale_s
        raise
    try:
        return dst.read_bytes() == data
    except FileNotFoundError:
        return False


def _link_exclusive(src: Path, dst: Path) -> bool:
    """``os.link(src, dst)``: True if we made it. EEXIST from a retransmitted NFS link whose first try succeeded is
    told apart by ``src``'s link count (2: our link exists). A filesystem without hard links gets ``dst`` by
    ``_create_exclusive`` with ``src``'s bytes."""
    global _said_no_hard_links
    try:
        os.link(src, dst)
        return True
    except FileExistsError:
        try:
            return os.stat(src).st_nlink == 2
        except FileNotFoundError:
            return False
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
        if not _said_no_hard_links:
            _said_no_hard_links = True
            print(f"note: {dst.parent} has no hard links (link: {err.strerror}); its lock files are created with "
                  "O_CREAT|O_EXCL instead (exclusive on local filesystems, NFSv3+ and FUSE mounts that honour "
                  "O_EXCL)", file=sys.stderr, flush=True)
        return _create_exclusive(dst, src.read_bytes())


def _user_name(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415  (POSIX only)

        return f"user {pwd.getpwuid(uid).pw_name}"
    except (ImportError, KeyError):
        return f"uid {uid}"


class RunLock:
    STALE_SETTING = "checkpoint.lock_stale_s"
    """The setting users change ``stale_s`` with, named in messages (data prep's lock: ``--lock-stale-s``)."""

    def __init__(self, run_dir: str | Path, stale_s: float = 60.0, interval_s: float | None = None):
        self.path = Path(run_dir) / LOCK_NAME
        self.stale_s = float(stale_s)
        self.interval_s = float(interval_s) if interval_s else max(0.2, min(10.0, self.stale_s / 6))
        self.info = {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(), "pid_ns": _pid_ns(),
                     "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "token": uuid.uuid4().hex,
                     "started": time.time(), "interval_s": self.interval_s, "stale_s": self.stale_s}
        self.lost = False
        self.heartbeat_error: str | None = None
        """Why the heartbeat stopped while the run lives (the loop stops the run), else None."""
        self._beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> str:
        return self.info["token"]

    def _hb_path(self, token: str) -> Path:
        return self.path.with_name(f"{LOCK_NAME}.{token}.hb")

    # -- reading and judging ---------------------------------------------------------------------------------------
    def _read(self, path: Path | None = None) -> dict | None:
        """The lock's content; None if there is no lock; {} if it cannot be parsed (damaged by hand)."""
        try:
            return json.loads((path or self.path).read_text())
        except FileNotFoundError:
            return None
        except (ValueError, OSError):
            return {}

    def _signature(self) -> tuple | None:
        """What changes while the holder lives: (the holder's token, or the raw bytes of a lock without one; the
        lock's bytes; its heartbeat file's bytes and mtime). None if there is no lock."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            token = json.loads(raw).get("token")
        except (ValueError, AttributeError):
            token = None
        hb = None
        if token:
            try:
                hb_path = self._hb_path(token)
                hb = (hb_path.read_bytes(), hb_path.stat().st_mtime_ns)
            except FileNotFoundError:
                pass
        return token or raw, raw, hb

    def _dead_here(self, info: dict) -> str | None:
        """Why the holder is certainly dead, judged without waiting: it ran on this machine, in this pid namespace,
        and its pid is gone. A host name alone does not say that: containers started with one fixed ``--hostname``
        and two clusters mounting one filesystem with a node ``gpu001`` each share names, and a live holder there
        was taken over at once (and stopped). A lock that records neither (written by an earlier version) is
        judged by host and pid as it was then."""
        if not info or info.get("host") != self.info["host"]:
            return None
        recorded = "boot_id" in info or "pid_ns" in info
        if recorded and (info.get("boot_id") != self.info["boot_id"] or info.get("pid_ns") != self.info["pid_ns"]):
            return None  # another machine or container with this host name: its pid says nothing here
        if not _pid_alive(int(info.get("pid", -1))):
            return f"its process {info.get('pid')} on this host is gone"
        return None

    # -- taking and giving back ------------------------------------------------------------------------------------
    def _own_file(self, suffix: str) -> Path:
        tmp = self.path.with_name(f"{LOCK_NAME}.{self.token}.{suffix}")
        tmp.write_text(json.dumps(self.info))
        return tmp

    def _write_heartbeat(self) -> None:
        self._beats += 1
        hb = self._hb_path(self.token)
        tmp = hb.with_name(hb.name + ".tmp")
        tmp.write_text(json.dumps({"beat": self._beats, "pid": os.getpid()}))
        os.replace(tmp, hb)  # our own file: never the shared lock

    def _create(self) -> bool:
        tmp = self._own_file("tmp")
        try:
            return _link_exclusive(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def _claim_path(self, raw: bytes) -> tuple[Path, str]:
        try:
            stale_token = json.loads(raw).get("token") or ""
        except (ValueError, AttributeError):
            stale_token = ""
        key = stale_token or "unreadable-" + hashlib.sha256(raw).hexdigest()[:16]
        return self.path.with_name(f"{LOCK_NAME}.{key}.takeover"), stale_token

    def _take_over(self, raw: bytes) -> bool:
        """Replace the stale lock whose bytes are ``raw``, if this contender wins the right to (see the module)."""
        claim, stale_token = self._claim_path(raw)
        tmp = self._own_file("claim")
        try:
            if not _link_exclusive(tmp, claim):
                return False  # another contender takes it over
        finally:
            tmp.unlink(missing_ok=True)
        try:
            try:
                if self.path.read_bytes() != raw:
                    return False  # released or taken over meanwhile: look again
            except FileNotFoundError:
                return False
            new = self._own_file("new")
            try:
                os.replace(new, self.path)
            except OSError as err:
                new.unlink(missing_ok=True)
                raise self._cannot_replace(err) from err
            if stale_token:
                try:
                    self._hb_path(stale_token).unlink(missing_ok=True)
                except OSError:
                    pass  # another user's file in a sticky folder: a dead holder's heartbeat, harmless
            return True
        finally:
            claim.unlink(missing_ok=True)

    def _cannot_replace(self, err: OSError) -> RunLockedError:
        """The stale lock cannot be replaced: in a sticky (``+t``) folder only the owner of ``run.lock`` (or of the
        folder, or root) may, so a colleague's dead run blocks the folder until it is removed by hand."""
        folder, why = self.path.parent, f"{type(err).__name__}: {err}"
        try:
            sticky = bool(os.stat(folder).st_mode & stat.S_ISVTX)
            owner = _user_name(os.stat(self.path).st_uid)
        except OSError:
            sticky, owner = False, "its owner"
        if sticky:
            why += (f"; {folder} has the sticky bit (+t) and {self.path.name} belongs to {owner}, so only {owner}, "
                    "the folder's owner or root may replace it")
        return RunLockedError(
            f"cannot take over the stale lock of {folder} ({why}). Its holder is dead: ask {owner} (or an admin) to "
            f"remove {self.path}, then launch again, or use another folder. Several users sharing one project "
            "folder: give it the setgid bit and default ACLs instead of the sticky bit (docs/cluster_operations.md, "
            "'Several users, one project folder')")

    def _clear_dead_claim(self, raw: bytes, claim_bytes: bytes) -> None:
        """A contender that won the takeover of ``raw`` died before finishing (its claim file and the stale lock
        both unchanged for ``stale_s`` more): remove its claim, if it is still that one."""
        claim, _ = self._claim_path(raw)
        aside = claim.with_name(f"{claim.name}.dead-{self.token}")
        try:
            os.rename(claim, aside)
        except FileNotFoundError:
            return
        if aside.read_bytes() != claim_bytes:  # a live contender's fresh claim: put it back
            _link_exclusive(aside, claim)
        aside.unlink(missing_ok=True)

    def _start(self) -> "RunLock":
        self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write_heartbeat()  # before the lock exists, so a contender sees it at once
        try:
            return self._acquire()
        except BaseException:
            self._hb_path(self.token).unlink(missing_ok=True)
            raise

    def _acquire(self) -> "RunLock":
        deadline = None
        seen, since, blocked = None, time.monotonic(), None
        while True:
            if self._create():
                return self._start()
            sig = self._signature()
            if sig is None:  # released between our attempt and the read: try again
                continue
            now = time.monotonic()
            info = self._read() or {}
            if sig != seen:
                if seen is not None and sig[0] == seen[0] and not self._same_job(info):
                    raise self._refusal(info)  # the same holder's heartbeat moved: it is alive
                seen, since, blocked = sig, now, None
            # the holder's own stale_s counts too: it beats every stale_s / 6 of ITS setting
            stale_s = max(self.stale_s, float(info.get("stale_s") or 0))
            reason = self._dead_here(info)
            if reason is None and now - since > stale_s:
                reason = (f"its heartbeat did not change for {now - since:.0f} s of this launch's watching "
                          f"(> {self.STALE_SETTING} = {stale_s:g})")
            if reason:
                if blocked is None:
                    print(f"warning: taking over the stale lock of {self.path.parent} ({reason}); it was held by "
                          f"{describe(info) if info else 'an unknown launch (unreadable lock file)'}",
                          file=sys.stderr, flush=True)
                if self._take_over(sig[1]):
                    return self._start()
                claim, _ = self._claim_path(sig[1])
                try:
                    claim_bytes = claim.read_bytes()
                except FileNotFoundError:
                    claim_bytes = None
                if claim_bytes is not None and (blocked is None or blocked[0] != claim_bytes):
                    blocked = (claim_bytes, now)
                elif claim_bytes is not None and now - blocked[1] > stale_s:
                    self._clear_dead_claim(sig[1], claim_bytes)
                    blocked = None
            elif self._same_job(info):
                if deadline is None:
                    deadline = now + 2 * stale_s
                    print(f"run folder {self.path.parent} is still held by an earlier launch of this Slurm job "
                          f"({describe(info)}); waiting up to {2 * stale_s:.0f} s for it to exit or go stale",
                          file=sys.stderr, flush=True)
                elif now > deadline:
                    raise self._refusal(info)
            time.sleep(min(self.interval_s, float(info.get("interval_s") or self.interval_s)) / 2)

    def _same_job(self, info: dict) -> bool:
        return bool(info.get("slurm_job_id")) and info.get("slurm_job_id") == self.info["slurm_job_id"]

    def _refusal(self, info: dict) -> RunLockedError:
        return RunLockedError(
            f"run folder {self.path.parent} is in use by a live launch ({describe(info)}; lock file {self.path}, "
            "its heartbeat is moving). Two launches on one folder would overwrite each other's metrics and "
            "checkpoints: stop that launch, or use another run_dir. A holder that died without removing the lock "
            f"is taken over automatically once its heartbeat has not moved for {self.stale_s:g} s "
            "(checkpoint.lock_stale_s).")

    # -- holding ---------------------------------------------------------------------------------------------------
    def owns(self) -> bool:
        """Does ``run.lock`` still name this holder? (One small read.)"""
        info = self._read()
        if info == {}:  # unreadable right now: our own file is never rewritten, so this is a read error
            raise OSError(f"cannot read {self.path}")
        return info is not None and info.get("token") == self.token

    def check(self) -> None:
        """The fence before a write into the folder: raises ``RunLockLostError`` unless the lock is still ours. The
        first to see a takeover (this fence, or the heartbeat thread) says who holds the folder now."""
        if self.lost or not self.owns():
            if not self.lost:
                self._say_taken_over(self._read())
            self.lost = True
            raise RunLockLostError(f"this run no longer holds {self.path} (another launch took over the folder): "
                                   "it writes nothing more there")

    @property
    def trouble(self) -> str | None:
        """Why the run must stop (lost lock, dead heartbeat), else None. Checked by the loop at every step."""
        if self.lost:
            return "lost"
        if self.heartbeat_error:
            return self.heartbeat_error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return "the heartbeat thread ended"
        return None

    def _beat(self) -> None:
        try:
            last_ok = time.monotonic()
            while not self._stop.wait(self.interval_s):
                current = self._read()
                if current is None or (current and current.get("token") != self.token):
                    if not self.lost:  # (the fence may have seen it first, and said so)
                        self._say_taken_over(current)
                    self.lost = True
                    return
                try:
                    self._write_heartbeat()
                    last_ok = time.monotonic()
                except OSError as err:  # transient: tried again next beat, unless it lasts
                    if time.monotonic() - last_ok > self.stale_s / 2:
                        raise
                    print(f"warning: run lock heartbeat failed: {err}", file=sys.stderr, flush=True)
        except Exception as err:  # noqa: BLE001  (any failure here must stop the run, never the thread silently)
            self.heartbeat_error = f"the run lock's heartbeat failed: {type(err).__name__}: {err}"
            print(f"error: {self.heartbeat_error}; the run stops (a launch would otherwise take the folder over "
                  f"within {self.STALE_SETTING} = {self.stale_s:g} s while this run still writes to it)",
                  file=sys.stderr, flush=True)

    def _say_taken_over(self, current: dict | None) -> None:
        held_by = describe(current) if current else "nobody: the lock file was removed"
        print(f"error: the lock of {self.path.parent} was taken over by another launch ({held_by}) while this run is "
              f"alive: this run's heartbeats stalled for > {self.stale_s:g} s?", file=sys.stderr, flush=True)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            try:
                if not self.lost and self.owns():
                    self.path.unlink(missing_ok=True)
            except OSError:
                pass  # cannot read it: leave it; it goes stale and is taken over
        self._hb_path(self.token).unlink(missing_ok=True)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class FolderLocks:
    """The locks of a run's folders (the run folder, and ``checkpoint.dir`` when it lies outside it), held and
    checked as one."""

    def __init__(self, locks: list[RunLock]):
        self.locks = locks

    @property
    def lost(self) -> bool:
        return any(lock.lost for lock in self.locks)

    @property
    def trouble(self) -> str | None:
        return next((t for t in (lock.trouble for lock in self.locks) if t), None)

    def check(self) -> None:
        for lock in self.locks:
            lock.check()

    def owns(self) -> bool:
        """All locks still name this run (False also when one cannot be read)."""
        try:
            return all(lock.owns() for lock in self.locks)
        except OSError:
            return False

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()


def folders_to_lock(run_dir: str | Path, checkpoint_dir: str | Path | None) -> list[Path]:
    """The run folder, and the checkpoint folder when it is not inside it."""
    run = Path(run_dir).resolve()
    dirs = [Path(run_dir)]
    if checkpoint_dir is not None:
        ckpt = Path(checkpoint_dir).resolve()
        if ckpt != run and run not in ckpt.parents:
            dirs.append(Path(checkpoint_dir))
    return dirs


def take_run_folder(run_dir: str | Path, stale_s: float, rank: int, device: str,
                    checkpoint_dir: str | Path | None = None) -> FolderLocks | None:
    """Rank 0 takes the locks (the run folder, and ``checkpoint_dir`` when it lies outside it); every rank learns the
    outcome (one broadcast) and raises ``RunLockedError`` with rank 0's message when it was refused. Returns the
    locks on rank 0 (release them at exit), None elsewhere."""
    import torch
    import torch.distributed as dist

    locks, error = None, None
    if rank == 0:
        held: list[RunLock] = []
        try:
            for folder in folders_to_lock(run_dir, checkpoint_dir):
                held.append(RunLock(folder, stale_s).acquire())
            locks = FolderLocks(held)
        except RunLockedError as err:
            for lock in held:
                lock.release()
            error = str(err)
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0, device=torch.device(device))
        error = box[0]
    if error:
        raise RunLockedError(error)
    return locks
