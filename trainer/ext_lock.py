"""Stale build locks of torch's JIT-compiled extensions (the DeepSpeed ops of ``trainer/build_ops.py``).

torch's ``cpp_extension.load`` takes ``<build dir>/lock`` (``torch.utils.file_baton``: a file created with O_EXCL,
removed when done) for every load, also of an op that is already built, and a process that finds it waits until the
file is gone, without a word and forever. A build or load killed while holding it (SIGKILL, the OOM killer, a node
failure) leaves it behind; every later start then hangs: on the CPU accelerator each ``deepspeed.init_distributed``
loads ``deepspeed_shm_comm``, and ZeRO-Offload's optimizer loads ``cpu_adam``. The file holds no owner, so a lock
counts as stale by its age: a build holds it ~40-80 s, a load of a built op well under a second.

``clear_stale_locks`` runs before those loads (``trainer.engine``) and before ``python -m trainer.build_ops``:

- no lock: nothing to do;
- a lock younger than ``BERTFAMILY_EXT_LOCK_STALE_S`` seconds (default 300), or one whose build is running on this
  node (a process working in the build folder: torch runs ninja there): another rank's or launch's load or build,
  waited for (said once, with the lock's path), and stopping on SIGTERM (``should_stop``) instead of waiting on;
- an older lock beside the op's built library: left by a killed load; removed (said), and the load goes on;
- an older lock without a built library: a killed build, which may have left its folder half-written: the run stops
  with a message naming the lock and what to do (``python -m trainer.build_ops`` removes it and builds).

The decision to remove is taken again under an ``flock`` of ``<build dir>/.bertfamily-lock-check``, on a fresh look
at the lock, so that of several ranks on a node finding the same stale lock, one removes it and none removes the
fresh lock another rank's load takes right after. Another node sharing the extensions folder is seen only through
the lock's age (and where ``flock`` works on that filesystem).

A built op in a folder this process cannot write (a read-only image or software stack, a folder another user built
with umask 022) cannot go through torch at all: torch creates the lock and runs ninja there at every load. Such an
op is loaded from its library directly instead (``readonly_build``, used by ``trainer.engine``), when its
``build.ninja`` shows it was built from this DeepSpeed's sources with this op's flags and no source is newer than the
library (what ninja would rebuild for, headers apart); otherwise the start stops with one line naming
``TORCH_EXTENSIONS_DIR``. ``build_dir`` likewise stops with one line where torch's default folder cannot be created
(a read-only HOME; no HOME and no passwd entry, where torch would create a literal ``./~/.cache``).

Standard library only, apart from torch's naming of the build folder (``build_dir``).
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STALE_ENV = "BERTFAMILY_EXT_LOCK_STALE_S"
DEFAULT_STALE_S = 300.0
_GUARD = ".bertfamily-lock-check"


class ExtensionLockError(RuntimeError):
    """A stale build lock this start cannot remove safely; the message names it and what to do."""

    @property
    def one_line(self) -> str:  # trainer.pretrain.main says it without a traceback
        return str(self)


class ExtensionFolderError(ExtensionLockError):
    """The extensions folder cannot be used by this process (not creatable, or not writable and the op not built
    there as this start needs it); the message names TORCH_EXTENSIONS_DIR and what to do."""


class ExtensionLockWaitStopped(RuntimeError):
    """SIGTERM/SIGUSR1 came while this start waited on another process's build lock."""


@dataclass(frozen=True)
class Verdict:
    action: str  # "none" | "wait" | "remove" | "stop"
    message: str = ""


def stale_after() -> float:
    """Seconds after which a lock counts as stale (``BERTFAMILY_EXT_LOCK_STALE_S``, default 300)."""
    try:
        return float(os.environ.get(STALE_ENV, DEFAULT_STALE_S))
    except ValueError:
        return DEFAULT_STALE_S


