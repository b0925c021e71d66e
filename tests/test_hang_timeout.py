"""``deepspeed.timeout_minutes`` bounds a hang in DeepSpeed's own collectives, in a real 2-rank gloo run.

DeepSpeed reduces ZeRO gradients over its clone of the world group, a group it creates without a timeout, which torch
gave its 30-minute gloo default: a stopped rank held the others for 30 minutes whatever the setting
(trainer/launch_env.py ``_default_group_timeout``). Here rank 1 stops itself with SIGSTOP as it starts step 3, so rank 0
waits for it in step 3's gradient reduction (tests/liveness_worker.py); with a 15 s timeout rank 0 must fail with the
timeout error long before the test's hang guard. Under NCCL the same default governs NCCL's watchdog; that path needs
a GPU and is not run here.
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
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "liveness_worker.py"
HANG_GUARD_S = 150  # torch's old default would hold rank 0 for 1800 s

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]  # ~22 s: 15 s of it the timeout itself

CONFIG = {
    "seed": 5,
    "model": {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "dropout": 0.0},
    "data": {"corpora": [{"prefix": "unused-by-the-standin"}], "max_seq_length": 16},
    "objective": {"name": "standin", "options": {"record_samples": False}},
    "train": {"steps": 8, "global_batch_size": 8, "micro_batch_size": 2},
    "optim": {"name": "adamw", "lr": 3e-3},
    "schedule": {"kind": "linear", "warmup_steps": 2, "decay_steps": 8},
    "checkpoint": {"every_steps": 100, "save_at_end": False},
    "logging": {"every_steps": 1, "progress_bar": False, "tensorboard": False, "peak_tflops": 0.1},
    "deepspeed": {"config": str(REPO / "ds_configs" / "zero1.json"), "timeout_minutes": 0.25},
}


def launch(tmp: Path, env: dict, timeout: float, until=None, **overrides) -> tuple[int | None, str]:
    """torchrun --nproc_per_node 2 of the worker; returns (its exit status, or None when ``until()`` came true or
    ``timeout`` passed first, and its output). Every process of the launch is killed at the end (a stopped rank
    included: SIGKILL ends stopped processes; torchrun's own teardown of it would take another 30 s)."""
    raw = json.loads(json.dumps(CONFIG))
    for section, values in overrides.items():
        raw[section] = {**raw.get(section, {}), **values}
    raw["run_dir"] = str(tmp / "run")
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(raw))
    log = open(tmp / "out.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(WORKER), "--config", str(tmp / "cfg.yaml")], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **env))
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline and not (until and until()):
            time.sleep(0.5)
        done = proc.poll()
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            child.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.seek(0)
    return done, log.read()


def test_stopped_rank_fails_the_others_after_the_timeout(tmp_path):
    """Rank 1 SIGSTOPped inside step 3: rank 0 fails with gloo's timeout (not the test's hang guard), status.json
    says failed at step 2, the last step every rank completed."""
    status_file = tmp_path / "run" / "status.json"

    def failed() -> bool:
        try:
            return json.loads(status_file.read_text())["status"] == "failed"
        except (OSError, ValueError):
            return False

    start = time.monotonic()
    _, out = launch(tmp_path, {"BERTFAMILY_TEST_STOP_RANK": "1", "BERTFAMILY_TEST_STOP_AT_STEP": "3"},
                    HANG_GUARD_S, until=failed)
    assert failed(), (f"rank 0 had not failed after {time.monotonic() - start:.0f} s (guard {HANG_GUARD_S} s): "
                      f"the timeout did not apply\n{out[-4000:]}")
    assert "rank 0: training failed" in out and "Timed out" in out, out[-4000:]
    status = json.loads(status_file.read_text())
    assert status["step"] == 2, status
    assert status["message"].startswith("a collective timed out (deepspeed.timeout_minutes)"), status
