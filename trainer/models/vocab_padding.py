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


def resume_padding_error(saved_config: dict, cfg, where: str) -> str | None:
    """Why a checkpoint saved with ``saved_config`` (its recorded run config) cannot resume into ``cfg`` (a ModelConfig)
    because of vocabulary padding, or None. DeepSpeed's optimizer state has the saved row count, so unlike a weights
    load it cannot be fitted; checkpoints from before ``pad_vocab_to`` existed have no key and no padding."""
    model = (saved_config or {}).get("model") or {}
    if model.get("vocab_size") != cfg.vocab_size:
        return None  # another vocabulary: not a padding question (DeepSpeed names the mismatch)
    saved_pad = int(model.get("pad_vocab_to", 1))
    saved_rows = -(-cfg.vocab_size // saved_pad) * saved_pad
    if saved_rows == cfg.padded_vocab_size:
        return None
    return (f"{where} was saved with {saved_rows} vocabulary rows (model.pad_vocab_to {saved_pad}"
            f"{'' if 'pad_vocab_to' in model else ', from before vocabulary padding'}), this config stores "
            f"{cfg.padded_vocab_size} (pad_vocab_to {cfg.pad_vocab_to}): resume with --set model.pad_vocab_to="
            f"{saved_pad}, or start a new run from its weights with checkpoint.init_from (which pads them)")
