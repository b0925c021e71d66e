#!/usr/bin/env bash
# The first run on a GPU node (issue 23): BERT-large bf16 model steps, the trainer's step through the real engine, a
# correctness check against Hugging Face, then the other large presets, as JSON lines appended while it runs.
#
# Needs: one CUDA GPU, Python with a CUDA torch and transformers. What else the trainer step needs (pydantic,
# DeepSpeed, megatron-core, ...) is installed from bench/out/wheels when it does not import (see below).
#   bash bench/gpu.sh                 # all of it, within BUDGET_S (480 s)
#   BUDGET_S=470 bash bench/gpu.sh    # a device call with a 530 s limit: give the caller BUDGET_S + 60 s
#   bash bench/gpu.sh --cpu-smoke     # the same code on the CPU with tiny shapes (SMOKE=1): checks the script only
# On a node without pydantic/deepspeed/megatron-core and without network: `make gpu-wheels` first (where there is
# network), then bring bench/out/wheels along; the script installs from it (pip --no-index) into bench/out/site. A
# wheel missing there is recorded ({"stage": "install", "failed": ...}) and the stages still run. Before spending device
# time: `make gpu-preflight` runs --cpu-smoke in the node's Python 3.12, torch 2.11 and transformers 5.17 with them.
#
# Stages, in the issue's priority order (each writes its JSON lines to $OUT/gpu_bench.jsonl as it measures, and its
# printout to $OUT/gpu_bench.txt; without $OUT, to /tmp):
#   env                  device, versions, GPU memory, datasheet bf16 peak, a measured bf16 matmul peak
#   model_stages_core    bench/model_stages.py --part core: BERT-large seq 512 bf16 model step on full / 10 % short /
#                        packed rows (ms, tokens/s, MFU, peak memory), then compiled (the CUDA default) full and packed
#   trainer_step         bench/trainer_step.py: the trainer's step through the DeepSpeed bf16 engine, ZeRO-1 then
#                        ZeRO-2, accumulation 4 then 1, AdamW and LAMB, syncs per step, against the bare model step
#   model_stages_profile bench/model_stages.py --part profile: one profiled step's kernel split (GEMM / attention /
#                        elementwise) and attention kernels, device idle time at accumulation 4
#   hf_comparison        our logits against Hugging Face's on the GPU (fp32, bf16, unpadded, varlen kernels), then our
#                        BERT-large training step against BertForPreTraining at seq 128, 512, 512 with 50 % padding
#   model_stages_others  RoBERTa-large packed, ALBERT-xxlarge, ELECTRA-large model steps
#
# Time: the run ends by BENCH_DEADLINE (start + BUDGET_S). Each stage after env keeps a share of the budget for itself
# (KEEP, percent), and a stage runs under `timeout` until the deadline less what the stages after it keep: a stage
# that hangs costs its own time, never the later stages', and time a stage leaves unused goes on to the next. A stage
# logs "[time] stage: start" first; one that fails or is cut writes {"stage": ..., "failed": exit status} (124: cut)
# and the stages after it still run; one with no time left writes {"stage": ..., "skipped": ...}. The script exits
# non-zero if any stage failed.
#
# Status: one attempt on an H200 (2026-12-04, before the per-stage timeouts) ran past its 590 s limit and returned no
# output, so no figure exists yet; what hung is unknown. `--cpu-smoke` runs in the test suite. The figures belong in
# BENCHMARKS.md under "## Model step" once a run completes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--cpu-smoke" ] && export SMOKE=1
START=$(date +%s)
export BENCH_DEADLINE="${BENCH_DEADLINE:-$(( START + ${BUDGET_S:-480} ))}"
TOTAL=$(( BENCH_DEADLINE - START ))
ORDER="env model_stages_core trainer_step model_stages_profile hf_comparison model_stages_others"
declare -A KEEP=([env]=0 [model_stages_core]=28 [trainer_step]=20 [model_stages_profile]=8 [hf_comparison]=10
                 [model_stages_others]=10)
