"""Disk full while saving a checkpoint: how it is recognised, what every rank says, and the check before a save.

Standard library only. ``trainer/checkpoint.py`` uses it; see its ``save`` for what happens on a full disk (the
partial folder removed, ``latest`` untouched, every rank stopping with ``disk_full_message``).
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
# what torch's zip writer raises when a write(2) underneath fails (it drops the errno)
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed writing file", "file write failed")


def is_disk_full(err: BaseException | None) -> bool:
    """ENOSPC or EDQUOT anywhere in the exception's chain, or torch's writer failure (which hides the errno)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in _DISK_FULL_ERRNOS:
            return True
        if isinstance(err, RuntimeError) and any(s in str(err) for s in _TORCH_WRITE_FAILED):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


def disk_full_message(root: Path, tag: str, last: Path | None, err: BaseException | None) -> str:
    """The one line every rank prints; the cause (errno, file) only where the rank saw it."""
    cause = ""
    if err is not None:
        cause = f" ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    return (f"disk full while saving {tag} to {root}; last complete checkpoint: {last or 'none'}{cause}. Free "
            f"space (or lower checkpoint.keep_last), then run the same command again (--resume auto)")


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
