"""The checkpoint copies of eval.downstream (trainer/finetune/downstream_copy.py): what a copy holds and that a
failed fine-tuning leaves none behind (review of long runs, finding 2: every failed fine-tuning leaked a full copy,
optimizer state included)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

FILES = ("bertfamily.json", "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
         "rng_rank0.pt")


def checkpoint(root: Path, step: int, precision: str = "fp32", zero_stage: int = 1) -> Path:
    """A checkpoint folder with the files DeepSpeed's ZeRO-1 writes (contents do not matter here)."""
    tag = root / "checkpoints" / f"global_step{step}"
    tag.mkdir(parents=True)
    for name in FILES[1:]:
        (tag / name).write_bytes(b"x" * 64)
    state = {"step": step, "zero_stage": zero_stage, "config": {"deepspeed": {"precision": precision}}}
    (tag / "bertfamily.json").write_text(json.dumps(state))
    return tag


def launcher(tmp_path: Path, child: str):
    from trainer.finetune.downstream import DownstreamLauncher, EvalConfig

    cfg = EvalConfig(downstream=[{"task": "rte", "data": str(tmp_path / "rte"), "every_steps": 10}],
                     command_prefix=["sh", "-c", child, "child"])
    said = []
    return DownstreamLauncher(cfg, tmp_path, 0, say=said.append), said


def records(run_dir: Path, split: str, count: int) -> list[dict]:
    deadline, found = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(found) < count:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
        found = [r for r in map(json.loads, lines) if r["split"] == split]
        time.sleep(0.05)
    return found


def test_an_fp32_zero1_copy_holds_the_weights_only_and_a_bf16_one_its_masters(tmp_path):
    """The loader reads an fp32 ZeRO-1/2 checkpoint's weights from the model states once the optimizer files are
    absent (the same tensors); a bf16 run's fp32 masters are in its optimizer files, so those stay. RNG states never
    go into a copy."""
    from trainer.finetune.downstream_runner import copy_checkpoint

    copy = copy_checkpoint(checkpoint(tmp_path / "a", 10), tmp_path / "a" / "out")
    assert sorted(p.name for p in copy.iterdir()) == ["bertfamily.json", "mp_rank_00_model_states.pt"]
    copy = copy_checkpoint(checkpoint(tmp_path / "b", 10, precision="bf16"), tmp_path / "b" / "out")
    assert sorted(p.name for p in copy.iterdir()) == sorted(FILES[:3])
    copy = copy_checkpoint(checkpoint(tmp_path / "c", 10, zero_stage=3), tmp_path / "c" / "out")
    assert sorted(p.name for p in copy.iterdir()) == sorted(FILES[:3])


def test_a_failed_fine_tuning_leaves_no_copy_and_says_what_it_kept(tmp_path):
    """Review: a fine-tuning that exits non-zero (a wrong data path: every due step of the run) kept its copy for
    good; with keep_last pruning the originals, 7 copies (68 MB) beside 10 MB of checkpoints. Nothing runs it again,
    so the runner removes the copy; the record says so, what the folder keeps and what to fine-tune to retry."""
    run, said = launcher(tmp_path, "exit 3")
    tags = [checkpoint(tmp_path, step) for step in (10, 20)]
    for step, tag in zip((10, 20), tags):
        run.launch(step, tag)
    run.finish()
    failed = records(tmp_path, "downstream_failed", 2)
    assert sorted(r["step"] for r in failed) == [10, 20], failed
    for rec, tag in zip(sorted(failed, key=lambda r: r["step"]), tags):
        assert "exit 3" in rec["error"] and "copy was removed" in rec["error"] and str(tag) in rec["error"], rec
    for step in (10, 20):
        out = tmp_path / "downstream" / f"global_step{step}" / "rte"
        deadline = time.monotonic() + 30
        while not (out / "finetune.exit").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(p.name for p in out.iterdir()) == ["finetune.exit", "finetune.log"], list(out.iterdir())


def test_a_runner_killed_under_the_launch_leaves_no_copy(tmp_path):
    """A runner that dies while its launch goes on (killed, the OOM killer) is recorded failed and forgotten by that
    launch (nothing runs it again): its copy is removed too."""
    gate = tmp_path / "gate"
    run, said = launcher(tmp_path, f"i=0; while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done")
    run.launch(10, checkpoint(tmp_path, 10))
    assert len(run.running) == 1
    copy = tmp_path / "downstream" / "global_step10" / "rte" / "global_step10"
    assert copy.is_dir()
    os.killpg(run.running[0].pid, signal.SIGKILL)
    run.running[0].proc.wait()
    run.poll()
    gate.write_text("")
    assert not copy.exists() and any("ended before it finished" in s and "copy was removed" in s for s in said), said
