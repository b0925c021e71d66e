"""The training templates of slurm/ submitted to the local two-node Slurm cluster (tests/slurm_cluster.py), each node
running one gloo rank on CPU (fp32) through the template's own srun + torchrun launch, with tiny configs:

- slurm/roberta_large.sh, tiny RoBERTa, ZeRO-1, 2 loader workers per rank (the production setting): losses fall and
  a checkpoint is written; the same run preempted with `scontrol requeue` mid-run, then cancelled with `scancel` and
  resubmitted, saves (status `preempted`) and resumes each time, and ends with the uninterrupted run's losses. Both deliver SIGTERM to every process of the job, loader workers included, as slurmd does at preemption;
  the uninterrupted run is made once for the module (``roberta_reference``);
- slurm/albert_xxlarge.sh, tiny ALBERT (SOP + n-gram masking) with LAMB under ZeRO-1, with a rank killed on one
  node: the job fails within a bounded time with the template's message naming the last complete checkpoint, and
  resubmitting the same command resumes from that checkpoint;
- slurm/bert_base.sh, both phases in one job, phase 2 starting from phase 1's weights, with the time-limit warning
  (USR1 to the batch shell, forwarded to every rank's process group, loader workers included) in phase 1:
  checkpoint, self-requeue, resume.

Each launch costs ~30 s here (two ranks importing torch/DeepSpeed on a shared 2-core machine), so runs are few and
short, and every test checks all that its launches allow.
"""
from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml

from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slurm, pytest.mark.slow, pytest.mark.multiproc,
]
JOB_TIMEOUT = 300
VOCAB = 1024  # the tiny presets' vocabulary; the test tokenizer is trained to exactly this size
# EXTRA_SETS for the recipes' production loader setting (the tiny recipes use 0 workers)
LOADER = "data.num_workers=2"


@pytest.fixture(scope="module")
def corpus(en_corpus, tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer of the tiny presets' size and indexed shards of the corpus's first documents."""
    from data_prep import build_indexed, train_tokenizer

    tmp = tmp_path_factory.mktemp("data")
    lines = en_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:6000]
    while lines and lines[-1].strip():  # end at a document boundary (blank line)
        lines.pop()
    text = tmp / "en.txt"
    text.write_text("".join(lines), encoding="utf-8")
    assert train_tokenizer.main(["--kind", "bbpe", "--input", str(text), "--output", str(tmp / "tok"),
                                 "--vocab-size", str(VOCAB), "--quiet"]) == 0
    prefix = tmp / "corpus" / "en"
    assert build_indexed.main(["--input", str(text), "--tokenizer", str(tmp / "tok"), "--output-prefix",
                               str(prefix)]) == 0
    return prefix


def sets(**values) -> str:
    """EXTRA_SETS for a template: ``sets(train__steps=30)`` -> "train.steps=30"."""
    return " ".join(f"{k.replace('__', '.')}={v}" for k, v in values.items())


def submit(cluster, template: str, log: Path, nodes: int = 2, **env: str) -> int:
    """sbatch a template the way a user does (from the repo root), with the test cluster's sizes: 2 nodes (fewer for
    a cluster that has lost one), no GPUs."""
    env = {"RDZV_TIMEOUT": "120", "SAVE_TIMEOUT": "60", **env}
    return cluster.sbatch(REPO / "slurm" / template, f"--nodes={nodes}", "--gpus-per-node=0", "--time=30:00",
                          f"--output={log}", cwd=REPO, env=env)


def records(run_dir: Path) -> dict[int, dict]:
    """step -> the training record of metrics.jsonl (a resumed run appends; the last record of a step wins)."""
    out = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec.get("split", "train") == "train" and "loss" in rec:
            out[rec["step"]] = rec
    return out


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss (``records``)."""
    return {step: rec["loss"] for step, rec in records(run_dir).items()}


