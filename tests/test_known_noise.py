"""Start-up noise (data_prep/known_noise.py): a launched process no longer prints megatron-core's "Transformer Engine
and Apex are not installed" warnings or DeepSpeed's "Setting accelerator to CPU" warning, and other warnings,
including other megatron-core ones, still reach the user."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TE_APEX = "Transformer Engine and Apex are not installed"
NO_GPU = "Setting accelerator to CPU"
CPU_TORCH = torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def _python(code: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "PYTHONWARNINGS")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**environ, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _output(proc) -> str:
    return proc.stdout + proc.stderr  # DeepSpeed's logger writes to stdout, warnings go to stderr


def test_upstream_still_warns_without_our_filters():
    """The control: megatron-core and DeepSpeed imported bare print what the product silences (so the test below
    can fail; if upstream stops warning, this test says so and the filters can go)."""
    proc = _python("import megatron.core.datasets.indexed_dataset; from deepspeed.accelerator import get_accelerator; "
                   "get_accelerator()")
    assert proc.stderr.count(TE_APEX) >= 1
    if CPU_TORCH:
        assert NO_GPU in _output(proc)


def test_product_imports_print_no_known_noise_and_keep_real_warnings():
    code = """
import warnings
import trainer.engine  # the module that imports deepspeed
from trainer.data.corpus import IndexedCorpus  # noqa: F401
import megatron.core.datasets.indexed_dataset  # noqa: F401
from deepspeed.accelerator import get_accelerator
print(get_accelerator().device_name())
# real warnings still show: another megatron-core message, and the same text from anywhere else
warnings.warn_explicit("megatron.core says something else", UserWarning, "m.py", 1, module="megatron.core.x")
warnings.warn_explicit(f"{TE_APEX} (not from megatron)", UserWarning, "o.py", 1, module="ours")
""".replace("{TE_APEX}", TE_APEX)
    proc = _python(code)
    assert TE_APEX + "." not in proc.stderr and "Falling back" not in proc.stderr, proc.stderr
    assert "megatron.core says something else" in proc.stderr
    assert f"{TE_APEX} (not from megatron)" in proc.stderr
    if CPU_TORCH:
        assert proc.stdout.split() == ["cpu"] and NO_GPU not in _output(proc), _output(proc)


def test_a_users_accelerator_choice_is_kept(monkeypatch):
    from data_prep.known_noise import choose_cpu_accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    assert choose_cpu_accelerator() is False and os.environ["DS_ACCELERATOR"] == "cuda"
    monkeypatch.delenv("DS_ACCELERATOR")
    assert choose_cpu_accelerator() is CPU_TORCH  # set only for a torch that can use nothing but the CPU
    assert os.environ.get("DS_ACCELERATOR") == ("cpu" if CPU_TORCH else None)


@pytest.mark.skipif(not CPU_TORCH, reason="only a CPU-only torch makes the choice for DeepSpeed")
def test_a_gpu_torch_would_leave_deepspeeds_detection_alone(monkeypatch):
    from data_prep.known_noise import choose_cpu_accelerator

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert choose_cpu_accelerator() is False and "DS_ACCELERATOR" not in os.environ
