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


def check_gpu_sh_output(tmp_path):
    """The printout and JSON lines of one `bash bench/gpu.sh --cpu-smoke` run in ``tmp_path`` (its $OUT)."""
    out = (tmp_path / "gpu_bench.txt").read_text()
    diff = float(re.search(r"fp32 logits vs HF on cpu: max \|diff\| (\S+)", out).group(1))
    assert diff < 1e-4, out  # the script's own correctness check against Hugging Face passes
    assert float(re.search(r"unpad \(\w+\) vs padded hidden: max \|diff\| (\S+)", out).group(1)) < 1e-5, out
    # bf16 rounding only (measured 5.6e-3 and 7.8e-3 on the CPU): a wrong mask or dtype path gives O(1)
    assert float(re.search(r"bf16 autocast logits vs fp32 HF: max \|diff\| (\S+)", out).group(1)) < 5e-2, out
    assert float(re.search(r"varlen nested vs padded \(bf16\): max \|diff\| (\S+)", out).group(1)) < 3e-2, out
    assert float(re.search(r"measured bf16 matmul peak: (\S+) TFLOP/s", out).group(1)) > 0  # a measurement ran
    # The timings mean nothing on a CPU, but the arithmetic on them is the script's: tokens/s is the configuration's
    # real tokens (batch x seq x (1 - padding)) over the step time, and the ratio is ours/hf of those rates. Each
    # printed figure is checked within its own rounding (ms to 0.1, tokens/s to 1, ratio to 0.01).
    rows = re.findall(r"seq (\d+) batch (\d+) padding (\d+)% unpad=\w+ +(ours|hf): +(\S+) ms/step +(\S+) tokens/s", out)
    ratios = [float(x) for x in re.findall(r"ratio ours/hf: (\S+)x", out)]
    assert len(rows) == 8 and len(ratios) == 4, out
    for k, ratio in enumerate(ratios):
        rates = {}
        for seq, batch, padding, who, ms, rate in rows[2 * k:2 * k + 2]:
            tokens = int(batch) * int(int(seq) * (1 - int(padding) / 100))
            ms, rate = float(ms), float(rate)
            assert ms > 0 and tokens / (ms + 0.05) * 1e3 - 0.5 <= rate <= tokens / (ms - 0.05) * 1e3 + 0.5, (
                f"{who} seq {seq} padding {padding}%: {rate} tokens/s is not {tokens} tokens in {ms} ms")
            rates[who] = rate
        want = rates["ours"] / rates["hf"]
        assert abs(ratio - want) <= 0.005 + want * (0.5 / rates["ours"] + 0.5 / rates["hf"]), (ratio, rates)
    check_model_stages([json.loads(line) for line in (tmp_path / "gpu_bench.jsonl").read_text().splitlines()])


STAGE_PRESETS = {("tiny", "full", "off"), ("tiny", "short10", "off"), ("tiny", "packed", "off"),
                 ("tiny", "full", "on"), ("tiny", "packed", "on"), ("tiny-roberta", "packed", "off"),
                 ("tiny-albert", "full", "off"), ("tiny-electra", "full", "off")}


def check_model_stages(records):
    """bench/model_stages.py's lines (gpu.sh --cpu-smoke): every model-step stage is there with real-token counts and
    rates that follow from them, the profile split sums to 1 and names the attention op that ran, idle time lies
    inside the accumulation step's span."""
    steps = {(r["preset"], r["mix"], r["compile"]): r for r in records if r["stage"] == "model_step" and "mix" in r}
    assert set(steps) == STAGE_PRESETS, records
    for (preset, mix, _), r in steps.items():
        rows = r["row_tokens"]
        assert r["tokens_per_step"] == sum(map(sum, rows)) / len(rows)  # real tokens, not batch x seq
        assert all(len(b) == r["batch"] and max(b) <= r["seq"] for b in rows)
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / (r["ms_per_step"] / 1e3), rel=1e-9)
        assert math.isfinite(r["loss"]) and r["mfu"] is None  # no datasheet peak on a CPU
        # FLOPs as the sequences run: full rows give trainer.flops' count x tokens; short rows and packed samples
        # attend over fewer keys, so less (a count at full-row length would credit them with padding's attention)
        full_count = r["full_row_flops_per_token"] * r["tokens_per_step"]
        if mix == "full":
            assert r["flops_per_step"] == pytest.approx(full_count, rel=1e-9)
        else:
            assert 0.5 * full_count < r["flops_per_step"] < full_count
        if mix == "full":
            assert all(n == r["seq"] for b in rows for n in b) and r["samples"] == [r["batch"]] * len(rows)
        elif mix == "short10":  # 10 % of the rows (at least one) shorter, one sample per row
            assert all(sum(n < r["seq"] for n in b) == max(1, round(0.1 * r["batch"])) for b in rows), rows
            assert r["samples"] == [r["batch"]] * len(rows)
        else:  # several samples per row (the packing metadata the trainer builds), rows nearly full
            assert all(s > r["batch"] for s in r["samples"]) and r["tokens_per_step"] > 0.9 * r["batch"] * r["seq"]
    prof = next(r for r in records if r["stage"] == "profile")
    assert sum(prof["fractions"].values()) == pytest.approx(1.0, abs=1e-9) and prof["fractions"]["gemm"] > 0
    assert any("scaled_dot_product" in name for name in prof["attention_kernels"]), prof
    idle = next(r for r in records if r["stage"] == "idle")
    assert idle["accum"] == 4 and 0 <= idle["idle_ms"] < idle["span_ms"]
    assert idle["busy_ms"] + idle["idle_ms"] == pytest.approx(idle["span_ms"])
    assert not any("skipped" in r for r in records), records


