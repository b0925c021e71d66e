"""The checkpoint folder's layout, its state file and what is complete: what ``trainer.checkpoint`` (saves, resume,
lineages) and ``trainer.lineage`` (where a lineage started) both read, apart from them so that neither imports the
other. ``trainer.checkpoint`` re-exports every name here."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

STATE_FILE = "bertfamily.json"
LATEST = "latest"
UNIVERSAL = "universal"
ABANDONED = "abandoned-"
_TAG = re.compile(r"^global_step(\d+)$")


def tag_for(step: int) -> str:
    return f"global_step{step}"


def step_of(tag: str) -> int | None:
    m = _TAG.match(tag)
    return int(m.group(1)) if m else None


def is_complete(tag_dir: Path) -> bool:
    return (Path(tag_dir) / STATE_FILE).is_file()


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep the half-written temp file either
        raise


FORMAT = "bertfamily-checkpoint"
FORMAT_VERSION = 1
"""The ``version`` in ``bertfamily.json`` that this code writes and the newest it reads."""


class CheckpointStateError(ValueError):
    """A checkpoint's ``bertfamily.json`` cannot be used: damaged, not ours, or of a newer format. ``one_line`` is what
    ``trainer/pretrain.py``'s ``main`` says instead of a traceback."""

    def __init__(self, line: str):
        super().__init__(line)
        self.one_line = line


def read_state(tag_dir: Path) -> dict:
    """The checkpoint's ``bertfamily.json``, checked: a damaged file (cut by a failing disk or a copy stopped half
    way; our own writes are atomic), another program's file or a newer format is refused by name, with the earlier
    complete checkpoint to resume from, instead of a JSON traceback or a silent misreading."""
    path = Path(tag_dir) / STATE_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointStateError(f"{path} is damaged ({err}): {_instead(Path(tag_dir))}") from None
    if not isinstance(record, dict) or record.get("format", FORMAT) != FORMAT:
        raise CheckpointStateError(f"{path} is not a bertfamily checkpoint state (format "
                                   f"{record.get('format') if isinstance(record, dict) else type(record).__name__!r}, "
                                   f"expected {FORMAT!r}): {_instead(Path(tag_dir))}")
    version = record.get("version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointStateError(f"{path}: checkpoint format version {version!r} was written by a newer bertfamily "
                                   f"(this one reads up to {FORMAT_VERSION}): upgrade bertfamily to resume, export or "
                                   "fine-tune from it")
    return record


def _saved_run_id(tag_dir: Path) -> str | None:
    """The run id a complete checkpoint was saved by; None for a damaged state file (moving it aside, or saving
    over it, needs no more)."""
    try:
        return read_state(tag_dir).get("run_id")
    except CheckpointStateError:
        return None


def _instead(tag_dir: Path) -> str:
    earlier = [p for p in complete_checkpoints(tag_dir.parent) if (step_of(p.name) or 0) < (step_of(tag_dir.name) or 0)]
    return ("this checkpoint cannot be used; restore the file from a copy, or resume from the one before it with "
            f"--resume {earlier[-1]} (checkpoints saved after it are moved aside, not deleted)" if earlier else
            "this checkpoint cannot be used and no earlier complete one is in its folder; restore the file from a "
            "copy")


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(step_of(p.name), p) for p in root.iterdir() if p.is_dir() and step_of(p.name) is not None]
    return [p for s, p in sorted(found) if is_complete(p)]


def find_latest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, else None.

    Not whatever ``latest`` names: a save moves ``latest`` after its checkpoint is complete, so a kill between the two
    leaves it naming the previous one, and trusting it made ``--resume auto`` a roll-back (``begin_lineage`` moved
    the newer, complete checkpoint aside). Every complete checkpoint in ``root`` is of the folder's current lineage
    (a roll-back moves the newer ones aside before it trains), so the newest is the one to continue."""
    done = complete_checkpoints(root)
    return done[-1] if done else None
