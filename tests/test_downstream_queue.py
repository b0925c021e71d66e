"""The downstream fine-tuning queue and its runners with stand-in checkpoints and children
(trainer/finetune/downstream.py, downstream_runner.py): what outlives a launch, what runs again, what is recorded when
a child, a copy or the queue fails. The real fine-tunings during pretraining are in tests/test_finetune_downstream.py."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from test_finetune_downstream import _kill_runners

REPO = Path(__file__).resolve().parents[1]


def _fake_checkpoint(root: Path, step: int) -> Path:
    tag = root / "checkpoints" / f"global_step{step}"
    tag.mkdir(parents=True)
    (tag / "bertfamily.json").write_text("{}")
    return tag


def test_a_child_that_cannot_start_is_reported_and_pretraining_goes_on(tmp_path):
    """eval.command_prefix naming no program (a typo: srunn): Popen raised FileNotFoundError out of the loop and
    killed the pretraining. It is said, recorded with the reason in metrics.jsonl, and its copy removed."""
    from trainer.finetune.downstream import DownstreamLauncher, EvalConfig

    cfg = EvalConfig(downstream=[{"task": "rte", "data": str(tmp_path / "rte"), "every_steps": 10}],
                     command_prefix=["srunn-no-such-program", "--overlap"])
    said = []
    launcher = DownstreamLauncher(cfg, tmp_path, 0, say=said.append)
    launcher.launch(10, _fake_checkpoint(tmp_path, 10))
    launcher.finish()
    assert not launcher.running and any("failed" in s and "srunn-no-such-program" in s for s in said), said
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert rec["split"] == "downstream_failed" and rec["step"] == 10 and "srunn-no-such-program" in rec["error"]
    assert not (tmp_path / "downstream" / "global_step10" / "rte" / "global_step10").exists()
    assert "srunn-no-such-program" in (tmp_path / "downstream" / "global_step10" / "rte" / "finetune.log").read_text()


def _fake_children(tmp_path: Path, max_running: int):
    """A launcher whose children are `sh` recording start and end of each fine-tuning (no interpreter start). A child
    runs until the test creates ``tmp_path / "gate"`` (``_open_gate``; at most 60 s, so a failed test leaves no
    child behind for long): "still running" never depends on how fast the machine is."""
    from trainer.finetune.downstream import DownstreamLauncher, EvalConfig

    log, gate = tmp_path / "children.log", tmp_path / "gate"
    child = (f'echo "start $*" >> {log}; i=0; while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; '
             f'i=$((i+1)); done; echo "end $*" >> {log}')
    cfg = EvalConfig(downstream=[{"task": "rte", "data": str(tmp_path / "rte"), "every_steps": 10}],
                     max_running=max_running, command_prefix=["sh", "-c", child, "child"])
    said = []
    return (lambda: DownstreamLauncher(cfg, tmp_path, 0, say=said.append)), log, said


def _open_gate(tmp_path: Path) -> None:
    (tmp_path / "gate").write_text("")


def _events(log: Path, count: int) -> list[tuple[str, int]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= count:
            break
        time.sleep(0.1)
    return [(line.split()[0], int(line.split("--report-step ")[1].split()[0])) for line in lines]


def _queue(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "downstream" / "queue.json").read_text())


def test_queued_fine_tunings_outlive_a_stopped_launch_and_keep_max_running(tmp_path, monkeypatch):
    """Issue: a launch ended by train.stop_at_step or preemption dropped its queue (in memory only) and left the
    copies behind; at the end of a run finish() started every queued child at once, ignoring eval.max_running. The
    queue is kept in RUN_DIR/downstream/queue.json and started by the next launch; finish() runs the rest one
    after another per slot, after the slot's running child. Review: the next launch counted only its own
    children, so the earlier launch's child still running and the new one ran at once (2 x max_running); the
    runners' pids and start times in queue.json now hold the slot across launches."""
    monkeypatch.setattr("trainer.finetune.downstream.CHAIN_POLL_S", 0.1)
    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    first = new_launcher()
    for step in (10, 20):
        first.launch(step, _fake_checkpoint(tmp_path, step))
    first.suspend()  # the launch stops (train.stop_at_step): step 20 is not started, but kept and said
    queue = _queue(tmp_path)
    assert [row["step"] for row in queue["queued"]] == [20] and any("queue.json" in s for s in said), said
    assert [[j["step"] for j in r["jobs"]] for r in queue["running"]] == [[10]]
    second = new_launcher()  # the next launch of the run, while step 10's child still runs
    second.poll()
    assert [job.step for job in second.queued] == [20]  # the slot is the first launch's runner's
    for step in (30, 40):
        second.launch(step, _fake_checkpoint(tmp_path, step))
    second.finish()  # 10 running, 20, 30 and 40 queued: one slot, so they start after 10, one at a time
    assert _queue(tmp_path)["queued"] == []
    _open_gate(tmp_path)  # step 10's child ran until now (review: a sleep 0.4 child assumed still running)
    events = _events(log, 8)
    assert events == [("start", 10), ("end", 10), ("start", 20), ("end", 20), ("start", 30), ("end", 30),
                      ("start", 40), ("end", 40)], events


