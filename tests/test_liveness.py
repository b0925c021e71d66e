"""What an operator's scripts read while a long run goes on, from a real 2-rank gloo run (torchrun) of the stand-in
trainer (tests/liveness_worker.py): the time fields of metrics.jsonl, the slowest rank's data wait, the timed
checkpoint save, and status.json rewritten at each logging step, which stays as it was when every rank is killed.

Rank 1's loader sleeps 0.3 s before each micro-batch (2 per step); rank 1 stops itself (SIGSTOP) as it starts step
5, after the records of steps 2 and 4 (logging every 2 steps, a checkpoint at step 3); the test then kills every
process with SIGKILL, as a lost node or ``scancel --signal=KILL`` does. No assertion on a speed: the sleep is a lower
bound on rank 1's wait whatever the machine's load.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from test_hang_timeout import launch

pytestmark = [pytest.mark.multiproc]


def test_records_and_status_show_time_slow_rank_and_saves(tmp_path):
    status_file = tmp_path / "run" / "status.json"

    def at_step_4() -> bool:
        try:
            return json.loads(status_file.read_text())["step"] == 4
        except (OSError, ValueError, KeyError):
            return False

    before = time.time()
    exit_status, out = launch(
        tmp_path, {"BERTFAMILY_TEST_SLOW_RANK": "1", "BERTFAMILY_TEST_SLOW_S": "0.3",
                   "BERTFAMILY_TEST_STOP_RANK": "1", "BERTFAMILY_TEST_STOP_AT_STEP": "5"}, 150, until=at_step_4,
        logging={"every_steps": 2}, checkpoint={"every_steps": 3}, deepspeed={"timeout_minutes": 10})
    assert exit_status is None and at_step_4(), out[-4000:]
    killed = time.time()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4], records
    assert before < records[0]["time"] <= records[1]["time"] <= killed
    for r in records:
        assert r["max_data_wait_rank"] == 1 and r["max_data_wait_s"] >= 0.6, r  # 2 micro-batches x 0.3 s a step
        assert r["data_wait_s"] < r["max_data_wait_s"] and r["max_step_s"] >= r["max_data_wait_s"], r
        assert r["window_s"] > 0 and r["step_s"] > 0 and r["eval_s"] == 0, r
    assert records[0]["save_s"] == 0 and records[1]["save_s"] > 0, records  # the step-3 checkpoint, in window 2
    assert "step 3: checkpoint saved to" in out and " s\n" in out.split("step 3: checkpoint saved to")[1], out[-3000:]
    # every rank is gone: the status stays "running" at step 4 with the time of its write, older than any new one
    time.sleep(1)
    status = json.loads(status_file.read_text())
    assert status["status"] == "running" and status["step"] == 4 and status["total_steps"] == 8, status
    assert status["time"] <= killed < time.time() and status["every_s"] > 0, status
    assert status["time"] == pytest.approx(records[1]["time"], abs=5)


def test_progress_bar_is_off_in_a_log_file_unless_forced(tmp_path, monkeypatch):
    """logging.progress_bar: "auto" draws no bar when stderr is a file (a Slurm job log: one \\r frame a second),
    one on a terminal; true forces it (a resolved config.json with true loads and behaves as before), false never."""
    from types import SimpleNamespace

    from trainer.metrics import MetricsLogger, show_progress_bar

    class Tty:
        def isatty(self):
            return True

    with open(tmp_path / "job.log", "w") as log:
        assert not show_progress_bar("auto", log) and not show_progress_bar(None, log)
        assert show_progress_bar(True, log) and show_progress_bar("true", log) and not show_progress_bar(False, Tty())
        monkeypatch.setattr("sys.stderr", log)
        bars = {s: MetricsLogger(tmp_path / str(s), SimpleNamespace(tensorboard=False, progress_bar=s), 0, 10, 0).bar
                for s in ("auto", True, False)}
    assert bars["auto"] is None and bars[True] is not None and bars[False] is None
    assert show_progress_bar("auto", Tty())


def test_the_default_progress_bar_is_auto_and_a_resolved_config_with_true_still_loads():
    """Every recipe's default is auto (the bar only on a terminal: the Slurm templates' job logs are files); a run's
    config.json written before holds true and resumes with the bar forced, as it ran."""
    import json

    from trainer.config import config_from_dict, load_config

    cfg = load_config("roberta_large", ["model.vocab_size=1024", "model.pad_token_id=1"])
    assert cfg.logging.progress_bar == "auto"
    resolved = json.loads(cfg.model_dump_json())
    resolved["logging"]["progress_bar"] = True
    assert config_from_dict(resolved).logging.progress_bar is True
