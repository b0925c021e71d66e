"""One encoder for BERT, RoBERTa, ALBERT, ELECTRA and ERNIE, its heads, the presets table and Hugging Face conversion.

Importing this package imports torch but builds nothing. The Hugging Face conversion (``hf_convert``) is imported
on demand because it pulls in ``transformers``.
"""
from trainer.models.config import ModelConfig
from trainer.models.electra import ElectraPretrainingModel, generator_config
from trainer.models.encoder import Encoder
from trainer.models.heads import (MLM, NSP, RTD, SOP, HeadSpec, MLMHead, PretrainingModel, SequenceHead, TokenHead,
                                  count_parameters, flat_positions)
from trainer.models.presets import PRESET_ROWS, PRESETS, get_preset

__all__ = ["ModelConfig", "Encoder", "HeadSpec", "MLMHead", "SequenceHead", "TokenHead", "PretrainingModel",
           "ElectraPretrainingModel", "generator_config", "PRESETS", "PRESET_ROWS", "get_preset", "flat_positions",
           "count_parameters", "MLM", "NSP", "SOP", "RTD"]
