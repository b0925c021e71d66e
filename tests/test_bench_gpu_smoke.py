"""bench/gpu.sh waits for a GPU session with 15 minutes of device time: its every line runs here first, on the CPU
with tiny shapes (SMOKE=1), so the first GPU run measures instead of failing on a typo."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_gpu_bench_script_runs_end_to_end_on_cpu(tmp_path):
    # the GPU machine has torch and transformers but no deepspeed or megatron-core: the script must not need them
    for name in ("deepspeed", "megatron"):
        (tmp_path / "absent" / name).mkdir(parents=True)
        (tmp_path / "absent" / name / "__init__.py").write_text(f"raise ImportError('no {name} on the GPU machine')")
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path), PYTHONPATH=str(tmp_path / "absent"),
               WHEELS=str(tmp_path / "no_wheels"))
    proc = subprocess.run(["bash", "bench/gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = (tmp_path / "gpu_bench.txt").read_text()
    diff = float(re.search(r"fp32 logits vs HF on cpu: max \|diff\| (\S+)", out).group(1))
    assert diff < 1e-4, out  # the script's own correctness check against Hugging Face passes
    assert float(re.search(r"unpad \(\w+\) vs padded hidden: max \|diff\| (\S+)", out).group(1)) < 1e-5, out
    assert "varlen nested vs padded" in out and "measured bf16 matmul peak" in out
    # every configuration measured both models and printed a ratio (figures themselves mean nothing on a CPU)
    assert len(re.findall(r"ratio ours/hf: \d+\.\d+x", out)) == 4, out
    assert len(re.findall(r" (ours|  hf): +\d+\.\d ms/step", out)) == 8, out


@pytest.mark.slow
def test_trainer_step_bench_runs_on_cpu(tmp_path):
    """bench/trainer_step.py (what gpu.sh runs when deepspeed is importable): the bf16 engine at ZeRO-1 and ZeRO-2,
    accumulation 1 and 4, AdamW and LAMB, through the trainer's train_step, tiny shapes on the CPU; one JSON line per
    configuration (syncs per step are null on a CPU: torch.cuda.set_sync_debug_mode needs CUDA)."""
    jsonl = tmp_path / "bench.jsonl"
    proc = subprocess.run([sys.executable, "bench/trainer_step.py", "--smoke", "--jsonl", str(jsonl)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert records[0]["stage"] == "model_step"
    steps = [r for r in records if r["stage"] == "trainer_step"]
    assert {(r["zero"], r["accum"], r["optimizer"]) for r in steps} == {
        (z, a, o) for z in (1, 2) for a in (1, 4) for o in ("adamw", "lamb")}
    assert all(math.isfinite(r["loss"]) and r["syncs_per_step"] is None for r in steps), steps


# What bench/gpu.sh installs from the wheels folder, made unimportable here so that only the installed copies serve
FROM_WHEELS = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "hjson", "msgpack", "einops",
               "psutil", "cpuinfo", "deepspeed", "megatron")


@pytest.mark.slow
def test_cpu_smoke_installs_from_the_wheels_folder_and_runs_every_stage(tmp_path):
    """``bash bench/gpu.sh --cpu-smoke`` with pydantic, DeepSpeed, megatron-core and their requirements unimportable:
    the script installs them from the wheels folder (pip --no-index, ``make gpu-wheels``) and runs the model step and
    every trainer-step configuration. What it cannot show: that nothing else of this venv (numpy, yaml, tokenizers,
    which transformers brings on the GPU node too) is needed; and the cp312 wheels themselves (this is CPython
    3.11: the folder holds both)."""
    wheels = REPO / "bench" / "out" / "wheels"
    if not any(wheels.glob("deepspeed-*.whl")):
        proc = subprocess.run(["bash", "bench/gpu_wheels.sh", str(wheels)], cwd=REPO, capture_output=True, text=True,
                              timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"make gpu-wheels failed (no network?): {proc.stderr[-500:]}")
    absent = tmp_path / "absent"
    for name in FROM_WHEELS:
        (absent / name).mkdir(parents=True)
        (absent / name / "__init__.py").write_text(f"raise ImportError('{name} only from the wheels folder')")
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(absent), WHEELS=str(wheels), SITE=str(tmp_path / "site"))
    proc = subprocess.run(["bash", "bench/gpu.sh", "--cpu-smoke"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "installed from" in proc.stdout and any((tmp_path / "site").glob("deepspeed*")), proc.stdout[-2000:]
    records = [json.loads(line) for line in (tmp_path / "gpu_bench.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records].count("trainer_step") == 8, records
