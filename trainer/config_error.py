"""``ConfigError``, apart from trainer/config.py so that modules trainer.config itself imports (the fine-tuning task
specs, through ``trainer.finetune.downstream``) can raise it without an import cycle. ``trainer.config`` re-exports it."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run; the message names the file, the dotted key and what to do."""
