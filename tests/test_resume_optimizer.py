"""What a resume restores of the optimizer and what it takes from the config: real runs of the stand-in trainer
(tests/test_trainer_standin.py, gloo, CPU fp32) stopped at step 4 and resumed.

The moments and step counts come from the checkpoint; each param group's settings (betas, eps, weight decay, LAMB's
trust-ratio exclusion) come from the config of the resuming launch, as they would for a fresh start. DeepSpeed's load
put the checkpoint's there (and its ZeRO-3 universal load group 0's on every group, with one ``step`` tensor shared
by every sub-group): trainer/optim/after_load.py ``restore_group_settings`` / ``untie_state_tensors``. Also: a
preemption that arrives while such a resume converts its checkpoint to the universal form.
"""
from __future__ import annotations

import pytest

from test_trainer_multiproc import REPO, losses, make_config, run, run_several

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

ZERO3 = {"deepspeed": {"config": str(REPO / "ds_configs" / "zero3.json")},
         "checkpoint": {"every_steps": 4, "keep_last": 2}, "train": {"eval_every": 0}}
LAMB3 = {**ZERO3, "optim": {"name": "lamb", "lr": 1e-2}}


@pytest.fixture(scope="module")
def zero3_runs(tmp_path_factory):
    """8 steps on 2 ranks at ZeRO-3, and the same run stopped after step 4; the same two with LAMB (one launch)."""
    tmp = tmp_path_factory.mktemp("resume_optimizer")
    runs = []
    for name, sections in (("ref", ZERO3), ("lamb_ref", LAMB3)):
        runs += [(make_config(tmp, name, **sections),),
                 (make_config(tmp, name.replace("ref", "stopped"), **sections), "--set", "train.stop_at_step=4")]
    run_several(runs, 2)
    return tmp


def test_zero3_resume_on_another_world_size_matches_the_uninterrupted_run(zero3_runs):
    """2 ranks -> 1 rank at ZeRO-3 (universal checkpoint). DeepSpeed 0.19.8 gave the no-decay group weight decay 0.01
    and counted Adam's step twice per step after the load: rel. ~2e-4 off by step 8 (ZeRO-1/2 match to ~3e-8)."""
    tmp = zero3_runs
    resumed = run(tmp / "stopped.yaml", 1)
    assert "converting to DeepSpeed's universal checkpoint for 1" in resumed.stdout
    ref, got = losses(tmp / "ref"), losses(tmp / "stopped")
    assert sorted(got) == list(range(1, 9))
    for step in range(5, 9):
        assert got[step] == pytest.approx(ref[step], rel=1e-6, abs=0), (step, got[step], ref[step])


def test_resume_takes_betas_eps_and_weight_decay_from_the_config(zero3_runs):
    """A roll-back (a resume into another run folder here) with other optimizer settings trains with them, and the
    log says what replaced the checkpoint's; the same launch without them trained bit-identically to the reference
    before the fix (the checkpoint's settings were kept while bertfamily.json recorded the new ones)."""
    tmp = zero3_runs
    cfg = make_config(tmp, "changed", **ZERO3)
    proc = run(cfg, 2, "--resume", str(tmp / "ref" / "checkpoints" / "global_step4"), "--set", "optim.betas=[0.5,0.5]",
               "--set", "optim.eps=1e-2", "--set", "optim.weight_decay=0.5", "--set", "train.steps=6")
    got, ref = losses(tmp / "changed"), losses(tmp / "ref")
    assert got[5] == ref[5]  # the loss of step 5 is taken before its update
    assert got[6] != ref[6]
    assert "optimizer settings from this run's config, not the checkpoint's" in proc.stdout
    assert "betas of group 0: (0.9, 0.999) -> (0.5, 0.5)" in proc.stdout
    assert "weight_decay of group 0: 0.01 -> 0.5" in proc.stdout
    assert "weight_decay of group 1" not in proc.stdout  # still 0.0: biases and norms are never decayed


def test_lamb_zero3_resume_on_another_world_size_matches_the_uninterrupted_run(zero3_runs):
    """LAMB (per-parameter trust ratios over ZeRO-3 partitions), 2 ranks -> 1: the universal load replaced the fp32
    partitions and set exclude_from_trust_ratio=False on the bias/norm group, and the first step after it stopped
    with "Lamb is bound to a ZeRO partition layout but got a tensor ... not in it"."""
    tmp = zero3_runs
    run(tmp / "lamb_stopped.yaml", 1)
    ref, got = losses(tmp / "lamb_ref"), losses(tmp / "lamb_stopped")
    assert sorted(got) == list(range(1, 9))
    for step in range(5, 9):
        assert got[step] == pytest.approx(ref[step], rel=1e-6, abs=0), (step, got[step], ref[step])


def test_sigterm_during_the_universal_conversion_is_a_preemption(tmp_path):
    """SIGTERM to the job's process group (Slurm's preemption) while rank 0 converts a 2-rank checkpoint for 1 rank:
    the converter, a child in that group, dies too. Before: status "failed", exit 1, ``.universal.tmp`` left behind.
    Now: exit 75, status "preempted", no partial folder; the requeued launch converts again and trains."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_trainer_multiproc import command

    cfg = make_config(tmp_path, "run", **{**ZERO3, "deepspeed": {"config": str(REPO / "ds_configs" / "zero2.json")}})
    run(cfg, 2, "--set", "train.stop_at_step=4")
    tag = tmp_path / "run" / "checkpoints" / "global_step4"
    proc = subprocess.Popen(command(cfg, 1), cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    import psutil

    def converter_running() -> bool:
        # DeepSpeed's converter from its start, not its output folder: the folder appears late in a conversion that
        # can end within milliseconds of it, which a poll on a loaded machine would miss; the process lives for the
        # whole conversion (its imports alone take seconds)
        try:
            return any("ds_to_universal" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(True))
        except psutil.Error:
            return False

    deadline = time.monotonic() + 120
    while not converter_running() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, out[-2000:] + err[-4000:]
    assert "preempted during the universal conversion" in out
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "preempted"
    assert not (tag / ".universal.tmp").exists() and not (tag / "universal").exists()
    again = run(cfg, 1)
    assert "resumed from" in again.stdout and sorted(losses(tmp_path / "run")) == list(range(1, 9))
