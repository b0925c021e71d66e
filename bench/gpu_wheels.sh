#!/usr/bin/env bash
# `make gpu-wheels`: everything bench/gpu.sh needs beyond Python + torch + transformers + triton, as wheels in an
# ignored folder (default bench/out/wheels) that travels with the working tree to a bare GPU node with no network.
# Versions are the ones this checkout is tested with (read from the current environment). Binary wheels are fetched
# for CPython 3.12 on manylinux x86_64 (the GPU node) and for this interpreter (the --cpu-smoke run here); DeepSpeed
# comes as a source package and is built here into a pure-Python wheel without native ops (DS_BUILD_OPS=0: its ops
# JIT-compile on first use where nvcc exists; the trainer falls back to torch's fused AdamW where not).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-bench/out/wheels}"
mkdir -p "$DEST"
HERE="$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
PY_VERSIONS="${PY_VERSIONS:-3.12 $HERE}"
# DeepSpeed's, pydantic's and megatron-core's requirements that torch + transformers do not already bring
PACKAGES="pydantic pydantic-core annotated-types typing-extensions typing-inspection hjson msgpack ninja einops psutil
          py-cpuinfo tqdm megatron-core"
pinned=$(python - $PACKAGES <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in sys.argv[1:]))
PY
)
for v in $(echo $PY_VERSIONS | tr ' ' '\n' | sort -u); do
    pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$v" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$DEST" $pinned
done
DS_VERSION="$(python -c 'from importlib.metadata import version; print(version("deepspeed"))')"
DS_BUILD_OPS=0 pip wheel -q --no-deps --no-build-isolation "deepspeed==$DS_VERSION" -w "$DEST"
ls "$DEST"
