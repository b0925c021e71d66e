"""Optimizers for the trainer: ``OptimConfig`` (the ``optim`` config section) and ``build_optimizer``.

``adamw`` is torch's AdamW on CPU (DeepSpeed's ``cpu_adam``/``fused_adam`` would each spend ~75 s compiling a native op
on first use, and torch's is bit-reproducible across a resume) and DeepSpeed's FusedAdam on GPU (through
``trainer.engine``, the one module that imports deepspeed). ``lamb`` is ``trainer/optim/lamb.py``.

Every optimizer we hand to DeepSpeed skips a step whose gradients are not finite and says so in ``.overflow``: the
engine reads that attribute to count the step as skipped and hold the lr schedule. DeepSpeed's fp16 loss scaler
checks overflow itself; in fp32 and bf16 nothing does, so the guard lives here, for every stage.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from trainer.optim.param_groups import param_groups  # noqa: F401  (re-exported: biases/norms get no decay)


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = Field(gt=0)
    """Peak learning rate (reached at the end of warmup)."""
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    """Decoupled weight decay; never applied to biases or LayerNorm weights."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Clip the global gradient norm to this (0 = off); passed to DeepSpeed as gradient_clipping."""
    bias_correction: bool = True
    """LAMB only: Adam-style bias correction of the moments (the NVIDIA reference keeps it on)."""
    max_trust_ratio: float | None = Field(default=None, gt=0)
    """LAMB only: clip the trust ratio ||w|| / ||update|| to this (None = no clipping, as in ALBERT)."""


class NonFiniteGuard:
    """Mixin: skip ``step()`` when any gradient is NaN/Inf and set ``self.overflow`` (read by DeepSpeed's engine).

    Under ZeRO each rank holds only its partition of the gradients, so the decision is all-reduced: one rank's NaN
    makes every rank skip (otherwise the replicas diverge, and a collective inside the step, such as LAMB's trust-ratio
    all-reduce, waits forever for the ranks that skipped). DeepSpeed calls ``step`` the same number of times on every
    rank (equal, padded partitions), so the collective always matches.

    Costs one ``_foreach_norm`` over the gradients, one all-reduce of a scalar and one host sync per step.
    """

    overflow = False

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        device = grads[0].device if grads else (params[0].device if params else torch.device("cpu"))
        if grads:
            total = torch.stack([n.float() for n in torch._foreach_norm(grads)]).sum()
            bad = (~torch.isfinite(total)).float()
        else:
            bad = torch.zeros((), device=device)
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            if torch.distributed.get_backend() == "nccl" and bad.device.type != "cuda":
                bad = bad.cuda()  # CPU-offloaded partitions: NCCL reduces device tensors only
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        self.overflow = bool(bad.item())  # note: a host sync point
        if self.overflow:
            return None
        return super().step(closure)


class GuardedAdamW(NonFiniteGuard, torch.optim.AdamW):
    pass


def offloads_optimizer(ds: dict) -> bool:
    """True when ZeRO keeps the fp32 partitions and optimizer state off the accelerator (``offload_optimizer``
    device cpu or nvme): the same test DeepSpeed applies (``zero_use_cpu_optimizer``) before it demands its own
    CPU optimizer."""
    offload = (ds.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return offload.get("device", "none") in ("cpu", "nvme")


def offload_problem(cfg: OptimConfig, ds: dict, source: str = "deepspeed.config") -> str | None:
    """Why ``cfg`` cannot train under the DeepSpeed JSON ``ds`` with ZeRO's optimizer offload, or None.

    With ``offload_optimizer`` ``adamw`` steps DeepSpeed's CPU Adam (``trainer/engine.py``). ``lamb`` is refused:
    its trust-ratio all-reduce runs on the device of the offloaded (CPU) partitions, which NCCL does not reduce, and
    a substitute optimizer would silently train something else. Pure (no deepspeed import), so config validation can
    call it before anything is launched.
    """
    if cfg.name == "lamb" and offloads_optimizer(ds):
        device = ds["zero_optimization"]["offload_optimizer"]["device"]
        return (f"deepspeed.config: {source} offloads the optimizer (zero_optimization.offload_optimizer "
                f"device={device}), which optim.name=lamb does not support; use a config without "
                "offload (ds_configs/zero2.json or zero3.json: ZeRO already partitions LAMB's state over the ranks), "
                "or optim.name=adamw, which offloads as DeepSpeedCPUAdam")
    return None


def build_optimizer(cfg: OptimConfig, model: torch.nn.Module, device: str = "cpu") -> torch.optim.Optimizer:
    """The optimizer named by ``cfg`` over ``model``'s parameters, wrapped with the non-finite guard."""
    if cfg.name == "adamw":
        groups = param_groups(model, cfg.weight_decay)
        if device.startswith("cuda"):
            from trainer.engine import fused_adam_class
            cls = type("GuardedFusedAdam", (NonFiniteGuard, fused_adam_class()), {})
            return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                       adam_w_mode=True)
        return GuardedAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    from trainer.optim import lamb  # the LAMB issue's module (plain and ZeRO-aware)
    groups = param_groups(model, cfg.weight_decay, mark_trust_ratio=True)
    cls = type("GuardedLamb", (NonFiniteGuard, lamb.Lamb), {})
    kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                  bias_correction=cfg.bias_correction)
    if cfg.max_trust_ratio is not None:
        kwargs["max_trust_ratio"] = cfg.max_trust_ratio
    return cls(groups, **kwargs)