def test_model_stages_past_the_deadline_write_a_skipped_line_each(tmp_path):
    jsonl = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "bench/model_stages.py", "--smoke", "--deadline", "0", "--jsonl",
                           str(jsonl)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["stage"] for r in records] == ["model_step"] * 5 + ["profile", "idle"] + ["model_step"] * 3
    assert all("budget" in r["skipped"] for r in records)
    assert {(r["preset"], r["mix"], r["compile"]) for r in records if r["stage"] == "model_step"} == STAGE_PRESETS


def check_trainer_step_lines(records):
    """bench/trainer_step.py (what gpu.sh runs when deepspeed is importable): the bf16 engine at ZeRO-1 and ZeRO-2,
    accumulation 1 and 4, AdamW and LAMB, through the trainer's train_step, tiny shapes on the CPU; one JSON line per
    configuration (syncs per step are null on a CPU: torch.cuda.set_sync_debug_mode needs CUDA)."""
    records = records[[r.get("stage") == "model_step" and "mix" not in r for r in records].index(True):]
    records = [r for r in records if r["stage"] in ("model_step", "trainer_step") and "mix" not in r]
    assert records[0]["stage"] == "model_step"
    model = records[0]["loss"]
    steps = [r for r in records if r["stage"] == "trainer_step"]
    assert [(r["zero"], r["accum"], r["optimizer"]) for r in steps] == PRIORITY, steps
    assert all(r["syncs_per_step"] is None for r in steps), steps
    # Random tokens and labels after 3 steps at lr 1e-4: every loss is still the uniform one, ln(1024) MLM + ln(2)
    # NSP = 7.62 (to ~0.05: the initial logits are not exactly flat), and the trainer's AdamW step at accumulation 1
    # (bf16 weights) gives the bare fp32 model step's loss on the same batches to bf16 rounding. A loss scaled by the
    # accumulation, or missing its NSP term, is off by ln(2) = 0.69 or more.
    uniform = math.log(1024) + math.log(2)
    losses = [r["loss"] for r in steps]
    assert all(abs(x - uniform) < 0.1 for x in [model, *losses]), (uniform, model, steps)
    same_batches = [r["loss"] for r in steps if r["accum"] == 1 and r["optimizer"] == "adamw"]
    assert all(abs(x - model) < 0.05 for x in same_batches), (model, steps)


# bench/trainer_step.py's configurations in the first run's priority order: ZeRO-1 (the GPU recipes' default) before
# ZeRO-2, accumulation 4 (the goal) before 1
PRIORITY = [(z, a, o) for z in (1, 2) for a in (4, 1) for o in ("adamw", "lamb")]


def test_trainer_step_past_the_deadline_writes_a_skipped_line_per_configuration(tmp_path):
    """A trainer-step stage that runs out of its share of gpu.sh's budget writes one skipped line per configuration
    it did not measure, in priority order, and exits 0 (gpu.sh records it as run, not failed)."""
    pytest.importorskip("deepspeed")
    jsonl = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "bench/trainer_step.py", "--smoke", "--deadline", "0", "--jsonl",
                           str(jsonl)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert records[0]["stage"] == "model_step" and math.isfinite(records[0]["loss"])
    assert [(r["zero"], r["accum"], r["optimizer"]) for r in records[1:]] == PRIORITY, records
    assert all(r["stage"] == "trainer_step" and "budget" in r["skipped"] for r in records[1:]), records


