"""Optimizers the trainer builds itself: torch's AdamW and our LAMB, each behind the non-finite guard.

``adamw`` is torch's AdamW on CPU (DeepSpeed's ``cpu_adam``/``fused_adam`` would each spend ~75 s compiling a native op
on first use, and torch's is bit-reproducible across a resume); ``lamb`` is ``trainer/optim/lamb.py``. The optimizers
that come from DeepSpeed (FusedAdam on GPU, DeepSpeedCPUAdam under ZeRO-Offload) are built by ``trainer/engine.py``,
the one module that imports deepspeed, with the same groups and the same guard.

Every optimizer we hand to DeepSpeed skips a step whose gradients are not finite and says so in ``.overflow``: the
engine reads that attribute to count the step as skipped and hold the lr schedule. DeepSpeed's fp16 loss scaler
checks overflow itself; in fp32 and bf16 nothing does, so the guard lives here, for every stage.
"""
from __future__ import annotations

import torch

from trainer.optim.config import OptimConfig
from trainer.optim.lamb import Lamb
from trainer.optim.param_groups import param_groups


class NonFiniteGuard:
    """Mixin: skip ``step()`` when any gradient is NaN/Inf and set ``self.overflow`` (read by DeepSpeed's engine).

    Under ZeRO each rank holds only its partition of the gradients, so the decision is all-reduced: one rank's NaN
    makes every rank skip (otherwise the replicas diverge, and a collective inside the step, such as LAMB's trust-ratio
    all-reduce, waits forever for the ranks that skipped). DeepSpeed calls ``step`` the same number of times on every
    rank (equal, padded partitions), so the collective always matches.

    Costs one ``_foreach_norm`` over the gradients, one all-reduce of a scalar and one host sync per step.

    ``checked_by_wrapper``: set by ``trainer.engine.Engine`` when DeepSpeed's ZeRO-1/2 or bf16 optimizer wraps this
    one. Those compute the global gradient norm over all ranks anyway and skip the whole step, before calling this
    optimizer, when it is not finite; they also call ``step`` once per param group (ZeRO-1/2), where the guard
    would compute a norm, all-reduce and sync per group, and could skip one group but not the other.
    """

    overflow = False
    checked_by_wrapper = False

    def step(self, closure=None):
        if self.checked_by_wrapper:
            self.overflow = False
            return super().step(closure)
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


class GuardedLamb(NonFiniteGuard, Lamb):
    pass


def build_optimizer(cfg: OptimConfig, model: torch.nn.Module, groups: list[dict] | None = None
                    ) -> torch.optim.Optimizer:
    """torch's AdamW or our LAMB, as ``cfg`` names it, over ``model``'s parameters, wrapped with the non-finite guard
    (``trainer.engine.build_optimizer`` substitutes DeepSpeed's optimizers where they apply). ``groups`` replaces
    the default param groups (fine-tuning's per-layer learning rates, trainer/finetune/model.py)."""
    if cfg.name == "adamw":
        groups = groups or param_groups(model, cfg.weight_decay)
        return GuardedAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if groups is not None:
        groups = [{"exclude_from_trust_ratio": g["weight_decay"] == 0, **g} for g in groups]
    groups = groups or param_groups(model, cfg.weight_decay, mark_trust_ratio=True)
    kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                  bias_correction=cfg.bias_correction)
    if cfg.max_trust_ratio is not None:
        kwargs["max_trust_ratio"] = cfg.max_trust_ratio
    return GuardedLamb(groups, **kwargs)
