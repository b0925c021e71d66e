"""Weight files readable as the umask allows: safetensors writes its files with mode 0600 whatever the umask
(safetensors 0.8, measured), so a model exported into a shared project folder (group-readable under umask 002 or
022) could be read by its writer alone, while every other file beside it was readable. ``share_as_umask`` gives the
weight files the mode a plain ``open(..., "w")`` would have (0666 less the umask); it never widens a file past that.
"""
from __future__ import annotations

import os
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin")


def current_umask() -> int:
    """The process's umask, read without changing it (Linux's /proc/self/status; else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def share_as_umask(folder: str | Path) -> list[Path]:
    """chmod the weight files directly in ``folder`` to 0666 & ~umask; returns the files changed."""
    want = 0o666 & ~current_umask()
    changed = []
    for pattern in WEIGHT_PATTERNS:
        for path in sorted(Path(folder).glob(pattern)):
            mode = path.stat().st_mode & 0o777
            if mode != want and mode & ~want == 0:  # only ever adds the bits the umask allows
                os.chmod(path, want)
                changed.append(path)
    return changed
