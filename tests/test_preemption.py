"""Preemption as clusters deliver it, with the production loader setting (``data.num_workers`` 2): the stop signal
reaches every process, the loader workers included (trainer/data/workers.py).

- one process group, one DataLoader with 2 workers: SIGTERM to the whole group; the workers live on, the batches
  keep coming, the rank's own handler saw the signal, and ``shutdown_workers`` ends the workers;
- torchrun, 2 ranks, tiny_roberta on a real corpus, evaluation at every step: SIGTERM to the launcher's process
  group (torchrun forwards it to each rank's process group, loader workers included); every rank exits 75 after the
  checkpoint, status.json says ``preempted``, the preempted step is not evaluated, and the relaunch with
  ``--resume auto`` ends with the uninterrupted run's losses at every step.

The Slurm versions (``scontrol requeue``, ``scancel --signal=TERM --full``) are in tests/test_slurm_training.py and
tests/test_slurm_templates.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from test_slurm_training import corpus  # noqa: F401  (fixture: tokenizer + shards of the shared English corpus)

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 300
STEPS = 40  # the signal comes after step 2 and lands a few steps later (more under load)

PROBE = r"""
import os, signal, sys, time
import psutil, torch
from trainer.data.loader import build_dataloader

class Samples(torch.utils.data.Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i): time.sleep(0.002); return i

seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
loader = build_dataloader(Samples(), torch.tensor, 0, 8, 4, 0, 1, 4096, num_workers=2, prefetch_factor=2)
batches = iter(loader)
first = next(batches).tolist()
workers = psutil.Process().children()
os.killpg(os.getpgrp(), signal.SIGTERM)  # as slurmd / torchrun: every process of the group, this one included
time.sleep(0.5)
rest = [next(batches).tolist() for _ in range(40)]
assert first + sum(rest, []) == list(range(4 * 41)), "batches out of order"
print("signal", seen, "workers alive", [w.is_running() and w.status() != "zombie" for w in workers], flush=True)
from trainer.data.workers import shutdown_workers
print("shut down", shutdown_workers(), "alive after", [w.is_running() and w.status() != "zombie" for w in workers])
"""


def test_loader_workers_ignore_a_stop_signal_to_the_process_group():
    # A new session: the probe's killpg must not reach pytest.
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                          start_new_session=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]  # old code: "DataLoader worker ... exited"
    assert f"signal [{int(signal.SIGTERM)}] workers alive [True, True]" in proc.stdout, proc.stdout
    assert "shut down 1 alive after [False, False]" in proc.stdout, proc.stdout


PLAIN_EXIT = r"""
import sys, torch
from trainer.data.loader import build_dataloader

class Samples(torch.utils.data.Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i): return i

batches = iter(build_dataloader(Samples(), torch.tensor, 0, 8, 4, 0, 1, 4096, num_workers=2, prefetch_factor=2))
print("first", next(batches).tolist(), flush=True)
sys.exit(3)  # a plain interpreter exit, workers alive and shutdown_workers never called
"""


def test_a_script_that_exits_with_live_loader_workers_ends():
    """A script (a benchmark, a user's loop over build_dataloader) that exits without ``shutdown_workers``: before,
    Python's exit sent SIGTERM to the workers, which ignore it, then joined them forever. The atexit hook now shuts
    them down first; the script's own exit status comes through."""
    proc = subprocess.run([sys.executable, "-c", PLAIN_EXIT], cwd=REPO, capture_output=True, text=True, timeout=60,
                          start_new_session=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 3 and "first [0, 1, 2, 3]" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def _launch(corpus: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    status_dir = run_dir.parent / f"{run_dir.name}.exit"
    status_dir.mkdir(parents=True, exist_ok=True)
    for old in status_dir.glob("rank*"):
        old.unlink()
    sets = {"run_dir": run_dir, "data.corpora.0.prefix": corpus, "data.valid_corpora": f"[{{prefix: {corpus}}}]",
            "data.num_workers": 2, "data.prefetch_factor": 2, "train.steps": STEPS, "train.eval_every": 1,
            "train.eval_batches": 1, "checkpoint.every_steps": 0, "logging.every_steps": 1,
            "logging.progress_bar": "false", "logging.tensorboard": "false", "logging.peak_tflops": 1}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "tests" / "rank_exit.py"), "--config", "tiny_roberta", *extra]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    log = open(run_dir.parent / f"{run_dir.name}.log", "a")
    # Its own session: the launcher's process group is the test's to signal, as Slurm or a scheduler would.
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", EXIT_STATUS_DIR=str(status_dir)))


def _finish(proc: subprocess.Popen, run_dir: Path) -> tuple[int, str, dict[str, int]]:
    try:
        proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            # torchrun starts each rank in a session of its own: kill them first, or they outlive the launcher
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (run_dir.parent / f"{run_dir.name}.log").read_text(errors="replace")
    codes = {p.name: int(p.read_text()) for p in (run_dir.parent / f"{run_dir.name}.exit").glob("rank*")}
    return proc.returncode, text, codes


def _records(run_dir: Path, split: str = "train") -> dict[int, dict]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []:
        rec = json.loads(line)
        if rec.get("split", "train") == split and "loss" in rec:
            out[rec["step"]] = rec
    return out


@pytest.mark.slow
@pytest.mark.multiproc
def test_torchrun_run_with_loader_workers_saves_on_sigterm_and_resumes_to_the_same_losses(corpus, tmp_path):
    straight = tmp_path / "straight"
    rc, text, codes = _finish(_launch(corpus, straight), straight)
    assert rc == 0 and codes == {"rank0": 0, "rank1": 0}, text[-5000:]
    reference = {s: r["loss"] for s, r in _records(straight).items()}
    assert sorted(reference) == list(range(1, STEPS + 1)), text[-3000:]

    run = tmp_path / "preempted"
    proc = _launch(corpus, run)
    deadline = time.monotonic() + TIMEOUT
    while len(_records(run)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (run.parent / "preempted.log").read_text()[-5000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # the launcher's process group, as a scheduler stops a job
    rc, text, codes = _finish(proc, run)
    # Old code: the workers die, a rank raises "DataLoader worker (pid ...) exited unexpectedly", status "failed".
    assert "exited unexpectedly" not in text, text[-5000:]
    assert codes == {"rank0": 75, "rank1": 75}, (codes, rc, text[-5000:])
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "preempted", (status, text[-5000:])
    at = status["step"]
    assert 2 <= at < STEPS
    assert (run / "checkpoints" / "latest").read_text() == f"global_step{at}"
    assert (run / "checkpoints" / f"global_step{at}" / "bertfamily.json").exists()
    assert f"preempted at step {at}: checkpoint saved" in text, text[-3000:]
    # Saved first, evaluated never: every step before the preempted one was evaluated, that one was not.
    assert sorted(_records(run, "eval")) == list(range(1, at)), _records(run, "eval")

    rc, text, codes = _finish(_launch(corpus, run, "--resume", "auto"), run)
    assert rc == 0 and codes == {"rank0": 0, "rank1": 0}, text[-5000:]
    assert f"resumed from {run / 'checkpoints' / f'global_step{at}'} at step {at}" in text, text[-3000:]
    assert json.loads((run / "status.json").read_text())["status"] == "completed"
    resumed = {s: r["loss"] for s, r in _records(run).items()}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    # torch AdamW under ZeRO-1 resumes bit-identically; the tolerance covers only metrics.jsonl's rounding
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), (step, resumed, reference)
