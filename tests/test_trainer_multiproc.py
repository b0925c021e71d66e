"""Real multi-process runs of trainer/pretrain.py (gloo, CPU fp32) with the stand-in components of
tests/test_trainer_standin.py: ZeRO stage equivalence, bit-identical resume after kill -9, resume on another world
size through DeepSpeed's universal checkpoint, preemption, the NaN guard, evaluation, plots.

The ranks are forks of a process that has imported torch and DeepSpeed, with torchrun's environment and rendezvous
(``run(..., launcher="fork")``, tests/fork_server.py): a rank's start-up as a new interpreter costs ~4 CPU-s and
torchrun's agent ~2, more than the few steps most of these runs take. What depends on the launcher uses the real one:
the kill -9 (torchrun tears the job down), the preemption signal (mpirun), and tests/test_preemption.py, the Slurm
tests. Runs are still shared between tests through module-scoped fixtures.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

import fork_server

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "test_trainer_standin.py"
SEVERAL = REPO / "tests" / "several_runs.py"
TIMEOUT = 240

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]  # each launch ~8 s alone, 20-40 s on a shared machine

BASE = {
    "seed": 5,
    "model": {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "dropout": 0.0},
    "data": {"corpora": [{"prefix": "unused-by-the-standin"}], "max_seq_length": 16},
    "objective": {"name": "standin"},
    "train": {"steps": 8, "global_batch_size": 8, "micro_batch_size": 2, "eval_every": 4, "eval_batches": 2},
    "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01, "grad_clip": 1.0},
    "schedule": {"kind": "linear", "warmup_steps": 2, "decay_steps": 8},
    "checkpoint": {"every_steps": 2, "keep_last": 2},
    "logging": {"every_steps": 1, "progress_bar": False, "tensorboard": False, "peak_tflops": 0.1},
    "deepspeed": {"config": str(REPO / "ds_configs" / "zero2.json")},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(tmp: Path, name: str, **sections) -> Path:
    raw = json.loads(json.dumps(BASE))
    for key, value in sections.items():
        if isinstance(value, dict):
            raw[key] = {**raw.get(key, {}), **value}
        else:
            raw[key] = value
    raw["run_dir"] = str(tmp / name)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def command(config: Path, nproc: int, *extra: str, launcher: str = "torchrun") -> list[str]:
    if nproc == 1:  # no launcher at all: the trainer makes its own 1-rank group
        return [sys.executable, str(STANDIN), "--config", str(config), *extra]
    if launcher == "mpirun":  # DeepSpeed discovers the MPI environment; mpirun passes a rank's exit status on
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(nproc), "-x",
                f"MASTER_PORT={_free_port()}", "-x", "PATH", sys.executable, str(STANDIN), "--config", str(config),
                *extra]
    # --standalone: torchrun binds a free port itself and keeps it (no probe-then-pass race with other jobs)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            str(STANDIN), "--config", str(config), *extra]


def run(config: Path, nproc: int = 2, *extra: str, expect: int | None = 0,
        launcher: str = "fork") -> subprocess.CompletedProcess:
    """One launch of the stand-in trainer. ``launcher="fork"``: the process (1 rank) or ranks are forks of a process
    that has imported torch and DeepSpeed, the ranks with torchrun's environment and rendezvous (tests/fork_server.py;
    ~4 CPU-s of imports and ~2 of torchrun's agent saved per rank and launch); ``"torchrun"``: torchrun itself, for
    what depends on the launcher (its teardown, signals, exit status)."""
    # One thread per process, as torchrun sets for its workers: two OpenMP threads on 2 shared cores stall at every
    # barrier while a neighbour holds a core.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if nproc == 1:  # no launcher at all: the trainer makes its own 1-rank group
        proc = fork_server.run(command(config, 1, *extra), cwd=REPO, env=env, timeout=TIMEOUT)
    elif launcher == "fork":
        proc = fork_server.run_ranks(command(config, 1, *extra), nproc, cwd=REPO, env=env, timeout=TIMEOUT)
    else:
        proc = subprocess.run(command(config, nproc, *extra, launcher=launcher), capture_output=True, text=True,
                              timeout=TIMEOUT, cwd=REPO, env=env)
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    # start-up noise known to be irrelevant is silenced in every rank (data_prep/known_noise.py, tests/test_known_noise.py)
    for noise in ("Transformer Engine and Apex are not installed", "Setting accelerator to CPU"):
        assert noise not in proc.stdout + proc.stderr, noise
    return proc


def run_several(runs: list[tuple], nproc: int = 2) -> subprocess.CompletedProcess:
    """Independent runs, each ``(config, *extra arguments)``, one after the other in one launch
    (tests/several_runs.py; ranks forked as in ``run``): one start-up for all of them."""
    from several_runs import joined
    args = joined([["--config", str(config), *extra] for config, *extra in runs])
    proc = fork_server.run_ranks([sys.executable, str(SEVERAL), *args], nproc, cwd=REPO,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=TIMEOUT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert [f"several_runs: run {k} exited 0" in proc.stdout for k in range(len(runs))] == [True] * len(runs)
    return proc


def records(run_dir: Path, split: str = "train") -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("split", "train") == split]


def losses(run_dir: Path) -> dict[int, float]:
    """Loss per step; a step logged twice (before a kill and after the resume) keeps its last record."""
    return {r["step"]: r["loss"] for r in records(run_dir)}


def samples_per_step(run_dir: Path) -> dict[int, list[int]]:
    """Global sample indices trained at each step, over all ranks; a step trained again after a resume counts
    only its last attempt (lines carry the writing process's pid)."""
    out: dict[int, list[int]] = {}
    for path in sorted(Path(run_dir).glob("samples_rank*.txt")):
        attempts: dict[int, dict[int, list[int]]] = {}
        for line in path.read_text().splitlines():
            pid, step, *idx = map(int, line.split())
            attempts.setdefault(step, {}).setdefault(pid, []).extend(idx)
        for step, by_pid in attempts.items():
            out.setdefault(step, []).extend(list(by_pid.values())[-1])
    return {s: sorted(i) for s, i in sorted(out.items())}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trainer")


LAMB = {"model": {"dropout": 0.1}, "optim": {"name": "lamb", "lr": 1e-2}, "checkpoint": {"keep_last": 4}}


@pytest.fixture(scope="module")
def first_runs(tmp) -> None:
    """The module's runs that start from nothing on 2 ranks, one after the other in one launch (tests/several_runs.py;
    four 2-rank runs: ~11 CPU-s in one launch against ~33 as four): the same 8 steps at ZeRO 0, 1, 2 and 3; the LAMB
    run and the LAMB run stopped at step 4 of test_lamb_resume_is_bit_identical; the first 3 steps of
    test_world_size_2_to_1_to_2_keeps_sample_order. What continues from them (resumes, other world sizes) starts
    new processes."""
    ds = {stage: {"config": str(REPO / "ds_configs" / f"zero{stage}.json")} for stage in (0, 1, 2, 3)}
    run_several([*((make_config(tmp, f"zero{stage}", deepspeed=ds[stage]),) for stage in (0, 1, 2, 3)),
                 (make_config(tmp, "lamb", **LAMB),),
                 (make_config(tmp, "lamb_resumed", **LAMB), "--set", "train.stop_at_step=4"),
                 (make_config(tmp, "elastic"), "--set", "train.steps=3")], 2)


@pytest.fixture(scope="module")
def zero_runs(tmp, first_runs) -> dict[int, Path]:
    """The same 8 steps on 2 ranks at ZeRO 0, 1, 2 and 3."""
    return {stage: tmp / f"zero{stage}" for stage in (0, 1, 2, 3)}


def test_zero_stages_match_stage0(zero_runs):
    ref = losses(zero_runs[0])
    assert sorted(ref) == list(range(1, 9))
    assert len(set(ref.values())) == 8  # the weights move
    for stage in (1, 2, 3):
        got = losses(zero_runs[stage])
        assert sorted(got) == sorted(ref)
        for step in ref:
            assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-6), (stage, step, got[step], ref[step])


