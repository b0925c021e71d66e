"""Vocabulary rows across padding: weights saved with one ``pad_vocab_to`` loaded into a model built with another.

The word embedding, the tied MLM decoder and the decoder bias have ``cfg.padded_vocab_size`` rows (ModelConfig); only
the first ``cfg.vocab_size`` hold the vocabulary. A checkpoint from before padding (30,522 rows), a Hugging Face
import (the tokenizer's rows) or a model saved with another multiple has a different count; ``fit_vocab_rows`` pads
with zero rows (what a fresh padded model holds there) or drops padding rows, never a real one. The Hugging Face
export trims to ``vocab_size`` in ``hf_convert.to_hf_state_dict``.
"""
import torch

VOCAB_ROW_KEYS = ("embeddings.word.weight", "decoder.weight", "decoder.bias")
"""Key endings (any prefix: ``encoder.``, ``heads.mlm.``, ``generator.`` ...) of the tensors whose rows are the
vocabulary."""


def is_vocab_row_key(key: str) -> bool:
    return any(key == end or key.endswith("." + end) for end in VOCAB_ROW_KEYS)


def fit_rows(tensor: torch.Tensor, rows: int, vocab_size: int, key: str = "") -> torch.Tensor:
    """``tensor`` with ``rows`` rows: zero rows appended, or padding rows (index >= vocab_size) dropped."""
    have = tensor.shape[0]
    if have == rows:
        return tensor
    if have < vocab_size:
        raise ValueError(f"{key or 'tensor'} has {have} vocabulary rows, fewer than the model's vocab_size "
                         f"{vocab_size}: these weights were trained with another tokenizer")
    if have > rows:
        return tensor[:rows]
    return torch.cat([tensor, tensor.new_zeros((rows - have, *tensor.shape[1:]))])


def fit_vocab_rows(state_dict: dict, rows: int, vocab_size: int) -> dict:
    """A copy of ``state_dict`` whose vocabulary tensors (VOCAB_ROW_KEYS) have ``rows`` rows (see ``fit_rows``).
    Aliased tensors (a decoder weight that is the word embedding) stay aliased."""
    out, done = dict(state_dict), {}
    for key, tensor in state_dict.items():
        if is_vocab_row_key(key) and isinstance(tensor, torch.Tensor):
            ident = id(tensor)
            if ident not in done:
                done[ident] = fit_rows(tensor, rows, vocab_size, key)
            out[key] = done[ident]
    return out


def fit_to_config(state_dict: dict, cfg) -> dict:
    """``fit_vocab_rows`` to a ModelConfig's padded_vocab_size."""
    return fit_vocab_rows(state_dict, cfg.padded_vocab_size, cfg.vocab_size)
