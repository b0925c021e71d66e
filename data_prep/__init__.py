"""bertfamily data prep: tokenizers and Megatron-format indexed shards."""
from data_prep.known_noise import silence_megatron_fallbacks as _silence

__version__ = "0.1.0"
_silence()  # megatron-core's "Transformer Engine and Apex are not installed" (data_prep/known_noise.py)