def test_grad_norm_is_logged_at_every_stage(zero_runs):
    """ZeRO-0's DeepSpeed engine keeps no gradient norm (metrics.jsonl said null); the loop measures it there, the
    same norm (before clipping) as DeepSpeed's ZeRO-1/2 optimizers report for the same steps."""
    norms = {stage: [r["grad_norm"] for r in records(zero_runs[stage])] for stage in (0, 1, 2)}
    assert all(n is not None and n > 0 for n in norms[0]), norms[0]
    for stage in (1, 2):
        assert norms[0] == pytest.approx(norms[stage], rel=1e-4), (stage, norms)


def test_run_outputs_and_checkpoints(zero_runs):
    run_dir = zero_runs[2]
    recs = records(run_dir)
    for key in ("step", "loss", "lr", "tokens_per_s", "samples_per_s", "grad_norm", "mfu", "mlm_acc"):
        assert key in recs[-1], key
    assert recs[0]["lr"] == 0.0 and recs[2]["lr"] == pytest.approx(3e-3)  # warmup 2 steps, then linear decay
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "latest").read_text() == "global_step8"
    # keep_last=2: steps 2 and 4 were deleted once 6 and 8 were complete
    assert sorted(p.name for p in ckpts.glob("global_step*")) == ["global_step6", "global_step8"]
    state = json.loads((ckpts / "global_step8" / "bertfamily.json").read_text())
    assert state["step"] == 8 and state["consumed_samples"] == 64 and state["world_size"] == 2
    assert {p.name for p in (ckpts / "global_step8").glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}
    # the 8 sample positions of each step are the contract's [s*G, (s+1)*G)
    assert samples_per_step(run_dir) == {s: list(range((s - 1) * 8, s * 8)) for s in range(1, 9)}
    evals = records(run_dir, "eval")
    assert [r["step"] for r in evals] == [4, 8] and all(r["loss"] > 0 and "mlm_acc" in r for r in evals)
    proc = subprocess.run([sys.executable, "-m", "trainer.plot", str(run_dir)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("loss.png", "throughput.png"):
        png = run_dir / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_load_model_state_consolidates_every_stage(zero_runs):
    import torch

    from trainer.checkpoint import load_model_state
    states = {stage: load_model_state(zero_runs[stage] / "checkpoints") for stage in (0, 2, 3)}
    ref, config = states[0]
    assert config["model"]["hidden_size"] == 32
    for stage in (2, 3):
        sd, _ = states[stage]
        assert sorted(sd) == sorted(ref)
        for k in ref:
            torch.testing.assert_close(sd[k].float(), ref[k].float(), rtol=1e-4, atol=1e-5)


# The stand-in trainer whose rank 1 stops itself (SIGSTOP) when it starts writing the checkpoint of step
# STOP_AT_SAVE: the run cannot go on, whatever the load, until the test kills that rank (-9). Polling the log for a
# step and then killing raced the run: a test process starved for the last steps' ~0.5 s let the run finish first.
STOP_AT_SAVE = 6
STOPPING_RANK = f"""
import os, runpy, signal, sys
sys.path[:0] = [{str(REPO / "tests")!r}, {str(REPO)!r}]
import torch
real_save = torch.save

def save(obj, f, *args, **kwargs):
    if os.environ.get("RANK") == "1" and "global_step{STOP_AT_SAVE}" in str(f):
        os.kill(os.getpid(), signal.SIGSTOP)
    return real_save(obj, f, *args, **kwargs)

torch.save = save
runpy.run_path({str(STANDIN)!r}, run_name="__main__")
"""


def _kill_the_stopped_rank(proc: subprocess.Popen) -> None:
    """SIGKILL the rank that stopped itself (STOPPING_RANK) once it is stopped."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for worker in psutil.Process(proc.pid).children(recursive=True):
            try:
                if worker.status() == psutil.STATUS_STOPPED and worker.environ().get("RANK") == "1":
                    worker.send_signal(signal.SIGKILL)
                    return
            except psutil.Error:  # a process that ended meanwhile
                continue
        if proc.poll() is not None:
            pytest.fail(f"run ended before rank 1 stopped at step {STOP_AT_SAVE}'s save: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for rank 1 to stop at step {STOP_AT_SAVE}'s save")


def test_kill9_one_rank_then_resume_is_bit_identical(tmp, zero_runs):
    """torch AdamW, ZeRO-2, gradient accumulation 2; the uninterrupted run is the ZeRO-2 one. Rank 1 is killed (-9)
    while writing the checkpoint of step 6 (stopped there by STOPPING_RANK, so the kill lands at the same point
    whatever the load): the resume starts from step 4's checkpoint, redoes steps 5 and 6 that the killed run had
    logged, and gives the uninterrupted run's losses bit for bit. (RNG restore, with dropout on, is checked bit for
    bit by the LAMB resume test.)"""
    ref_dir = zero_runs[2]
    cfg = make_config(tmp, "kill")
    script = tmp / "stopping_rank.py"
    script.write_text(STOPPING_RANK)
    cmd = [str(script) if c == str(STANDIN) else c for c in command(cfg, 2)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        _kill_the_stopped_rank(proc)
        assert proc.wait(timeout=TIMEOUT) != 0  # torchrun tears the job down and fails
    finally:
        if proc.poll() is None:
            proc.kill()
    assert max(losses(tmp / "kill")) == STOP_AT_SAVE  # the killed run trained past its last complete checkpoint
    assert (tmp / "kill" / "checkpoints" / "latest").read_text() == "global_step4"
    resumed = run(cfg, 2, "--resume", "auto")
    assert "resumed from" in resumed.stdout and "global_step4" in resumed.stdout, resumed.stdout[-3000:]
    ref, got = losses(ref_dir), losses(tmp / "kill")
    assert sorted(ref) == list(range(1, 9))  # the reference is the whole run (not a vacuous comparison)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == ref[step], (step, got[step], ref[step])  # bit-identical, not approximately
    assert samples_per_step(tmp / "kill") == samples_per_step(ref_dir)


def test_lamb_resume_is_bit_identical(tmp, first_runs):
    """Our LAMB under ZeRO-2 (per-parameter trust ratios over partitions), dropout on: 8 steps in one run, against
    a second run stopped after step 4 by train.stop_at_step (checkpoint, status "stopped", schedule of 8 steps kept)
    and continued with --resume auto in a new launch. (The first two: ``first_runs``.)"""
    cfg = tmp / "lamb_resumed.yaml"
    status = json.loads((tmp / "lamb_resumed" / "status.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 4)
    resumed = run(cfg, 2, "--resume", "auto")
    assert "resumed from" in resumed.stdout
    ref, got = losses(tmp / "lamb"), losses(tmp / "lamb_resumed")
    assert sorted(got) == list(range(1, 9))
    for step in got:
        assert got[step] == ref[step], (step, got[step], ref[step])


def test_world_size_2_to_1_to_2_keeps_sample_order(tmp, zero_runs):
    """2 ranks for 3 steps (``first_runs``), 1 rank to step 6, 2 ranks to step 8: universal conversion at each
    change."""
    cfg = tmp / "elastic.yaml"
    one = run(cfg, 1, "--set", "train.steps=6")
    assert "converting to DeepSpeed's universal checkpoint for 1" in one.stdout
    two = run(cfg, 2)
    assert "converting to DeepSpeed's universal checkpoint for 2" in two.stdout
    assert (tmp / "elastic" / "checkpoints" / "global_step6" / "universal" / ".complete").exists()
    ref, got = losses(zero_runs[2]), losses(tmp / "elastic")
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-5), (step, got[step], ref[step])
    assert samples_per_step(tmp / "elastic") == samples_per_step(zero_runs[2])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_preemption_signal_saves_and_exits_for_requeue(tmp):
    """Under mpirun: SIGUSR1 to ONE rank; both agree (all-reduced flag), save at the next step boundary, exit 75.
    Then the same command with train.stop_at_step at the saved step: a successful mpirun launch exits 0 (each rank
    finalizes the MPI that DeepSpeed's discovery initialised; without it mpirun reports 1)."""
    cfg = make_config(tmp, "preempt", train={"steps": 400}, checkpoint={"every_steps": 0},
                      schedule={"decay_steps": None})  # (BASE's decay ends at step 8: refused for a longer run)
    proc = subprocess.Popen(command(cfg, 2, launcher="mpirun"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        deadline = time.time() + TIMEOUT
        while not ((tmp / "preempt" / "metrics.jsonl").exists() and records(tmp / "preempt")):
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "python" in c.name()]
        workers[0].send_signal(signal.SIGUSR1)
        stderr = proc.communicate(timeout=TIMEOUT)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, stderr[-3000:]
    status = json.loads((tmp / "preempt" / "status.json").read_text())
    assert status["status"] == "preempted" and 0 < status["step"] < 400
    latest = (tmp / "preempt" / "checkpoints" / "latest").read_text()
    assert latest == f"global_step{status['step']}"
    assert (tmp / "preempt" / "checkpoints" / latest / "bertfamily.json").exists()
    done = subprocess.run(command(cfg, 2, "--set", f"train.stop_at_step={status['step']}", launcher="mpirun"),
                          capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp / "preempt" / "status.json").read_text())["status"] == "stopped"


def test_nan_guard_skips_then_stops_with_a_clear_message(tmp):
    """One process, no launcher. Losses turn NaN from step 4: steps are skipped (weights untouched), and after 3 in
    a row the run stops with exit status 3 and a message naming the step. No checkpoint is saved while the streak is
    open (steps 4 and 5 are due), so keep-last pruning never drops a good one for them, and the message names the
    last one saved before it (step 3) to resume from."""
    cfg = make_config(tmp, "nan", objective={"options": {"nan_after_step": 3}},
                      train={"steps": 20, "max_nonfinite_in_a_row": 3}, checkpoint={"every_steps": 1, "keep_last": 10},
                      schedule={"decay_steps": None}, deepspeed={"config": str(REPO / "ds_configs" / "zero0.json")})
    proc = run(cfg, 1, expect=3)
    out = proc.stdout + proc.stderr
    assert "stopping at step 6" in out and "optim.lr" in out
    assert f"--resume {tmp / 'nan' / 'checkpoints' / 'global_step3'} " in out, out[-2000:]
    assert "step 4: checkpoint not saved" in out
    recs = records(tmp / "nan")
    assert [r["skipped"] for r in recs] == [0, 0, 0, 1, 2, 3]
    # strict JSON (no NaN/Infinity literals): a non-finite value is null; trainer.plot draws the run still
    def strict(name):
        raise ValueError(f"{name} in metrics.jsonl")
    lines = (tmp / "nan" / "metrics.jsonl").read_text().splitlines()
    train = [r for r in (json.loads(line, parse_constant=strict) for line in lines) if "split" not in r]
    assert [r["loss"] is None for r in train] == [False] * 3 + [True] * 3
    from trainer.plot import plot
    assert all(p.exists() for p in plot(tmp / "nan"))
    assert json.loads((tmp / "nan" / "status.json").read_text())["status"] == "nonfinite"
    import torch

    from trainer.checkpoint import load_model_state
    state, _ = load_model_state(tmp / "nan" / "checkpoints" / "global_step3")
    assert all(torch.isfinite(v).all() for v in state.values())
    step2, _ = load_model_state(tmp / "nan" / "checkpoints" / "global_step2")
    assert any(not torch.equal(step2[k], state[k]) for k in state)  # the trained steps moved the weights
    assert sorted(p.name for p in (tmp / "nan" / "checkpoints").glob("global_step*")) == \
        ["global_step1", "global_step2", "global_step3"]
    assert (tmp / "nan" / "checkpoints" / "latest").read_text() == "global_step3"


def test_the_checkpoint_that_ends_a_launch_is_saved_during_a_nan_streak_and_keeps_the_one_before(tmp):
    """The last step is non-finite (a streak of 1, under the limit): the run completes. Periodic saves wait for the
    streak's end, but the final one (like stop_at_step's and a preemption's) is saved: without it a completed run had
    no checkpoint of its last step (phase 2 and exports took an older one, a stop_at_step relaunch redid the same
    steps forever). That save keeps one more than keep_last, so the checkpoint before the streak survives it."""
    cfg = make_config(tmp, "nan_end", objective={"options": {"nan_after_step": 4}},
                      train={"steps": 5, "max_nonfinite_in_a_row": 3}, checkpoint={"every_steps": 2, "keep_last": 2},
                      deepspeed={"config": str(REPO / "ds_configs" / "zero0.json")})
    proc = run(cfg, 1, expect=0)
    assert "final checkpoint saved during a NaN/Inf streak of 1 step(s)" in proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp / "nan_end" / "checkpoints").glob("global_step*")) == \
        ["global_step2", "global_step4", "global_step5"]
    assert json.loads((tmp / "nan_end" / "status.json").read_text())["status"] == "completed"


