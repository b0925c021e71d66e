"""Optimizers and learning-rate schedules.

- ``config.py``: the ``optim`` and ``schedule`` config sections (pydantic only; imported by config validation);
- ``build.py``: ``build_optimizer`` (torch AdamW or LAMB) and ``NonFiniteGuard``, the skip-on-NaN/Inf mixin every
  optimizer the trainer steps carries; DeepSpeed's own optimizers are built by ``trainer/engine.py``;
- ``lamb.py`` and ``zero_lamb.py``: LAMB, exact under ZeRO 1-3; ``param_groups.py``: weight-decay groups;
- ``schedules.py``: warmup + decay as a torch ``LambdaLR``.

Importing this package imports only the config sections, so validating a config does not import torch.
"""
from trainer.optim.config import OptimConfig, ScheduleConfig

__all__ = ["OptimConfig", "ScheduleConfig"]
