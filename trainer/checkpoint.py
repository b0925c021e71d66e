"""Atomic checkpoints: DeepSpeed's engine checkpoint plus our state, a ``latest`` pointer, keep-last-K, resume.

Layout (DESIGN.md "Checkpoints")::

    RUN_DIR/checkpoints/global_step200/     DeepSpeed's files (tag global_step200), written by every rank
                        global_step200/rng_rank{r}.pt   each rank's RNG states
                        global_step200/bertfamily.json  step, consumed samples, world size, config; written LAST
                        global_step200/universal/       DeepSpeed universal form, made on demand for a new world size
                        latest                          "global_step200", replaced atomically after all ranks finished
                        lineage.json                    where the current lineage started (trainer/lineage.py)
                        abandoned-<UTC>-<run id>/       checkpoints a roll-back or fresh start moved aside (moved.json)

A checkpoint is complete iff its ``bertfamily.json`` exists; that file is written by rank 0 after a barrier that
every rank reaches only after its own shards are on disk, and then ``latest`` moves (write a temp file, then
``os.replace``, which is atomic on POSIX). A kill at any point of a save therefore leaves ``latest`` naming the
previous complete checkpoint, and ``--resume auto`` never picks a half-written one. ``--resume auto`` takes the newest
complete checkpoint, also when ``latest`` lags behind it (a kill between the state file and the pointer); ``latest``
is for people and tools that read the folder.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from trainer.disk_space import (DiskFullError, disk_full_message, folder_bytes,  # noqa: F401  (used as checkpoint.*)
                                is_disk_full, warn_if_short_of_space)
from trainer import safe_load
from trainer.data_changes import saved_record
from trainer.checkpoint_files import (ABANDONED, FORMAT, FORMAT_VERSION, LATEST, STATE_FILE, UNIVERSAL, _TAG,  # noqa: F401
                                      CheckpointStateError, _atomic_write_text, _instead, _saved_run_id,  # (re-exported)
                                      complete_checkpoints, find_latest, is_complete, read_state, step_of, tag_for)


def resolve_resume(root: Path, resume: str) -> Path | None:
    """``--resume auto|none|PATH`` -> the checkpoint folder to load, or None for a fresh start."""
    if resume == "none":
        return None
    if resume == "auto":
        latest = find_latest(root)
        from trainer import lineage
        source = lineage.resume_source(root, latest, _saved_run_id)
        if source is not None:  # a lineage started outside the folder and killed before its first save
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"--resume auto: this run started from {source} ({Path(root) / lineage.FILE}) and has saved "
                      f"no checkpoint of its own yet: resuming from there"
                      + (f", not from {latest}, which belongs to the run before" if latest is not None else ""),
                      file=sys.stderr, flush=True)
            return source
        return latest
    path = Path(resume)
    if (path / LATEST).is_file() or (path.is_dir() and not is_complete(path) and step_of(path.name) is None):
        found = find_latest(path)
        if found is None:
            raise FileNotFoundError(f"--resume {resume}: no complete checkpoint under it")
        return found
    if not is_complete(path):
        raise FileNotFoundError(f"--resume {resume}: not a complete checkpoint (no {STATE_FILE}); "
                                "a save was interrupted there; use --resume auto to take the newest complete one")
    return path


# --- RNG ---------------------------------------------------------------------------------------------------------

def rng_state() -> dict:
    """Tensors and plain data only, so that ``restore_rng`` loads it weights-only (``trainer.safe_load``)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    saved = state["numpy"]
    if isinstance(saved, dict):
        saved = (saved["kind"], saved["keys"].numpy().astype(np.uint32), saved["pos"], saved["has_gauss"],
                 saved["cached_gaussian"])
    np.random.set_state(saved)  # else a tuple with numpy's array: a file written before the plain-data format
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --- save / restore ----------------------------------------------------------------------------------------------

