"""The runner side of ``eval.downstream`` (trainer/finetune/downstream.py): the fine-tunings (``Job``) and runner
processes (``Runner``) that ``RUN_DIR/downstream/queue.json`` records (written by ``_write_atomic``), how a process is
told apart from a later one that reused its pid (Linux ``/proc``: pid, start time, boot id), the runner's loop
(``run_chain``), the records it and the child append to the pretraining run's ``metrics.jsonl``, and the checkpoint
copy a job reads (``copy_checkpoint``). Standard library only at import time."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

EXIT_FILE = "finetune.exit"
"""``RUN_DIR/downstream/global_step<s>/<task>/finetune.exit``: the child's exit status, written by its runner."""

@dataclass
class Job:
    """One fine-tuning: ``task`` and ``data`` name the ``eval.downstream`` entry, ``copy`` the checkpoint copy the
    child reads (its folder ``copy.parent`` gets finetune.log, finetune/ and ``EXIT_FILE``). ``source``: the original
    checkpoint when the copy is not made yet (a preemption whose hard links failed: the next launch copies it);
    ``origin``: the original checkpoint, ``run_id`` its ``bertfamily.json`` run id (None in queue.json rows written
    before they were recorded; None for a checkpoint saved without one)."""

    task: str
    data: str
    step: int
    copy: Path
    source: Path | None = None
    origin: Path | None = None
    run_id: str | None = None

    @property
    def out(self) -> Path:
        return self.copy.parent

    def row(self) -> dict:
        row = {"task": self.task, "data": self.data, "step": self.step, "copy": str(self.copy)}
        for key in ("source", "origin", "run_id"):
            if getattr(self, key) is not None:
                row[key] = str(getattr(self, key))
        return row

    @classmethod
    def from_row(cls, row: dict) -> Job:
        return cls(row["task"], row["data"], int(row["step"]), Path(row["copy"]),
                   *(Path(row[key]) if row.get(key) else None for key in ("source", "origin")), row.get("run_id"))


@dataclass
class Runner:
    """A runner process (``python -m trainer.finetune.downstream --runner``) holding one slot of its task: it runs
    ``jobs`` one after another. ``proc`` is set when this launch started it; otherwise (an earlier launch's) it is
    known by ``pid`` and its start time (field 22 of /proc/PID/stat) on the machine of ``boot_id``."""

    task: str
    data: str
    jobs: list[Job]
    pid: int
    start: int | None
    boot_id: str
    proc: subprocess.Popen | None = None

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.boot_id == _boot_id() and alive(self.pid, self.start)

    def row(self) -> dict:
        return {"task": self.task, "data": self.data, "pid": self.pid, "start": self.start, "boot_id": self.boot_id,
                "jobs": [j.row() for j in self.jobs]}


def process_start(pid: int) -> int | None:
    """The start time of a live, non-zombie process (field 22 of /proc/PID/stat, clock ticks after boot): with the
    pid it names one process, where the pid alone may name an unrelated one that reused it; None if none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):  # a zombie (a container's PID 1 may never reap an orphan) has ended
        return None
    return int(fields[19])


def alive(pid: int, start: int | None) -> bool:
    """Whether the process of ``pid`` that started at ``start`` still runs (not a later one that reused the pid)."""
    return start is not None and process_start(pid) == start


def _boot_id() -> str:
    """This machine's boot id, "" where there is none (the run lock's, as recorded in queue.json)."""
    from trainer.run_lock import _boot_id as boot_id
    return boot_id() or ""


def _exit_code(job: Job) -> int | None:
    try:
        return int((job.out / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None


def _unfinished(job: Job) -> bool:
    """No exit status written and its checkpoint (copy or original) still there: it never ran to its end."""
    return _exit_code(job) is None and (job.source or job.copy).is_dir()


def _record_failure(run_dir: Path, task: str, step: int, reason: str, say=print, run_id: str | None = None) -> None:
    """``run_id``: the checkpoint's, so a record of an abandoned lineage's step s is told from the new one's."""
    rec = {"step": step, "split": "downstream_failed", "task": task, "error": reason, "run_id": run_id}
    try:
        _append_record(run_dir, rec)
    except OSError as err:
        say(f"downstream: could not record that failure in {run_dir / 'metrics.jsonl'}: {err}")


def removed_copy(out: Path, origin: str | Path | None) -> str:
    """What a failed fine-tuning leaves, for its failure message and record. Nothing runs a failed fine-tuning again
    (only those whose runner died before writing an exit status: their copies stay for that), so its copy is
    removed. Kept, a run whose fine-tunings all fail leaked one per due step (review: 68 MB of copies beside 10 MB of
    checkpoints; ~5 GB each for RoBERTa-large)."""
    again = f"fine-tune {origin} by hand while checkpoint.keep_last keeps it" if origin else \
        "fine-tune its checkpoint by hand while checkpoint.keep_last keeps it"
    return (f"its checkpoint copy was removed; {out} keeps finetune.log, {EXIT_FILE} and what finetune/ got (kB); to "
            f"retry, {again}")


