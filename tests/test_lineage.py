"""Roll-backs that survive the launch after them (trainer/lineage.py): a roll-back to a checkpoint outside the folder
(restored from an archive because keep-last pruned it) killed before its first save, and ``sbatch ... --resume PATH``
requeued."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from trainer import checkpoint, lineage

REPO = Path(__file__).resolve().parents[1]


def test_a_roll_back_from_an_archive_killed_before_its_first_save_resumes_the_archive(tmp_path):
    """Real 1-rank runs of the stand-in trainer. The run saved 4, 8, 12 (keep_last 2 pruned 4; a copy of it is in
    the archive). The roll-back to the archive's step 4 hits a full disk at its first save (step 8), so it leaves
    nothing in the folder but the abandoned run's global_step... nothing newer than 4, which it moved aside. The next
    ``--resume auto`` started from step 0 with random weights, silently (found by review); now it resumes the archive
    and the roll-back's settings reach the checkpoints it then writes."""
    from test_trainer_multiproc import TIMEOUT, make_config, run

    cfg = make_config(tmp_path, "run", train={"steps": 12, "eval_every": 0},
                      schedule={"kind": "constant", "warmup_steps": 0},
                      checkpoint={"every_steps": 4, "keep_last": 10})
    root = tmp_path / "run" / "checkpoints"
    run(cfg, 1, "--resume", "none")
    archive = tmp_path / "archive" / "global_step4"
    shutil.copytree(root / "global_step4", archive)
    shutil.rmtree(root / "global_step4")  # as keep-last pruning had it
    first = checkpoint.read_state(root / "global_step12")["run_id"]

    worker = REPO / "tests" / "fault_worker.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", BERTFAMILY_TEST_ENOSPC="global_step8/mp_rank_00_model_states")
    proc = subprocess.run([sys.executable, str(worker), "--config", str(cfg), "--resume", str(archive), "--set",
                           "optim.lr=1e-3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode != 0 and "disk full while saving global_step8" in proc.stderr, proc.stderr[-3000:]
    assert checkpoint.complete_checkpoints(root) == []  # 8 and 12 moved aside, step 8 not saved
    record = json.loads((root / lineage.FILE).read_text())
    assert record["source"] == str(archive.resolve()) and record["step"] == 4 and record["run_id"] != first

    proc = run(cfg, 1, "--resume", "auto", "--set", "optim.lr=1e-3")
    assert f"resumed from {archive} at step 4" in proc.stdout, proc.stdout[-2000:]
    assert "has saved no checkpoint of its own yet: resuming from there" in proc.stderr
    state = checkpoint.read_state(root / "global_step12")
    assert state["config"]["optim"]["lr"] == 1e-3 and state["run_id"] != first
    # the lineage has saved: auto continues it from the folder
    assert checkpoint.resolve_resume(root, "auto") == root / "global_step12"


def test_auto_skips_the_abandoned_runs_older_checkpoints_and_names_a_lost_source(tmp_path):
    """The folder keeps the abandoned run's step 4 (older than the roll-back's start at 6): ``auto`` resumed it,
    under the new command's settings, before the lineage's first save. Fake checkpoints: only the state files the
    resolution reads."""
    root, archive = tmp_path / "checkpoints", tmp_path / "archive" / "global_step6"

    def fake(folder: Path, step: int, run_id: str) -> None:
        folder.mkdir(parents=True)
        (folder / checkpoint.STATE_FILE).write_text(json.dumps({"step": step, "run_id": run_id, "config": {}}))

    fake(root / "global_step4", 4, "old")
    fake(root / "global_step8", 8, "old")
    fake(archive, 6, "elsewhere")
    run_id = checkpoint.begin_lineage(root, archive, rank=0)
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["global_step4"]
    assert checkpoint.resolve_resume(root, "auto") == archive
    fake(root / "global_step7", 7, run_id)  # the lineage's first save
    assert checkpoint.resolve_resume(root, "auto") == root / "global_step7"
    shutil.rmtree(root / "global_step7")
    shutil.rmtree(archive)
    try:
        checkpoint.resolve_resume(root, "auto")
    except FileNotFoundError as err:
        assert f"started from {archive.resolve()}" in str(err) and "would undo the roll-back" in str(err)
    else:
        raise AssertionError("a lost source resumed the abandoned run's checkpoint")


def test_a_slurm_job_rolls_back_at_its_first_launch_and_continues_after_a_requeue(tmp_path):
    """``sbatch slurm/x.sh --resume PATH``: common.sh appended ``--resume auto`` after the job's arguments and
    argparse kept the last, so the roll-back never happened (found by review). Now the job's first launch gets
    ``--resume PATH`` and a requeued launch of the same job (the lineage record names this job and PATH) continues
    with auto; a new job with the same arguments rolls back again."""
    root, source = tmp_path / "checkpoints", tmp_path / "archive" / "global_step6"
    source.mkdir(parents=True)
    (source / checkpoint.STATE_FILE).write_text(json.dumps({"step": 6, "run_id": "x", "config": {}}))

    def started(job: str) -> int:
        return subprocess.run([sys.executable, "-m", "trainer.lineage", "started", str(root), str(source)], cwd=REPO,
                              env=dict(os.environ, SLURM_JOB_ID=job, PYTHONPATH=str(REPO))).returncode

    assert started("41") == 1  # nothing started yet: this launch rolls back
    os.environ["SLURM_JOB_ID"] = "41"
    try:
        checkpoint.begin_lineage(root, source, rank=0)
    finally:
        del os.environ["SLURM_JOB_ID"]
    assert started("41") == 0  # the requeued launch of job 41 continues
    assert started("42") == 1  # a new job with the same --resume rolls back again


def test_the_template_passes_the_jobs_resume_to_the_first_launch_only(tmp_path):
    """What common.sh hands the trainer (fake srun, python -m trainer.lineage real): --resume PATH once, then auto,
    and never --resume to --check or build_index."""
    from test_slurm_common import common

    (tmp_path / "run" / "logs").mkdir(parents=True)
    source = tmp_path / "archive" / "global_step6"
    script = f'''
BF_NNODES=1 BF_NPROC=1 BF_CPUS=1 BF_JOB_TAG=j BF_MASTER_ADDR=h BF_MASTER_PORT=1 BF_RDZV_TIMEOUT=9 BF_SIGNAL=""
BF_STEP_GPUS=() BF_TORCHRUN_OPTS=()
bf_torchrun_options() {{ :; }}
BUILD_INDEX=1 bf_train tiny_roberta "{tmp_path / 'run'}" --set train.steps=3 --resume "{source}"
'''
    fakes = {"srun": 'echo "srun $*" >> "$CALLS"',
             "python": 'case "$1 $2" in "-m trainer.lineage") exec "$REAL_PY" "$@";; esac; '
                       'echo "python $*" >> "$CALLS"; echo "{{}}"'}
    calls = tmp_path / "calls"
    env = {"CALLS": str(calls), "REAL_PY": sys.executable, "SLURM_JOB_ID": "41", "PYTHONPATH": str(REPO)}
    proc = common(tmp_path, script, env=env, fakes=fakes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = calls.read_text()
    before, srun = text.split("srun ", 1)  # srun's arguments hold the multi-line bash -c script
    assert srun.strip().endswith(f"--resume {source}") and srun.count("--resume") == 1, srun
    others = before.splitlines()
    assert any("--check" in line for line in others) and any("build_index" in line for line in others), others
    assert all("--resume" not in line for line in others), others
    assert "this launch starts the run from it" in proc.stderr + proc.stdout


def test_metrics_hold_each_step_of_the_run_once_after_a_roll_back(tmp_path):
    """Real 1-rank runs of the stand-in trainer, logging every step: 12 steps at lr 3e-3, then a roll-back to step 4
    at lr 1e-3. metrics.jsonl held the new run's steps 5-12 after the abandoned run's 5-12, nothing telling them apart
    (found by review); now it holds steps 1-12 once, 5-12 the new run's, and the abandoned ones are in the side
    file the launch names."""
    from test_trainer_multiproc import make_config, run

    cfg = make_config(tmp_path, "run", train={"steps": 12, "eval_every": 0},
                      schedule={"kind": "constant", "warmup_steps": 0},
                      checkpoint={"every_steps": 4, "keep_last": 3})
    root = tmp_path / "run" / "checkpoints"
    run(cfg, 1, "--resume", "none")
    proc = run(cfg, 1, "--resume", str(root / "global_step4"), "--set", "optim.lr=1e-3")
    log = tmp_path / "run" / "metrics.jsonl"
    train = [json.loads(line) for line in log.read_text().splitlines()]
    train = [r for r in train if r.get("split", "train") == "train" and "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    assert {r["lr"] for r in train if r["step"] > 4} == {1e-3} and {r["lr"] for r in train if r["step"] <= 4} == {3e-3}
    aside = tmp_path / "run" / "metrics.set-aside.jsonl"
    head, *moved = [json.loads(line) for line in aside.read_text().splitlines()]
    assert head["resumed_at_step"] == 4 and head["records"] == len(moved)
    assert [r["step"] for r in moved if "loss" in r] == list(range(5, 13)) and {r["lr"] for r in moved} == {3e-3}
    assert f"moved to the end of {aside}" in proc.stdout + proc.stderr


def test_set_aside_keeps_earlier_records_and_lines_without_a_step(tmp_path):
    from trainer.metrics import set_aside_after

    log = tmp_path / "metrics.jsonl"
    lines = ['{"step": 3, "loss": 1.0}', '{"step": 7, "loss": 0.5}', '{"step": 5, "split": "downstream", "x": 1}',
             'not json at all', '{"step": 12, "split": "eval", "loss": 2}', '{"step": 4, "loss": 0.9}']
    log.write_text("\n".join(lines) + "\n")
    moved, aside = set_aside_after(log, 5)
    assert moved == 2 and log.read_text().splitlines() == [lines[0], lines[2], lines[3], lines[5]]
    assert aside.read_text().splitlines()[1:] == [lines[1], lines[4]]
    assert json.loads(aside.read_text().splitlines()[0])["records"] == 2
    assert set_aside_after(log, 5) == (0, None) and set_aside_after(tmp_path / "absent.jsonl", 0) == (0, None)


def test_a_job_resuming_the_newest_checkpoint_by_name_continues_after_a_requeue(tmp_path):
    """``sbatch ... --resume RUN/checkpoints/global_stepN`` where N is the newest (what the NaN guard's message
    suggests): the first launch is a continuation, which wrote no record, so every requeue of the job rolled back to N
    again and moved what it had trained aside (found by review of the day's diff). A named continuation is recorded."""
    root = tmp_path / "checkpoints"
    newest = root / "global_step4"
    newest.mkdir(parents=True)
    (newest / checkpoint.STATE_FILE).write_text(json.dumps({"step": 4, "run_id": "r1", "config": {}}))
    os.environ["SLURM_JOB_ID"] = "41"
    try:
        assert checkpoint.begin_lineage(root, newest, rank=0, explicit=True) == "r1"  # same run: a continuation
        assert lineage.started(root, str(newest))
        assert not lineage.started(root, str(root / "global_step2"))
    finally:
        del os.environ["SLURM_JOB_ID"]
    assert checkpoint.resolve_resume(root, "auto") == newest  # an in-folder record changes nothing for auto


def _bert_base(tmp_path, run: Path, resume: Path) -> list[str]:
    """slurm/bert_base.sh with fakes: each srun (one per phase) records its arguments and leaves that phase
    completed with a checkpoint; python runs for real where the template needs an answer (lineage, config reads)."""
    from test_slurm_common import common

    calls = tmp_path / "calls"
    srun = ('printf "%s\\n" "$*" >> "$CALLS"; for a in "$@"; do case "$a" in run_dir=*) d=${a#run_dir=}; d=${d#\\"};'
            ' d=${d%\\"}; mkdir -p "$d/checkpoints/global_step4"; echo "{}" > "$d/checkpoints/global_step4/'
            'bertfamily.json"; echo \'{"status": "completed", "step": 4}\' > "$d/status.json";; esac; done')
    fakes = {"scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo n1; else echo "NodeName=n1 '
                         'NodeAddr=10.0.0.1"; fi',
             "torchrun": 'echo "usage: torchrun [--signals-to-handle S] [--shutdown-timeout T]"',
             "python": f'case "$1 $2" in "-m trainer.lineage") exec "{sys.executable}" "$@";; esac\n'
                       f'case "$1" in -|-c) exec "{sys.executable}" "$@";; esac\nexit 0',
             "srun": srun}
    env = {"SLURM_JOB_ID": "79", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "BERTFAMILY_HOME": str(REPO),
           "BERTFAMILY_VENV": "none", "BUILD_INDEX": "0", "RUN_DIR": str(run), "CALLS": str(calls),
           "PYTHONPATH": str(REPO)}
    proc = common(tmp_path, f'bash {REPO}/slurm/bert_base.sh --set train.steps=3 --resume "{resume}"', env=env,
                  fakes=fakes, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = calls.read_text()
    return [part.rsplit("--resume ", 1)[1].split()[0] for part in text.split("--nnodes")[1:]]


def test_bert_base_gives_the_jobs_resume_to_the_phase_that_holds_the_checkpoint(tmp_path):
    """Both phases got the job's --resume: a phase-1 roll-back made phase 2 resume the phase-1 checkpoint past its own
    train.steps and complete without training (review of the day's diff). Now phase 1 gets a phase-1 path and phase 2
    continues (--resume auto), and the reverse for a phase-2 path."""
    run = tmp_path / "runs" / "b"
    assert _bert_base(tmp_path, run, run / "phase1" / "checkpoints" / "global_step2") == \
        [str(run / "phase1" / "checkpoints" / "global_step2"), "auto"]
    (tmp_path / "calls").unlink()
    import shutil
    shutil.rmtree(run)
    assert _bert_base(tmp_path, run, run / "phase2" / "checkpoints" / "global_step2") == \
        ["auto", str(run / "phase2" / "checkpoints" / "global_step2")]


def test_a_record_appended_while_metrics_are_rewritten_is_kept(tmp_path, monkeypatch):
    """A detached downstream runner appends its score while a new launch rewrites metrics.jsonl: its O_APPEND write
    lands in the old file, and was lost with it (found by review of the day's diff: 40 of 2,000 racing records). Made
    deterministic here: the record is appended to the old file just before the rename, and one more just after."""
    import trainer.metrics as metrics

    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 11)))
    real = os.replace

    def racing(src, dst):
        with open(log, "ab") as old:  # the runner's write, before and after the rename, both into the old inode
            old.write(b'{"step": 4, "split": "downstream", "rte_accuracy": 0.6}\n')
            real(src, dst)
            old.write(b'{"step": 12, "split": "downstream", "rte_accuracy": 0.7}\n')

    monkeypatch.setattr(metrics.os, "replace", racing)
    moved, aside = metrics.set_aside_after(log, 5)
    kept = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in kept] == [1, 2, 3, 4, 5, 4]  # the runner's step-4 score is kept
    assert [json.loads(line).get("step") for line in aside.read_text().splitlines()[1:]] == [6, 7, 8, 9, 10, 12]


def test_a_record_older_than_the_newest_checkpoint_of_another_run_is_stale(tmp_path, capsys):
    """lineage.json names an archive start at step 20; then code that does not keep the file (a rolled-back checkout)
    started another lineage and saved global_step10. --resume auto resumed the archive and abandoned that run (found
    by the review of upgrades): a checkpoint of another run saved after the record makes it stale."""
    import time as clock

    root, source = tmp_path / "checkpoints", tmp_path / "elsewhere" / "global_step20"
    source.mkdir(parents=True)
    (source / checkpoint.STATE_FILE).write_text(json.dumps({"step": 20, "run_id": "a", "config": {}}))
    lineage.write(root, "a", source, 20)
    newer = root / "global_step10"
    newer.mkdir()
    (newer / checkpoint.STATE_FILE).write_text(json.dumps({"step": 10, "run_id": "b", "config": {},
                                                           "time": clock.time() + 60}))
    assert checkpoint.resolve_resume(root, "auto") == newer
    assert "saved after it by another run" in capsys.readouterr().err
    (newer / checkpoint.STATE_FILE).write_text(json.dumps({"step": 10, "run_id": "b", "config": {},
                                                           "time": clock.time() - 600}))  # saved before the record
    assert checkpoint.resolve_resume(root, "auto") == source


def test_an_empty_set_value_is_refused(tmp_path):
    """`--set checkpoint.init_from=` (a job script whose value came from a failed command substitution) was read as
    null and phase 2 trained from random weights (found by the review of upgrades); KEY=null still unsets."""
    import pytest

    from trainer.config import ConfigError, apply_override

    with pytest.raises(ConfigError, match=r"no value after '='.*checkpoint.init_from=null"):
        apply_override({}, "checkpoint.init_from=")
    raw: dict = {}
    apply_override(raw, "checkpoint.init_from=null")
    assert raw == {"checkpoint": {"init_from": None}}