# What bench/gpu.sh installs from the wheels folder, made unimportable here so that only the installed copies serve
FROM_WHEELS = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "hjson", "msgpack", "einops",
               "psutil", "cpuinfo", "deepspeed", "megatron")


def only_from_wheels(tmp_path) -> Path:
    """A PYTHONPATH folder that makes FROM_WHEELS unimportable, so that only what gpu.sh installs serves."""
    absent = tmp_path / "absent"
    for name in FROM_WHEELS:
        (absent / name).mkdir(parents=True)
        (absent / name / "__init__.py").write_text(f"raise ImportError('{name} only from the wheels folder')")
    return absent


def test_a_wheel_missing_from_the_folder_is_recorded_and_the_stages_still_run(tmp_path):
    """A wheels folder without one package (hjson, which DeepSpeed imports): the install is recorded as failed with
    that name, everything else is installed, and every stage still writes its line (here, with no time left, a
    skipped one; the trainer step's says deepspeed does not import) instead of the script stopping at the install,
    which is what a missing cp312 wheel did to a whole first GPU run; exit status 1."""
    import shutil
    import time

    wheels = REPO / "bench" / "out" / "wheels"
    if not any(wheels.glob("hjson-*.whl")):
        pytest.skip("no wheels folder (make wheels: needs network)")
    partial = tmp_path / "wheels"
    shutil.copytree(wheels, partial)
    for whl in partial.glob("hjson-*.whl"):
        whl.unlink()
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(only_from_wheels(tmp_path)), WHEELS=str(partial),
               SITE=str(tmp_path / "site"), BENCH_DEADLINE=str(int(time.time())))
    proc = subprocess.run(["bash", "bench/gpu.sh", "--cpu-smoke"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "gpu_bench.jsonl").read_text().splitlines()]
    assert records[0] == {"stage": "install", "failed": f"not in {partial} for this Python: hjson"}, records
    assert [r["stage"] for r in records[1:]] == ["env", "model_stages_core", "trainer_step", "model_stages_profile",
                                                 "hf_comparison", "model_stages_others"], records
    assert "deepspeed or pydantic is not importable" in records[3]["skipped"], records
    assert any((tmp_path / "site").glob("deepspeed*")) and any((tmp_path / "site").glob("pydantic*"))


