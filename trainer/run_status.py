"""How a run ends: the exit statuses of ``trainer/pretrain.py`` and ``RUN_DIR/status.json``.

Standard library only: ``trainer/pretrain.py`` returns ``EXIT_CONFIG`` before it imports torch.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
"""The config is invalid (nothing was launched)."""
EXIT_NONFINITE = 3
"""Stopped after train.max_nonfinite_in_a_row consecutive NaN/Inf steps (the last good checkpoint is intact)."""
EXIT_REQUEUE = 75
"""Preempted (SIGTERM/SIGUSR1): a checkpoint was saved; run the same command again with --resume auto.
75 is EX_TEMPFAIL from sysexits.h ("temporary failure; the user is invited to retry")."""


_progress = {"step": -1}  # this process's last completed step (one run at a time per process)


def note_step(step: int) -> None:
    """Record the step this process last completed (the loop calls it every step: a dict store, no I/O), so that a
    failure's status names it (``last_step``) although the exception left the loop's state behind."""
    _progress["step"] = step


def last_step() -> int:
    """The last step noted (``note_step``, or any status written by this process); -1 before training state exists."""
    return _progress["step"]


def write_status(run_dir: str | Path, rank: int, status: str, step: int, message: str = "",
                 fence: Callable[[], None] | None = None, total_steps: int | None = None,
                 every_s: float | None = None) -> None:
    """RUN_DIR/status.json: what the last run of this folder did (for job scripts whose launcher masks exit codes).
    Written by rank 0 only, atomically, after ``fence()`` (the run lock's ownership check: it raises when another
    launch owns the folder now). A failed write raises: callers say so rather than leave a stale status.

    Statuses: ``running`` (at start, again at each logging step (``logging.every_steps``) and at each checkpoint
    save, with its step), ``completed``, ``stopped``, ``preempted``, ``nonfinite``, ``disk_full``, ``failed`` (the
    last completed step, or -1 when it failed before training state existed).

    Fields: ``status``, ``step``, ``message``, ``time`` (unix seconds of the write); from the loop also
    ``total_steps`` (train.steps) and, on logging steps, ``every_s`` (wall seconds of the last logging interval,
    checkpoint saves and evaluations in it included).

    Liveness rule: nothing rewrites a ``running`` status when every rank has been killed (SIGKILL, a lost node) or
    the run hangs, so a ``running`` status is only live while it is fresh. It is rewritten at least once per logging
    interval plus any checkpoint save or evaluation in it: treat it as hung or dead when ``now - time`` exceeds
    several intervals, e.g. ``max(3 * every_s, every_s + longest save seen, 600)`` seconds (the first interval after
    a start or resume also covers start-up and the data index, so allow it the floor). A status without ``every_s``
    (written at start or by a save) is judged by the same rule with the previous value or the floor."""
    if step >= 0:
        note_step(step)
    if rank != 0:
        return
    if fence is not None:
        fence()
    path = Path(run_dir) / "status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    record = {"status": status, "step": step, "message": message, "time": time.time()}
    if total_steps is not None:
        record["total_steps"] = total_steps
    if every_s is not None:
        record["every_s"] = round(every_s, 3)
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