def run_chain(spec: dict) -> int:
    """The runner: wait for the processes of ``spec["wait"]`` (pid and start time) to end, then run each
    fine-tuning one after another; a child's exit status goes to its folder's ``EXIT_FILE``, and a failure (a
    non-zero exit, a program that cannot start) to metrics.jsonl as ``"split": "downstream_failed"`` (the child
    appends its score itself), its copy removed (``removed_copy``: the child's ``--cleanup`` removes it on success
    only). It outlives the trainer, so the record does not depend on it."""
    run_dir = Path(spec["run_dir"])
    for pid, start, boot in spec["wait"]:
        while boot == _boot_id() and alive(pid, start):
            time.sleep(spec["poll_s"])
    for job in spec["jobs"]:
        out, cmd = Path(job["copy"]).parent, job["cmd"]
        try:
            with open(out / "finetune.log", "w") as log:
                code = subprocess.call(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            reason = f"exit {code}; see {out / 'finetune.log'}"
        except OSError as err:
            code, reason = 127, f"could not start {cmd[0]!r}: {err}"
            try:
                (out / "finetune.log").write_text(f"{reason}\ncommand: {' '.join(cmd)}\n")
            except OSError:
                pass
        if code != 0:
            shutil.rmtree(job["copy"], ignore_errors=True)
            _record_failure(run_dir, job["task"], job["step"], f"{reason}; {removed_copy(out, job.get('origin'))}",
                            run_id=job.get("run_id"))
        try:
            (out / EXIT_FILE).write_text(f"{code}\n")
        except OSError:
            pass
    return 0


def read_score(job: Job) -> str:
    """A finished fine-tuning's best scores, as the launcher prints them."""
    from trainer.finetune.tasks import ALIASES
    path = job.out / "finetune" / ALIASES.get(job.task.lower(), job.task.lower()) / "results.json"
    try:
        rec = json.loads(path.read_text())
        return " ".join(f"{m}={100 * v:.2f}" for m, v in rec["best"][rec["selection_split"]].items())
    except (OSError, ValueError, KeyError) as err:
        return f"(no readable results at {path}: {err})"


def score_record(summary: dict) -> dict:
    """The metrics.jsonl record of a finished fine-tuning: the best setting's medians, ``<task>_<metric>`` keys
    (``<task>_<split>_<metric>`` for splits after the first, e.g. MNLI's mismatched)."""
    task = summary["task"].replace("-", "")
    rec = {"step": summary["pretraining_step"], "split": "downstream", "task": summary["task"]}
    for i, (split, scores) in enumerate(summary["best"].items()):
        for metric, value in scores.items():
            rec[f"{task}_{metric}" if i == 0 else f"{task}_{split}_{metric}"] = value
    rec["setting"] = summary["best_setting"]
    return rec


def report(run_dir: str | Path, summary: dict) -> dict:
    """Write the score to TensorBoard, then append it to the pretraining run's metrics.jsonl (one O_APPEND write):
    the record comes last, so a reader that sees it finds the event file complete and closed."""
    from trainer.finetune.downstream_copy import run_id_of_copy
    run_dir = Path(run_dir)
    copy = summary.get("checkpoint")
    rec = {**score_record(summary), "run_id": run_id_of_copy(Path(copy)) if copy else None}
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        SummaryWriter = None
    if SummaryWriter is not None:
        writer = SummaryWriter(str(run_dir / "tensorboard"), filename_suffix=f".downstream{os.getpid()}")
        for key, value in rec.items():
            if isinstance(value, float):
                writer.add_scalar(f"downstream/{key}", value, rec["step"])
        writer.close()
    _append_record(run_dir, rec)
    return rec


def _append_record(run_dir: Path, rec: dict) -> None:
    """One line appended to ``run_dir/metrics.jsonl`` in one O_APPEND write: no interleaving with other writers on one
    machine or on Lustre; on NFS appends from different clients are not atomic (a line may be overwritten)."""
    fd = os.open(Path(run_dir) / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


def copy_checkpoint(tag_dir: Path, dest: Path, links_only: bool = False) -> Path:
    """``dest/<tag>``: hard links of the checkpoint's files that a fine-tuning reads (a copy where links fail): no
    universal/ subfolder, no RNG states, no optimizer files where the model states hold the fp32 weights
    (``downstream_copy.not_copied``). With ``links_only`` a file that cannot be linked raises OSError (the partial
    copy removed) instead of being copied."""
    from trainer.finetune.downstream_copy import not_copied
    target = dest / Path(tag_dir).name
    if target.exists():
        shutil.rmtree(target)
    dest.mkdir(parents=True, exist_ok=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            if links_only:
                raise
            shutil.copy2(src, dst)
    try:
        shutil.copytree(tag_dir, target, copy_function=link,
                        ignore=shutil.ignore_patterns(*not_copied(tag_dir)))
    except (OSError, shutil.Error):
        shutil.rmtree(target, ignore_errors=True)
        if links_only:
            raise OSError(f"cannot hard-link {tag_dir} into {dest}") from None
        raise
    return target


def _write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file of this process's own (host, pid, random: two writers never
    share one, as they did ``queue.tmp``), fsync'd before ``os.replace`` so the rename never lands before the data."""
    tmp = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