def test_a_runner_waits_for_its_process_not_for_a_reused_pid(tmp_path):
    """Review: a chain waited on a bare /proc/PID, which after the trainer's exit may name an unrelated process that
    reused the pid (then it waited on it, possibly forever). A process is its pid and its start time (field 22 of
    /proc/PID/stat): the live pid with another start time is not waited for; the right one is, until it ends."""
    from trainer.finetune.downstream import EXIT_FILE, _boot_id, alive, process_start, run_chain

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start(sleeper.pid)
        assert alive(sleeper.pid, start) and not alive(sleeper.pid, start - 1)
        out = tmp_path / "global_step10" / "rte"
        out.mkdir(parents=True)
        state = f"awk '{{print $3}}' /proc/{sleeper.pid}/stat"  # R/S while it runs, Z once it ended (unreaped)
        job = {"task": "rte", "step": 10, "copy": str(out / "global_step10"),
               "cmd": ["sh", "-c", f'test "$({state})" != Z']}  # exit 0: the sleeper still ran when the job began
        # the pid lives, but started at another time: another process, not waited for
        run_chain({"run_dir": str(tmp_path), "poll_s": 0.05, "jobs": [job],
                   "wait": [[sleeper.pid, start - 1, _boot_id()]]})
        assert (out / EXIT_FILE).read_text().strip() == "0"  # the job ran while the sleeper lived
        assert sleeper.poll() is None  # and run_chain returned without waiting for the 30 s sleeper
        job["cmd"] = ["sh", "-c", f'test "$({state})" = Z']  # exit 0: the sleeper had ended when the job began
        subprocess.Popen(["sh", "-c", f"sleep 1; kill {sleeper.pid}"])
        run_chain({"run_dir": str(tmp_path), "poll_s": 0.05, "jobs": [job],
                   "wait": [[sleeper.pid, start, _boot_id()]]})
        assert (out / EXIT_FILE).read_text().strip() == "0"  # the job started only after the sleeper ended
        assert sleeper.poll() is not None  # waited for it to end (a zombie until now)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_failures_after_the_trainer_exits_are_recorded(tmp_path, monkeypatch):
    """Review: children still running when the run completed, and those of the chains started then, were never
    polled: a failure left no "downstream_failed" record. The runner that starts a child (which outlives the
    trainer) records it; the child records its score itself."""
    from trainer.finetune.downstream import EvalConfig

    monkeypatch.setattr("trainer.finetune.downstream.CHAIN_POLL_S", 0.1)
    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    launcher = new_launcher()
    launcher.cfg = EvalConfig(**{**launcher.cfg.model_dump(), "command_prefix": [
        "sh", "-c", f'echo "start $*" >> {log}; sleep 0.3; echo "end $*" >> {log}; exit 3', "child"]})
    for step in (10, 20):
        launcher.launch(step, _fake_checkpoint(tmp_path, step))
    launcher.finish()  # the trainer exits: nobody polls step 10's child nor the chain that runs step 20
    del launcher
    deadline, failed = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(failed) < 2:
        time.sleep(0.1)
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines() if (tmp_path / "metrics.jsonl").exists() else []
        failed = [json.loads(x) for x in lines if '"downstream_failed"' in x]
    assert sorted(r["step"] for r in failed) == [10, 20] and all("exit 3" in r["error"] for r in failed), failed