def wait_for_steps(run_dir: Path, n: int, cluster, job: int, timeout: float = JOB_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while len(losses(run_dir)) < n:
        if time.monotonic() > deadline or cluster.job(job).get("JobState") not in ("PENDING", "RUNNING"):
            raise AssertionError(f"job {job} did not reach {n} logged steps: {cluster.job(job).get('JobState')}\n"
                                 + cluster.job_output(job))
        time.sleep(0.3)


def job_ranks(cluster, node_id: str | None = None) -> list[psutil.Process]:
    """The training ranks of this cluster's running job (on node ``node_id`` only, if given): the children of the
    nodes' torchrun, not their loader workers (forks of a rank, with its command line and environment)."""
    def is_rank(cmd, env):
        return ("RANK" in env and "pretrain.py" in cmd and "torchrun" not in cmd
                and node_id in (None, env.get("SLURM_NODEID")))

    ranks = []
    for proc in cluster.processes(is_rank):
        with contextlib.suppress(psutil.Error):
            if "torchrun" in " ".join(proc.parent().cmdline()):
                ranks.append(proc)
    return ranks


def _state(proc: psutil.Process) -> tuple[str, int]:
    """(state letter, pending-signal mask) from /proc/PID/status ("gone" when the process has exited)."""
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
    except OSError:
        return "gone", 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return fields["State"].split()[0], int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


@contextlib.contextmanager
def signal_lands_mid_run(cluster, job: int, run_dir: Path, step: int, signum: int, ranks: int = 2,
                         timeout: float = JOB_TIMEOUT):
    """Stop (SIGSTOP) the job's ranks once ``run_dir`` has logged ``step``, run the block (which sends ``signum``
    to the job), and continue them (SIGCONT) once ``signum`` is pending in every rank, or once Slurm has continued
    them itself (a job termination sends SIGCONT before SIGTERM). A rank then takes the signal within a step or two
    of ``step``, whatever the load.

    Why: the signal otherwise raced the run. A tiny step takes 25-60 ms, and the signal ~1 s to go from the batch
    shell through srun and torchrun to the ranks; in a CI run with three xdist workers (2026-12-05) the BERT
    template's phase 1 (20 steps) finished before the time-limit warning reached it. The ranks are found while
    they start, so that stopping them costs no process scan after ``step``. Stopping a process is not something
    Slurm does here: it stands for a step still running when the signal comes."""
    deadline = time.monotonic() + timeout
    checked = 0.0
    procs: list[psutil.Process] = []
    while len(procs) != ranks or max(losses(run_dir), default=0) < step:
        now = time.monotonic()
        if now - checked > 1.0:  # scontrol and a process scan: about once a second, not at every poll
            checked = now
            state = cluster.job(job).get("JobState")
            assert now < deadline and state in ("PENDING", "RUNNING"), (
                f"job {job} did not reach step {step} with {ranks} ranks: {state}, {procs}\n" + cluster.job_output(job))
            if len(procs) != ranks:
                procs = job_ranks(cluster)
        time.sleep(0.01)
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        while any(_state(proc)[0] not in ("T", "t", "gone") for proc in procs):
            time.sleep(0.005)
        yield
        while any(state in ("T", "t") and not pending >> (signum - 1) & 1
                  for state, pending in map(_state, procs)):
            assert time.monotonic() < deadline, f"signal {signum} never reached the ranks {procs}"
            time.sleep(0.02)
    finally:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)


def latest_step(run_dir: Path) -> int | None:
    latest = run_dir / "checkpoints" / "latest"
    return int(latest.read_text().strip().removeprefix("global_step")) if latest.exists() else None


def assert_completed(cluster, job: int, log: Path) -> str:
    info = cluster.wait_job(job, JOB_TIMEOUT)
    text = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", f"{info.get('JobState')} {info.get('ExitCode')}\n{text[-6000:]}"
    return text


def assert_falls(run: dict[int, float], window: int = 5) -> None:
    steps = sorted(run)
    first = sum(run[s] for s in steps[:window]) / window
    last = sum(run[s] for s in steps[-window:]) / window
    assert last < first - 0.02, f"loss did not fall: first {first:.4f}, last {last:.4f} ({run})"


def resumed_at(text: str) -> list[int]:
    """The steps the trainer reports resuming at ("resumed from DIR at step K ...")."""
    return [int(line.split(" at step ")[1].split()[0]) for line in text.splitlines()
            if "resumed from" in line and " at step " in line]


ROBERTA_STEPS = 40  # stopped at step 3 and two steps past the resume (signal_lands_mid_run), then run to the end