def build_dir(op: str) -> Path:
    """The folder torch builds and loads ``op`` in: ``torch.utils.cpp_extension._get_build_directory``
    (TORCH_EXTENSIONS_DIR, else torch's default root with its ``py311_cpu``-style subfolder; it creates the folder, as
    the load would)."""
    from torch.utils.cpp_extension import _get_build_directory
    fix = ("set TORCH_EXTENSIONS_DIR to a folder this user can write (and run `python -m trainer.build_ops` with it "
           "set, so that no job compiles at start)")
    if not os.environ.get("TORCH_EXTENSIONS_DIR") and os.path.expanduser("~") == "~":
        raise ExtensionFolderError(f"no home directory (HOME unset and no passwd entry for uid {os.getuid()}): torch "
                                   f"would build its extension {op!r} under a literal './~/.cache' here; {fix}")
    try:
        return Path(_get_build_directory(op, verbose=False))
    except OSError as err:
        raise ExtensionFolderError(f"cannot create torch's extensions folder for {op!r} ({err}); {fix}") from None


def writable(folder: Path) -> bool:
    """True when this process may create files in ``folder`` (torch creates its lock there at every load)."""
    return os.access(folder, os.W_OK | os.X_OK)


def _ninja_build(folder: Path) -> tuple[list[str], str]:
    """(sources, cflags) that ``folder/build.ninja`` compiles: ``build x.o: compile SRC`` lines, ``cflags = ...``."""
    sources, cflags = [], ""
    for line in (folder / "build.ninja").read_text(encoding="utf-8").splitlines():
        if line.startswith("build ") and ": compile " in line:
            sources.append(line.split(": compile ", 1)[1].strip())
        elif line.startswith("cflags = "):
            cflags = line[len("cflags = "):]
    return sources, cflags


def readonly_build(folder: Path, op: str, sources: list[str], cxx_args: list[str]) -> Path:
    """The built library of ``op`` in ``folder``, which this process cannot write, to be loaded directly: checked as
    ninja would check it (built from ``sources``, the op's current absolute source paths, with every flag of
    ``cxx_args``, and no source newer than the library; headers are not checked). Raises ``ExtensionFolderError``
    naming what is wrong and what to do."""
    root = folder.parent
    fix = (f"run `python -m trainer.build_ops` as a user who can write {root} (its owner), or set TORCH_EXTENSIONS_DIR "
           "to a folder this user can write (each user or team its own)")
    library = built_library(folder, op)
    if library is None or not (folder / "build.ninja").is_file():
        raise ExtensionFolderError(f"{folder}: this user cannot write the extensions folder and the torch extension "
                                   f"{op!r} is not built there, so torch cannot build or even load it; {fix}")
    built_from, cflags = _ninja_build(folder)
    flags = set(cflags.split())
    why = ""
    if sorted(built_from) != sorted(sources):
        why = f"it was built from other sources ({', '.join(built_from)}; another DeepSpeed install)"
    elif not all(f in flags for f in cxx_args):
        why = f"it was built with other flags (this node needs {' '.join(cxx_args)}; another CPU type?)"
    else:
        built = library.stat().st_mtime
        newer = [s for s in sources if not os.path.exists(s) or os.path.getmtime(s) > built]
        if newer:
            why = f"a source is newer than {library.name} ({newer[0]})"
    if why:
        raise ExtensionFolderError(f"{folder}: this user cannot write the extensions folder and the torch extension "
                                   f"{op!r} there is out of date: {why}; {fix}")
    return library


def built_library(folder: Path, op: str) -> Path | None:
    """The op's built shared library in its build folder (``op.so``, or ``op_vN.so`` after torch rebuilt it)."""
    for f in sorted(folder.glob(f"{op}*.so")) + sorted(folder.glob(f"{op}*.pyd")):
        if f.is_file():
            return f
    return None


def building_here(folder: Path) -> bool:
    """True when a process of this node works in ``folder`` (torch runs ninja and the compilers there): a build is
    running now. Processes of other users or of another node are not seen."""
    target = os.path.realpath(folder)
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/cwd") == target:
                return True
        except OSError:
            continue
    return False


