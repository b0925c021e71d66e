"""bertfamily data prep: tokenizers and Megatron-format indexed shards."""
__version__ = "0.1.0"
