#!/usr/bin/env bash
# `make gpu-preflight`: bench/gpu.sh --cpu-smoke in the GPU node's own Python, torch and transformers, before device
# time is spent on it. The lent GPU machines' image ("cuda", /work/.library/device/KINDS.md, read 2026-11) has Python
# 3.12, torch 2.11.0 (a CUDA 13 build), transformers 5.17.0 and triton 3.6.0, and no network; the test suite runs
# gpu.sh's smoke in this checkout's venv instead (Python 3.11, torch 2.13.0 CPU, transformers 5.x), so an API that
# torch 2.11 lacks, or a cp312 wheel missing from bench/out/wheels, would first show on the GPU. This makes a venv
# with only those (PY, TORCH, TRANSFORMERS override them), outside the checkout so that it never travels to the
# device, and runs the smoke there with the wheels folder as the node would: pydantic, DeepSpeed and megatron-core
# come from the cp312 wheels, nothing else of this checkout's venv is importable.
# Downloads ~5 GB once (a CUDA build of torch: PyPI has no CPU build of 2.11), ~1 min on a machine with a PyPI
# mirror; the smoke itself ~1 min. Not part of `make test` for that reason. Exits non-zero if any stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# The GPU node's Python: $PY, else python3.12 on PATH, else a pyenv-installed 3.12 (pyenv's shim alone fails when 3.12
# is installed but not selected)
PYENV_312=$(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python 2>/dev/null || true)
for candidate in ${PY:-} python3.12 $PYENV_312; do
    if "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 12)" >/dev/null 2>&1; then
        PY="$candidate"
        break
    fi
done
TORCH="${TORCH:-torch==2.11.0}" TRANSFORMERS="${TRANSFORMERS:-transformers==5.17.0}"
VENV="${VENV:-${TMPDIR:-/tmp}/bertfamily-gpu-preflight/venv}"
OUTDIR="${OUTDIR:-${TMPDIR:-/tmp}/bertfamily-gpu-preflight/out}"
[ -n "${PY:-}" ] || { echo "gpu-preflight: no Python 3.12 found (set PY=/path/to/python3.12: the GPU node's)"; exit 2; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q "$TORCH" "$TRANSFORMERS"
ls bench/out/wheels/deepspeed-*.whl >/dev/null 2>&1 || bash bench/gpu_wheels.sh bench/out/wheels
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
# PATH: the venv and the system's tools only (no other venv); no PYTHONPATH, so only the venv and the wheels serve
status=0
env -u PYTHONPATH -u VIRTUAL_ENV PATH="$VENV/bin:/usr/bin:/bin" OUT="$OUTDIR" SITE="$OUTDIR/site" \
    TORCH_EXTENSIONS_DIR="$OUTDIR/torch_extensions" bash bench/gpu.sh --cpu-smoke > "$OUTDIR/log" 2>&1 || status=$?
"$VENV/bin/python" - "$OUTDIR/gpu_bench.jsonl" "$status" <<'PY'
import json
import sys
from collections import Counter

try:
    records = [json.loads(line) for line in open(sys.argv[1])]
except FileNotFoundError:
    records = []  # gpu.sh stopped before its first stage (its log follows)
env = next((r for r in records if r["stage"] == "env" and "device" in r), {})
print("gpu-preflight: Python {python}, torch {torch}, transformers {transformers}, deepspeed {deepspeed}, "
      "megatron-core {megatron-core}, pydantic {pydantic}".format(**{k: env.get(k) for k in (
          "python", "torch", "transformers", "deepspeed", "megatron-core", "pydantic")}))
print("gpu-preflight: lines per stage", dict(Counter(r["stage"] for r in records)))
bad = [r for r in records if "failed" in r or "skipped" in r]
for r in bad:
    print("gpu-preflight: NOT RUN", json.dumps(r)[:500])
print(f"gpu-preflight: gpu.sh exited {sys.argv[2]}; {'OK' if not bad and sys.argv[2] == '0' else 'FAILED'}")
PY
[ "$status" = 0 ] || { tail -40 "$OUTDIR/log"; exit "$status"; }
