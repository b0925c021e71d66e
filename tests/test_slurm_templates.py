"""The ELECTRA and ERNIE 2.0 templates of slurm/ submitted to the local two-node Slurm cluster (tests/slurm_cluster.py)
the way a user does, each node running one gloo rank on CPU (fp32), with the tiny recipes:

- slurm/electra_base.sh, tiny_electra (generator + discriminator, ZeRO-1): a straight run completes with both the
  generator's MLM loss and the discriminator's RTD loss finite and falling and a final checkpoint; the same command
  preempted with `scontrol requeue` (SIGTERM) saves, is requeued, resumes and ends with the straight run's losses;
- slurm/ernie2_base.sh, tiny_ernie2 (continual multi-task plan, through trainer/pretrain.py) on a cased
  corpus, shortened to 300 of the plan's 2,050 steps so that it still crosses two stage boundaries: the time-limit
  warning (USR1 to the batch shell) in stage 1 checkpoints, the job requeues itself, resumes in the middle of the
  stage with the same task mix and ends with the straight run's per-step losses, every task trained on the steps the
  plan gives it.

Both run 2 loader workers per rank (the recipes' production setting; the tiny recipes default to 0), which the stop
signal reaches too: SIGTERM from slurmd to every process of the job, USR1 forwarded by torchrun to each rank's
process group.

The helpers, the cluster sizes and the ordinary corpus are tests/test_slurm_training.py's. Each launch costs ~30 s
here (two ranks importing torch/DeepSpeed on a shared 2-core machine); steps of these recipes cost ~0.03-0.3 s, so
each test runs three launches (straight, preempted, resumed) and puts its steps where they check something.
"""
from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest

from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)
from test_slurm_training import (  # noqa: F401  (corpus: fixture)
    LOADER, assert_completed, corpus, latest_step, records, resumed_at, sets, signal_lands_mid_run, submit,
)

pytestmark = [
    pytest.mark.slurm, pytest.mark.slow, pytest.mark.multiproc,
]


@pytest.fixture(scope="module")
def cased_corpus(en_corpus, tmp_path_factory) -> Path:
    """A cased WordPiece tokenizer (ERNIE 2.0's capitalization task needs case) and shards of the first 4,000 lines,
    as tests/test_ernie_train.py prepares tiny_ernie2's corpus; no side-car: tiny_ernie2 masks at the basic level."""
    from data_prep import build_indexed, train_tokenizer

    tmp = tmp_path_factory.mktemp("cased")
    text = tmp / "en.txt"
    text.write_text("\n".join(en_corpus.read_text(encoding="utf-8").splitlines()[:4000]) + "\n", encoding="utf-8")
    assert train_tokenizer.main(["--kind", "wordpiece", "--input", str(text), "--output", str(tmp / "tok"),
                                 "--vocab-size", "3000", "--quiet", "--cased"]) == 0
    prefix = tmp / "corpus" / "en"
    assert build_indexed.main(["--input", str(text), "--tokenizer", str(tmp / "tok"), "--output-prefix",
                               str(prefix)]) == 0
    return prefix


def series(recs: dict[int, dict], key: str, steps=None) -> dict[int, float]:
    """step -> ``key`` for the steps that log it (within ``steps`` if given)."""
    return {s: r[key] for s, r in sorted(recs.items()) if key in r and (steps is None or s in steps)}


def assert_finite_and_falls(values: dict[int, float], key: str, window: int, margin: float) -> None:
    """Every value finite, and the mean of the last ``window`` below the mean of the first by more than ``margin``."""
    ys = [values[s] for s in sorted(values)]
    assert len(ys) >= 2 * window, f"{key}: only {len(ys)} values"
    assert all(math.isfinite(y) for y in ys), f"{key} not finite: {values}"
    first, last = sum(ys[:window]) / window, sum(ys[-window:]) / window
    assert last < first - margin, f"{key} did not fall: first {first:.4f}, last {last:.4f} ({values})"


