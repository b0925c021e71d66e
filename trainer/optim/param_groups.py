"""Optimizer parameter groups: weight decay (and LAMB's trust ratio) only on weight matrices and embeddings.

BERT's reference optimizer excludes ``bias`` and ``LayerNorm`` parameters from weight decay by name; ALBERT's LAMB
excludes the same ones from layer adaptation (``exclude_from_layer_adaptation``); NVIDIA's LAMB reaches the same end
through the groups' zero weight decay. We decide by what a parameter is, not only by its name: a parameter is
excluded when it is a bias, belongs to a normalization module (``nn.LayerNorm``, ``nn.RMSNorm``, ``GroupNorm``, or any
module whose class name ends in ``Norm``), or is 1-D (a gain or offset vector). Everything else, embeddings included,
is decayed, as in BERT.

Shared parameters (ALBERT's layer sharing, tied MLM decoder and word embeddings) are listed once: DeepSpeed refuses a
parameter that appears in two groups.
"""
from __future__ import annotations

import torch
from torch import nn

_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._BatchNorm)


def _norm_module_params(model: nn.Module) -> set[int]:
    ids = set()
    for module in model.modules():
        if isinstance(module, _NORM_TYPES) or type(module).__name__.endswith("Norm"):
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def is_excluded(name: str, param: torch.Tensor, norm_param_ids: set[int] = frozenset()) -> bool:
    """True for parameters that get no weight decay and a trust ratio of 1: biases, norm weights, 1-D vectors."""
    lname = name.lower()
    return (param.ndim < 2 or id(param) in norm_param_ids or lname.endswith("bias")
            or "layernorm" in lname or "layer_norm" in lname)


def excluded_names(model: nn.Module) -> list[str]:
    """Names of the parameters ``param_groups`` puts in the no-decay group (for logs and tests)."""
    norm_ids = _norm_module_params(model)
    return [n for n, p in model.named_parameters() if p.requires_grad and is_excluded(n, p, norm_ids)]


def param_groups(model: nn.Module, weight_decay: float, mark_trust_ratio: bool = False) -> list[dict]:
    """``[{"params": decayed, "weight_decay": weight_decay}, {"params": excluded, "weight_decay": 0.0}]``.

    With ``mark_trust_ratio`` (for ``Lamb``) the excluded group also gets ``exclude_from_trust_ratio: True`` and the
    decayed one ``False``. Empty groups are dropped (ZeRO cannot partition an empty group). Frozen parameters
    (``requires_grad=False``) are left out.
    """
    norm_ids = _norm_module_params(model)
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # named_parameters() already yields a shared tensor once
        if param.requires_grad:
            (no_decay if is_excluded(name, param, norm_ids) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if mark_trust_ratio:
        groups[0]["exclude_from_trust_ratio"] = False
        groups[1]["exclude_from_trust_ratio"] = True
    return [g for g in groups if g["params"]]