def test_a_nan_streak_cut_by_the_end_of_a_launch_goes_on_counting_after_the_resume(tmp):
    """Steps 4 and 5 are non-finite and the launch ends at step 5 (stop_at_step, as a preemption would): its save
    records the streak. The resumed launch's first step is non-finite too: 3 in a row, the guard stops at step 6.
    Before, the count restarted at the resume and the run went on to step 8 (review)."""
    cfg = make_config(tmp, "nan_cut", objective={"options": {"nan_after_step": 3}},
                      train={"steps": 20, "max_nonfinite_in_a_row": 3, "stop_at_step": 5},
                      checkpoint={"every_steps": 2, "keep_last": 2}, schedule={"decay_steps": None},
                      deepspeed={"config": str(REPO / "ds_configs" / "zero0.json")})
    run(cfg, 1, expect=0)
    from trainer.checkpoint import read_state
    assert read_state(tmp / "nan_cut" / "checkpoints" / "global_step5")["nonfinite_in_a_row"] == 2
    # the stand-in counts its NaN steps per process: from the resumed launch's first step on
    proc = run(cfg, 1, "--set", "train.stop_at_step=null", "--set", "objective.options.nan_after_step=0", expect=3)
    assert "stopping at step 6" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]


def test_the_checkpoint_before_a_streak_survives_saves_during_it_across_launches_and_is_named(tmp):
    """keep_last 1, every_steps 4: launch A saves 4 and (stop_at_step) 5, the last good one, off-schedule. Launch B is
    non-finite from its first step and its stop_at_step save (7) falls in the streak: pruning deleted 5 although the
    log said it was kept, and launch C's guard named 7, saved during the streak (review of the day's diff). Now 5 is
    protected while the streak is open, and C's message names it."""
    cfg = make_config(tmp, "streak", train={"steps": 20, "max_nonfinite_in_a_row": 3, "stop_at_step": 5,
                                             "eval_every": 0},
                      checkpoint={"every_steps": 4, "keep_last": 1}, schedule={"decay_steps": None},
                      deepspeed={"config": str(REPO / "ds_configs" / "zero0.json")})
    root = tmp / "streak" / "checkpoints"
    run(cfg, 1, expect=0)
    proc = run(cfg, 1, "--set", "train.stop_at_step=7", "--set", "objective.options.nan_after_step=0", expect=0)
    assert f"the checkpoint before it, {root / 'global_step5'}, is kept" in proc.stdout + proc.stderr
    assert sorted(p.name for p in root.glob("global_step*")) == ["global_step4", "global_step5", "global_step7"]
    proc = run(cfg, 1, "--set", "train.stop_at_step=null", "--set", "objective.options.nan_after_step=0", expect=3)
    out = proc.stdout + proc.stderr
    assert "stopping at step 8" in out and f"--resume {root / 'global_step5'}" in out, out[-2000:]