@pytest.fixture(scope="module")
def roberta_env(corpus) -> dict[str, str]:
    """The recipe's own data format (full-sentences, as roberta_base), dropout on (the recipe's 0.1: a resumed run
    continues the uninterrupted run's RNG streams), periodic checkpoints off (a resumed run must come from the
    checkpoint the stop signal made), 2 loader workers per rank."""
    return {"CONFIG": "tiny_roberta", "DATA_PREFIX": str(corpus),
            "EXTRA_SETS": sets(train__steps=ROBERTA_STEPS, checkpoint__every_steps=0, logging__every_steps=1) + " "
            + LOADER}


@pytest.fixture(scope="module")
def roberta_reference(slurm_cluster, roberta_env, tmp_path_factory) -> dict[int, float]:
    """The uninterrupted run, once for the module: its losses per step."""
    tmp = tmp_path_factory.mktemp("roberta")
    straight = tmp / "straight"
    job = submit(slurm_cluster, "roberta_large.sh", tmp / "straight.out", RUN_DIR=str(straight), **roberta_env)
    text = assert_completed(slurm_cluster, job, tmp / "straight.out")
    reference = losses(straight)
    assert sorted(reference) == list(range(1, ROBERTA_STEPS + 1)), reference
    assert_falls(reference)
    assert "ZeRO stage 1" in text and "world size 2" in text, text[-4000:]
    assert latest_step(straight) == ROBERTA_STEPS
    assert json.loads((straight / "status.json").read_text())["status"] == "completed"
    # One torchrun per node, each rank's output in its own file.
    rank_logs = sorted((straight / "logs").glob("job*-restart0/node*/*/attempt_0/0/stderr.log"))
    assert len(rank_logs) == 2, rank_logs
    resolved = json.loads(next((straight / "logs").glob("job*-restart0/config.json")).read_text())
    assert resolved["data"]["num_workers"] == 2
    return reference


def assert_same_losses(run_dir: Path, reference: dict[int, float]) -> None:
    """Every step's loss equals the uninterrupted run's (torch AdamW under ZeRO-1 resumes bit-identically; the
    tolerance covers only the rounding of metrics.jsonl)."""
    resumed = losses(run_dir)
    assert sorted(resumed) == sorted(reference)
    for step in sorted(reference):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), (step, resumed, reference)


def test_roberta_large_template_resumes_after_a_requeue_and_after_scancel_and_resubmission_to_the_same_losses(
        slurm_cluster, roberta_env, roberta_reference, tmp_path):
    """One run of the template stopped the two ways a cluster stops a job, each resumed from the checkpoint the stop
    signal made (periodic checkpoints are off), ending with the uninterrupted run's losses at every step:

    1. `scontrol requeue JOB` after step 2, as a preemption with PreemptMode=REQUEUE: slurmd sends SIGTERM to every
       process of the job, loader workers included; the ranks save (status `preempted`), Slurm requeues the job and it
       resumes mid-run.
    2. `scancel JOB` two steps into the requeued run: SIGTERM to every process (as a preemption with
       PreemptMode=CANCEL) and SIGKILL after KillWait, no requeue. The ranks save and exit 75 within KillWait, the job
       ends CANCELLED, status.json says `preempted`; the same command submitted again resumes from that checkpoint.
       (Not `scancel --signal=TERM --full`: srun, sent SIGTERM outside a job termination, kills its step at once,
       "srun: forcing job termination"; docs/cluster_operations.md says to use `--signal=USR1 --batch` to ask for a
       save.)

    (Two tests with a launch each more before 2026-12-05, one per stop.)"""
    run = tmp_path / "run"
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "first.out", RUN_DIR=str(run), **roberta_env)
    with signal_lands_mid_run(slurm_cluster, job, run, 2, signal.SIGTERM):
        slurm_cluster.client("scontrol", "requeue", str(job))  # SIGTERM to every process of the job, a preemption
    slurm_cluster.release_requeued(job)
    # the requeued job: two steps past its resume, then cancelled
    deadline = time.monotonic() + JOB_TIMEOUT
    while not (resumed := resumed_at((tmp_path / "first.out").read_text(errors="replace"))):
        state = slurm_cluster.job(job).get("JobState")
        assert time.monotonic() < deadline and state in ("PENDING", "RUNNING", "REQUEUED"), (
            state, (tmp_path / "first.out").read_text(errors="replace")[-6000:])
        time.sleep(0.1)
    with signal_lands_mid_run(slurm_cluster, job, run, resumed[0] + 2, signal.SIGTERM):
        slurm_cluster.client("scancel", str(job))
    info = slurm_cluster.wait_job(job, JOB_TIMEOUT)
    text = (tmp_path / "first.out").read_text(errors="replace")
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "1", (info, text[-6000:])
    assert "stopped by SIGTERM" in text and "restart 1" in text, text[-6000:]
    assert "exited unexpectedly" not in text, text[-6000:]  # the loader workers ignored the signal both times
    (first,) = resumed  # the requeued run resumed mid-run from the checkpoint the requeue's SIGTERM made
    assert 2 <= first < ROBERTA_STEPS, text[-6000:]
    assert f"preempted at step {first}: checkpoint saved" in text, text[-6000:]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "preempted", (status, text[-6000:])  # old code: the workers died, status "failed"
    second = status["step"]
    assert first + 2 <= second < ROBERTA_STEPS and latest_step(run) == second, (first, second, latest_step(run))

    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "again.out", RUN_DIR=str(run), **roberta_env)
    text = assert_completed(slurm_cluster, job, tmp_path / "again.out")
    assert resumed_at(text) == [second], text[-6000:]
    assert_same_losses(run, roberta_reference)