export PYTHONUNBUFFERED=1  # a stage cut by its timeout still leaves every line it printed
export STEPS="${STEPS:-20}" BATCH_TOKENS="${BATCH_TOKENS:-8192}" SMOKE="${SMOKE:-0}"
OUTDIR="${OUT:-/tmp}"
# A bare node (Python + torch + transformers + triton, no network): what else the trainer step needs is installed from
# the wheels `make gpu-wheels` put in $WHEELS, with --no-index, into $SITE (prepended to PYTHONPATH; nothing else
# on the machine changes). Skipped when everything imports already.
WHEELS="${WHEELS:-bench/out/wheels}" SITE="${SITE:-bench/out/site}"
case "$SITE" in /*) ;; *) SITE="$PWD/$SITE" ;; esac
NEEDED="pydantic pydantic-core annotated-types typing-extensions typing-inspection hjson msgpack ninja einops psutil
        py-cpuinfo tqdm deepspeed megatron-core"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The interpreter that has torch: $PYTHON, else python, else python3 (GPU images often have only python3, and a
# symlink named python to a venv's python3 loses the venv). A function, so every `python` below uses it.
for candidate in ${PYTHON:-} python python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" >/dev/null 2>&1; then
        PYTHON="$(command -v "$candidate")"
        break
    fi
done
[ -n "${PYTHON:-}" ] || { echo "no python with torch on PATH (tried \$PYTHON, python, python3)"; exit 2; }
python() { "$PYTHON" "$@"; }
left() { echo $(( BENCH_DEADLINE - $(date +%s) )); }
note() { echo "[$(date +%T)] $*" | tee -a "$OUTDIR/gpu_bench.txt"; }
record() { echo "$1" | tee -a "$OUTDIR/gpu_bench.jsonl" "$OUTDIR/gpu_bench.txt"; }
FAILED=0
# A wheel missing from the folder (or one built for another Python) must not cost the stages that do not need it: the
# install is tried again without each package pip names as not found, that failure is recorded, and the run goes on
# (trainer_step writes its own skipped line if deepspeed or pydantic still does not import).
if ! python -c "import pydantic, deepspeed, megatron.core" >/dev/null 2>&1; then
    if [ -d "$WHEELS" ]; then
        start=$(date +%s) todo="$(echo $NEEDED)" missing=""
        while [ -n "$todo" ]; do
            if err=$(python -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target "$SITE" --upgrade \
                     $todo 2>&1); then
                echo "installed from $WHEELS into $SITE in $(( $(date +%s) - start )) s: $todo"
                break
            fi
            gone=$(echo "$err" | sed -n 's/.*No matching distribution found for \([A-Za-z0-9._-]*\).*/\1/p' | head -1)
            if [ -z "$gone" ] || ! echo " $todo " | grep -q " $gone "; then
                echo "$err" | tail -5
                missing="$missing (pip failed on: $todo)"
                break
            fi
            missing="$missing $gone"
            todo=$(echo " $todo " | sed "s/ $gone / /; s/^ *//; s/ *$//")
        done
        if [ -n "$missing" ]; then
            record "{\"stage\": \"install\", \"failed\": \"not in $WHEELS for this Python:${missing}\"}"
            FAILED=1
        fi
        export PYTHONPATH="$SITE:$PYTHONPATH"
    else
        echo "pydantic/deepspeed/megatron-core missing and no $WHEELS: run 'make gpu-wheels' where there is network"
    fi
fi
# started(NAME): set LIMIT (seconds NAME may run: the time left less what the stages after it keep) and
# STAGE_DEADLINE, log the start; or write {"stage": NAME, "skipped": ...} and answer false when no time is left
started() {
    local after=0 seen=0 s now_left
    for s in $ORDER; do
        [ "$seen" = 1 ] && after=$(( after + KEEP[$s] * TOTAL / 100 ))
        [ "$s" = "$1" ] && seen=1
    done
    now_left=$(left)
    LIMIT=$(( now_left - after ))
    if [ "$LIMIT" -le 0 ]; then
        record "{\"stage\": \"$1\", \"skipped\": \"time budget (BUDGET_S) spent\"}"
        return 1
    fi
    export STAGE_DEADLINE=$(( $(date +%s) + LIMIT ))
    note "$1: start (${LIMIT} s for it, ${now_left} s of the budget left)"
}
# finished(NAME, STATUS): a stage that failed or was cut writes {"stage": NAME, "failed": STATUS}
finished() {
    if [ "$2" != 0 ]; then
        record "{\"stage\": \"$1\", \"failed\": $2}"
        FAILED=1
    fi
}
SMOKE_FLAG=$([ "$SMOKE" = 1 ] && echo --smoke || true)
# model_stages PART: the stage model_stages_PART, bench/model_stages.py --part PART under the stage's limit
model_stages() {
    started "model_stages_$1" || return 0
    local rc=0
    timeout -k 10 "$LIMIT" "$PYTHON" bench/model_stages.py --part "$1" --deadline "$STAGE_DEADLINE" $SMOKE_FLAG \
        --jsonl "$OUTDIR/gpu_bench.jsonl" 2>&1 | { grep -v "^USDT" || true; } | tee -a "$OUTDIR/gpu_bench.txt" || rc=$?
    finished "model_stages_$1" "$rc"
}
# ---------------------------------------------------------------- env: what ran, and the peaks MFU is measured against
note "budget: ${TOTAL} s from the start of this script (deadline $BENCH_DEADLINE)"
if started env; then
    rc=0
    timeout -k 10 "$LIMIT" "$PYTHON" - <<'PY' 2>&1 | tee -a "$OUTDIR/gpu_bench.txt" || rc=$?
