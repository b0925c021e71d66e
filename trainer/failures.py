"""How a run that fails says so: one line instead of a traceback where the fault is known (a damaged checkpoint, a
full disk outside a save), and a hint in ``status.json`` when rank 0 failed only because another rank did.
``trainer/pretrain.py``'s ``main`` and ``_run_locked`` call these.
"""
from __future__ import annotations

import sys
from pathlib import Path

from trainer.config import RunConfig, checkpoint_dir
from trainer.run_status import EXIT_ERROR, last_step, write_status


class CheckpointDamagedError(RuntimeError):
    """A complete checkpoint (its ``bertfamily.json`` is there) whose DeepSpeed files cannot be read back: a shard cut
    short or corrupted after the save (a copy stopped half way, a failing disk). ``one_line`` is what ``main`` says."""

    def __init__(self, line: str):
        super().__init__(line)
        self.one_line = line


# What torch and DeepSpeed raise reading a file that is cut short or corrupted (torch 2.13: OSError EINVAL from
# PyTorchFileReader on a file cut inside its records, "PytorchStreamReader failed reading zip archive: failed finding
# central directory" on one cut before its end record)
_READ_FAILED = ("PytorchStreamReader", "zip archive", "central directory", "unexpected EOF", "Ran out of input")


def damaged_checkpoint_error(resume_dir: Path, loaded: Path, err: BaseException) -> CheckpointDamagedError | None:
    """The error to raise when loading ``loaded`` (``resume_dir`` or its universal conversion) failed because a file
    of it is unreadable (``err``'s chain: an OSError, EOFError, unpickling error or torch's zip reader failure); None
    for any other failure (refused classes: ``safe_load.UntrustedCheckpointError``, a shape mismatch, ...). Names the
    damaged files (the .pt files that are no readable zip archive), and the previous complete checkpoint beside it with
    the ``--resume`` command that continues from it (that roll-back moves the newer ones aside, never deletes)."""
    import pickle
    import zipfile

    from trainer import checkpoint
    from trainer.safe_load import UntrustedCheckpointError

    e, seen, read_error = err, 0, None
    while e is not None and seen < 10 and read_error is None:
        if isinstance(e, UntrustedCheckpointError):
            return None
        if isinstance(e, (OSError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile)) and \
                not isinstance(e, PermissionError) or (
                isinstance(e, RuntimeError) and any(s in str(e) for s in _READ_FAILED)):
            read_error = e
        e = e.__cause__ or e.__context__
        seen += 1
    if read_error is None:
        return None
    bad = []
    for folder in dict.fromkeys([Path(resume_dir), Path(loaded)]):
        for f in sorted(folder.glob("*.pt")):
            try:
                if not zipfile.is_zipfile(f):
                    bad.append(str(f))
            except OSError:
                bad.append(str(f))
    if not bad and type(read_error) is OSError or isinstance(read_error, (TimeoutError, InterruptedError)):
        # every file is a whole zip archive and the error is the filesystem's (EIO, ESTALE, EMFILE...): not damage,
        # and the roll-back advice would move intact checkpoints aside; the traceback says what failed
        return None
    first = str(read_error).splitlines()[0].split(". ")[0] if str(read_error) else ""
    what = f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''} is cut short or corrupted" if bad else \
        f"a file of it cannot be read ({type(read_error).__name__}: {first})"
    step = checkpoint.step_of(Path(resume_dir).name)
    earlier = [c for c in checkpoint.complete_checkpoints(Path(resume_dir).parent)
               if step is not None and (checkpoint.step_of(c.name) or 0) < step]
    if earlier:
        todo = (f"resume from the previous complete checkpoint: run the same command with --resume {earlier[-1]} "
                f"(this moves {Path(resume_dir).name} and any newer checkpoint aside into "
                f"{Path(resume_dir).parent}/abandoned-*/, not deleted)")
    else:
        todo = (f"there is no earlier complete checkpoint in {Path(resume_dir).parent}: restore the file from a "
                "copy, or start over with --resume none (moves these checkpoints aside, not deleted)")
    return CheckpointDamagedError(f"checkpoint {resume_dir} is damaged: {what} (a copy stopped half way or a failing "
                                  f"disk; {type(read_error).__name__}: {first[:160]}); {todo}")