def test_bad_settings_fail_before_any_node_starts(slurm_cluster, corpus, tmp_path):
    """A misspelt key or a missing corpus ends the job on the batch host with a message naming it; no rank runs."""
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "key.out", CONFIG="tiny_roberta",
                 DATA_PREFIX=str(corpus), RUN_DIR=str(tmp_path / "key"), EXTRA_SETS="optim.lrr=1e-3")
    info = slurm_cluster.wait_job(job, JOB_TIMEOUT)
    text = (tmp_path / "key.out").read_text()
    assert info["JobState"] == "FAILED" and "optim.lrr" in text and "nothing was launched" in text, text
    assert not list((tmp_path / "key").glob("logs/*/node*")), "a rank was started"

    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "data.out", CONFIG="tiny_roberta",
                 DATA_PREFIX=str(tmp_path / "nowhere" / "corpus"), RUN_DIR=str(tmp_path / "data"))
    info = slurm_cluster.wait_job(job, JOB_TIMEOUT)
    text = (tmp_path / "data.out").read_text()
    assert info["JobState"] == "FAILED" and f"no {tmp_path}/nowhere/corpus.manifest.json" in text, text


def test_albert_xxlarge_template_with_lamb_survives_a_killed_rank(slurm_cluster, corpus, tmp_path):
    """Tiny ALBERT (SOP + n-gram masking, LAMB under ZeRO-1). One node's rank is killed: the job fails within a
    bounded time with the template's message naming the last complete checkpoint; resubmitting the same command
    resumes from that checkpoint and finishes, with the loss falling over the whole run."""
    steps = 24
    run = tmp_path / "albert"
    env = {"CONFIG": "tiny_albert", "DATA_PREFIX": str(corpus), "RUN_DIR": str(run),
           "EXTRA_SETS": sets(train__steps=steps, checkpoint__every_steps=4, logging__every_steps=1, optim__lr=1e-2)}
    job = submit(slurm_cluster, "albert_xxlarge.sh", tmp_path / "first.out", **env)
    wait_for_steps(run, 5, slurm_cluster, job)
    victims = job_ranks(slurm_cluster, node_id="1")
    assert len(victims) == 1, victims
    # Kill one or two steps after a checkpoint (every 4 steps), so that the killed run has done steps past its last
    # checkpoint that the resubmission must redo; polled tightly: a step takes longer than this loop.
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        saved, done = latest_step(run), max(losses(run))
        if saved is not None and saved >= 4 and done > saved and done % 4 in (1, 2):
            break
        assert time.monotonic() < deadline, (saved, done)
        time.sleep(0.01)
    victims[0].kill()
    # the job ends after the cluster's KillWait (30 s), not after a collective timeout: wait_job raises past 120 s
    info = slurm_cluster.wait_job(job, 120)
    text = (tmp_path / "first.out").read_text(errors="replace")
    assert info["JobState"] == "FAILED", text[-5000:]
    assert "TRAINING FAILED" in text and "n2: task 1" in text, text[-5000:]
    last = latest_step(run)
    assert last is not None and last >= saved and last < steps
    assert f"Last complete checkpoint: {run}/checkpoints/global_step{last}" in text, text[-3000:]
    resolved = json.loads(next((run / "logs").glob("job*-restart0/config.json")).read_text())
    assert resolved["optim"]["name"] == "lamb" and resolved["objective"]["name"] == "mlm+sop"
    assert resolved["data"]["masking"]["strategy"] == "ngram" and resolved["train"]["steps"] == steps
    before = losses(run)

    job = submit(slurm_cluster, "albert_xxlarge.sh", tmp_path / "again.out", **env)
    text = assert_completed(slurm_cluster, job, tmp_path / "again.out")
    assert resumed_at(text) == [last], text[-5000:]
    assert "ZeRO stage 1" in text and latest_step(run) == steps
    run_losses = losses(run)
    assert sorted(run_losses) == list(range(1, steps + 1))
    assert_falls(run_losses)
    # Steps the killed run had done past its checkpoint were redone with the same losses (exact resume under LAMB).
    redone = [s for s in before if s > last]
    assert redone, before
    for step in redone:
        assert run_losses[step] == pytest.approx(before[step], rel=1e-6, abs=1e-7), (step, before, run_losses)