@dataclass
class TrainState:
    """What the trainer adds to DeepSpeed's checkpoint. ``consumed_samples`` is the data position."""
    step: int = 0
    consumed_samples: int = 0
    skipped_steps: int = 0
    nonfinite_in_a_row: int = 0  # the NaN guard's streak at the save (a launch-ending save during one): it goes on
    before_streak: str = ""  # during a streak: the checkpoint saved before it (kept by pruning, named by messages)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _broadcast(obj, device="cpu"):
    """Rank 0's ``obj`` on every rank (one collective); ``obj`` itself without a multi-rank group."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=torch.device(device))
        return box[0]
    return obj


def new_run_id() -> str:
    return uuid.uuid4().hex


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _move_aside(root: Path, folders: list[Path], run_id: str, why: str) -> Path:
    """Move checkpoint folders into ``root/abandoned-<UTC stamp>-<run id>/`` (a rename: never copied, never
    deleted) with a note saying why; ``complete_checkpoints``, ``find_latest`` and ``prune`` never look inside."""
    aside = root / f"{ABANDONED}{_utc_stamp()}-{run_id[:12]}"
    aside.mkdir(parents=True, exist_ok=True)
    moved = []
    for folder in folders:
        complete = is_complete(folder)
        moved.append({"tag": folder.name, "complete": complete,
                      "run_id": _saved_run_id(folder) if complete else None})
        os.rename(folder, aside / folder.name)
    note = aside / "moved.json"
    earlier = json.loads(note.read_text())["moved"] if note.is_file() else []
    _atomic_write_text(note, json.dumps({"why": why, "by_run_id": run_id, "moved": earlier + moved}, indent=1))
    return aside


def begin_lineage(root: Path, resume_dir: Path | None, rank: int, device="cpu", fence=None,
                  explicit: bool = False) -> str:
    """Collective, before training starts: this run's id, and the checkpoints folder made consistent with it.

    A start from step s (0 for a fresh start, else the resumed checkpoint's step) that is not the continuation of
    ``root``'s newest complete checkpoint is a new lineage: the checkpoints of ``root`` newer than s (complete or
    not) are moved aside into ``root/abandoned-<UTC stamp>-<new run id>/`` (never deleted) and ``latest`` is
    rewritten to name s's checkpoint (or the newest one left, or removed when none is left). A continuation
    (``--resume auto`` after a preemption) keeps its run id. Rank 0 decides and acts; the others receive the id.
    ``fence`` (the run lock's ownership check) runs before anything is moved. ``explicit``: the checkpoint was named
    (``--resume PATH``, not ``auto``); a continuation named so is recorded in ``lineage.json`` too, so that the Slurm
    templates' requeued launches of the job continue instead of rolling back to it again (trainer/lineage.py)."""
    decision = None
    if rank == 0:
        decision = _begin_lineage(Path(root), resume_dir, fence, explicit)
    decision = _broadcast(decision, device)
    if "error" in decision:
        raise decision["error"]
    return decision["run_id"]


def _begin_lineage(root: Path, resume_dir: Path | None, fence, explicit: bool = False) -> dict:
    try:
        start = read_state(resume_dir)["step"] if resume_dir is not None else 0
        parent = read_state(resume_dir).get("run_id") if resume_dir is not None else None
        in_root = resume_dir is not None and Path(resume_dir).parent.resolve() == root.resolve()
        newer = sorted((p for p in root.iterdir() if p.is_dir() and (step_of(p.name) or 0) > start),
                       key=lambda p: step_of(p.name)) if root.is_dir() else []
        if in_root and parent and not any(is_complete(p) for p in newer):
            if explicit:  # --resume naming the newest checkpoint: this job has started from it (trainer/lineage.py)
                if fence is not None:
                    fence()
                from trainer import lineage
                lineage.write(root, parent, resume_dir, start)
            return {"run_id": parent}  # a continuation; incomplete debris is replaced by the save of its step
        run_id = new_run_id()
        if fence is not None:
            fence()
        from trainer import lineage
        if resume_dir is not None or explicit:  # where this lineage starts (trainer/lineage.py)
            lineage.write(root, run_id, resume_dir, start)
        else:  # a fresh start by --resume auto: nothing to record; an earlier lineage's record no longer applies
            (root / lineage.FILE).unlink(missing_ok=True)
        if not newer:
            return {"run_id": run_id}
        what = f"step {start} of {resume_dir}" if resume_dir is not None else "step 0 (--resume none)"
        aside = _move_aside(root, newer, run_id, f"run {run_id} started from {what}; these were newer")
        left = complete_checkpoints(root)
        if in_root:
            _atomic_write_text(root / LATEST, Path(resume_dir).name)
        elif left:
            _atomic_write_text(root / LATEST, left[-1].name)
        else:
            (root / LATEST).unlink(missing_ok=True)
        print(f"checkpoints: this run ({run_id}) starts from {what}; the {len(newer)} newer checkpoint folder(s) "
              f"of {root} ({', '.join(p.name for p in newer)}) were moved aside to {aside} (not deleted)",
              file=sys.stderr, flush=True)
        return {"run_id": run_id}
    except Exception as err:  # noqa: BLE001  (every rank raises rank 0's error instead of waiting in a collective)
        return {"error": err}


def save(engine, root: Path, state: TrainState, config: dict, rank: int, world_size: int, keep_last: int,
         run_id: str = "", fence=None, protect: Path | None = None) -> Path:
    """Collective: every rank calls this at the same step. Returns the checkpoint folder.

    Rank 0 decides whether the step is already saved (a complete checkpoint of this step and of this ``run_id``,
    e.g. a preemption right after a periodic save) and broadcasts it: ranks never decide on their own what a
    shared filesystem's cache shows them. A complete checkpoint of this step from another lineage is moved aside
    (``_move_aside``) and replaced."""
    root = Path(root)
    tag = tag_for(state.step)
    tag_dir = root / tag
    device = getattr(engine, "device", "cpu")
    decision = None
    if rank == 0:
        try:
            decision = _before_save(root, tag_dir, run_id, fence)
        except Exception as err:  # noqa: BLE001  (every rank raises it, none waits in a collective)
            decision = {"error": err}
    decision = _broadcast(decision, device)
    if "error" in decision:
        raise decision["error"]
    if decision["saved"]:
        return tag_dir
    failure = None
    try:
        engine.save(root, tag, client_state={"bertfamily_step": state.step})
    except Exception as err:  # noqa: BLE001  (judged below, together with the other ranks)
        failure = err
        # DeepSpeed's save_checkpoint (0.19.8) ends in dist.barrier() after its writes; a rank whose write raised
        # skipped it, so it takes that barrier here and the ranks stay in step for the all-reduce below.
        _barrier()
    if failure is None:
        try:
            torch.save(rng_state(), tag_dir / f"rng_rank{rank}.pt")
            _sync_own_files(tag_dir, rank)
        except Exception as err:  # noqa: BLE001
            failure = err
    # every rank's shards are on disk, or some rank failed: one all-reduce (in place of a barrier) tells all
    worst = all_max(0 if failure is None else 2 if is_disk_full(failure) else 1, device)
    if worst:
        if rank == 0:
            shutil.rmtree(tag_dir, ignore_errors=True)  # the partial folder (it can hold gigabytes)
        _barrier()
        if worst == 2:
            raise DiskFullError(disk_full_message(root, tag, find_latest(root), failure)) from failure
        if failure is not None:
            raise failure
        raise RuntimeError(f"another rank failed while saving {tag} to {root} (its error is in its output); "
                           f"the partial folder was removed")
    outcome = {}
    if rank == 0:
        try:
            if fence is not None:
                fence()
            record = {"format": FORMAT, "version": FORMAT_VERSION, "step": state.step, "run_id": run_id,
                      "consumed_samples": state.consumed_samples, "skipped_steps": state.skipped_steps,
                      "nonfinite_in_a_row": state.nonfinite_in_a_row, "before_streak": state.before_streak,
                      "world_size": world_size, "zero_stage": engine.zero_stage, "time": time.time(),
                      "config": config,
                      # each corpus's manifest fingerprint, so a resume sees a rebuilt corpus (data_changes.py)
                      "data_corpora": saved_record(config)}
            _atomic_write_text(tag_dir / STATE_FILE, json.dumps(record, indent=1))
            if fence is not None:
                fence()
            _atomic_write_text(root / LATEST, tag)
        except Exception as err:  # noqa: BLE001  (every rank raises it)
            shutil.rmtree(tag_dir, ignore_errors=True)  # not named by latest: the previous one stays the newest
            outcome = {"error": DiskFullError(disk_full_message(root, tag, find_latest(root), err))
                       if is_disk_full(err) else err}
        else:
            try:
                if fence is not None:
                    fence()
                downstream = [int(t.get("every_steps") or 0) for t in (config.get("eval") or {}).get("downstream") or []]
                prune(root, keep_last, int((config.get("checkpoint") or {}).get("every_steps") or 0), protect,
                      downstream)
            except Exception as err:  # noqa: BLE001
                outcome = {"error": err}
    outcome = _broadcast(outcome, device)
    if "error" in outcome:
        raise outcome["error"]
    return tag_dir


_RANKED = re.compile(r"pp_rank_(\d+)_|^rng_rank(\d+)\.pt$")


def _sync_own_files(tag_dir: Path, rank: int) -> None:
    """fsync the files of ``tag_dir`` this rank wrote (DeepSpeed's ``*pp_rank_R_*`` shards, ``rng_rankR.pt``; rank 0
    also the unranked ones, ``mp_rank_00_model_states.pt``, and the folder), before rank 0 marks the checkpoint
    complete and prunes older ones. Neither DeepSpeed nor torch.save syncs: a node that crashes with its shards in
    its page cache (or a Lustre client cache) left a "complete" checkpoint with a cut shard, the older ones already
    pruned. A write error that NFS reports only at fsync (a full disk) is raised here, inside the save."""
    for path in tag_dir.iterdir():
        found = _RANKED.search(path.name)
        owner = int(found.group(1) or found.group(2)) if found else 0
        if owner == rank and path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    if rank == 0:
        fd = os.open(tag_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def all_max(value: int, device) -> int:
    """The largest ``value`` over all ranks (one all-reduce on the device: NCCL reduces device tensors only)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())
    return value


def _before_save(root: Path, tag_dir: Path, run_id: str, fence) -> dict:
    """Rank 0: is ``tag_dir`` already this lineage's complete checkpoint? Otherwise clear the way for it."""
    if fence is not None:
        fence()  # nothing of this save is written unless the folder is still ours
    if is_complete(tag_dir):
        if _saved_run_id(tag_dir) == run_id:
            return {"saved": True}
        aside = _move_aside(root, [tag_dir], run_id, f"replaced by run {run_id}'s save of the same step")
        print(f"checkpoints: {tag_dir} belonged to another run; moved aside to {aside} and saved again",
              file=sys.stderr, flush=True)
    elif tag_dir.exists():
        shutil.rmtree(tag_dir)  # debris of an interrupted save of this very step (never complete: it is not latest)
    warn_if_short_of_space(root, tag_dir.name, find_latest(root), skip=UNIVERSAL)
    return {"saved": False}


def prune(root: Path, keep_last: int, every_steps: int = 0, protect: Path | None = None,
          also_periodic: list[int] | None = None) -> None:
    """Delete all but the newest ``keep_last`` complete periodic checkpoints (steps that are multiples of
    ``every_steps``, or of a downstream task's ``every_steps`` in ``also_periodic``: a failed fine-tuning's message
    sends the user to that checkpoint) and the newest checkpoint of all, and incomplete ones older than the newest.
    Without ``every_steps`` (0: no periodic saves), all but the newest ``keep_last``. ``protect`` (the checkpoint
    saved before a NaN/Inf streak, while the streak is open) is never deleted. Folders moved aside (``abandoned-*``)
    are never touched.

    Off-schedule checkpoints (a preemption's, ``train.stop_at_step``'s, the end of a run) count only while they are
    the newest: before, each counted against ``keep_last``, and a burst of requeues (three launches preempted after a
    step each) left only ``global_step32/34/36`` and pruned every periodic checkpoint, so a roll-back could go back a
    few steps at most (found by review).

    A folder that cannot be deleted (a colleague's checkpoint in a shared project folder without group write, a
    read-only snapshot) does not stop the run: the save is done. It is said in one warning per save, naming the
    folders and the first error, since ``keep_last`` is then exceeded and the disk fills (found by review: the
    errors were ignored and nothing was said)."""
    failed: dict[Path, str] = {}

    def remove(folder: Path) -> None:
        def note(_func, path, exc_info) -> None:
            failed.setdefault(folder, f"{exc_info[0].__name__}: {exc_info[1]}")
        shutil.rmtree(folder, onerror=note)  # (onexc from Python 3.12)

    done = complete_checkpoints(root)
    every = [e for e in [every_steps, *(also_periodic or [])] if e > 0] if every_steps > 0 else []
    if every and done:
        periodic = [p for p in done if any((step_of(p.name) or 0) % e == 0 for e in every)]
        keep = set(periodic[-keep_last:]) | {done[-1]}
        old = [p for p in done if p not in keep]
    else:
        old = done[:-keep_last]
    if protect is not None:
        old = [p for p in old if p.resolve() != Path(protect).resolve()]
    for folder in old:
        remove(folder)
    if done:
        newest = step_of(done[-1].name)
        for p in Path(root).iterdir():
            s = step_of(p.name)
            if p.is_dir() and s is not None and s < newest and not is_complete(p):
                remove(p)
    if failed:
        first, err = next(iter(failed.items()))
        print(f"warning: checkpoints: could not delete {len(failed)} old checkpoint folder(s) in {root} "
              f"({', '.join(p.name for p in failed)}; {first.name}: {err}), so checkpoint.keep_last = {keep_last} is "
              "exceeded and they keep their disk space. Delete them by hand (their owner can, in a folder shared by "
              "several users: docs/cluster_operations.md, 'Several users, one project folder')",
              file=sys.stderr, flush=True)


UNIVERSAL_WAIT_S = float(os.environ.get("BERTFAMILY_UNIVERSAL_WAIT_S", 4 * 3600))


def _wait_for_rank0(done: Path, failed: Path, rank: int, what: str, shown: Path, wait_s: float | None,
                    poll_s: float) -> None:
    """Poll the shared filesystem until rank 0 has made ``done`` (or written its failure to ``failed``)."""
    waited = UNIVERSAL_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + waited
    while not done.exists():
        if failed.exists():
            raise RuntimeError(f"rank 0 failed to {what}: {failed.read_text().strip()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: {shown} did not appear within {waited:g} s "
                               "(rank 0 makes it; is the folder on a filesystem every node "
                               "shares? raise BERTFAMILY_UNIVERSAL_WAIT_S for a very large model)")
        time.sleep(poll_s)


def restore_rng(tag_dir: Path, rank: int, world_size: int, seed: int, step: int) -> None:
    """Same world size: each rank continues its own RNG stream. Otherwise: a fresh stream from (seed, step, rank)
    (samples do not depend on it, only dropout does)."""
    saved = read_state(tag_dir)
    path = Path(tag_dir) / f"rng_rank{rank}.pt"
    if saved["world_size"] == world_size and path.exists():
        # weights-only: a poisoned file is refused, naming it; numpy's array class is allowed for the files written
        # before the plain-data format
        set_rng_state(safe_load.load(path, safe_load.numpy_rng_globals()))
    else:
        seed_everything(seed + 1_000_003 * step + rank)


# --- export ------------------------------------------------------------------------------------------------------

def load_model_state(ckpt_dir: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Consolidated fp32 weights (keys of the objective's model module) and the resolved config dict.

    ``ckpt_dir`` is one checkpoint (``.../global_stepN``) or a checkpoints folder (its newest complete one).
    """
    from trainer.engine import consolidated_fp32_state_dict  # deepspeed: loaded only by the calls that need it
    path = resolve_checkpoint(ckpt_dir)
    config = read_state(path)["config"]  # checked before gigabytes of weights are read
    return consolidated_fp32_state_dict(path.parent, path.name), config


def resolve_checkpoint(ckpt_dir: str | Path) -> Path:
    """``ckpt_dir`` itself when it is a complete checkpoint, else the newest complete one inside it."""
    path = Path(ckpt_dir)
    if not is_complete(path):
        found = find_latest(path)
        if found is None:
            raise FileNotFoundError(f"{ckpt_dir}: not a complete checkpoint and holds none")
        path = found
    return path
