"""Downstream scores during pretraining: ``eval.downstream`` fine-tunes copies of checkpoints in separate processes.

    eval:
      downstream:
        - {task: rte, data: glue_data/RTE, every_steps: 10000, set: [optim.lr=3e-5]}

At step s (a multiple of ``every_steps``) the run saves a checkpoint (if that step has none yet), and rank 0 copies it
to ``RUN_DIR/downstream/global_step<s>-<run id>/<task>/`` as hard links (``downstream_copy.py``: the run id keeps a
roll-back's lineages apart; no extra disk; the copy survives keep-last pruning of the original; a plain copy where
hard links are impossible) and starts a runner (``python -m
trainer.finetune.downstream --runner``, a new process session with the launcher's rank variables removed), which
starts ``python -m trainer.finetune`` on the copy, so it is a 1-process job of its own and the pretraining ranks never
wait for it. The child deletes its copy, writes TensorBoard (``downstream/<task>_<metric>``, its own event file in
``RUN_DIR/tensorboard``), and last its result record into ``RUN_DIR/metrics.jsonl`` (``"split": "downstream"``,
``step`` = the pretraining step, ``<task>_<metric>`` = the median score; one ``O_APPEND`` write of a line, which does
not interleave with the trainer's own line writes on a local or Lustre filesystem; NFS has no atomic append across
clients, so writers on different machines can overwrite or interleave each other's lines there): a reader that sees
the record finds everything else done. The runner writes the child's exit status to ``finetune.exit`` in the task's
folder, and a failure (non-zero exit, a program that cannot start) to metrics.jsonl (``"split": "downstream_failed"``
with the reason) and removes the copy (nothing retries it; ``downstream_copy.py`` says what a copy holds): both
records are written whether or not the trainer still runs. Rank 0 polls its runners once per
step (no blocking) and prints each finished score or names the log of a failed one; a wrong ``command_prefix`` (no
such program) is said and recorded at once, and pretraining goes on.

At most ``max_running`` runners per task run at once, counted across launches: ``RUN_DIR/downstream/queue.json``
holds the runners started (pid and process start time, which together name one process where a pid may be reused)
and the due steps not started yet (their copies made at once); a launch counts the live runners of earlier ones.
When the run completes, what is still queued is started in ``max_running`` detached runners per task, each running
its fine-tunings one after another after the runner it replaces in its slot. A launch that ends before the run
completes (``train.stop_at_step``, preemption, the NaN/Inf guard) starts nothing more and says what waits; the next
launch starts it. At preemption the copy is hard links only: where they fail, the step is queued referencing the
checkpoint itself and the next launch makes the copy (a full copy would eat the scheduler's kill grace period). The
fine-tunings of a runner that died before finishing them are queued again by the next launch, or run in the foreground
by ``python -m trainer.finetune.downstream RUN_DIR``, which waits until nothing runs or waits and exits non-zero when
a fine-tuning failed. It takes the run's lock (``trainer.run_lock``) and is refused while a launch holds it (both would
start the queue). Under Slurm with proctrack/cgroup the runners die when the trainer's job step (its ``srun``) ends,
so the slurm/ templates run that command in the batch script after a completed training. A failed checkpoint copy or
queue.json write is said and recorded, never raised (rank 0 alone would leave the loop).

A runner is recognised by its pid, its start time and the boot id of the machine (Linux ``/proc``) it was started on:
a runner started on another machine or in another container (another boot id, or a pid namespace of its own) counts as
dead, and its fine-tunings are queued again (run twice if it does in fact still run).

Where the child runs is ``command_prefix`` (e.g. ``[srun, --overlap, -N1, -n1, --gres=gpu:1]``) and ``env``; by
default it sees no GPU (``child_env``), so it never lands on rank 0's. This module (the launcher side) imports only
pydantic and the standard library at import time (it holds a config section); the runner side, the queue's records,
the metrics.jsonl records and the file helpers (``copy_checkpoint``, ``_write_atomic``) are in
``downstream_runner.py``, which keeps this module under 500 lines.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainer.finetune.downstream_copy import abandoned, job_folder, run_id_of
from trainer.finetune.downstream_runner import (EXIT_FILE, Job, Runner, _boot_id, _exit_code,  # noqa: F401
                                                _record_failure, _unfinished, _write_atomic, alive, copy_checkpoint,
                                                process_start, read_score, removed_copy, report, run_chain,
                                                score_record)

REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE_FILE = "queue.json"
"""``RUN_DIR/downstream/queue.json``: ``eval`` (the run's ``EvalConfig``, for ``main``), ``queued`` (the due
fine-tunings not started yet: task, data, step, copy) and ``running`` (the runners started: pid, start time, boot id
and their fine-tunings), so a later launch or ``main`` counts live runners against ``max_running`` and starts what is
left. Written through a temporary file of the writer's own, fsync'd, then ``os.replace``; one that cannot be parsed
is moved aside to ``queue.json.bad-<UTC time>`` (said), never dropped."""
CHAIN_POLL_S = 2.0
"""How often a runner looks whether the runners it waits for have ended (and ``wait`` polls)."""
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
    seeds: int | None = Field(default=None, gt=0)
    """Runs per setting (``--seeds``); when given it overrides ``train.seeds`` of ``set`` and of the ``config``
    YAML, as ``--seeds`` does on the command line. None: those decide (1 when neither sets it)."""


class EvalConfig(BaseModel):
    """The ``eval`` section of a pretraining run."""

    model_config = ConfigDict(extra="forbid")

    downstream: list[DownstreamTask] = Field(default_factory=list)
    """Tasks fine-tuned on copies of checkpoints in separate processes while pretraining continues."""
    max_running: int = Field(default=1, gt=0)
    """Runners per task running at once, counted across launches of the run and ``python -m
    trainer.finetune.downstream RUN_DIR`` (live runners recorded in queue.json hold their slots); later fine-tunings
    wait in the queue (copies made when due)."""
    command_prefix: list[str] = Field(default_factory=list)
    """Prepended to the child's command, e.g. [srun, --overlap, -N1, -n1] to run it on an allocation's resources."""
    env: dict[str, str] = Field(default_factory=dict)
    """Set in the child's environment. The child sees no GPU (CUDA_VISIBLE_DEVICES="") unless this names one, e.g.
    {CUDA_VISIBLE_DEVICES: "7"} for a GPU the pretraining does not use."""


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
    next launch). ``RUN_DIR/downstream/queue.json`` (``QUEUE_FILE``) holds, whenever they change, the fine-tunings
    not started yet and the runner processes started (pid and start time, each runner's fine-tunings), so a new
    launch counts an earlier launch's live runners against ``max_running`` and starts what they left."""

    def __init__(self, cfg: EvalConfig, run_dir: str | Path, rank: int, say=print):
        self.cfg, self.run_dir, self.rank, self.say = cfg, Path(run_dir), rank, say
        self.running: list[Runner] = []
        self.queued: list[Job] = []
        self.failures = 0
        """Fine-tunings seen failing by this launcher (``main`` exits non-zero when any did)."""
        if rank == 0:
            self._load_queue()

    @property
    def queue_file(self) -> Path:
        return self.run_dir / "downstream" / QUEUE_FILE

    def _task(self, job) -> DownstreamTask | None:
        return next((t for t in self.cfg.downstream if (t.task, t.data) == (job.task, job.data)), None)

    def _save_queue(self) -> bool:
        """Write the queue and the runners (removed when both are empty), so a launch that ends before starting a
        fine-tuning loses none, and the next launch knows which runners still hold slots. Atomic: a temporary file
        of this process's own (two writers never share one), fsync'd before ``os.replace``, so a crash leaves the old
        file or the new one, never a torn one. A failed write (full disk, permissions) is said, never raised: it runs
        on rank 0 only, and an exception there would kill the pretraining. False then."""
        try:
            if not self.queued and not self.running:
                self.queue_file.unlink(missing_ok=True)
                return True
            state = {"eval": self.cfg.model_dump(mode="json"), "queued": [j.row() for j in self.queued],
                     "running": [r.row() for r in self.running]}
            self.queue_file.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.queue_file, json.dumps(state, indent=1))
            return True
        except OSError as err:
            self.say(f"downstream: could not write {self.queue_file} ({err}); a later launch may not know what this "
                     "one queued or started. Pretraining continues")
            return False

    def _load_queue(self) -> None:
        """What an earlier launch of this run left: its runners still alive keep their slots (polled like ours); a
        fine-tuning of a checkpoint a roll-back moved aside (``checkpoints/abandoned-*/``) is dropped (said, counted);
        the fine-tunings of a runner that died before finishing them (killed with a Slurm job) and those never
        started are queued again (started by the next ``poll``) when ``eval.downstream`` still names the task;
        otherwise said and their copies removed."""
        try:
            state = json.loads(self.queue_file.read_text())
            if isinstance(state, list):  # the first format: the queued rows only
                state = {"queued": state, "running": []}
            runners = [Runner(r["task"], r["data"], [Job.from_row(j) for j in r["jobs"]], int(r["pid"]),
                              r["start"], r["boot_id"]) for r in state.get("running", [])]
            queued = [Job.from_row(row) for row in state.get("queued", [])]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            self._set_aside(err)
            return
        rows = []
        for runner in runners:
            if runner.alive():
                self.running.append(runner)
                self.say(f"downstream: runner pid {runner.pid} of an earlier launch still fine-tunes {runner.task} "
                         f"(steps {[j.step for j in runner.jobs]}); it holds one of eval.max_running's slots")
            else:
                rows += [j for j in runner.jobs if _unfinished(j)]
        rows += queued
        gone = [(j, aside) for j in rows if (aside := abandoned(self.run_dir, j.origin, (j.source or j.copy).name,
                                                                 j.run_id or run_id_of(j.source or j.copy)))]
        for job, aside in gone:  # a roll-back moved their checkpoints aside (before this launcher was made)
            shutil.rmtree(job.copy, ignore_errors=True)
        if gone:
            self.say(f"downstream: dropped {len(gone)} queued fine-tuning(s) of an abandoned lineage ("
                     f"{_listing([j for j, _ in gone])}): a roll-back moved their checkpoints aside ({gone[0][1]}...)")
        for job in (j for j in rows if all(j is not g for g, _ in gone)):
            task = self._task(job)
            why = None
            if task is None:
                why = "eval.downstream no longer names it"
            elif job.source is not None:  # a preemption queued it without a copy: copy it now
                try:
                    job.copy = copy_checkpoint(job.source, job.out)
                    job.source = None
                except OSError as err:
                    why = f"its checkpoint {job.source} cannot be copied ({err})"
            elif not job.copy.is_dir():
                why = "its checkpoint copy is gone"
            if why is None:
                self.queued.append(job)
            else:
                if job.source is None:
                    shutil.rmtree(job.copy, ignore_errors=True)
                self.say(f"downstream: dropped the fine-tuning of {job.task} at step {job.step} queued by an "
                         f"earlier launch: {why}")
        if self.queued:
            self.say(f"downstream: {len(self.queued)} fine-tuning(s) queued by an earlier launch of this run "
                     f"({_listing(self.queued)}): started as eval.max_running allows")
        self._save_queue()

    def _set_aside(self, err: Exception) -> None:
        """queue.json cannot be read or parsed (a torn write, a crash of NFS, an edit by hand): move it to
        ``queue.json.bad-<UTC time>`` and say so, with the copies it may name (hard links under downstream/ that
        hold disk until removed). Dropped silently and then overwritten, they would leak forever."""
        bad = self.queue_file.with_name(f"{QUEUE_FILE}.bad-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        try:
            os.replace(self.queue_file, bad)
        except OSError as move_err:
            self.say(f"downstream: cannot read {self.queue_file} ({err}) nor move it aside ({move_err}); its "
                     "fine-tunings are not started. Look at it by hand")
            return
        self.say(f"downstream: cannot read {self.queue_file} ({err}); moved it to {bad}. Its fine-tunings are not "
                 f"started; their checkpoint copies under {self.queue_file.parent}/global_step*/ hold disk until "
                 "removed (or rerun them by hand)")

    def due(self, step: int) -> bool:
        return any(step % t.every_steps == 0 for t in self.cfg.downstream)

    def launch(self, step: int, tag_dir: Path, start: bool = True) -> None:
        """Copy ``tag_dir`` for every task due at ``step`` and queue it; with ``start``, start what the slots allow.
        A preempted launch passes False: the queue waits for the next launch, and the copy is hard links only (a
        full copy would eat the scheduler's kill grace period): where links fail, the step is queued referencing
        the checkpoint itself and the next launch copies it."""
        if self.rank != 0:
            return
        for t in self.cfg.downstream:
            if step % t.every_steps == 0:
                run_id = run_id_of(tag_dir)  # in the path: a roll-back's new lineage has a step s of its own
                dest = job_folder(self.run_dir, tag_dir.name, t.task, run_id)
                job = Job(t.task, t.data, step, dest / tag_dir.name, origin=Path(tag_dir), run_id=run_id)
                try:
                    copy_checkpoint(tag_dir, dest, links_only=not start)
                except OSError as err:  # shutil.Error too; on rank 0 only: raised, it would end the pretraining
                    if start:
                        self._failed(job, f"its checkpoint {tag_dir} could not be copied to {dest} ({err})")
                        continue
                    job.source = Path(tag_dir)
                self.queued.append(job)
        self._save_queue()
        if start:
            self.poll()

    def _command(self, t: DownstreamTask, step: int, copy: Path) -> list[str]:
        out = copy.parent
        cmd = [*self.cfg.command_prefix, sys.executable, "-m", "trainer.finetune", "--checkpoint", str(copy),
               "--task", t.task, "--data", t.data, "--set", f"run_dir={out}",
               "--report-run", str(self.run_dir), "--report-step", str(step), "--cleanup"]
        if t.seeds is not None:  # else train.seeds of set / config stands (--seeds would override it)
            cmd += ["--seeds", str(t.seeds)]
        if t.config:
            cmd += ["--config", t.config]
        for s in t.set:
            cmd += ["--set", s]
        for s in t.sweep:
            cmd += ["--sweep", s]
        return cmd

    def _start(self, t: DownstreamTask, jobs: list[Job], wait: list[Runner] = ()) -> Runner | None:
        """Start a runner for ``jobs`` (one after another, after the runners ``wait``); None if it cannot start. A
        fine-tuning whose program does not exist (a wrong ``eval.command_prefix``) is failed here and now."""
        runnable = []
        for job in jobs:
            cmd = self._command(t, job.step, job.copy)
            if shutil.which(cmd[0]) is None:
                self._cannot_start(job, cmd, f"could not start {cmd[0]!r}: no such program")
            else:
                runnable.append({"task": job.task, "step": job.step, "copy": str(job.copy), "cmd": cmd,
                                 "origin": str(job.origin) if job.origin else None, "run_id": job.run_id})
        jobs = [j for j in jobs if any(r["step"] == j.step for r in runnable)]
        if not jobs:
            return None
        spec = {"run_dir": str(self.run_dir), "poll_s": CHAIN_POLL_S, "jobs": runnable,
                "wait": [[r.pid, r.start, r.boot_id] for r in wait]}
        for job in jobs:  # a stale exit file from a killed earlier try must not read as this try's
            try:
                (job.out / EXIT_FILE).unlink(missing_ok=True)
            except OSError:
                pass
        try:
            proc = subprocess.Popen([sys.executable, "-m", "trainer.finetune.downstream", "--runner", json.dumps(spec)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=child_env(self.cfg.env), start_new_session=True, cwd=os.getcwd())
        except OSError as err:
            for job in jobs:
                self._cannot_start(job, runnable[0]["cmd"], f"could not start the runner {sys.executable}: {err}")
            return None
        runner = Runner(t.task, t.data, jobs, proc.pid, process_start(proc.pid), _boot_id(), proc)
        self.running.append(runner)
        return runner

    def poll(self) -> None:
        """Say what ended (never blocks) and start what the slots allow."""
        if self.rank != 0:
            return
        changed = self._reap()
        waiting = []
        for job in self.queued:
            t = self._task(job)
            if job.source is None and \
                    sum(1 for r in self.running if (r.task, r.data) == (job.task, job.data)) < self.cfg.max_running:
                if self._start(t, [job]) is not None:
                    self.say(f"downstream: fine-tuning {t.task} on the step-{job.step} checkpoint (pid "
                             f"{self.running[-1].pid}, log {job.out / 'finetune.log'})")
            else:  # full slots, or not copied yet (a preemption: the next launch copies it)
                waiting.append(job)
        if changed or len(waiting) != len(self.queued):
            self.queued = waiting
            self._save_queue()

    def _reap(self) -> bool:
        """Say what the runners that ended did; whether any ended."""
        still = []
        for runner in self.running:
            if runner.alive():
                still.append(runner)
                continue
            for job in runner.jobs:  # the runner recorded each failure in metrics.jsonl; the child its score
                code = _exit_code(job)
                if code == 0:
                    self.say(f"downstream: {job.task} at step {job.step}: {read_score(job)}")
                elif code is not None:
                    self.failures += 1
                    self.say(f"downstream: fine-tuning {job.task} at step {job.step} failed (exit {code}; "
                             f"{removed_copy(job.out, job.origin)}); pretraining continues")
                elif _unfinished(job):  # removed from queue.json: nothing runs it again
                    shutil.rmtree(job.copy, ignore_errors=True)
                    self._failed(job, f"its runner (pid {runner.pid}) ended before it finished; "
                                      f"{removed_copy(job.out, job.origin)}")
        changed = len(still) != len(self.running)
        self.running = still
        return changed

    def _cannot_start(self, job: Job, cmd: list[str], reason: str) -> None:
        try:  # the folder says what happened too
            (job.out / "finetune.log").write_text(f"{reason}\ncommand: {' '.join(cmd)}\n")
        except OSError:
            pass
        shutil.rmtree(job.copy, ignore_errors=True)  # no child will read it
        self._failed(job, f"{reason}; {removed_copy(job.out, job.origin)}")

    def _failed(self, job: Job, reason: str) -> None:
        """Say that a fine-tuning failed and why, and append a ``"split": "downstream_failed"`` record with the reason
        to metrics.jsonl (``report``'s one O_APPEND write)."""
        self.failures += 1
        self.say(f"downstream: fine-tuning {job.task} at step {job.step} failed ({reason}); pretraining continues")
        _record_failure(self.run_dir, job.task, job.step, reason, self.say, job.run_id)

    def finish(self) -> None:
        """End of the pretraining: start what is still queued, never waiting for children and keeping
        ``max_running`` per task, counting the runners still alive (this launch's and earlier ones'). The queue is
        split into ``max_running`` runners per task, each running its fine-tunings one after another once the
        runners it replaces in its slot have ended. They are detached (a session of their own) and outlive the
        trainer; under Slurm they end with the job (README, docs/cluster_operations.md)."""
        if self.rank != 0:
            return
        self.poll()
        for t in self.cfg.downstream:
            mine = [j for j in self.queued if (j.task, j.data) == (t.task, t.data)]
            if not mine:
                continue
            busy = [r for r in self.running if (r.task, r.data) == (t.task, t.data)]
            slots = self.cfg.max_running
            for k in range(slots):
                chain, wait = mine[k::slots], busy[k::slots]
                if not chain:
                    continue
                runner = self._start(t, chain, wait)
                if runner is not None:
                    after = f" after pid(s) {[r.pid for r in wait]}" if wait else ""
                    self.say(f"downstream: fine-tuning {t.task} on the checkpoints of steps "
                             f"{[j.step for j in runner.jobs]} one after another{after} (pid {runner.pid}; logs "
                             f"{runner.jobs[0].out / 'finetune.log'} ...)")
        self.queued = []
        self._save_queue()
        if self.running and os.environ.get("SLURM_JOB_ID"):
            self.say(f"downstream: under Slurm these runners most likely die when this job step ends (proctrack/cgroup "
                     f"kills what is left in the step when the trainer exits); `python -m trainer.finetune.downstream "
                     f"{self.run_dir}` is what finishes them: the slurm/ templates run it in the batch script after a "
                     "completed training (elsewhere: in your job script, or a job of its own). It waits for runners "
                     "still alive and runs again what a killed runner left")

    def suspend(self) -> None:
        """The launch ends before the run is complete (train.stop_at_step, preemption): what is queued stays in
        ``queue.json`` for the next launch of the run, which starts it; said, with the steps."""
        if self.rank != 0:
            return
        self._reap()  # starts nothing: the launch ends
        self._save_queue()
        if self.queued:
            self.say(f"downstream: {len(self.queued)} fine-tuning(s) not started ({_listing(self.queued)}) wait in "
                     f"{self.queue_file}; the next launch of this run (--resume auto) starts them")

    def wait(self, trouble=lambda: None) -> int:
        """Start what is queued as slots free up and return when nothing runs or waits (``python -m
        trainer.finetune.downstream RUN_DIR``), or when ``trouble()`` names a reason to stop (the run lock lost):
        the number of fine-tunings seen failing, or -1 when stopped early."""
        while True:
            self.poll()
            if not self.queued and not self.running:
                return self.failures
            why = trouble()
            if why:
                self.say(f"downstream: stopped waiting: {why}")
                return -1
            time.sleep(CHAIN_POLL_S)


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.finetune.downstream RUN_DIR``: run, in the foreground, what the run's queue.json holds
    (queued fine-tunings, those of runners killed before finishing them), ``max_running`` per task as the
    pretraining saved it, waiting for runners still alive; for the end of a Slurm job, whose detached runners die
    with it. Not while a launch of the run is alive (both would start the queue)."""
    import argparse  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m trainer.finetune.downstream", description=main.__doc__)
    p.add_argument("run_dir", nargs="?", type=Path, metavar="RUN_DIR",
                   help="the pretraining run's folder (required; optional only for the internal --runner form)")
    p.add_argument("--runner", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.runner is not None:
        return run_chain(json.loads(args.runner))
    if args.run_dir is None:
        p.error("RUN_DIR is required")
    queue = args.run_dir / "downstream" / QUEUE_FILE
    if not queue.exists():
        print(f"downstream: {queue} does not exist: nothing waits")
        return 0
    from trainer.run_lock import RunLock, RunLockedError  # noqa: PLC0415  (standard library only)

    lock = RunLock(args.run_dir)  # the launch's own lock: one of us starts the queue, never both
    try:
        lock.acquire()
    except RunLockedError as err:
        print(f"downstream: not run: a launch of this run (or another `python -m trainer.finetune.downstream`) "
              f"holds it and starts its queue itself. {err}", file=sys.stderr)
        return 2
    try:
        try:
            cfg = EvalConfig(**json.loads(queue.read_text())["eval"])
        except FileNotFoundError:
            print(f"downstream: {queue} does not exist: nothing waits")
            return 0
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"downstream: cannot read {queue}: {err}", file=sys.stderr)
            return 1
        failures = DownstreamLauncher(cfg, args.run_dir, 0).wait(lambda: lock.trouble)
        if failures:
            print(f"downstream: {'stopped early' if failures < 0 else f'{failures} fine-tuning(s) failed'} (see "
                  f"{args.run_dir / 'metrics.jsonl'}, split downstream_failed)", file=sys.stderr)
        return 1 if failures else 0
    finally:
        lock.release()


def _listing(queued: list[Job]) -> str:
    return ", ".join(f"{j.task} at step {j.step}" for j in queued)


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    sys.exit(main())
