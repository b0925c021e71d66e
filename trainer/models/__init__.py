"""One encoder for BERT, RoBERTa, ALBERT, ELECTRA and ERNIE, its heads, the presets table and Hugging Face conversion.

Importing this package imports only the torch-free part (``ModelConfig``, ``HeadSpec``, the presets table), so config
validation can use it; the modules (``Encoder``, ``PretrainingModel``, ...) import torch when first named
(PEP 562 ``__getattr__``). The Hugging Face conversion (``hf_convert``) is imported on demand because it pulls in
``transformers``.
"""
import importlib

from trainer.models.config import (MLM, NSP, RTD, SOP, HeadSpec, ModelConfig, generator_config,
                                   infer_generator_fraction)
from trainer.models.presets import PRESET_ROWS, PRESETS, get_preset

_TORCH_PARTS = {
    "Encoder": "trainer.models.encoder",
    "MLMHead": "trainer.models.heads", "SequenceHead": "trainer.models.heads", "TokenHead": "trainer.models.heads",
    "PretrainingModel": "trainer.models.heads", "count_parameters": "trainer.models.heads",
    "flat_positions": "trainer.models.heads", "mlm_targets": "trainer.models.heads",
    "ElectraPretrainingModel": "trainer.models.electra",
}


def __getattr__(name: str):
    if name in _TORCH_PARTS:
        return getattr(importlib.import_module(_TORCH_PARTS[name]), name)
    raise AttributeError(f"module 'trainer.models' has no attribute {name!r}")


__all__ = ["ModelConfig", "Encoder", "HeadSpec", "MLMHead", "SequenceHead", "TokenHead", "PretrainingModel",
           "ElectraPretrainingModel", "generator_config", "infer_generator_fraction", "PRESETS", "PRESET_ROWS",
           "get_preset", "flat_positions", "mlm_targets", "count_parameters", "MLM", "NSP", "SOP", "RTD"]
