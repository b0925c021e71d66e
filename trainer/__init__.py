"""bertfamily trainer: one encoder, pluggable objectives, one DeepSpeed engine."""
__version__ = "0.1.0"
