"""Learning-rate schedules: linear warmup, then linear or polynomial decay (BERT, RoBERTa, ALBERT, ELECTRA).

The schedule is a ``torch.optim.lr_scheduler.LambdaLR`` over a ``WarmupDecay`` object, handed to
``deepspeed.initialize`` so that DeepSpeed saves and restores its position with the engine checkpoint. The multiplier
is a pure function of the step and the config, so a resumed run (on any world size) continues the same curve, or the
stretched one if ``train.steps`` was extended.
"""
from __future__ import annotations

import torch

from trainer.optim.config import ScheduleConfig


class WarmupDecay:
    """lr multiplier at step s. A class, not a closure, so LambdaLR.state_dict() can save it."""

    def __init__(self, cfg: ScheduleConfig, total_steps: int):
        self.kind = cfg.kind
        self.warmup = cfg.warmup_steps
        self.power = cfg.power if cfg.kind == "polynomial" else 1.0
        self.end = cfg.end_ratio
        self.total = cfg.decay_steps or total_steps

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return step / self.warmup
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total - self.warmup)
        progress = min(1.0, (step - self.warmup) / span)
        return self.end + (1.0 - self.end) * (1.0 - progress) ** self.power


class WarmupDecayLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR whose checkpoint holds only the position (the step), not the curve's settings or the peak lr.

    So a resumed run follows the config it is started with: extending ``train.steps`` stretches the decay instead
    of leaving the lr at 0 past the old end. With an unchanged config the curve is the same function, so resume stays
    bit-identical.
    """

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.pop("base_lrs", None)
        state["lr_lambdas"] = [None] * len(self.lr_lambdas)
        return state

    def sync_lr(self) -> None:
        """After loading a checkpoint: the optimizer's groups still carry the lr of the saved run's curve; set the
        lr of the current step from this config's curve (the same value when the config is unchanged)."""
        for group, base, fn in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
            group["lr"] = base * fn(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def build_scheduler(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> WarmupDecayLR:
    return WarmupDecayLR(optimizer, WarmupDecay(cfg, total_steps))
