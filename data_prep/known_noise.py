"""Start-up warnings that our code paths make irrelevant, silenced precisely; every other warning is kept.

megatron-core: importing any ``megatron.core`` module runs ``megatron/core/__init__.py``, which imports its optimizer
and FSDP packages, and four of their modules warn "Transformer Engine and Apex are not installed. Falling back to
..." (local multi_tensor_applier, torch optimizers). We use megatron-core only for its indexed dataset files (and its
C++ sample helpers); optimizers, fused kernels and data parallelism come from DeepSpeed and torch, so the fallbacks
it announces are never on our path. ``silence_megatron_fallbacks`` ignores exactly that message from megatron.core's
modules (a warnings filter: by message prefix, category and emitting module); called by ``data_prep`` and ``trainer``
when they are imported, before any megatron import.

DeepSpeed: when it detects no accelerator it warns "Setting accelerator to CPU. If you have GPU or other accelerator,
we were unable to detect it." With a torch built for the CPU only (no CUDA, no ROCm, no XPU, no MPS) and none of the
other accelerator plug-ins DeepSpeed looks for installed, no GPU can be used whatever the machine holds, so the CPU is
the only choice and the warning says nothing: ``choose_cpu_accelerator`` sets ``DS_ACCELERATOR=cpu`` (DeepSpeed's own
override) before deepspeed is imported. It never overrides a value the user set, and with a GPU build of torch that
sees no device it does nothing: that warning is then real (a GPU job that lost its GPU) and stays.
"""
from __future__ import annotations

import importlib.util
import os
import warnings

MEGATRON_FALLBACK = r"Transformer Engine and Apex are not installed"
# Accelerator plug-ins DeepSpeed's auto-detection imports before it falls back to the CPU (deepspeed/accelerator/
# real_accelerator.py): with any of them installed, detection is left to DeepSpeed.
_ACCELERATOR_PLUGINS = ("intel_extension_for_pytorch", "torch_npu", "torch_sdaa", "habana_frameworks", "torch_mlu",
                        "torch_supa", "torch_xmlir")


def silence_megatron_fallbacks() -> None:
    warnings.filterwarnings("ignore", message=MEGATRON_FALLBACK, category=UserWarning, module=r"megatron\.core(\.|$)")


def choose_cpu_accelerator() -> bool:
    """Set ``DS_ACCELERATOR=cpu`` when this torch can use nothing else (module docstring); returns whether it did.
    Call before ``import deepspeed``: DeepSpeed picks its accelerator at import."""
    if "DS_ACCELERATOR" in os.environ:
        return False
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return False
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return False
    if torch.backends.mps.is_available():
        return False
    if any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_PLUGINS):
        return False
    os.environ["DS_ACCELERATOR"] = "cpu"
    return True
