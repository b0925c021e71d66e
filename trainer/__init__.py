"""bertfamily trainer: one encoder, pluggable objectives, one DeepSpeed engine."""
from data_prep.known_noise import silence_megatron_fallbacks as _silence

__version__ = "0.1.0"
_silence()  # megatron-core's "Transformer Engine and Apex are not installed" (data_prep/known_noise.py)