import json
import os
import platform
import time
from importlib.metadata import PackageNotFoundError, version

import torch
import transformers

from trainer.metrics import table_peak_flops
from trainer.models.kernels import choose_varlen_method

SMOKE = os.environ["SMOKE"] == "1"  # CPU, tiny shapes: exercises every line of the script, measures nothing
if not SMOKE and not torch.cuda.is_available():
    raise SystemExit("bench/gpu.sh needs a CUDA GPU (torch.cuda.is_available() is False); --cpu-smoke runs it on "
                     "the CPU")
dev = torch.device("cpu" if SMOKE else "cuda")


def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def bf16_peak(n=256 if SMOKE else 8192, reps=2 if SMOKE else 50):
    """FLOP/s of a square bf16 matmul, synchronised (below the datasheet: the MFU here uses the datasheet's)."""
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    if dev.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - start)


name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (SMOKE=1: checks the script, no figures)"
props = torch.cuda.get_device_properties(dev) if dev.type == "cuda" else None
sheet = table_peak_flops(name, torch.bfloat16) if dev.type == "cuda" else None  # datasheet dense bf16, or None
measured = bf16_peak()
env = {"stage": "env", "device": name, "python": platform.python_version(), "torch": torch.__version__,
       "cuda": torch.version.cuda, "transformers": transformers.__version__,
       **{pkg: installed(pkg) for pkg in ("triton", "deepspeed", "megatron-core", "pydantic", "flash-attn")},
       "gpu_memory_gib": props.total_memory / 2**30 if props else None,
       "sm_count": props.multi_processor_count if props else None,
       "datasheet_bf16_peak_flops": sheet, "measured_bf16_matmul_flops": measured,
       "varlen_bf16": choose_varlen_method(dev, torch.bfloat16),
       "varlen_fp32": choose_varlen_method(dev, torch.float32)}
