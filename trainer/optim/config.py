"""The ``optim`` and ``schedule`` sections of the run config: pydantic and the standard library only, so that config
validation (``--check``) imports neither torch nor DeepSpeed."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
