"""One launch per run folder (trainer/run_lock.py): a live holder refuses a second launch, a stale lock is taken
over, a requeue of the same Slurm job waits for its old processes instead of failing or hanging; and real launches
of trainer/pretrain.py (the stand-in components of test_trainer_standin.py) behave so."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import fork_server
import pytest

from trainer.run_lock import LOCK_NAME, RunLock, RunLockedError, RunLockLostError

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
    lock = RunLock(tmp_path, stale_s=2.0, interval_s=0.1).acquire()
    try:
        beats = set()
        hb = tmp_path / f"{LOCK_NAME}.{lock.token}.hb"
        lock_bytes = (tmp_path / LOCK_NAME).read_bytes()
        deadline = time.time() + 30
        while len(beats) < 3 and time.time() < deadline:
            beats.add(json.loads(hb.read_text())["beat"])
            time.sleep(0.05)
        assert len(beats) >= 3
        assert (tmp_path / LOCK_NAME).read_bytes() == lock_bytes  # the holder never rewrites the shared lock
        # older than stale_s since the holder started, yet never stale: the heartbeat is what counts
        time.sleep(2.2)
        with pytest.raises(RunLockedError, match="its heartbeat is moving"):
            RunLock(tmp_path, stale_s=2.0, interval_s=0.1).acquire()
    finally:
        lock.release()
    assert not list(tmp_path.iterdir())  # lock and heartbeat file gone


def test_stale_locks_are_taken_over_with_a_warning(tmp_path, capsys):
    # another host, a heartbeat that does not move while the contender watches for stale_s
    _foreign_lock(tmp_path / "a", heartbeat_age=0)
    lock = RunLock(tmp_path / "a", stale_s=1, interval_s=0.1).acquire()
    assert json.loads((tmp_path / "a" / LOCK_NAME).read_text())["token"] == lock.info["token"]
    lock.release()
    err = capsys.readouterr().err
    assert "taking over the stale lock" in err and "node-elsewhere" in err
    # judged on its own watching (past stale_s), not on the heartbeat time in the file, which is fresh
    assert re.search(r"its heartbeat did not change for \d+ s of this launch's watching "
                     r"\(> checkpoint\.lock_stale_s = 1\)", err), err
    # this host, but its process is gone (a kill -9 on this node): at once
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _foreign_lock(tmp_path / "b", heartbeat_age=0, host=socket.gethostname(), pid=dead.pid)
    RunLock(tmp_path / "b", stale_s=60).acquire().release()
    assert f"its process {dead.pid} on this host is gone" in capsys.readouterr().err


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
        with pytest.raises(RunLockedError, match="Slurm job 77"):
            RunLock(tmp_path / "b", stale_s=0.5, interval_s=0.1).acquire()
        # refused after waiting its bound, not at once (a refusal at first sight says no such thing)
        err = capsys.readouterr().err
        assert "still held by an earlier launch of this Slurm job" in err, err
        assert "waiting up to 1 s for it to exit or go stale" in err, err
        assert "taking over" not in err, err  # a moving heartbeat is never stale
    finally:
        stop.set()
        beater.join()


def test_an_unreadable_lock_is_waited_on_until_stale(tmp_path, capsys):  # noqa: D103
    (tmp_path / LOCK_NAME).write_text("")  # as if caught half-written
    RunLock(tmp_path, stale_s=1.0, interval_s=0.1).acquire().release()
    err = capsys.readouterr().err
    # taken over once stale by this launch's watching, not at once as a lock of a dead process would be
    assert re.search(r"its heartbeat did not change for \d+ s of this launch's watching "
                     r"\(> checkpoint\.lock_stale_s = 1\)\); it was held by an unknown launch \(unreadable lock "
                     r"file\)", err), err


def test_a_holder_that_lost_its_lock_leaves_the_new_one_alone(tmp_path, capsys):
    lock = RunLock(tmp_path, stale_s=60, interval_s=0.1).acquire()
    _foreign_lock(tmp_path, heartbeat_age=0)  # as if a launch took over after this one stalled
    deadline = time.monotonic() + 30  # the heartbeat thread notices at its next beat (every 0.1 s)
    while not lock.lost and time.monotonic() < deadline:
        time.sleep(0.05)
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
                          checkpoint={"every_steps": 0, "keep_last": 2, "save_at_end": False},
                          schedule={"kind": "constant", "warmup_steps": 0})  # endless: a decay would end at lr 0
    run_dir = tmp_path / "run"
    first = subprocess.Popen(command(endless, 1), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (run_dir / "metrics.jsonl").exists():  # the first launch is training
            assert first.poll() is None and time.time() < deadline, "the first launch did not start training"
            time.sleep(0.5)
        # the second and third launches are forks of a process that has imported the trainer (tests/fork_server.py):
        # each is its own process with its own pid, which is what the lock compares
        second = fork_server.run(command(endless, 1), cwd=REPO, env=env, timeout=240)
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
    third = fork_server.run(command(short, 1, "--resume", "none"), cwd=REPO, env=env, timeout=240)
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
                         checkpoint={"every_steps": 0, "keep_last": 2, "save_at_end": True, "lock_stale_s": 3},
                         schedule={"kind": "constant", "warmup_steps": 0})  # endless: a decay would end at lr 0
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


# --- issue 21: no clock comparison, the shared file never rewritten, fencing, a dead heartbeat, NFS -----------------

HOLD = """
import sys, time
from pathlib import Path
from trainer.run_lock import RunLock
lock = RunLock(sys.argv[1], stale_s=float(sys.argv[2]), interval_s=0.1).acquire()
print("held", lock.info["token"], flush=True)
while not Path(sys.argv[3]).exists():
    time.sleep(0.05)
