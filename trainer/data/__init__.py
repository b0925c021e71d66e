"""Pretraining data: indexed corpus reader, sample index, formats, masking, global order and blending, loader.

Only the config model is imported here (cheap); the reader imports megatron-core when it opens shards.
"""
from trainer.data.config import CorpusSpec, DataConfig, MaskingConfig

__all__ = ["DataConfig", "MaskingConfig", "CorpusSpec"]
