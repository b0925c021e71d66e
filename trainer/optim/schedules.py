"""Learning-rate schedules: linear warmup, then linear or polynomial decay (BERT, RoBERTa, ALBERT, ELECTRA).

The schedule is a ``torch.optim.lr_scheduler.LambdaLR`` over a picklable ``WarmupDecay`` object, handed to
``deepspeed.initialize`` so that DeepSpeed saves and restores it with the engine checkpoint. The multiplier is a pure
function of the step, so a resumed run (on any world size) continues the same curve.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field


class ScheduleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["linear", "polynomial", "constant"] = "linear"
    """Decay after warmup: linear to end_ratio (BERT, RoBERTa), polynomial with `power` (ALBERT uses power 1)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warmup from 0 to the peak lr over this many steps (BERT 10k, RoBERTa-base 24k, ALBERT 3125)."""
    power: float = Field(default=1.0, gt=0)
    """Exponent of the polynomial decay (1.0 = linear)."""
    end_ratio: float = Field(default=0.0, ge=0, le=1)
    """lr at the last step, as a fraction of the peak."""
    decay_steps: int | None = Field(default=None, gt=0)
    """Step at which decay ends (None = train.steps)."""


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


def build_scheduler(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupDecay(cfg, total_steps))
