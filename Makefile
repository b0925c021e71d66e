# Everything a fresh machine needs: `make quickstart` and `make test` create/refresh the venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to the CPU wheel, so nothing that depends on it can pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: venv test test-fast quickstart bench gpu-wheels gpu-preflight wheels clean

venv: $(VENV)/.stamp

$(VENV)/.stamp: setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev,hf,mpi,plot,eval]"
	# DeepSpeed's just-in-time ops (cpu_adam, the CPU shm comm op), compiled now instead of inside the first run
	$(BIN)/python -m trainer.build_ops
	touch $@

# Three pytest-xdist workers on the 2 cores: the third fills the time the others wait (Slurm polling, KillWait, the
# rendezvous timeout, signals landing): with one thread per process, 370.2 / 383.2 s against 418.8-430.3 s at two
# (BENCHMARKS.md "Test suite"). Each module stays on one worker (tests/conftest.py).
XDIST = -n 3 --dist loadgroup

test: venv wheels
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: venv
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not slurm and not multiproc"

quickstart: venv
	bash scripts/quickstart.sh

# bench/prep.py's baseline is Megatron-LM's own tools/preprocess_data.py at the tag of the installed megatron-core;
# it is cloned into the ignored bench/out/, never committed here.
bench/out/megatron_lm:
	git clone -q --depth 1 --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM $@

bench: venv bench/out/megatron_lm
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python bench/prep.py

# Wheels bench/gpu.sh installs (pip --no-index) on a GPU node that has only Python 3.12, torch, transformers, triton.
gpu-wheels: venv
	bash bench/gpu_wheels.sh bench/out/wheels

# bench/gpu.sh --cpu-smoke in the GPU node's Python 3.12, torch 2.11.0 and transformers 5.17.0 with those wheels, in a
# venv under /tmp (~5 GB download once): run it before spending device time (bench/gpu_preflight.sh).
gpu-preflight: venv
	bash bench/gpu_preflight.sh

# The same wheels for `make test` (tests/test_bench_gpu_smoke.py installs bench/gpu.sh's from them), fetched once like
# the venv; without network the test tries again itself and, failing, skips only its trainer-step part.
WHEELS_STAMP := bench/out/wheels/.stamp
wheels: $(WHEELS_STAMP)

$(WHEELS_STAMP): setup.py bench/gpu_wheels.sh | venv
	if bash bench/gpu_wheels.sh bench/out/wheels >/dev/null; then touch $@; \
	else echo "make: the GPU wheels were not fetched (no network?); tests/test_bench_gpu_smoke.py tries again"; fi

clean:
	rm -rf $(VENV) quickstart_out .pytest_cache