def stopped(cfg: RunConfig, rank: int, status: str, line: str) -> int:
    """Say ``line`` (one line, no traceback), record ``status`` with it in RUN_DIR/status.json, exit status 1."""
    print(f"rank {rank}: error: {line}", file=sys.stderr, flush=True)
    try:
        write_status(cfg.run_dir, rank, status, last_step(), line)
    except OSError as err:  # (a full disk): said, not swallowed
        print(f"rank {rank}: could not write {cfg.run_dir}/status.json either: {err}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def disk_full_line(cfg: RunConfig, err: BaseException) -> str:
    """What a full disk outside a checkpoint save stopped: the file when the error names one, which of the run's
    folders are on a (nearly) full filesystem now, and what to do."""
    from trainer.disk_space import disk_full_elsewhere_message
    root = checkpoint_dir(cfg)
    cache = (Path(cfg.data.cache_dir) if cfg.data.cache_dir
             else Path(str(cfg.data.corpora[0].prefix)).parent / "index_cache")  # trainer/data/dataset.py's
    candidates = [("run_dir", Path(cfg.run_dir)), ("checkpoint folder", root), ("data index cache", cache)]
    last = None
    try:
        from trainer.checkpoint import find_latest
        last = find_latest(root)
    except Exception:  # noqa: BLE001  (the message matters more than naming the checkpoint)
        pass
    return disk_full_elsewhere_message(err, candidates, last)


_TIMED_OUT = ("Timed out waiting", "timed out after", "Watchdog caught collective operation timeout")
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote process exited",
              "NCCL communicator was aborted", "ProcessGroupNCCL's watchdog", "Broken pipe", "recvBytes", "sendBytes")


def peer_failure_hint(err: BaseException) -> str:
    """status.json is rank 0's: when rank 0 failed only because another rank's failure closed the collective under it
    (a loader worker killed by the OOM killer on rank 17), its error names gloo or NCCL, not the cause. Said first,
    so the job's status points at the other ranks' output."""
    text = f"{type(err).__name__}: {err}"
    if any(mark in text for mark in _TIMED_OUT):  # gloo's and NCCL's words: neither names the rank it waited for
        return ("a collective timed out (deepspeed.timeout_minutes): another rank most likely stopped responding "
                "(hung in a kernel, a driver call or storage, stopped, or its node is gone); the rank whose output "
                "ends without an error, or whose metrics show the longest data_wait_s/step_s, is the one to look at. "
                "This rank's error: ")
    if any(mark in text for mark in _PEER_GONE):
        return ("another rank most likely failed first (this rank's collective lost its peer): its own error is in "
                "that rank's output (torchrun --tee / the job log per rank). This rank's error: ")
    return ""


def other_model_error(resume_dir: Path, cfg: RunConfig, err: BaseException) -> CheckpointDamagedError | None:
    """The error to raise when the checkpoint's weights do not fit this launch's model (torch's "Error(s) in loading
    state_dict"): the model settings differ from the ones the run was saved with (e.g. a generator_fraction or a
    vocabulary changed in the config between launches). One line naming the settings that differ; None for any
    other failure."""
    from trainer import checkpoint

    e, seen = err, 0
    while e is not None and seen < 10 and "Error(s) in loading state_dict" not in str(e):
        e, seen = e.__cause__ or e.__context__, seen + 1
    if e is None or seen >= 10:
        return None
    saved_cfg = checkpoint.read_state(resume_dir).get("config") or {}
    differ = []
    # the model's settings, then the objective's (its heads: a recipe that gained a head, as ernie_base's NSP on
    # 2026-12-06, builds a model the checkpoint lacks a part of; the message said "no model setting differs")
    for section, now in (("model", cfg.model.model_dump(mode="json")),
                         ("objective", cfg.objective.model_dump(mode="json"))):
        saved = saved_cfg.get(section) or {}
        for k in sorted(now):
            if k in saved and saved[k] != now[k] and isinstance(now[k], dict) and isinstance(saved[k], dict):
                differ += [f"{section}.{k}.{j}: {saved[k].get(j)!r} there, {now[k].get(j)!r} here"
                           for j in sorted(set(now[k]) | set(saved[k])) if saved[k].get(j) != now[k].get(j)]
            elif k in saved and saved[k] != now[k]:
                differ.append(f"{section}.{k}: {saved[k]!r} there, {now[k]!r} here")
    said = "; ".join(differ[:4]) or "see the traceback: no model or objective setting in its bertfamily.json differs"
    return CheckpointDamagedError(
        f"checkpoint {resume_dir} holds another model than this launch builds ({said}): resume with the settings it "
        "was saved with (remove the --set / config change), or start a new run (another run_dir) from its weights "
        f"with --set checkpoint.init_from={resume_dir}")