def test_a_killed_runner_s_fine_tunings_run_again(tmp_path, monkeypatch):
    """Review: under Slurm the detached runners die with the job when its script ends. What a killed runner did
    not finish is queued again: `python -m trainer.finetune.downstream RUN_DIR` (or the next launch) runs it, in
    the foreground, waiting for the end."""
    import signal

    from trainer.finetune.downstream import main

    monkeypatch.setattr("trainer.finetune.downstream.CHAIN_POLL_S", 0.1)
    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    launcher = new_launcher()
    launcher.launch(10, _fake_checkpoint(tmp_path, 10))
    launcher.finish()
    assert _events(log, 1) == [("start", 10)]  # the child blocks on the gate until killed
    os.killpg(launcher.running[0].pid, signal.SIGKILL)  # the job's end kills the runner and its child
    launcher.running[0].proc.wait()
    _open_gate(tmp_path)  # the fine-tuning run again ends at once
    assert main([str(tmp_path)]) == 0
    assert _events(log, 3) == [("start", 10), ("start", 10), ("end", 10)]
    assert not (tmp_path / "downstream" / "queue.json").exists()


def test_a_preemption_makes_no_full_copy(tmp_path, monkeypatch):
    """Review: at preemption a due step's copy fell back to a full copy where hard links fail, during the kill
    grace period. It is queued referencing the checkpoint itself, and the next launch copies it."""
    import shutil

    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    launcher = new_launcher()

    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")

    def no_copy(*args, **kwargs):
        raise AssertionError("a full copy during the preemption's grace period")

    tag = _fake_checkpoint(tmp_path, 10)
    with monkeypatch.context() as m:
        m.setattr(os, "link", no_link)
        m.setattr(shutil, "copy2", no_copy)
        launcher.launch(10, tag, start=False)
        launcher.suspend()
    copy = tmp_path / "downstream" / "global_step10" / "rte" / "global_step10"
    assert not copy.exists() and [r["source"] for r in _queue(tmp_path)["queued"]] == [str(tag)]
    second = new_launcher()  # the next launch copies it, then starts it
    assert (copy / "bertfamily.json").exists() and [(j.copy, j.source) for j in second.queued] == [(copy, None)]


def test_the_foreground_command_is_refused_while_a_launch_holds_the_run(tmp_path, capsys):
    """Review: `python -m trainer.finetune.downstream RUN_DIR` beside a live launch (or twice) started the queue twice
    (fine-tunings run twice, max_running broken, both rewriting queue.json). It takes the run's own lock
    (trainer/run_lock.py) and is refused while a launch holds it; queue.json is left as it was."""
    from trainer.finetune.downstream import main
    from trainer.run_lock import RunLock

    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    new_launcher().launch(10, _fake_checkpoint(tmp_path, 10), start=False)
    before = (tmp_path / "downstream" / "queue.json").read_text()
    with RunLock(tmp_path, interval_s=0.1):  # a live launch: its heartbeat moves
        assert main([str(tmp_path)]) == 2
    assert "holds it" in capsys.readouterr().err
    assert (tmp_path / "downstream" / "queue.json").read_text() == before and not log.exists()
    assert not (tmp_path / "run.lock").exists()


def test_a_failed_checkpoint_copy_is_recorded_and_pretraining_goes_on(tmp_path, monkeypatch):
    """Review: hard link failing, then the full copy failing too (ENOSPC) raised out of launch() on rank 0 only and
    killed the pretraining. It is a failed fine-tuning (said, recorded in metrics.jsonl); a failed queue.json write
    is said, not raised; the next due step still runs."""
    import shutil

    from trainer.finetune import downstream

    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    launcher = new_launcher()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    tag = _fake_checkpoint(tmp_path, 10)
    with monkeypatch.context() as m:
        m.setattr(os, "link", full)
        m.setattr(shutil, "copy2", full)
        launcher.launch(10, tag)
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert rec["split"] == "downstream_failed" and rec["step"] == 10 and "No space left" in rec["error"], rec
    assert not launcher.queued and not launcher.running and launcher.failures == 1
    with monkeypatch.context() as m:
        m.setattr(downstream, "_write_atomic", full)
        launcher.launch(20, _fake_checkpoint(tmp_path, 20), start=False)  # queue.json cannot be written
    assert any("could not write" in s and "queue.json" in s for s in said), said
    assert [j.step for j in launcher.queued] == [20]


