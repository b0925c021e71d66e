"""What users rely on when a cluster loses nodes, through the real templates on the local two-node Slurm cluster
(tests/slurm_cluster.py), each node running one gloo rank on CPU (fp32), with tiny_roberta and slurm/roberta_large.sh:

- a node lost for good: a run checkpointed on 2 nodes is resubmitted with `--nodes=1` while the other node is drained;
  it resumes through DeepSpeed's universal checkpoint on 1 node (the global batch unchanged, so the accumulation
  doubles), continues the same sample order, and its losses continue the uninterrupted 2-node run's; resubmitted
  on 2 nodes again, it continues once more;
- a node that never joins the rendezvous (its task frozen before it connects, as a hung node or a firewall that drops
  the connection leaves it): the job fails with the template's message after RDZV_TIMEOUT seconds instead of
  hanging until the Slurm time limit.

The helpers, the cluster sizes and the corpus are tests/test_slurm_training.py's. A launch costs ~30 s here.
"""
from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)
from test_slurm_training import (  # noqa: F401  (corpus: fixture)
    JOB_TIMEOUT, assert_completed, corpus, latest_step, losses, records, resumed_at, sets, submit,
)

pytestmark = [
    pytest.mark.slurm, pytest.mark.slow, pytest.mark.multiproc,
]
GLOBAL_BATCH, MICRO_BATCH = 16, 4  # trainer/recipes/tiny_roberta.yaml


def test_a_run_that_loses_a_node_resumes_on_one_node_and_back_on_two(slurm_cluster, corpus, tmp_path):
    """2 nodes to step 4 (train.stop_at_step: a checkpoint, as a preempted or time-limited job leaves), then n2 is
    drained and the same command with --nodes=1 runs to step 8, then n2 returns and --nodes=2 runs to step 12; every
    step's loss matches an uninterrupted 2-node run of 12 steps.

    Tolerance: rel 1e-5, as tests/test_trainer_multiproc.py::test_world_size_2_to_1_to_2_keeps_sample_order. The
    same 4-sequence micro-batches are trained at every world size (rank r of R takes its contiguous slice of each
    micro-batch: 2 ranks x accumulation 2 and 1 rank x accumulation 4 both cut a step's 16 samples into 0-3, 4-7,
    8-11, 12-15), so only the order of the fp32 gradient sums differs (all-reduce vs accumulation; ~1e-7 relative per
    step, compounded through Adam). A wrong sample order or a lost optimizer state moves the loss by 1e-2 or more.
    Dropout is off: after a world-size change each rank starts a fresh dropout stream from (seed, step, rank)
    (trainer/checkpoint.py restore_rng), so with dropout the masks, and hence the losses, legitimately differ."""
    steps = 12
    common = dict(train__steps=steps, checkpoint__every_steps=0, logging__every_steps=1,
                  model__dropout=0.0, model__attention_dropout=0.0)
    env = {"CONFIG": "tiny_roberta", "DATA_PREFIX": str(corpus)}

    straight = tmp_path / "straight"
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "straight.out", RUN_DIR=str(straight),
                 EXTRA_SETS=sets(**common), **env)
    assert_completed(slurm_cluster, job, tmp_path / "straight.out")
    reference = losses(straight)
    assert sorted(reference) == list(range(1, steps + 1)), reference

    run = tmp_path / "elastic"
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "two.out", RUN_DIR=str(run),
                 EXTRA_SETS=sets(**common, train__stop_at_step=4), **env)
    text = assert_completed(slurm_cluster, job, tmp_path / "two.out")
    assert "stopped at step 4" in text and latest_step(run) == 4, text[-4000:]

    # The cluster loses n2: only a 1-node job can run now.
    slurm_cluster.client("scontrol", "update", "nodename=n2", "state=drain", "reason=lost-for-good")
    try:
        job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "one.out", nodes=1, RUN_DIR=str(run),
                     EXTRA_SETS=sets(**common, train__stop_at_step=8), **env)
        text = assert_completed(slurm_cluster, job, tmp_path / "one.out")
    finally:
        slurm_cluster.client("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert slurm_cluster.job(job)["NodeList"] == "n1"
    assert "on 1 node(s)" in text, text[-4000:]
    assert "saved on 2 ranks at ZeRO-1; converting to DeepSpeed's universal checkpoint for 1" in text, text[-4000:]
    assert f"micro batch {MICRO_BATCH} x accumulation 4 x 1 ranks = {GLOBAL_BATCH}" in text, text[-4000:]
    assert f"at step 4 ({4 * GLOBAL_BATCH} samples consumed)" in text, text[-4000:]
    assert resumed_at(text) == [4] and latest_step(run) == 8

    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "back.out", RUN_DIR=str(run),
                 EXTRA_SETS=sets(**common), **env)
    text = assert_completed(slurm_cluster, job, tmp_path / "back.out")
    assert "saved on 1 ranks at ZeRO-1; converting to DeepSpeed's universal checkpoint for 2" in text, text[-4000:]
    assert f"micro batch {MICRO_BATCH} x accumulation 2 x 2 ranks = {GLOBAL_BATCH}" in text, text[-4000:]
    assert resumed_at(text) == [8] and latest_step(run) == steps
    assert json.loads((run / "status.json").read_text())["status"] == "completed"

    got = losses(run)
    assert sorted(got) == list(range(1, steps + 1)), got
    assert {s: r["consumed_samples"] for s, r in records(run).items()} == {
        s: s * GLOBAL_BATCH for s in range(1, steps + 1)}
    diffs = {s: abs(got[s] - reference[s]) / abs(reference[s]) for s in got}
    print(f"relative loss differences vs the uninterrupted 2-node run: { {s: f'{d:.1e}' for s, d in diffs.items()} }")
    for step in range(1, steps + 1):
        assert got[step] == pytest.approx(reference[step], rel=1e-5), (step, got, reference)


