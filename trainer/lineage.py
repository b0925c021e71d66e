"""Where the checkpoints folder's current lineage started: ``CHECKPOINTS/lineage.json``.

``trainer.checkpoint.begin_lineage`` writes it when a run starts a new lineage (a fresh start, a roll-back to an
earlier checkpoint of the folder, a start from a checkpoint outside it): the new run id, the checkpoint it started
from (its resolved path, or ``none``), that checkpoint's step, and the Slurm job that started it. Two things read it:

- ``--resume auto`` (``resume_source``). A lineage that started from a checkpoint outside the folder (restored from an
  archive because keep-last had pruned it, or copied from another cluster) has nothing of its own in the folder until
  its first save. A launch killed before that save left ``--resume auto`` with the folder's older checkpoints (the
  abandoned run's, resumed under the new command's settings) or none at all (a silent start from step 0 with random
  weights; both found by review). Until the lineage's first save, ``auto`` resumes from its source.
- the Slurm templates (``python -m trainer.lineage started CHECKPOINTS SOURCE``). ``sbatch slurm/x.sh --resume PATH``
  rolls back at the job's first launch; a requeued launch of the same job gets the same arguments, and rolling back
  again would throw away what the job trained since. It continues (``--resume auto``) when this file says the job
  already started from PATH; a new job with the same ``--resume PATH`` rolls back again, as asked.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from trainer.checkpoint_files import (CheckpointStateError, _atomic_write_text, find_latest, is_complete, read_state,
                                      step_of)

FILE = "lineage.json"


def source_name(resume_dir: Path | None) -> str:
    """What a lineage record names as its source: the resolved checkpoint folder, or ``none`` for step 0."""
    return str(Path(resume_dir).resolve()) if resume_dir is not None else "none"


def write(root: Path, run_id: str, resume_dir: Path | None, step: int) -> None:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "source": source_name(resume_dir), "step": int(step),
              "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "time": time.time()}
    _atomic_write_text(root / FILE, json.dumps(record, indent=1))


def read(root: Path) -> dict | None:
    """The record, or None (no record, or one this code cannot read: said, and treated as none)."""
    path = Path(root) / FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        print(f"warning: {path} cannot be read ({err}); --resume auto takes the newest complete checkpoint of the "
              "folder", file=sys.stderr, flush=True)
        return None
    return record if isinstance(record, dict) and {"run_id", "source", "step"} <= set(record) else None


def resume_source(root: Path, latest: Path | None, saved_run_id) -> Path | None:
    """For ``--resume auto``: the checkpoint outside ``root`` that the current lineage started from, when the lineage
    has saved nothing in ``root`` yet (``latest``, the folder's newest complete checkpoint, is older than the source's
    step or of another run); else None (``latest`` is the one to continue). ``saved_run_id(folder)`` reads a
    checkpoint's run id. Raises FileNotFoundError when that source is gone."""
    root = Path(root)
    record = read(root)
    if record is None or record["source"] == "none":
        return None
    source = Path(record["source"])
    if source.parent.resolve() == root.resolve():
        return None  # a roll-back inside the folder: its source is the folder's newest complete checkpoint
    if latest is not None and ((step_of(latest.name) or 0) > int(record["step"])
                               or saved_run_id(latest) == record["run_id"]):
        return None  # the lineage has saved in the folder
    if latest is not None and _saved_after(latest, record, root / FILE):
        # another run saved it after the record was written: code that does not keep this file (an older checkout)
        # started a lineage since; the record is stale (found by review of upgrades and roll-backs of the code)
        print(f"warning: {root / FILE} names {source} as where this run started, but {latest} was saved after it by "
              f"another run (code that does not write {FILE}); --resume auto takes {latest}", file=sys.stderr,
              flush=True)
        return None
    if not is_complete(source):
        raise FileNotFoundError(
            f"--resume auto: this run started from {source} ({root / FILE}) and has saved no checkpoint of its own "
            f"since, but {source} is no longer a complete checkpoint; restore it, or give --resume PATH (the "
            f"folder's newest checkpoint, {latest}, belongs to the run before: resuming it would undo the roll-back)"
            if latest is not None else
            f"--resume auto: this run started from {source} ({root / FILE}) and has saved no checkpoint of its own "
            f"since, but {source} is no longer a complete checkpoint; restore it, or give --resume PATH or --resume "
            "none")
    return source


def _saved_after(checkpoint_dir: Path, record: dict, path: Path) -> bool:
    """Whether ``checkpoint_dir`` (its state file's ``time``) was saved after the record was written (its ``time``,
    else the file's modification time)."""
    try:
        saved = float(read_state(checkpoint_dir).get("time") or 0)
        written = float(record.get("time") or path.stat().st_mtime)
    except (CheckpointStateError, OSError, TypeError, ValueError):
        return False
    return saved > written


def started(root: Path, source: str) -> bool:
    """Whether this Slurm job (``SLURM_JOB_ID``) already started the folder's lineage from ``source`` (a checkpoint
    path, or ``none``)."""
    record = read(root)
    job = os.environ.get("SLURM_JOB_ID")
    if record is None or not job or record.get("slurm_job_id") != job:
        return False
    want = "none" if source == "none" else source_name(Path(source))
    if record["source"] == want:
        return True
    # a folder holding LATEST (--resume RUN_DIR/checkpoints): the checkpoint it resolved to
    found = find_latest(Path(source)) if source != "none" and Path(source).is_dir() else None
    return found is not None and record["source"] == source_name(found)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "started":
        print("usage: python -m trainer.lineage started CHECKPOINTS_DIR SOURCE  (exit 0: this Slurm job already "
              "started the folder's lineage from SOURCE)", file=sys.stderr)
        return 2
    return 0 if started(Path(args[1]), args[2]) else 1


if __name__ == "__main__":
    sys.exit(main())