def test_status_names_the_last_step_of_a_failed_run(tmp):
    """One process, no launcher: the data fails at step 5. status.json said 'failed' at step -1 whatever the run had
    done; it names the last completed step (4). While running, it follows the checkpoint saves (trainer.loop
    Trainer.save; checked without a run in test_a_save_updates_the_running_status)."""
    cfg = make_config(tmp, "fails", objective={"options": {"fail_at_step": 5}}, train={"steps": 8, "eval_every": 0},
                      deepspeed={"config": str(REPO / "ds_configs" / "zero0.json")})
    proc = run(cfg, 1, expect=1)
    assert "stand-in failure at step 5" in proc.stderr
    status = json.loads((tmp / "fails" / "status.json").read_text())
    assert (status["status"], status["step"]) == ("failed", 4), status


def test_a_save_updates_the_running_status(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from trainer import checkpoint
    from trainer.loop import Trainer

    monkeypatch.setattr(checkpoint, "save", lambda *a, **k: tmp_path / "checkpoints" / "global_step6")
    cfg = SimpleNamespace(run_dir=str(tmp_path), checkpoint=SimpleNamespace(dir=None, keep_last=2),
                          train=SimpleNamespace(steps=10), model_dump=lambda mode: {})
    said = []
    fake = SimpleNamespace(cfg=cfg, state=SimpleNamespace(step=6), engine=None, rank=0, world_size=1, run_id="x",
                           fence=None, last_checkpoint=None, nonfinite_streak=0, save_seconds=0.0,
                           metrics=SimpleNamespace(message=said.append))
    assert Trainer.save(fake) == tmp_path / "checkpoints" / "global_step6"
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["status"], status["step"]) == ("running", 6)
    # a status file that cannot be written (a transient NFS or quota error) after a good checkpoint is said, not
    # raised: rank 0 alone leaving the loop left the other ranks in the next step's collective
    (tmp_path / "status.tmp").mkdir()  # write_status's temporary file: writing it fails with IsADirectoryError
    fake.state.step = 8
    assert Trainer.save(fake) == tmp_path / "checkpoints" / "global_step6"
    warned = [line for line in said if "could not update" in line]  # (each save also says its duration)
    assert len(warned) == 1 and "step 8" in warned[0], said
    assert [line.split(":")[0] for line in said if "checkpoint saved" in line] == ["step 6", "step 8"], said
    # a second save() of the same step (a downstream step on a periodic save) returns the checkpoint, saying and
    # timing nothing (a fence read and a broadcast took 0.5-7 ms, read as a save by a "> 1 ms" rule before)
    (tmp_path / "status.tmp").rmdir()
    fake.save_seconds = 0.0
    Trainer.save(fake)
    assert [line for line in said if "checkpoint saved" in line][-1].startswith("step 8") and \
        sum("checkpoint saved" in line for line in said) == 2 and fake.save_seconds == 0.0, said