def assert_same_steps(resumed: dict[int, dict], reference: dict[int, dict], keys: tuple[str, ...]) -> None:
    """Every step's ``keys`` equal the uninterrupted run's (the tolerance covers only metrics.jsonl's rounding)."""
    assert sorted(resumed) == sorted(reference)
    for step in sorted(reference):
        for key in keys:
            if key in reference[step] or key in resumed[step]:
                assert resumed[step].get(key) == pytest.approx(reference[step].get(key), rel=1e-6, abs=1e-7), (
                    step, key, resumed[step], reference[step])


def assert_finished(run_dir: Path, objective: str, steps: int) -> None:
    """A completed run: its last checkpoint at ``steps``, status completed, the resolved config of the objective."""
    assert latest_step(run_dir) == steps
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    resolved = json.loads(next((run_dir / "logs").glob("job*-restart0/config.json")).read_text())
    assert resolved["objective"]["name"] == objective and resolved["train"]["steps"] == steps


def test_electra_base_template_trains_both_networks_and_a_preempted_run_resumes_to_the_same_losses(
        slurm_cluster, corpus, tmp_path):
    steps = 40
    # Periodic checkpoints off: the resumed run must come from the checkpoint the preemption signal made. Dropout on
    # and the peak FLOP/s measured (the recipe's defaults): the resumed run continues the same RNG streams (dropout,
    # the generator's Gumbel sampling) as the uninterrupted one.
    env = {"CONFIG": "tiny_electra", "DATA_PREFIX": str(corpus),
           "EXTRA_SETS": sets(train__steps=steps, checkpoint__every_steps=0, logging__every_steps=1) + " " + LOADER}

    straight = tmp_path / "straight"
    job = submit(slurm_cluster, "electra_base.sh", tmp_path / "straight.out", RUN_DIR=str(straight), **env)
    text = assert_completed(slurm_cluster, job, tmp_path / "straight.out")
    assert slurm_cluster.job(job)["ExitCode"] == "0:0"
    reference = records(straight)
    assert sorted(reference) == list(range(1, steps + 1)), reference
    assert "world size 2" in text, text[-4000:]
    # Both networks learn: the generator's MLM loss (from ~ln 1024) and the discriminator's replaced-token detection.
    assert_finite_and_falls(series(reference, "gen_mlm_loss"), "gen_mlm_loss", 5, 0.1)
    assert_finite_and_falls(series(reference, "rtd_loss"), "rtd_loss", 5, 0.02)
    assert_finite_and_falls(series(reference, "loss"), "loss", 5, 0.1)
    assert_finished(straight, "electra", steps)

    preempted = tmp_path / "preempted"
    job = submit(slurm_cluster, "electra_base.sh", tmp_path / "preempted.out", RUN_DIR=str(preempted), **env)
    with signal_lands_mid_run(slurm_cluster, job, preempted, 2, signal.SIGTERM):
        slurm_cluster.client("scontrol", "requeue", str(job))
    slurm_cluster.release_requeued(job)
    text = assert_completed(slurm_cluster, job, tmp_path / "preempted.out")
    info = slurm_cluster.job(job)
    assert info["Restarts"] == "1" and info["ExitCode"] == "0:0", info
    assert "stopped by SIGTERM" in text and "restart 1" in text, text[-6000:]
    assert "exited unexpectedly" not in text, text[-6000:]  # the loader workers ignored the signal
    (at,) = resumed_at(text)
    assert 2 <= at < steps, text[-6000:]
    assert latest_step(preempted) == steps
    assert_same_steps(records(preempted), reference, ("loss", "gen_mlm_loss", "rtd_loss"))