print(json.dumps(env), flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_bench.jsonl"), "a") as f:
    f.write(json.dumps(env) + "\n")
print(f"measured bf16 matmul peak: {measured / 1e12:.4g} TFLOP/s; MFU is against "
      f"{'the datasheet: %.1f TFLOP/s' % (sheet / 1e12) if sheet else 'the measured peak (GPU not in PEAK_TFLOPS)'}")
PY
    finished env "$rc"
fi
# ---------------------------------------------------------------- the bare model step of BERT-large seq 512 bf16
model_stages core
# ---------------------------------------------------------------- the trainer's step through the DeepSpeed engine
# DeepSpeed's log lines and the memory report its bf16 optimizer prints per parameter group (kept out of the printout,
# which the device tool returns only the last 12,000 characters of; the JSON lines hold the figures)
DS_NOISE='^\[20|^MA [0-9.]+ GB|^CPU Virtual Memory|^(begin|end) bf16_ ?optimizer|^(before|after) initializing group'
if ! python -c "import deepspeed, pydantic" >/dev/null 2>&1; then
    record '{"stage": "trainer_step", "skipped": "deepspeed or pydantic is not importable (make gpu-wheels, then '\
'bring bench/out/wheels)"}'
elif started trainer_step; then
    rc=0
    timeout -k 10 "$LIMIT" "$PYTHON" bench/trainer_step.py --deadline "$STAGE_DEADLINE" $SMOKE_FLAG \
        --jsonl "$OUTDIR/gpu_bench.jsonl" 2>&1 | { grep -v -E "$DS_NOISE" || true; } | tee -a "$OUTDIR/gpu_bench.txt" \
        || rc=$?
    finished trainer_step "$rc"
fi
# ---------------------------------------------------------------- one profiled step, idle time at accumulation 4
model_stages profile
# ---------------------------------------------------------------- correctness and speed against Hugging Face
if started hf_comparison; then
    rc=0
    timeout -k 10 "$LIMIT" "$PYTHON" - <<'PY' 2>&1 | tee -a "$OUTDIR/gpu_bench.txt" || rc=$?
import os
import time

import torch
import torch.nn.functional as F
import transformers

from trainer.metrics import table_peak_flops
from trainer.models import MLM, NSP, HeadSpec, PretrainingModel, flat_positions, get_preset
from trainer.models.hf_convert import hf_config, to_hf_state_dict
from trainer.models.kernels import choose_varlen_method, pack, varlen_attention

SMOKE = os.environ["SMOKE"] == "1"
dev = torch.device("cpu" if SMOKE else "cuda")
STEPS, BATCH_TOKENS = (2, 256) if SMOKE else (int(os.environ["STEPS"]), int(os.environ["BATCH_TOKENS"]))
CHECK, LARGE, SEQS = ("tiny", "tiny", (32, 64)) if SMOKE else ("bert-base", "bert-large", (128, 512))
DEADLINE = float(os.environ["STAGE_DEADLINE"])


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


HEADS = {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}
# ---------------------------------------------------------------- correctness against Hugging Face on the GPU
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
cfg = get_preset(CHECK, **({"num_layers": 4} if not SMOKE else {}), dropout=0.0, attention_dropout=0.0,
                 compile="off" if SMOKE else "on")  # the check runs the compiled layers (the CUDA default)
ours = PretrainingModel(cfg, HEADS).to(dev).eval()
with torch.no_grad():
    for p in ours.parameters():
        p.add_(torch.randn_like(p) * 0.02)
hf = transformers.BertForPreTraining(hf_config(cfg, "BertForPreTraining"))
hf.load_state_dict(to_hf_state_dict(cfg, {k: v.cpu() for k, v in ours.state_dict().items()}), strict=False)
hf.tie_weights()
hf = hf.to(dev).eval()
ids = torch.randint(5, cfg.vocab_size, (4, 128), device=dev)
mask = torch.ones_like(ids)
mask[1, 64:] = 0
mask[2, 10:] = 0
ids[mask == 0] = 0
with torch.no_grad():
    a = ours(ids, mask)[MLM]
    b = hf(input_ids=ids, attention_mask=mask).prediction_logits
    print(f"fp32 logits vs HF on {dev.type}: max |diff| {(a - b).abs().max().item():.2e} (want < 1e-4)")
    with torch.autocast(dev.type, torch.bfloat16):
        a16 = ours(ids, mask)[MLM].float()
    print(f"bf16 autocast logits vs fp32 HF: max |diff| {(a16 - b).abs().max().item():.2e} (bf16 rounding)")
    unpadded = PretrainingModel(cfg.replace(unpad=True), HEADS).to(dev).eval()
    unpadded.load_state_dict(ours.state_dict())
    real = mask.bool()
    try:  # fp32 here: flash-attn has no fp32 kernel, so this takes the nested path on a GPU
        d = (unpadded(ids, mask)["hidden"][real] - ours(ids, mask)["hidden"][real]).abs().max().item()
        print(f"unpad ({choose_varlen_method(dev, torch.float32)}) vs padded hidden: max |diff| {d:.2e}")
    except (RuntimeError, ImportError) as err:
        print(f"unpad ({choose_varlen_method(dev, torch.float32)}): FAILED ({str(err).splitlines()[0]})")
    packing = pack(mask)
    qkv = torch.randn(int(mask.sum()), 3, cfg.num_heads, cfg.hidden_size // cfg.num_heads, device=dev,
                      dtype=torch.bfloat16)
    ref = varlen_attention(qkv, packing, method="padded")
    for method in ("nested", "flash"):
        try:
            got = varlen_attention(qkv, packing, method=method)
            print(f"varlen {method} vs padded (bf16): max |diff| {(got - ref).abs().max().item():.2e}")
        except (RuntimeError, ImportError) as err:
            print(f"varlen {method}: unavailable ({str(err).splitlines()[0]})")
del ours, hf, unpadded
torch.backends.cuda.matmul.allow_tf32 = True

# ---------------------------------------------------------------- BERT-large bf16 training steps, ours vs HF
name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
peak = table_peak_flops(name, torch.bfloat16) if dev.type == "cuda" else None
if peak is None:  # not in PEAK_TFLOPS (or the CPU smoke): a measured bf16 matmul, as in the env stage
    x = torch.randn(256 if SMOKE else 8192, 256 if SMOKE else 8192, device=dev, dtype=torch.bfloat16)
    x @ x
    sync()
    start = time.perf_counter()
    for _ in range(2 if SMOKE else 50):
        x @ x
    sync()
    peak = 2 * x.shape[0] ** 3 * (2 if SMOKE else 50) / (time.perf_counter() - start)
for seq, padding in ((SEQS[0], 0.0), (SEQS[1], 0.0), (SEQS[1], 0.5)):
    if time.time() >= DEADLINE:
        print(f"{LARGE} seq {seq} padding {padding:.0%}: skipped (time budget spent)", flush=True)
        continue
    batch = BATCH_TOKENS // seq
    preds = round(0.15 * seq)
    for unpad in ((False, True) if padding else (False,)):
        torch.manual_seed(0)
        cfg = get_preset(LARGE, unpad=unpad, compile="off")  # eager against eager HF; compile: bench/model_stages.py
        ours = PretrainingModel(cfg, HEADS).to(dev).train()
        hf = transformers.BertForPreTraining(hf_config(cfg, "BertForPreTraining")).to(dev).train()
        real = int(seq * (1 - padding))
        ids = torch.randint(5, cfg.vocab_size, (batch, seq), device=dev)
        mask = torch.zeros_like(ids)
        mask[:, :real] = 1
        ids[mask == 0] = 0
        pos = torch.stack([torch.randperm(real - 1, device=dev)[:preds] + 1 for _ in range(batch)])
        labels = torch.randint(5, cfg.vocab_size, pos.shape, device=dev)
        nsp = torch.randint(0, 2, (batch,), device=dev)
        flat, flat_labels = flat_positions(pos, labels, seq)
        hf_labels = torch.full_like(ids, -100).scatter_(1, pos, labels)

        def our_step(opt):
            with torch.autocast(dev.type, torch.bfloat16):
                out = ours(ids, mask, mlm_positions=flat)
                loss = F.cross_entropy(out[MLM].float(), flat_labels) + F.cross_entropy(out[NSP].float(), nsp)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def hf_step(opt):
            with torch.autocast(dev.type, torch.bfloat16):
                loss = hf(input_ids=ids, attention_mask=mask, labels=hf_labels, next_sentence_label=nsp).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        tokens = int(mask.sum())
        h, L = cfg.hidden_size, cfg.num_layers
        flops = (6 * tokens * L * (4 * h * h + 2 * h * cfg.ffn_size) + 12 * L * h * real * tokens
                 + 6 * flat.numel() * h * cfg.vocab_size)
        rates = {}
        for name, fn, model in (("ours", our_step, ours), ("hf", hf_step, hf)):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
            for _ in range(1 if SMOKE else 3):
                fn(opt)
            sync()
            start = time.perf_counter()
            for _ in range(STEPS):
                fn(opt)
            sync()
            dt = (time.perf_counter() - start) / STEPS
            rates[name] = tokens / dt
            mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
            print(f"{LARGE} seq {seq} batch {batch} padding {padding:.0%} unpad={unpad} {name:>4}: "
                  f"{dt * 1e3:7.1f} ms/step {tokens / dt:10.0f} tokens/s MFU {flops / dt / peak:6.1%} "
                  f"peak mem {mem:.1f} GiB")
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
        print(f"  ratio ours/hf: {rates['ours'] / rates['hf']:.2f}x")
        del ours, hf
        if dev.type == "cuda":
            torch.cuda.empty_cache()
PY
    finished hf_comparison "$rc"
fi
# ---------------------------------------------------------------- if time is left: the other large presets
model_stages others
exit "$FAILED"
