"""Config sections that the fine-tuning config shares with pretraining (``deepspeed``), apart from trainer/config.py so
that trainer/finetune/config.py imports no module that imports it back (trainer/config_checks.py checks
``eval.downstream`` entries through the fine-tuning config; the suite refuses import cycles: tests/test_structure.py)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DeepSpeedConfig(_Section):
    config: str = "ds_configs/zero2.json"
    """DeepSpeed JSON (relative to the repo root or absolute). Batch sizes, optimizer, scheduler, precision and
    clipping are filled in by the trainer; do not set them in the JSON."""
    zero_stage: Literal[0, 1, 2, 3] | None = None
    """Overrides zero_optimization.stage of the JSON (None = keep the JSON's)."""
    precision: Literal["fp32", "bf16", "fp16"] | None = None
    """None = what the JSON enables (its bf16/fp16 blocks), fp32 if neither. fp32 on CPU (bf16 matmul is ~250x
    slower there); bf16 on GPUs that have it; fp16 uses dynamic loss scaling. Must not contradict the JSON."""
    timeout_minutes: float = Field(default=10.0, gt=0)
    """Collective timeout: a dead rank fails the others after this long instead of hanging the job."""