def test_bert_base_template_runs_both_phases_across_a_time_limit_requeue(slurm_cluster, corpus, tmp_path):
    """Phase 1 (tiny BERT, seq 32) then phase 2 (seq 64) in one job, phase 2 from phase 1's weights. In phase 1 the
    batch shell gets the time-limit warning (USR1, as --signal=B:USR1@600 sends it): the ranks checkpoint, the job
    requeues itself, resumes phase 1 where it stopped and goes on to phase 2."""
    phase1 = tmp_path / "phase1.yaml"
    phase1.write_text(yaml.safe_dump({"base": "tiny_bert", "data": {"max_seq_length": 32}, "train": {"steps": 20}}))
    phase2 = tmp_path / "phase2.yaml"
    phase2.write_text(yaml.safe_dump({"base": "tiny_bert", "data": {"max_seq_length": 64}, "train": {"steps": 6}}))
    run = tmp_path / "bert"
    job = submit(slurm_cluster, "bert_base.sh", tmp_path / "bert.out", PHASE1_CONFIG=str(phase1),
                 PHASE2_CONFIG=str(phase2), DATA_PREFIX=str(corpus), RUN_DIR=str(run),
                 EXTRA_SETS=sets(checkpoint__every_steps=0, logging__every_steps=1, optim__lr=2e-3) + " " + LOADER)
    with signal_lands_mid_run(slurm_cluster, job, run / "phase1", 2, signal.SIGUSR1):
        slurm_cluster.client("scancel", "--batch", "--signal=USR1", str(job))
    slurm_cluster.release_requeued(job)
    text = assert_completed(slurm_cluster, job, tmp_path / "bert.out")
    assert slurm_cluster.job(job)["Restarts"] == "1"
    assert "received SIGUSR1" in text and f"requeueing job {job}" in text, text[-6000:]
    assert "exited unexpectedly" not in text, text[-6000:]  # the loader workers ignored the forwarded USR1
    (at,) = resumed_at(text)  # phase 1 resumed mid-run; phase 2 started fresh from phase 1's weights
    assert 2 <= at < 20, text[-6000:]
    one, two = losses(run / "phase1"), losses(run / "phase2")
    assert sorted(one) == list(range(1, 21)) and sorted(two) == list(range(1, 7)), (one, two)
    assert latest_step(run / "phase1") == 20 and latest_step(run / "phase2") == 6
    assert f"initialised from {run}/phase1/checkpoints/global_step20" in text, text[-5000:]
    for phase, seq in (("phase1", 32), ("phase2", 64)):
        resolved = json.loads(next((run / phase / "logs").glob("job*-restart*/config.json")).read_text())
        assert resolved["data"]["max_seq_length"] == seq
    # Phase 2 starts from phase 1's weights, not from scratch: its first loss is well below phase 1's first (a fresh
    # tiny model starts near ln(vocab)).
    assert_falls(one)
    assert two[1] < one[1] - 0.05, (one, two)