lock.release()
"""


def _holder(run_dir: Path, stale_s: float, release: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), str(stale_s), str(release)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    line = proc.stdout.readline()
    assert line.startswith("held"), line
    return proc, line.split()[1]


def test_a_contender_whose_clock_runs_120_s_ahead_refuses_a_live_lock(tmp_path, monkeypatch):
    """Another launch holds the folder and beats; this contender's wall clock runs 120 s ahead (two hosts whose
    clocks disagree). main compared the heartbeat time with its own clock and took the live run over."""
    release = tmp_path / "release"
    holder, token = _holder(tmp_path / "run", 60, release)
    try:
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 120)
        with pytest.raises(RunLockedError, match="in use by a live launch"):
            RunLock(tmp_path / "run", stale_s=60, interval_s=0.1).acquire()
        monkeypatch.undo()
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["token"] == token
    finally:
        release.touch()
        holder.wait(timeout=60)


def test_a_stalled_holder_that_wakes_never_overwrites_the_new_holder(tmp_path, monkeypatch, capsys):
    """The holder's heartbeat thread stalls in the middle of a beat (blocked in its os.replace, as a process stopped
    by the kernel or a hung NFS write); a contender takes the folder over; the holder wakes. main's heartbeat then
    replaced run.lock with its own (two holders); here it writes only its own heartbeat file, sees it lost the
    folder, and its fence refuses every later write."""
    holder = RunLock(tmp_path, stale_s=1, interval_s=0.1).acquire()
    stalled, wake = threading.Event(), threading.Event()
    real_replace = os.replace

    def replace(src, dst):
        if threading.current_thread() is holder._thread and not stalled.is_set():
            stalled.set()
            wake.wait(60)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert stalled.wait(30)
    time.sleep(1.5)  # the stall outlasts stale_s (so that main's contender, reading the time in the file, agrees)
    new = RunLock(tmp_path, stale_s=1, interval_s=0.1).acquire()  # after 1 s more of an unchanged heartbeat
    try:
        wake.set()
        deadline = time.monotonic() + 30
        while not holder.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.lost and holder.trouble == "lost"
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == new.info["token"]
        with pytest.raises(RunLockLostError):
            holder.check()
        holder.release()
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == new.token  # release left it alone
        new.check()  # and the new holder still holds it
    finally:
        new.release()
    assert "was taken over by another launch" in capsys.readouterr().err


CONTEND = """
import sys, time
from pathlib import Path
from trainer.run_lock import RunLock, RunLockedError
sys.stdout.write("ready\\n"); sys.stdout.flush()
while not Path(sys.argv[2]).exists():
    time.sleep(0.01)
