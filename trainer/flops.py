"""Training FLOPs per token, counted for the layers as the forward applies them (MFU's numerator).

Each ``PretrainingModel`` inside the trained model (one for BERT/RoBERTa/ALBERT/ERNIE, the generator and the
discriminator for ELECTRA) is rebuilt on the meta device (no memory, no arithmetic) and its forward on one sequence
of ``seq_len`` tokens, with ``predictions`` MLM positions, runs under torch's ``FlopCounterMode``: every matmul and
attention product it performs is counted, so ALBERT's one stored layer counts once per application (12 or 24
times), ALBERT's E->H projection, the tied MLM decoder and every head the forward computes (ERNIE's task heads)
are in, and embedding lookups (no matmul) are out. Training = 3 x forward (backward: 2 matmuls per forward one).

Costs ~0.1-2 s per model at start-up on a CPU (meta tensors: shapes only). ``tests/test_flops.py`` checks every
preset against the closed form. Figures (seq 512, 76 predictions): bert-large 1.99 GFLOP/token, albert-xxlarge
14.80 (the parameter count gave 1.62: its shared layer counted once).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode


def _pretraining_models(model: torch.nn.Module) -> list[torch.nn.Module]:
    from trainer.models.heads import PretrainingModel

    return [m for m in model.modules() if isinstance(m, PretrainingModel)]


def forward_flops(pretraining_model: torch.nn.Module, seq_len: int, predictions: int) -> int:
    """Matmul FLOPs of one forward of ``pretraining_model``'s architecture on one sequence (meta device)."""
    from trainer.models.heads import PretrainingModel

    with torch.device("meta"):
        shadow = PretrainingModel(pretraining_model.cfg, pretraining_model.head_specs)
        input_ids = torch.zeros(1, seq_len, dtype=torch.long)
        positions = torch.arange(min(predictions, seq_len))
    with FlopCounterMode(display=False) as counter:
        shadow(input_ids, mlm_positions=positions)
    return counter.get_total_flops()


def train_flops_per_token(model: torch.nn.Module, seq_len: int, predictions: int) -> float:
    """Training FLOPs per token of ``model`` (the module the objective built) for rows of ``seq_len`` tokens with
    ``predictions`` MLM positions each (``data.masking.max_predictions_per_seq``)."""
    parts = _pretraining_models(model)
    if not parts:
        raise TypeError(f"train_flops_per_token: {type(model).__name__} holds no PretrainingModel to count")
    return 3.0 * sum(forward_flops(m, seq_len, predictions) for m in parts) / seq_len