def judge(lock: Path, op: str, now: float, stale_s: float, busy: bool, allow_unbuilt: bool = False) -> Verdict:
    """What to do about ``lock`` (``<build dir>/lock`` of ``op``) at time ``now``; ``busy``: a build runs on this node
    (``building_here``); ``allow_unbuilt``: an explicit build (``trainer.build_ops``) may remove a stale lock of an
    op that is not built, since it builds it next."""
    try:
        age = now - lock.stat().st_mtime
    except FileNotFoundError:
        return Verdict("none")
    if busy:
        return Verdict("wait", f"{lock}: a build of the torch extension {op!r} is running on this node (a process "
                               f"works in {lock.parent}); waiting for it to finish")
    if age < stale_s:
        return Verdict("wait", f"{lock}: held for {age:.0f} s by another process's load or build of the torch "
                               f"extension {op!r} (another rank, launch or node sharing {lock.parent.parent}); waiting "
                               f"for it, up to {stale_s:.0f} s after it was taken ({STALE_ENV}): a lock that old is "
                               "stale (left by a killed process) and is then removed")
    library = built_library(lock.parent, op)
    if library is not None:
        return Verdict("remove", f"{lock}: a stale build lock of the torch extension {op!r} ({age:.0f} s old; a "
                                 f"load holds it under a second), left by a killed load; {library.name} is built "
                                 "beside it: removed the lock")
    if allow_unbuilt:
        return Verdict("remove", f"{lock}: a stale build lock of the torch extension {op!r} ({age:.0f} s old) "
                                 "left by a killed build, and no built library: removed the lock; building again")
    return Verdict("stop", f"{lock}: a stale build lock of the torch extension {op!r} ({age:.0f} s old), left by a "
                           f"killed build (no {op}.so beside it); torch would wait on it forever. If no build of it "
                           f"is running on any node sharing {lock.parent.parent}, run `python -m trainer.build_ops` "
                           f"(it removes the lock and builds the op), or remove {lock}, then launch again")


def _remove_if_still_stale(lock: Path, op: str, stale_s: float, allow_unbuilt: bool,
                           clock: Callable[[], float]) -> Verdict:
    """Judge ``lock`` again under the folder's flock and remove it when it is still stale: a rank that found the same
    stale lock and comes second sees it gone, or the fresh lock of the load that followed, which it leaves."""
    guard_path = lock.parent / _GUARD
    try:
        guard = os.open(guard_path, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:
        guard = None
    try:
        if guard is not None:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX)
            except OSError:  # a filesystem without flock: the age check alone
                pass
        verdict = judge(lock, op, clock(), stale_s, building_here(lock.parent), allow_unbuilt)
        if verdict.action == "remove":
            try:
                lock.unlink()
            except FileNotFoundError:
                return Verdict("none")
        return verdict
    finally:
        if guard is not None:
            os.close(guard)  # releases the flock


def clear_stale_locks(ops, should_stop: Callable[[], bool] | None = None, say: Callable[[str], None] | None = None,
                      stale_s: float | None = None, allow_unbuilt: bool = False, poll_s: float = 0.5,
                      clock: Callable[[], float] = time.time, folder_of: Callable[[str], Path] = build_dir) -> None:
    """Before loading the torch extensions ``ops`` (their build names, e.g. ``deepspeed_shm_comm``): remove their
    stale build locks, wait on live ones (``should_stop()`` true ends the wait with ``ExtensionLockWaitStopped``),
    and raise ``ExtensionLockError`` for a stale lock of an op that is not built (module docstring)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    stale_s = stale_after() if stale_s is None else stale_s
    for op in ops:
        lock = folder_of(op) / "lock"
        told = False
        while True:
            verdict = judge(lock, op, clock(), stale_s, False, allow_unbuilt)
            if verdict.action == "none":
                break
            if verdict.action in ("remove", "stop"):
                verdict = _remove_if_still_stale(lock, op, stale_s, allow_unbuilt, clock)
            elif building_here(lock.parent):
                verdict = judge(lock, op, clock(), stale_s, True, allow_unbuilt)
            if verdict.action == "none":
                break
            if verdict.action == "remove":
                say(f"warning: {verdict.message}")
                break
            if verdict.action == "stop":
                raise ExtensionLockError(verdict.message)
            if not told:
                say(f"note: {verdict.message}")
                told = True
            if should_stop is not None and should_stop():
                raise ExtensionLockWaitStopped(f"stopped by a signal while waiting on {lock} (the build lock of the "
                                               f"torch extension {op!r}); nothing was trained")
            time.sleep(poll_s)