def test_ernie2_base_template_resumes_the_continual_plan_mid_stage_after_the_time_limit_warning(
        slurm_cluster, cased_corpus, tmp_path):
    # tiny_ernie2's plan at a fifth of its iterations (60, 60, 60, 60, 300): stage 0 = steps 1-20 (mlm), stage 1 =
    # 21-50 (+ capitalization, token_document), stage 2 from 51 (+ sentence_reorder, sentence_distance). 100 steps
    # cross both boundaries; the warning comes at step 30, in stage 1, and the ranks take it at step 31
    # (signal_lands_mid_run). (The recipe's own plan, 2,050 steps, learns in tests/test_ernie_train.py; here the
    # template's resume inside a stage is the point, and the 300 steps of the full plan's boundaries cost ~2 min.)
    steps, stage0, stage1 = 100, range(1, 21), range(21, 51)
    plan = " ".join(f"objective.options.continual.tasks.{i}.iterations={n}" for i, n in enumerate((60,) * 4 + (300,)))
    env = {"CONFIG": "tiny_ernie2", "DATA_PREFIX": str(cased_corpus),
           "EXTRA_SETS": sets(train__steps=steps, checkpoint__every_steps=0, checkpoint__save_at_end="true") + " "
           + LOADER + " " + plan}

    straight = tmp_path / "straight"
    job = submit(slurm_cluster, "ernie2_base.sh", tmp_path / "straight.out", RUN_DIR=str(straight), **env)
    text = assert_completed(slurm_cluster, job, tmp_path / "straight.out")
    assert slurm_cluster.job(job)["ExitCode"] == "0:0"
    reference = records(straight)
    assert sorted(reference) == list(range(1, steps + 1)), sorted(reference)
    assert "world size 2" in text, text[-4000:]
    assert all(math.isfinite(r["loss"]) for r in reference.values()), reference
    # The plan: a task logs its loss on the steps that train it, none before its stage; the token-level tasks start
    # with their stage, the two sentence-level ones take turns from stage 2's first step on.
    tasks = ("mlm", "capitalization", "token_document", "sentence_reorder", "sentence_distance")
    first_step = {t: min(s for s, r in reference.items() if f"{t}_loss" in r) for t in tasks}
    assert {t: first_step[t] for t in tasks[:3]} == {"mlm": 1, "capitalization": 21, "token_document": 21}
    sentence_first = sorted(first_step[t] for t in tasks[3:])
    assert sentence_first[0] == 51 and sentence_first[1] <= 60, first_step
    # measured (2 ranks, seed 1234, 2026-12-04): mean of the first 10 against the last 10 values, mlm 7.91 -> 7.51,
    # capitalization 0.63 -> 0.37, token_document 0.64 -> 0.48
    assert_finite_and_falls(series(reference, "mlm_loss", stage0), "mlm_loss", 10, 0.25)
    for task in ("capitalization", "token_document"):
        assert_finite_and_falls(series(reference, f"{task}_loss", stage1), f"{task}_loss", 10, 0.05)
    assert_finished(straight, "ernie2", steps)

    # The time-limit warning (USR1 to the batch shell, as --signal=B:USR1@600 sends it) in stage 1.
    warned = tmp_path / "warned"
    job = submit(slurm_cluster, "ernie2_base.sh", tmp_path / "warned.out", RUN_DIR=str(warned), **env)
    with signal_lands_mid_run(slurm_cluster, job, warned, 30, signal.SIGUSR1):
        slurm_cluster.client("scancel", "--batch", "--signal=USR1", str(job))
    slurm_cluster.release_requeued(job)
    text = assert_completed(slurm_cluster, job, tmp_path / "warned.out")
    info = slurm_cluster.job(job)
    assert info["Restarts"] == "1" and info["ExitCode"] == "0:0", info
    assert "received SIGUSR1" in text and f"requeueing job {job}" in text, text[-6000:]
    assert "exited unexpectedly" not in text, text[-6000:]
    (at,) = resumed_at(text)
    assert 30 <= at < steps, text[-6000:]
    assert latest_step(warned) == steps
    resumed = records(warned)
    assert_same_steps(resumed, reference, ("loss",) + tuple(f"{t}_loss" for t in tasks))
