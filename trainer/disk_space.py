"""Disk full while saving a checkpoint: how it is recognised, what every rank says, and the check before a save.

Standard library only. ``trainer/checkpoint.py`` uses it; see its ``save`` for what happens on a full disk (the
partial folder removed, ``latest`` untouched, every rank stopping with ``disk_full_message``). ``Engine.save``
(``trainer/engine.py``) turns any failed save on a (nearly) full filesystem into ENOSPC (``as_disk_full``), whatever
torch's writer said; ``trainer/pretrain.py``'s ``main`` stops a run that a full disk stopped elsewhere (metrics.jsonl,
TensorBoard, the data index cache) with ``disk_full_elsewhere_message`` and status ``disk_full``.
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path


class DiskFullError(RuntimeError):
    """A save ran out of space (ENOSPC/EDQUOT): its partial folder is gone, ``latest`` and the previous checkpoint
    are untouched, and every rank stops with this one line."""


_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# What torch's zip writer raises when a write(2) underneath fails; it drops the errno. torch <= 2.12 said the first
# two; torch 2.13 (its std::ofstream writer) says "basic_ios::clear: iostream error" for the failed write, and then,
# closing the archive, "[enforce fail at inline_container.cc:...] . unexpected pos 4800 vs 4692" (the stream's
# position behind the bytes it counted), the exception the caller sees, with the first as its context.
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed writing file", "file write failed", "basic_ios::clear",
                       "iostream error", "unexpected pos ")

# After a save failed, a filesystem with less free space than this counts as full: min(64 MiB, max(1 MiB, 1% of its
# size)), whatever the error said (a writer that reports a full disk in words this module does not know).
_NEARLY_FULL_CAP = 64 << 20
_NEARLY_FULL_FLOOR = 1 << 20


def is_disk_full(err: BaseException | None, path: str | Path | None = None) -> bool:
    """ENOSPC or EDQUOT anywhere in the exception's chain, or torch's writer failure (which hides the errno); with
    ``path`` (where the failed write went), also any failure while that filesystem is (nearly) full
    (``nearly_full``)."""
    first, seen = err, 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in _DISK_FULL_ERRNOS:
            return True
        if isinstance(err, RuntimeError) and any(s in str(err) for s in _TORCH_WRITE_FAILED):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return first is not None and path is not None and nearly_full(path)


def _usage(path: str | Path):
    """``shutil.disk_usage`` of the filesystem of ``path``, or of its nearest existing parent; None when that cannot
    be asked."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p)
    except OSError:
        return None


def free_bytes(path: str | Path) -> int | None:
    """Free bytes (for this user) on the filesystem of ``path`` (``_usage``); None when that cannot be asked."""
    usage = _usage(path)
    return usage.free if usage is not None else None


def nearly_full(path: str | Path) -> bool:
    """The filesystem of ``path`` has (almost) no free space left: below min(64 MiB, max(1 MiB, 1% of its size))."""
    usage = _usage(path)
    return usage is not None and usage.free < min(_NEARLY_FULL_CAP, max(_NEARLY_FULL_FLOOR, usage.total // 100))


def as_disk_full(err: BaseException, path: str | Path) -> OSError:
    """An ENOSPC ``OSError`` naming ``path`` and its filesystem's free space, to raise ``from err`` when ``err`` (a
    failed write to ``path``) did not say it was a full disk but the filesystem is (``is_disk_full(err, path)``)."""
    free = free_bytes(path)
    said = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return OSError(errno.ENOSPC, f"No space left on device ({free if free is not None else '?'} bytes free on its "
                   f"filesystem after the write failed with {said})", str(path))


def disk_full_elsewhere_message(err: BaseException, candidates: list[tuple[str, str | Path]],
                                last: Path | None) -> str:
    """The one line of a run stopped by a full disk outside a checkpoint save (metrics.jsonl, TensorBoard, the data
    index cache): the file when the error names one, the filesystems among ``candidates`` ((what, path) pairs) that
    are (nearly) full now, and what to do."""
    named, e, seen = None, err, 0
    while e is not None and seen < 10 and named is None:
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS and e.filename:
            named = e.filename
        e = e.__cause__ or e.__context__
        seen += 1
    full = [f"{what} {path} ({_size(free_bytes(path))} free)" for what, path in candidates if nearly_full(path)]
    where = f" writing {named}" if named else ""
    if full:
        where += f"; full now: {', '.join(full)}"
    elif not named:
        where += "; none of " + ", ".join(f"{what} {path}" for what, path in candidates) + " is full now (freed since?)"
    first = str(err).splitlines()[0] if str(err) else ""
    return (f"disk full ({type(err).__name__}: {first}){where}. Free space there (or point the folder elsewhere), "
            f"then run the same command again (--resume auto); last complete checkpoint: {last or 'none'}")


def _size(n: int | None) -> str:
    if n is None:
        return "? bytes"
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n} bytes"


def disk_full_message(root: Path, tag: str, last: Path | None, err: BaseException | None) -> str:
    """The one line every rank prints; the cause (errno, file) only where the rank saw it."""
    cause = ""
    if err is not None:
        cause = f" ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    return (f"disk full while saving {tag} to {root}; last complete checkpoint: {last or 'none'}{cause}. Free "
            f"space (or lower checkpoint.keep_last: a save needs room for one checkpoint more than it keeps, so with "
            f"keep_last 1 only freeing space helps), then run the same command again (--resume auto)")


def folder_bytes(folder: Path, skip: str | None = None) -> int:
    """Bytes under ``folder``, without its subfolder ``skip`` (a checkpoint's universal conversion: a new save
    does not write one)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        if skip and Path(dirpath) == Path(folder) and skip in dirnames:
            dirnames.remove(skip)
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def warn_if_short_of_space(root: Path, tag: str, last: Path | None, skip: str | None = None) -> None:
    """Before a save: warn when the last complete checkpoint ``last`` would not fit in the free space of ``root``'s
    filesystem (a walk of that one folder's files: a few hundred stat calls)."""
    if last is None:
        return
    need, free = folder_bytes(last, skip), shutil.disk_usage(root).free
    if need > free:
        print(f"warning: saving {tag} to {root}: the last checkpoint ({last.name}) took {need / 1e9:.2f} GB but "
              f"only {free / 1e9:.2f} GB are free there; this save will probably fail (disk full). Free space or "
              "lower checkpoint.keep_last", file=sys.stderr, flush=True)
