"""Downstream scores during pretraining: ``eval.downstream`` fine-tunes copies of checkpoints in separate processes.

    eval:
      downstream:
        - {task: rte, data: glue_data/RTE, every_steps: 10000, set: [optim.lr=3e-5]}

At step s (a multiple of ``every_steps``) the run saves a checkpoint (if that step has none yet), and rank 0 copies it
to ``RUN_DIR/downstream/global_step<s>/<task>/`` as hard links (no extra disk; the copy survives keep-last pruning of
the original; a plain copy where hard links are impossible) and starts ``python -m trainer.finetune`` on the copy as a
new process session with the launcher's rank variables removed, so it is a 1-process job of its own and the
pretraining ranks never wait for it. The child deletes its copy, writes TensorBoard (``downstream/<task>_<metric>``,
its own event file in ``RUN_DIR/tensorboard``), and last its result record into ``RUN_DIR/metrics.jsonl`` (``"split":
"downstream"``, ``step`` = the pretraining step, ``<task>_<metric>`` = the median score; one ``O_APPEND`` write of a
line, which does not interleave with the trainer's own line writes on a local or Lustre filesystem): a reader that
sees the record finds everything else done. Rank 0 polls its children once per step (``Popen.poll``: no blocking) and
prints each finished score or names the log of a failed one; a failed child, or one that cannot be started (a wrong
``command_prefix``), is said and recorded (``"split": "downstream_failed"`` with the reason) and pretraining goes on.
At most ``max_running`` children per task run at once; later due steps queue (their copies made at once, the queue
kept in ``RUN_DIR/downstream/queue.json``) and start as earlier ones finish. When the run completes, what is still
queued is started in ``max_running`` detached chains per task, each one after the other (and after the child still
running in its slot). A launch that ends before the run completes (``train.stop_at_step``, preemption: a step due
at the preemption's checkpoint is queued too) starts nothing more and says what waits; the next launch of the run
starts the queue.

Where the child runs is ``command_prefix`` (e.g. ``[srun, --overlap, -N1, -n1, --gres=gpu:1]``) and ``env``; by
default it sees no GPU (``child_env``), so it never lands on rank 0's. This module imports only pydantic and the
standard library at import time (it holds a config section).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE_FILE = "queue.json"
"""``RUN_DIR/downstream/queue.json``: the due fine-tunings not started yet (task, data, step, copy), for the next
launch when this one ends first."""
CHAIN_POLL_S = 2.0
"""How often a chain started by ``finish`` looks whether the child it waits for has ended."""
# Variables through which a launcher makes a process a rank of its job; the child must start a job of its own.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                  "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
                  "SLURM_LOCALID", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")
RANK_PREFIXES = ("TORCHELASTIC_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_")


class DownstreamTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str
    """A GLUE task name, tsv, jsonl, ner, squad, race or swag (as ``python -m trainer.finetune --task``)."""
    data: str
    """The task's folder in its layout (GLUE's, SQuAD's, CoNLL's, RACE's, SWAG's; README "Fine-tuning")."""
    every_steps: int = Field(gt=0)
    """Fine-tune the checkpoint of every N-th pretraining step (a checkpoint is saved at those steps)."""
    config: str | None = None
    """Fine-tuning YAML (``--config``); None = the papers' defaults."""
    set: list[str] = Field(default_factory=list)
    """``--set`` overrides for the fine-tuning, e.g. [optim.lr=3e-5, train.epochs=2]."""
    sweep: list[str] = Field(default_factory=list)
    """``--sweep`` grids, e.g. [optim.lr=2e-5,3e-5]; the logged score is the best setting's median."""
    seeds: int = Field(default=1, gt=0)


class EvalConfig(BaseModel):
    """The ``eval`` section of a pretraining run."""

    model_config = ConfigDict(extra="forbid")

    downstream: list[DownstreamTask] = Field(default_factory=list)
    """Tasks fine-tuned on copies of checkpoints in separate processes while pretraining continues."""
    max_running: int = Field(default=1, gt=0)
    """Children per task running at once; later ones wait in a queue (copies made when due)."""
    command_prefix: list[str] = Field(default_factory=list)
    """Prepended to the child's command, e.g. [srun, --overlap, -N1, -n1] to run it on an allocation's resources."""
    env: dict[str, str] = Field(default_factory=dict)
    """Set in the child's environment. The child sees no GPU (CUDA_VISIBLE_DEVICES="") unless this names one, e.g.
    {CUDA_VISIBLE_DEVICES: "7"} for a GPU the pretraining does not use."""


