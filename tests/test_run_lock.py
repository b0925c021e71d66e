"""One launch per run folder (trainer/run_lock.py): a live holder refuses a second launch, a stale lock is taken
over, a requeue of the same Slurm job waits for its old processes instead of failing or hanging; and real launches
of trainer/pretrain.py (the stand-in components of test_trainer_standin.py) behave so."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainer.run_lock import LOCK_NAME, RunLock, RunLockedError

REPO = Path(__file__).resolve().parents[1]


def _foreign_lock(run_dir: Path, heartbeat_age: float, host: str = "node-elsewhere", pid: int = 4242,
                  job: str | None = "77") -> dict:
    info = {"host": host, "pid": pid, "slurm_job_id": job, "token": "theirs", "started": time.time() - 3600,
            "heartbeat": time.time() - heartbeat_age}
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{LOCK_NAME}.writing"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, run_dir / LOCK_NAME)  # atomically, as a live holder's heartbeat does
    return info


def test_live_lock_refuses_a_second_holder_and_is_released(tmp_path):
    first = RunLock(tmp_path, stale_s=30).acquire()
    held = json.loads((tmp_path / LOCK_NAME).read_text())
    assert held["host"] == socket.gethostname() and held["pid"] == os.getpid()
    with pytest.raises(RunLockedError, match=rf"in use by a live launch \(host {socket.gethostname()}, "
                                             rf"pid {os.getpid()}, Slurm job"):
        RunLock(tmp_path, stale_s=30).acquire()
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    RunLock(tmp_path, stale_s=30).acquire().release()  # free again


def test_heartbeat_keeps_the_lock_fresh(tmp_path):
    lock = RunLock(tmp_path, stale_s=1.0, interval_s=0.1).acquire()
    try:
        beats = set()
        deadline = time.time() + 30
        while len(beats) < 3 and time.time() < deadline:
            beats.add(json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"])
            time.sleep(0.05)
        assert len(beats) >= 3
        # older than stale_s since the holder started, yet never stale: the heartbeat is what counts
        time.sleep(1.2)
        with pytest.raises(RunLockedError):
            RunLock(tmp_path, stale_s=1.0, interval_s=0.1).acquire()
    finally:
        lock.release()


def test_stale_locks_are_taken_over_with_a_warning(tmp_path, capsys):
    # another host, heartbeat older than stale_s
    _foreign_lock(tmp_path / "a", heartbeat_age=100)
    lock = RunLock(tmp_path / "a", stale_s=60).acquire()
    assert json.loads((tmp_path / "a" / LOCK_NAME).read_text())["token"] == lock.info["token"]
    lock.release()
    err = capsys.readouterr().err
    assert "taking over the stale lock" in err and "last heartbeat 100 s ago" in err and "node-elsewhere" in err
    # this host, fresh heartbeat, but its process is gone (a kill -9 on this node)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _foreign_lock(tmp_path / "b", heartbeat_age=0, host=socket.gethostname(), pid=dead.pid)
    RunLock(tmp_path / "b", stale_s=60).acquire().release()
    assert f"its process {dead.pid} on this host is gone" in capsys.readouterr().err
    # a fresh lock of a live process elsewhere is not stale
    _foreign_lock(tmp_path / "c", heartbeat_age=5)
    with pytest.raises(RunLockedError, match="host node-elsewhere, pid 4242, Slurm job 77"):
        RunLock(tmp_path / "c", stale_s=60).acquire()
    assert json.loads((tmp_path / "c" / LOCK_NAME).read_text())["token"] == "theirs"  # left as it was


def test_requeued_slurm_job_waits_for_its_old_launch_then_gives_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    # the old launch of job 77 exits 0.5 s later: the requeue waits and then holds the folder
    _foreign_lock(tmp_path / "a", heartbeat_age=0)
    threading.Timer(0.5, (tmp_path / "a" / LOCK_NAME).unlink).start()
    lock = RunLock(tmp_path / "a", stale_s=5, interval_s=0.1).acquire()
    assert json.loads((tmp_path / "a" / LOCK_NAME).read_text())["token"] == lock.info["token"]
    lock.release()
    assert "still held by an earlier launch of this Slurm job" in capsys.readouterr().err
    # an old launch that keeps beating: refused after 2 * stale_s, never a hang
    stop = threading.Event()

    def beat():
        while not stop.wait(0.1):
            _foreign_lock(tmp_path / "b", heartbeat_age=0)

    _foreign_lock(tmp_path / "b", heartbeat_age=0)
    beater = threading.Thread(target=beat)
    beater.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(RunLockedError, match="Slurm job 77"):
            RunLock(tmp_path / "b", stale_s=0.5, interval_s=0.1).acquire()
        assert time.monotonic() - t0 >= 1.0
    finally:
        stop.set()
        beater.join()


def test_an_unreadable_lock_is_waited_on_until_stale(tmp_path, capsys):
    (tmp_path / LOCK_NAME).write_text("")  # as if caught half-written
    t0 = time.monotonic()
    RunLock(tmp_path, stale_s=1.0, interval_s=0.1).acquire().release()
    assert time.monotonic() - t0 >= 0.9
    assert "unreadable lock file" in capsys.readouterr().err


def test_a_holder_that_lost_its_lock_leaves_the_new_one_alone(tmp_path, capsys):
    lock = RunLock(tmp_path, stale_s=60, interval_s=0.1).acquire()
    _foreign_lock(tmp_path, heartbeat_age=0)  # as if a launch took over after this one stalled
    time.sleep(0.5)
    lock.release()
    assert lock.lost and "was taken over by another launch" in capsys.readouterr().err
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == "theirs"


@pytest.mark.slow
@pytest.mark.multiproc
def test_second_launch_is_refused_while_the_first_lives_and_takes_over_after_kill(tmp_path):
    from test_trainer_multiproc import command, make_config

    env = dict(os.environ, OMP_NUM_THREADS="1")
    endless = make_config(tmp_path, "run", train={"steps": 1_000_000, "global_batch_size": 8, "micro_batch_size": 2,
                                                  "eval_every": 0, "eval_batches": 2},
                          checkpoint={"every_steps": 0, "keep_last": 2, "save_at_end": False})
    run_dir = tmp_path / "run"
    first = subprocess.Popen(command(endless, 1), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (run_dir / "metrics.jsonl").exists():  # the first launch is training
            assert first.poll() is None and time.time() < deadline, "the first launch did not start training"
            time.sleep(0.5)
        second = subprocess.run(command(endless, 1), cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=240)
        assert first.poll() is None  # the refusal happened while the first one lived
        assert second.returncode == 1, second.stderr[-3000:]
        assert f"in use by a live launch (host {socket.gethostname()}, pid {first.pid}" in second.stderr
        status = json.loads((run_dir / "status.json").read_text())
        assert status["status"] == "running"  # the refused launch wrote nothing into the folder
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (run_dir / LOCK_NAME).exists()  # kill -9: no chance to release
    short = make_config(tmp_path, "run", train={"steps": 2, "global_batch_size": 8, "micro_batch_size": 2,
                                                "eval_every": 0, "eval_batches": 2})
    third = subprocess.run(command(short, 1, "--resume", "none"), cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=240)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "taking over the stale lock" in third.stderr and f"its process {first.pid} on this host is gone" \
        in third.stderr
    assert not (run_dir / LOCK_NAME).exists()  # released at exit


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_run_whose_lock_is_taken_over_stops_on_every_rank_and_writes_nothing_more(tmp_path):
    """A live run whose lock another launch took over (as after a stall longer than checkpoint.lock_stale_s): both
    ranks stop at the next step with a clear error and exit 1, leave the new holder's lock alone, and write no
    status, checkpoint or metrics after the takeover is seen."""
    from test_trainer_multiproc import command, make_config

    config = make_config(tmp_path, "run", train={"steps": 1_000_000, "global_batch_size": 8, "micro_batch_size": 2,
                                                 "eval_every": 0, "eval_batches": 2},
                         checkpoint={"every_steps": 0, "keep_last": 2, "save_at_end": True, "lock_stale_s": 3})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(command(config, 2), cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not (run_dir / "metrics.jsonl").exists():
            assert proc.poll() is None and time.time() < deadline, "the run did not start training"
            time.sleep(0.2)
        _foreign_lock(run_dir, heartbeat_age=0)  # another launch's lock, as a takeover leaves it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "was taken over by another launch (host node-elsewhere, pid 4242, Slurm job 77" in err
    assert "another launch took over the run folder" in err and "writes nothing more" in err
    # rank 1 stopped on the all-reduced flag itself: a rank that crashed (rank 0 gone from a collective) would say
    # "rank 1: training failed" with its traceback
    assert "training failed" not in err, err[-3000:]
    assert json.loads((run_dir / LOCK_NAME).read_text())["token"] == "theirs"  # the new holder's lock stays
    assert json.loads((run_dir / "status.json").read_text())["status"] == "running"  # no status written after
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())  # save_at_end