try:
    lock = RunLock(sys.argv[1], stale_s=4, interval_s=0.1).acquire()
except RunLockedError:
    print("refused", flush=True)
    sys.exit(0)
print("won", flush=True)
while not Path(sys.argv[3]).exists():
    time.sleep(0.05)
lock.release()
"""


def eight_contenders(tmp_path, prelude: str = "") -> None:
    """Eight processes (``prelude`` run first in each) start watching one stale lock at once: exactly one wins and
    holds it, the others are refused, and nothing is left after the winner releases it."""
    _foreign_lock(tmp_path / "run", heartbeat_age=0)  # another host's lock whose heartbeat never moves
    go, release = tmp_path / "go", tmp_path / "release"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", prelude + CONTEND, str(tmp_path / "run"), str(go),
                               str(release)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(8)]
    try:
        for proc in procs:
            assert proc.stdout.readline() == "ready\n"
        go.touch()  # all start watching the same stale lock at once
        outcomes = [proc.stdout.readline().strip() for proc in procs]
        assert sorted(outcomes) == ["refused"] * 7 + ["won"], outcomes
        winner = procs[outcomes.index("won")]
        held = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert held["pid"] == winner.pid
    finally:
        release.touch()
        for proc in procs:
            proc.wait(timeout=60)
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert not list((tmp_path / "run").glob("*.takeover"))


def test_eight_concurrent_contenders_on_one_stale_lock_exactly_one_wins(tmp_path):
    eight_contenders(tmp_path)


def test_nfs_eexist_for_a_link_that_succeeded_is_told_by_the_link_count(tmp_path, monkeypatch):
    """A retransmitted NFS link answered EEXIST although the first one made the link: judged by st_nlink == 2.
    (Mocked: the test makes the link and raises EEXIST itself; it cannot see a real NFS server.)"""
    import trainer.run_lock as run_lock
    real_link = os.link

    def link_then_eexist(src, dst):
        real_link(src, dst)
        raise FileExistsError(17, "File exists", str(dst))

    monkeypatch.setattr(run_lock.os, "link", link_then_eexist)
    lock = RunLock(tmp_path / "a", stale_s=30, interval_s=0.1).acquire()
    assert json.loads((tmp_path / "a" / LOCK_NAME).read_text())["token"] == lock.token
    monkeypatch.undo()
    with pytest.raises(RunLockedError):  # a real EEXIST (someone else's lock): refused as before
        RunLock(tmp_path / "a", stale_s=30, interval_s=0.1).acquire()
    lock.release()


def test_a_checkpoint_dir_outside_the_run_folder_is_locked_too(tmp_path):
    from trainer.run_lock import take_run_folder

    locks = take_run_folder(tmp_path / "run", 3, rank=0, device="cpu", checkpoint_dir=tmp_path / "shared" / "ckpt")
    try:
        assert (tmp_path / "run" / LOCK_NAME).exists() and (tmp_path / "shared" / "ckpt" / LOCK_NAME).exists()
        with pytest.raises(RunLockedError, match=r"shared/ckpt is in use by a live launch"):
            take_run_folder(tmp_path / "other_run", 3, rank=0, device="cpu",
                            checkpoint_dir=tmp_path / "shared" / "ckpt")
        assert not (tmp_path / "other_run" / LOCK_NAME).exists()  # the refused launch let go of what it took
    finally:
        locks.release()
    inside = take_run_folder(tmp_path / "run2", 30, rank=0, device="cpu", checkpoint_dir=tmp_path / "run2" / "ck")
    assert len(inside.locks) == 1
    inside.release()


def test_every_write_after_a_lost_lock_is_fenced(tmp_path):
    """Save, prune, latest and status.json check the lock before writing; after a takeover they write nothing."""
    from test_checkpoint import FakeEngine

    from trainer import checkpoint
    from trainer.run_status import write_status

    lock = RunLock(tmp_path, stale_s=60, interval_s=0.1).acquire()
    root = tmp_path / "checkpoints"
    checkpoint.save(FakeEngine(), root, checkpoint.TrainState(step=2), {}, 0, 1, 1, run_id="a", fence=lock.check)
    write_status(tmp_path, 0, "running", 2, fence=lock.check)
    _foreign_lock(tmp_path, heartbeat_age=0)  # another launch took the folder over
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "run.lock" not in p.name)
    with pytest.raises(RunLockLostError):
        checkpoint.save(FakeEngine(), root, checkpoint.TrainState(step=4), {}, 0, 1, 1, run_id="a",
                        fence=lock.check)
    with pytest.raises(RunLockLostError):
        write_status(tmp_path, 0, "completed", 4, fence=lock.check)
    with pytest.raises(RunLockLostError):  # a roll-back's move of newer checkpoints
        checkpoint.begin_lineage(root, None, 0, fence=lock.check)
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "run.lock" not in p.name)
    assert after == before and (root / "latest").read_text() == "global_step2"
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "running"
    lock.release()


def test_an_exception_in_the_heartbeat_thread_is_reported_not_swallowed(tmp_path, monkeypatch, capsys):
    """Any exception (here a ValueError) in the heartbeat thread sets ``trouble``, which the loop checks at every
    step (main's thread died silently on anything but OSError, and the live run then looked stale)."""
    lock = RunLock(tmp_path, stale_s=60, interval_s=0.1).acquire()
    real_dumps = json.dumps

    def broken(*args, **kwargs):
        if threading.current_thread() is lock._thread:
            raise ValueError("injected")
        return real_dumps(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", broken)
    deadline = time.monotonic() + 30
    while lock.trouble is None and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.undo()
    assert "ValueError: injected" in lock.trouble
    assert "the run lock's heartbeat failed" in capsys.readouterr().err
    lock.release()


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_run_whose_heartbeat_thread_dies_stops(tmp_path):
    """A real 1-rank run whose lock heartbeat raises after a few beats stops at the next step with exit 1, says
    why, and records status failed (main kept training with a lock that a new launch would take over)."""
    from test_trainer_multiproc import TIMEOUT, make_config

    cfg = make_config(tmp_path, "run", train={"steps": 1_000_000, "eval_every": 0},
                      checkpoint={"every_steps": 0, "save_at_end": False, "lock_stale_s": 3},
                      schedule={"kind": "constant", "warmup_steps": 0})  # endless: a decay would end at lr 0
    worker = REPO / "tests" / "fault_worker.py"
    proc = subprocess.run([sys.executable, str(worker), "--config", str(cfg), "--resume", "none"], cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1", BERTFAMILY_TEST_HEARTBEAT_FAILS_AFTER="3"),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "RuntimeError: injected heartbeat failure" in proc.stderr
    assert "rank 0's run lock heartbeat failed" in proc.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "failed" and "heartbeat failed" in status["message"]


def test_heartbeat_write_errors_that_last_stop_the_run(tmp_path, monkeypatch, capsys):
    """A heartbeat that cannot write (a full disk: ENOSPC) is tolerated for stale_s / 2, then reported as trouble so
    the loop stops the run before a new launch judges the live run stale (main only warned, forever)."""
    lock = RunLock(tmp_path, stale_s=2, interval_s=0.1).acquire()

    def full(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunLock, "_write_heartbeat", full)
    deadline = time.monotonic() + 30
    while lock.trouble is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "No space left on device" in lock.trouble
    err = capsys.readouterr().err
    assert "warning: run lock heartbeat failed" in err and "the run stops" in err
    monkeypatch.undo()
    lock.release()