def copy_checkpoint(tag_dir: Path, dest: Path) -> Path:
    """``dest/<tag>``: hard links of the checkpoint's files (a copy where links fail); no universal/ subfolder."""
    target = dest / Path(tag_dir).name
    if target.exists():
        shutil.rmtree(target)
    dest.mkdir(parents=True, exist_ok=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(tag_dir, target, copy_function=link, ignore=shutil.ignore_patterns("universal", ".universal*"))
    return target


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The child's environment: ours without the launch variables, the repository on PYTHONPATH, and no GPU unless
    ``extra`` (``eval.env``) names one: inherited, CUDA_VISIBLE_DEVICES lists every GPU of the node and the child
    takes the first, rank 0's, which then trains slower than the others and holds every rank back at each step. A
    ``command_prefix`` that allocates a GPU (``srun --gres=gpu:1``) sets the variable for its task itself."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES and not k.startswith(RANK_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


class DownstreamLauncher:
    """Rank 0's side: ``due(step)``, ``launch(step, tag_dir)`` after the save, ``poll()`` every step, and at the end
    of a launch ``finish()`` (the run is complete) or ``suspend()`` (stopped or preempted: the queue waits for the
    next launch). The queue is kept in ``RUN_DIR/downstream/queue.json`` (``QUEUE_FILE``) whenever it changes, and
    a new launch of the run starts what it holds as slots free up."""

    def __init__(self, cfg: EvalConfig, run_dir: str | Path, rank: int, say=print):
        self.cfg, self.run_dir, self.rank, self.say = cfg, Path(run_dir), rank, say
        self.running: list[tuple[DownstreamTask, int, subprocess.Popen, Path]] = []
        self.queued: list[tuple[DownstreamTask, int, Path]] = []
        if rank == 0:
            self._load_queue()

    @property
    def queue_file(self) -> Path:
        return self.run_dir / "downstream" / QUEUE_FILE

    def _save_queue(self) -> None:
        """Write the queue (atomically; removed when empty), so a launch that ends before starting it loses none."""
        rows = [{"task": t.task, "data": t.data, "step": step, "copy": str(copy)} for t, step, copy in self.queued]
        if not rows:
            self.queue_file.unlink(missing_ok=True)
            return
        tmp = self.queue_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(self.queue_file)

    def _load_queue(self) -> None:
        """The fine-tunings an earlier launch of this run queued and did not start: queued again (started by the
        next ``poll``) when ``eval.downstream`` still names the task; otherwise said and their copies removed."""
        try:
            rows = json.loads(self.queue_file.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            self.say(f"downstream: cannot read {self.queue_file} ({err}); its fine-tunings are not started")
            return
        for row in rows:
            task = next((t for t in self.cfg.downstream if (t.task, t.data) == (row["task"], row["data"])), None)
            copy = Path(row["copy"])
            if task is not None and copy.is_dir():
                self.queued.append((task, int(row["step"]), copy))
            else:
                shutil.rmtree(copy, ignore_errors=True)
                why = "its checkpoint copy is gone" if task is not None else "eval.downstream no longer names it"
                self.say(f"downstream: dropped the fine-tuning of {row['task']} at step {row['step']} queued by an "
                         f"earlier launch: {why}")
        if self.queued:
            self.say(f"downstream: {len(self.queued)} fine-tuning(s) queued by an earlier launch of this run "
                     f"({_listing(self.queued)}): started as eval.max_running allows")
        self._save_queue()

    def due(self, step: int) -> bool:
        return any(step % t.every_steps == 0 for t in self.cfg.downstream)

    def launch(self, step: int, tag_dir: Path, start: bool = True) -> None:
        """Copy ``tag_dir`` for every task due at ``step`` and queue it; with ``start``, start what the slots allow
        (a preempted launch passes False: the queue waits for the next launch)."""
        if self.rank != 0:
            return
        for t in self.cfg.downstream:
            if step % t.every_steps == 0:
                copy = copy_checkpoint(tag_dir, self.run_dir / "downstream" / tag_dir.name / _slug(t.task))
                self.queued.append((t, step, copy))
        self._save_queue()
        if start:
            self.poll()

    def _command(self, t: DownstreamTask, step: int, copy: Path) -> list[str]:
        out = copy.parent
        cmd = [*self.cfg.command_prefix, sys.executable, "-m", "trainer.finetune", "--checkpoint", str(copy),
               "--task", t.task, "--data", t.data, "--seeds", str(t.seeds), "--set", f"run_dir={out}",
               "--report-run", str(self.run_dir), "--report-step", str(step), "--cleanup"]
        if t.config:
            cmd += ["--config", t.config]
        for s in t.set:
            cmd += ["--set", s]
        for s in t.sweep:
            cmd += ["--sweep", s]
        return cmd

    def _start(self, t: DownstreamTask, step: int, copy: Path) -> None:
        out = copy.parent
        cmd = self._command(t, step, copy)
        try:
            with open(out / "finetune.log", "w") as log:  # the child holds its own descriptor
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(self.cfg.env),
                                        start_new_session=True, cwd=os.getcwd())
        except OSError as err:  # a wrong eval.command_prefix (no such program), a full disk: reported, never fatal
            reason = f"could not start {cmd[0]!r}: {err}"
            try:  # the folder says what happened too
                (out / "finetune.log").write_text(f"{reason}\ncommand: {' '.join(cmd)}\n")
            except OSError:
                pass
            self._failed(t, step, reason, copy)
            return
        self.running.append((t, step, proc, out))
        self.say(f"downstream: fine-tuning {t.task} on the step-{step} checkpoint (pid {proc.pid}, log "
                 f"{out / 'finetune.log'})")

    def poll(self) -> None:
        if self.rank != 0:
            return
        still = []
        for t, step, proc, out in self.running:
            code = proc.poll()
            if code is None:
                still.append((t, step, proc, out))
            elif code == 0:
                score = _read_score(out / "finetune" / _task_dir(t.task) / "results.json")
                self.say(f"downstream: {t.task} at step {step}: {score}")
            else:
                self._failed(t, step, f"exit {code}; see {out / 'finetune.log'}")
        self.running = still
        waiting = []
        for t, step, copy in self.queued:
            if sum(1 for r in self.running if r[0] is t) < self.cfg.max_running:
                self._start(t, step, copy)
            else:
                waiting.append((t, step, copy))
        if len(waiting) != len(self.queued):
            self.queued = waiting
            self._save_queue()

    def _failed(self, t: DownstreamTask, step: int, reason: str, copy: Path | None = None) -> None:
        """Say that a fine-tuning failed and why, and append a ``"split": "downstream_failed"`` record with the reason
        to metrics.jsonl (``report``'s one O_APPEND write); a copy no child will read is removed."""
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
        self.say(f"downstream: fine-tuning {t.task} at step {step} failed ({reason}); pretraining continues")
        rec = {"step": step, "split": "downstream_failed", "task": t.task, "error": reason}
        try:
            _append_record(self.run_dir, rec)
        except OSError as err:
            self.say(f"downstream: could not record that failure in {self.run_dir / 'metrics.jsonl'}: {err}")

    def finish(self) -> None:
        """End of the pretraining: start what is still queued, never waiting for children and keeping
        ``max_running`` per task. The queue is split into ``max_running`` chains per task, each one detached shell
        that first waits for a child still running in its slot and then runs its fine-tunings one after another."""
        if self.rank != 0:
            return
        self.poll()
        for t in self.cfg.downstream:
            mine = [(step, copy) for task, step, copy in self.queued if task is t]
            if not mine:
                continue
            busy = [proc.pid for task, _, proc, _ in self.running if task is t]
            slots = max(1, self.cfg.max_running)
            for k in range(slots):
                chain = mine[k::slots]
                if chain:
                    self._start_chain(t, chain, busy[k] if k < len(busy) else None)
        self.queued = []
        self._save_queue()

    def suspend(self) -> None:
        """The launch ends before the run is complete (train.stop_at_step, preemption): what is queued stays in
        ``queue.json`` for the next launch of the run, which starts it; said, with the steps."""
        if self.rank != 0:
            return
        self.poll()
        if self.queued:
            self._save_queue()
            self.say(f"downstream: {len(self.queued)} fine-tuning(s) not started ({_listing(self.queued)}) wait in "
                     f"{self.queue_file}; the next launch of this run (--resume auto) starts them")

    def _start_chain(self, t: DownstreamTask, chain: list[tuple[int, Path]], wait_pid: int | None) -> None:
        import shlex  # noqa: PLC0415

        # wait for the slot's running child: until its /proc entry is gone or a zombie (kill -0 succeeds on a
        # zombie, which stays one where the container's PID 1 does not reap orphans)
        lines = [f"while st=$(sed -n 's/.*) \\(.\\) .*/\\1/p' /proc/{wait_pid}/stat 2>/dev/null) && [ -n \"$st\" ] && "
                 f"[ \"$st\" != Z ]; do sleep {CHAIN_POLL_S}; done"] if wait_pid else []
        for step, copy in chain:
            cmd = self._command(t, step, copy)
            lines.append(f"{shlex.join(cmd)} > {shlex.quote(str(copy.parent / 'finetune.log'))} 2>&1")
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", "\n".join(lines)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(self.cfg.env),
                                    start_new_session=True, cwd=os.getcwd())
        except OSError as err:
            for step, copy in chain:
                self._failed(t, step, f"could not start /bin/sh: {err}", copy)
            return
        self.say(f"downstream: fine-tuning {t.task} on the checkpoints of steps {[s for s, _ in chain]} one after "
                 f"another{' after pid ' + str(wait_pid) if wait_pid else ''} (pid {proc.pid}; logs "
                 f"{chain[0][1].parent / 'finetune.log'} ...)")


def _listing(queued: list) -> str:
    return ", ".join(f"{t.task} at step {step}" for t, step, _ in queued)


def _slug(task: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in task.lower())


def _task_dir(task: str) -> str:
    from trainer.finetune.tasks import ALIASES
    return ALIASES.get(task.lower(), task.lower())


def _read_score(path: Path) -> str:
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
    run_dir = Path(run_dir)
    rec = score_record(summary)
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
    """One line appended to ``run_dir/metrics.jsonl`` in one O_APPEND write (no interleaving with other writers)."""
    fd = os.open(Path(run_dir) / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)
