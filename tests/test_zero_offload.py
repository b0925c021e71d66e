"""ZeRO-Offload through the trainer (ds_configs/zero2_offload.json, zero3_offload.json), 2 gloo ranks, CPU fp32.

With ``offload_optimizer`` the trainer's AdamW is stepped as DeepSpeed's ``DeepSpeedCPUAdam`` (trainer/engine.py) with
the same groups, hyperparameters and schedule: per-step losses equal ZeRO-2 without offload (torch AdamW) up to the
last bits of fp32 arithmetic; a run resumed from its step-4 checkpoint (as after a kill) continues bit for bit like
the uninterrupted offload run. LAMB with offload is refused with a config error. Runs reuse tests/test_trainer_multiproc.py's stand-in launcher.

The first use of DeepSpeedCPUAdam on a machine compiles the ``cpu_adam`` op (~75 s on 2 cores, then cached).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trainer_multiproc import REPO, losses, make_config, run, run_several  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

# DeepSpeedCPUAdam and torch AdamW apply the same update, rounded differently in fp32 (fused AVX expressions vs torch
# ops, a running product for the bias correction). Over these 8 steps at lr 3e-3 the losses (~4.8) differ from
# ZeRO-2's by at most 2.6e-6 (5.4e-7 relative, ZeRO-2 and ZeRO-3 offload alike); 1e-5 relative leaves ~20x room for
# other CPUs' AVX paths. Which optimizer ran, and with which groups and schedule, is checked from its checkpoint.
REL = 1e-5


def _ds(name: str) -> dict:
    return {"config": str(REPO / "ds_configs" / name)}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("offload")


@pytest.fixture(scope="module")
def cpu_adam() -> None:
    """Build (first use on a machine: ~75 s on 2 cores, g++ and the venv's ninja) or load the cpu_adam op here, so
    a toolchain problem fails with its own message and the compile does not eat a launch's timeout."""
    from deepspeed.ops.op_builder import CPUAdamBuilder
    CPUAdamBuilder().load()


@pytest.fixture(scope="module")
def runs(tmp, cpu_adam) -> dict[str, Path]:
    """The same 8 steps of test_trainer_multiproc's BASE run at ZeRO-2, ZeRO-2 + optimizer offload and ZeRO-3 +
    optimizer and parameter offload; checkpoints at steps 2, 4, 6, 8 (all kept). One launch for the three
    (tests/several_runs.py); the resumes below start fresh processes."""
    names = ("zero2", "zero2_offload", "zero3_offload")
    run_several([(make_config(tmp, name, deepspeed=_ds(f"{name}.json"), checkpoint={"keep_last": 4}),)
                 for name in names], 2)
    return {name: tmp / name for name in names}


def _optimizer_groups(run_dir: Path) -> list[dict]:
    """Param groups of the optimizer DeepSpeed stepped, from rank 0's step-8 ZeRO checkpoint (stage 2 and 3)."""
    path = next((run_dir / "checkpoints" / "global_step8").glob("*rank_0_*optim_states.pt"))
    state = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    return state.get("base_optimizer_state", state.get("optimizer_state_dict"))["param_groups"]


@pytest.mark.parametrize("name", ["zero2_offload", "zero3_offload"])
def test_offload_matches_zero2(runs, name):
    ref, got = losses(runs["zero2"]), losses(runs[name])
    assert sorted(ref) == sorted(got) == list(range(1, 9))
    assert len(set(ref.values())) == 8  # the weights move
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=REL), (name, step, got[step], ref[step])
    assert got != ref  # a different kernel did the steps (equal bits would mean offload was not in effect)
    # DeepSpeedCPUAdam's groups (bias_correction, no torch "foreach"), with our weight-decay split and schedule
    groups = _optimizer_groups(runs[name])
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    assert all("bias_correction" in g and "foreach" not in g for g in groups)
    assert all(g["initial_lr"] == 3e-3 and g["lr"] == 0.0 for g in groups)  # linear decay to 0 at step 8
    assert json.loads((runs[name] / "status.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("name", ["zero2_offload", "zero3_offload"])
def test_offload_resume_is_bit_identical(tmp, runs, name):
    """As if killed right after the step-4 checkpoint: a copy of the run rolled back to it (later checkpoints and
    records removed), resumed with --resume auto, trains steps 5-8 exactly as the uninterrupted run did (optimizer
    moments, DeepSpeedCPUAdam's step counts, lr position, data position and RNG all come back). After a resume
    DeepSpeedCPUAdam computes beta**step with pow instead of its running product; at step 5 the two round alike."""
    src, dst = runs[name], tmp / f"{name}_resumed"
    shutil.copytree(src, dst)
    ckpts = dst / "checkpoints"
    for tag in ("global_step6", "global_step8"):
        shutil.rmtree(ckpts / tag)
    (ckpts / "latest").write_text("global_step4")
    metrics = dst / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                               if json.loads(line)["step"] <= 4))
    cfg = make_config(tmp, f"{name}_resumed", deepspeed=_ds(f"{name}.json"), checkpoint={"keep_last": 4})
    resumed = run(cfg, 2, "--resume", "auto")
    assert "resumed from" in resumed.stdout and "global_step4" in resumed.stdout
    ref, got = losses(src), losses(dst)
    assert sorted(got) == list(range(1, 9))
    for step in range(5, 9):
        assert got[step] == ref[step], (name, step, got[step], ref[step])  # bit-identical


def test_lamb_with_offload_is_refused(tmp):
    """LAMB's trust-ratio all-reduce would run on the offloaded CPU partitions (NCCL cannot), and stepping another
    optimizer instead would train something else: the trainer refuses before building anything."""
    import test_trainer_standin  # noqa: F401  (registers the stand-in objective the config names)

    from trainer.config import ConfigError, load_config
    from trainer.ds_json import offload_problem
    from trainer.engine import build_ds_config
    path = str(make_config(tmp, "lamb_offload", deepspeed=_ds("zero2_offload.json"), optim={"name": "lamb"}))
    with pytest.raises(ConfigError) as err:  # at validation: `--check` and every launcher exit 2 before starting
        load_config(path)
    for words in ("deepspeed.config", "zero2_offload.json", "optim.name=lamb", "zero2.json", "optim.name=adamw"):
        assert words in str(err.value), words
    cfg = load_config(path, ["optim.name=adamw"])
    cfg.optim.name = "lamb"
    assert offload_problem(cfg.optim, {"zero_optimization": {"stage": 2}}) is None  # LAMB without offload: fine
    cfg.optim.name = "adamw"
    assert build_ds_config(cfg, world_size=2, grad_accum=2)["zero_optimization"]["offload_optimizer"]["device"] \
        == "cpu"