def test_a_job_submitted_with_resume_rolls_back_to_that_checkpoint(slurm_cluster, corpus, tmp_path):
    """`sbatch slurm/roberta_large.sh --resume RUN/checkpoints/global_step4` on the two-node cluster: the template's
    own `--resume auto` came after the job's arguments and won, so the job continued from the newest checkpoint and
    never rolled back (found by review). Now the launch resumes step 4, the newer checkpoints are moved aside, and the
    rolled-back steps repeat the first run's losses (same settings, bit-identical resume). The requeue of such a job
    (continue, not roll back again) is tested with fakes in tests/test_lineage.py."""
    env = {"CONFIG": "tiny_roberta", "DATA_PREFIX": str(corpus),
           "EXTRA_SETS": sets(train__steps=8, checkpoint__every_steps=4, checkpoint__keep_last=5,
                              logging__every_steps=1) + " " + LOADER}
    run = tmp_path / "run"
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "first.out", RUN_DIR=str(run), **env)
    assert_completed(slurm_cluster, job, tmp_path / "first.out")
    first = losses(run)
    target = run / "checkpoints" / "global_step4"
    job = slurm_cluster.sbatch(REPO / "slurm" / "roberta_large.sh", "--nodes=2", "--gpus-per-node=0", "--time=30:00",
                               f"--output={tmp_path / 'again.out'}", args=("--resume", str(target)), cwd=REPO,
                               env={"RDZV_TIMEOUT": "120", "SAVE_TIMEOUT": "60", "RUN_DIR": str(run), **env})
    text = assert_completed(slurm_cluster, job, tmp_path / "again.out")
    assert resumed_at(text) == [4] and "this launch starts the run from it" in text, text[-6000:]
    (aside,) = (run / "checkpoints").glob("abandoned-*")
    assert sorted(p.name for p in aside.iterdir() if p.is_dir()) == ["global_step8"]
    again = losses(run)
    assert sorted(again) == list(range(1, 9)) and all(again[s] == first[s] for s in range(1, 9)), (first, again)


def test_a_job_started_from_another_runs_checkpoint_continues_after_a_requeue(slurm_cluster, corpus, tmp_path):
    """`sbatch roberta_large.sh --resume OTHER_RUN/checkpoints/global_step4` into a new run folder (a checkpoint from
    elsewhere), preempted by `scontrol requeue` at step 6: the requeued launch gets the same arguments, and must
    continue from the checkpoint its preemption saved, not start over from OTHER_RUN's step 4 (trainer/lineage.py).
    The steps repeat the first run's losses."""
    env = {"CONFIG": "tiny_roberta", "DATA_PREFIX": str(corpus),
           "EXTRA_SETS": sets(train__steps=12, checkpoint__every_steps=4, checkpoint__keep_last=5,
                              logging__every_steps=1) + " " + LOADER}
    other, run = tmp_path / "other", tmp_path / "run"
    job = submit(slurm_cluster, "roberta_large.sh", tmp_path / "first.out", RUN_DIR=str(other), **env)
    assert_completed(slurm_cluster, job, tmp_path / "first.out")
    source = other / "checkpoints" / "global_step4"
    job = slurm_cluster.sbatch(REPO / "slurm" / "roberta_large.sh", "--nodes=2", "--gpus-per-node=0", "--time=30:00",
                               f"--output={tmp_path / 'again.out'}", args=("--resume", str(source)), cwd=REPO,
                               env={"RDZV_TIMEOUT": "120", "SAVE_TIMEOUT": "60", "RUN_DIR": str(run), **env})
    with signal_lands_mid_run(slurm_cluster, job, run, 6, signal.SIGTERM):
        slurm_cluster.client("scontrol", "requeue", str(job))
    slurm_cluster.release_requeued(job)
    text = assert_completed(slurm_cluster, job, tmp_path / "again.out")
    first, second = resumed_at(text)
    assert first == 4 and 6 <= second < 12, text[-6000:]
    assert "already started this run from it; this launch continues" in text, text[-6000:]
    again, reference = losses(run), losses(other)
    assert sorted(again) == list(range(5, 13)) and all(again[s] == reference[s] for s in again), (reference, again)