def test_an_unreadable_queue_is_set_aside_not_dropped(tmp_path):
    """Review: a queue.json that could not be parsed was dropped (then overwritten), and the copies it named leaked
    disk with nothing left to find them. It is moved to queue.json.bad-<UTC time> and said; the next write goes
    through a temporary name of its own (no shared queue.tmp)."""
    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    new_launcher().launch(10, _fake_checkpoint(tmp_path, 10), start=False)
    queue = tmp_path / "downstream" / "queue.json"
    torn = queue.read_text()[:40]
    queue.write_text(torn)
    second = new_launcher()
    (bad,) = (tmp_path / "downstream").glob("queue.json.bad-*")
    assert bad.read_text() == torn and any(str(bad) in s for s in said), said
    assert not second.queued and not queue.exists()
    second.launch(20, _fake_checkpoint(tmp_path, 20), start=False)
    assert [r["step"] for r in _queue(tmp_path)["queued"]] == [20]
    assert sorted(p.name for p in (tmp_path / "downstream").iterdir() if p.is_file()) == ["queue.json", bad.name]


def test_the_foreground_command_fails_when_a_fine_tuning_failed(tmp_path, monkeypatch):
    """Review: wait() and main() exited 0 whatever happened. A failed fine-tuning makes main() exit 1."""
    from trainer.finetune.downstream import EvalConfig, main

    monkeypatch.setattr("trainer.finetune.downstream.CHAIN_POLL_S", 0.05)
    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    launcher = new_launcher()
    launcher.cfg = EvalConfig(**{**launcher.cfg.model_dump(), "command_prefix": ["sh", "-c", "exit 3", "child"]})
    launcher.launch(10, _fake_checkpoint(tmp_path, 10), start=False)
    launcher.suspend()
    assert main([str(tmp_path)]) == 1
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert rec["split"] == "downstream_failed" and "exit 3" in rec["error"]


def test_the_slurm_job_runs_what_a_completed_training_left(tmp_path):
    """Review: under Slurm with proctrack/cgroup the runners the trainer starts at its end die with its job step. The
    batch script (slurm/common.sh bf_finish -> bf_downstream) runs `python -m trainer.finetune.downstream RUN_DIR`
    after a completed training, once per run folder, only where queue.json shows something left."""
    left, done = tmp_path / "run a", tmp_path / "run b"
    (left / "downstream").mkdir(parents=True)
    (left / "downstream" / "queue.json").write_text("{}")
    done.mkdir()
    script = f"""
        set -uo pipefail
        source {REPO / 'slurm' / 'common.sh'}
        python() {{ echo "python $*" >> {tmp_path / 'calls'}; }}
        bf_run_status() {{ echo completed; }}
        bf_latest_checkpoint() {{ echo none; }}
        BF_RC=0 BF_SIGNAL="" BF_DONE_RUN_DIRS=()
        for BF_RUN_DIR in "{left}" "{done}" "{left}"; do bf_check_launch; done
        bf_downstream
    """
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "calls").read_text().splitlines() == [f"python -m trainer.finetune.downstream {left}"]


def test_the_slow_test_s_teardown_kills_the_runners_left(tmp_path):
    """The teardown of test_downstream_scores_during_pretraining (``_kill_runners``) ends the runners queue.json
    names, children included, so a failed run of it leaves no fine-tuning behind."""
    new_launcher, log, said = _fake_children(tmp_path, max_running=1)
    launcher = new_launcher()
    launcher.launch(10, _fake_checkpoint(tmp_path, 10))
    launcher.finish()
    assert _events(log, 1) == [("start", 10)]  # blocked on the gate, never opened
    runner = launcher.running[0]
    assert _kill_runners(tmp_path) == [runner.pid]
    assert runner.proc.wait(timeout=10) == -9 and not runner.alive()


def test_a_preemption_checkpoint_saved_during_a_nan_streak_is_not_fine_tuned(tmp_path):
    """Review: the preemption path queued the due step's checkpoint for fine-tuning even when it was saved during a
    NaN/Inf streak (the launch-ending save is let through): spoiled weights scored as the run's. Said and skipped."""
    from types import SimpleNamespace

    from trainer.loop import Trainer

    launched, said = [], []
    downstream = SimpleNamespace(due=lambda step: step % 10 == 0,
                                 launch=lambda step, saved, start: launched.append((step, saved, start)))
    fake = SimpleNamespace(state=SimpleNamespace(step=10), nonfinite_streak=2, downstream=downstream,
                           metrics=SimpleNamespace(message=said.append))
    Trainer._downstream_at_preemption(fake, tmp_path / "global_step10")
    assert launched == [] and "NaN/Inf streak of 2" in said[0], said
    fake.nonfinite_streak = 0
    Trainer._downstream_at_preemption(fake, tmp_path / "global_step10")
    assert launched == [(10, tmp_path / "global_step10", False)]