def test_a_node_that_never_joins_fails_the_job_after_the_rendezvous_timeout(slurm_cluster, corpus, tmp_path):
    """Node 1's task is frozen (SIGSTOP) as soon as it starts, before its torchrun can reach the rendezvous: node 0
    waits RDZV_TIMEOUT seconds for it, torchrun fails, srun ends the step and the job FAILS with the template's
    message, long before the job's time limit."""
    timeout = 8  # node 1 never joins: any timeout shows it; node 0's own start-up is not counted in it
    run = tmp_path / "rdzv"
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "rdzv.out", CONFIG="tiny_roberta",
                 DATA_PREFIX=str(corpus), RUN_DIR=str(run), RDZV_TIMEOUT=str(timeout),
                 EXTRA_SETS=sets(train__steps=4))
    frozen = _freeze_node_task(slurm_cluster, job, node_id="1")
    try:
        # bounded by the rendezvous timeout (plus node 0's torchrun start-up and srun's tear-down), not the job's
        # time limit: wait_job raises past timeout + 120 s
        info = slurm_cluster.wait_job(job, timeout + 120)
    finally:
        for proc in frozen:  # Slurm kills them with the step; never leave a stopped process behind
            if proc.is_running():
                proc.kill()
    text = (tmp_path / "rdzv.out").read_text(errors="replace")
    assert info["JobState"] == "FAILED", text[-5000:]
    assert "waiting for clients. 1/2 clients joined" in text, text[-5000:]  # torchrun on n1, the first node
    # The template's message says it was the rendezvous, and srun names the node that never joined.
    assert "TRAINING FAILED" in text and "The rendezvous timed out" in text, text[-5000:]
    assert f"past RDZV_TIMEOUT={timeout} s" in text and "n2: task 1: Terminated" in text, text[-5000:]
    assert not (run / "status.json").exists()  # no rank ever started training


def _freeze_node_task(cluster, job: int, node_id: str, timeout: float = JOB_TIMEOUT) -> list[psutil.Process]:
    """SIGSTOP this cluster's task on node ``node_id`` (the template's `bash -c ... exec torchrun`) the moment it
    appears; it has not connected yet: torchrun spends seconds importing torch before its rendezvous."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = cluster.processes(lambda cmd, env: env.get("SLURM_NODEID") == node_id
                                  and env.get("SLURM_STEP_ID") not in (None, "batch") and "torchrun" in cmd)
        frozen = []
        for proc in found:
            try:
                proc.send_signal(signal.SIGSTOP)
                frozen.append(proc)
            except psutil.NoSuchProcess:  # a subshell of the task's bash (a command substitution) that has ended
                pass
        if frozen:
            return frozen
        state = cluster.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING"), f"job {job} {state} before its node task started\n" \
            + cluster.job_output(job)
        time.sleep(0.02)
    raise AssertionError(f"node {node_id}'s task of job {job} never started\n" + cluster.job_output(job))