@pytest.mark.slow
@pytest.mark.timeout(2900)  # above its subprocesses' own limits (900 s + 1800 s): their output is kept
def test_cpu_smoke_installs_from_the_wheels_folder_and_runs_every_stage(tmp_path):
    """``bash bench/gpu.sh --cpu-smoke`` with pydantic, DeepSpeed, megatron-core and their requirements unimportable:
    the script installs them from the wheels folder (pip --no-index, ``make gpu-wheels``) and runs the model step and
    every trainer-step configuration; the HF check, the printed arithmetic, every model_stages line and the
    trainer-step losses are checked on that one run (three separate runs before). What it cannot show: that nothing
    else of this venv (numpy, yaml, tokenizers, which transformers brings on the GPU node too) is needed; and the
    cp312 wheels themselves (this is CPython 3.11: the folder holds both)."""
    wheels = REPO / "bench" / "out" / "wheels"
    skip = None
    if not any(wheels.glob("deepspeed-*.whl")):
        proc = subprocess.run(["bash", "bench/gpu_wheels.sh", str(wheels)], cwd=REPO, capture_output=True, text=True,
                              timeout=900)
        if proc.returncode != 0:  # no network: still run the script without them (model stages, no trainer step)
            skip = f"make gpu-wheels failed (no network?): {proc.stderr[-500:]}"
            wheels = tmp_path / "no_wheels"
    absent = only_from_wheels(tmp_path)
    # DeepSpeed installed into the site folder would JIT-compile any op it loads for that install's paths: in the
    # shared extensions folder such a build replaced the venv's, and every later launch of the suite rebuilt it (83 s
    # for the next Slurm job in a CI run). bench/trainer_step.py --smoke no longer loads the CPU shm op (a one-rank
    # run never communicates); its own folder still keeps the venv's builds out of reach.
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(absent), WHEELS=str(wheels), SITE=str(tmp_path / "site"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"))
    proc = subprocess.run(["bash", "bench/gpu.sh", "--cpu-smoke"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if skip:
        check_gpu_sh_output(tmp_path)
        pytest.skip(skip)
    assert "installed from" in proc.stdout and any((tmp_path / "site").glob("deepspeed*")), proc.stdout[-2000:]
    records = [json.loads(line) for line in (tmp_path / "gpu_bench.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records].count("trainer_step") == 8, records
    check_gpu_sh_output(tmp_path)  # the HF check, the ratio arithmetic and every model_stages line
    check_trainer_step_lines(records)  # bench/trainer_step.py's configurations and losses


def test_model_stages_count_each_rows_flops_at_its_own_length():
    """step_flops (MFU's numerator for the short and packed mixes) against trainer.flops' forward count run on each
    row's real length directly: the A n + B n^2 + K fit must give the same number for lengths it was not fitted at."""
    sys.path.insert(0, str(REPO / "bench"))
    import model_stages
    from trainer.flops import forward_flops

    torch = pytest.importorskip("torch")
    for preset in ("tiny", "tiny-electra"):
        model = model_stages.build_model(preset, "cpu")
        vocab = (model.cfg if hasattr(model, "cfg") else model.discriminator.cfg).vocab_size
        batch = model_stages.make_batch("short10", 10, 64, vocab, torch.Generator().manual_seed(1))
        assert min(batch["row_tokens"]) < 64
        parts = [m for m in model.modules() if type(m).__name__ == "PretrainingModel"]
        direct = 3 * sum(forward_flops(p, n, 10) for p in parts for n in batch["row_tokens"])
        assert model_stages.step_flops(model, [batch], 64, 10) == pytest.approx(direct, rel=1e-9)


def test_a_hung_gpu_sh_stage_is_cut_at_its_own_limit_and_the_later_stages_still_run(tmp_path):
    """A stage that hangs (here: importing transformers never returns, which hangs the env stage and the HF
    comparison) is killed at its own limit, the time left less what the later stages keep (KEEP), and recorded as
    failed (124, timeout's status); the stages after it still start with their share, the script exits non-zero, and
    every line printed before is kept. On 2026-12-04 a first H200 run without per-stage limits ran past its caller's
    limit and returned nothing; with one limit for all stages (the deadline) a hang in the first stage would still
    have cost every later one. What this cannot see: what hung there."""
    absent = tmp_path / "absent"
    (absent / "deepspeed").mkdir(parents=True)
    (absent / "deepspeed" / "__init__.py").write_text("raise ImportError('no deepspeed')")
    (absent / "transformers").mkdir()
    (absent / "transformers" / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    # The stages that import transformers hang until their limits, so the test takes most of the budget; 40 s leaves the
    # later stages shares (KEEP) that bash's own overhead between stages cannot eat, on a busy machine too. The
    # limits are checked against the budget gpu.sh logs, counted from its own start: the machine's load only moves
    # how much of it the interpreter probes before the first stage take.
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=str(absent), WHEELS=str(tmp_path / "none"), BUDGET_S="40")
    env.pop("BENCH_DEADLINE", None)
    proc = subprocess.run(["bash", "bench/gpu.sh", "--cpu-smoke"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)  # a hang guard only
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "gpu_bench.jsonl").read_text().splitlines()]
    text = (tmp_path / "gpu_bench.txt").read_text()
    total = int(re.search(r"budget: (\d+) s from the start", text).group(1))
    script = (REPO / "bench" / "gpu.sh").read_text()
    order = re.search(r'^ORDER="([^"]+)"', script, flags=re.M).group(1).split()
    keep = {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", script.split("declare -A KEEP=")[1].split(")")[0])}
    starts = re.findall(r"(\w+): start \((\d+) s for it, (\d+) s of the budget", text)
    limits = {name: (int(a), int(b)) for name, a, b in starts}
    for name, (limit, left) in limits.items():  # each stage may run the time left less what the later ones keep
        kept = sum(keep[s] * total // 100 for s in order[order.index(name) + 1:])
        assert limit == left - kept, (name, limits, total)
    # env hangs and is cut at its limit (124), or, where the interpreter probes took its whole share on a busy
    # machine, is skipped; either way the stages after it start with theirs
    assert records[0] in ({"stage": "env", "failed": 124},
                          {"stage": "env", "skipped": "time budget (BUDGET_S) spent"}), records
    # the core stage does not import transformers: it runs (within its limit, or cut at it on a slow machine)
    assert "model_stages_core" in limits, limits
    assert {"stage": "trainer_step", "skipped": "deepspeed or pydantic is not importable (make gpu-wheels, then "
            "bring bench/out/wheels)"} in records, records
    # the HF comparison hangs too and is cut at its own limit, after the stages before it hung
    assert {"stage": "hf_comparison", "failed": 124} in records and limits["hf_comparison"][0] >= 1, (records, limits)
