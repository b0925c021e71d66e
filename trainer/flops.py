"""Training FLOPs, counted for the layers as the forward applies them (MFU's numerator), split into the part linear
in tokens and the attention part quadratic in each attended segment's length.

Each ``PretrainingModel`` inside the trained model (one for BERT/RoBERTa/ALBERT/ERNIE, the generator and the
discriminator for ELECTRA) is rebuilt on the meta device (no memory, no arithmetic) and its forward on one sequence
of ``seq_len`` tokens, with ``predictions`` MLM positions, runs under torch's ``FlopCounterMode``: every matmul and
attention product it performs is counted, so ALBERT's one stored layer counts once per application (12 or 24
times), ALBERT's E->H projection, the tied MLM decoder and every head the forward computes (ERNIE's task heads)
are in, and embedding lookups (no matmul) are out. Training = 3 x forward (backward: 2 matmuls per forward one).

The split. A forward on one row of n tokens costs ``a n + b n^2 + c``: ``a`` every matmul applied per token (QKV and
output projections, FFN, the E->H projection, token heads), ``b n^2`` the attention products (QK^T and AV, 4 n^2 H
per layer application), ``c`` what is applied per row at a fixed count (the MLM head at ``predictions`` positions,
the sequence heads' pooler and classifier). ``b`` is the exact second difference of counts at n, n-1 and n-2 (the
same predictions at all three), so whatever op the attention lowers to is found without a hand formula. The loop then
counts ``per_token x real tokens + per_square x sum of squared attended-segment lengths`` (``TrainFlops.at``):
attention counted for the rows as computed rather than at ``seq_len`` for every token (which overstated BERT-large's
work by up to ~8 % on short rows, more on packed rows of short documents). ``c`` stays in ``per_token`` at
``c / seq_len`` (the heads at their full-row rates, as before).

Costs 3 meta forwards per model at start-up (~0.1-2 s each on a CPU: shapes only). ``tests/test_flops.py`` checks
every preset against the closed form of both parts. Full-row figures (seq 512, 76 predictions): bert-large 1.99
GFLOP/token, albert-xxlarge 14.80 (the parameter count gave 1.62: its shared layer counted once).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class TrainFlops:
    """Training FLOPs of one optimizer step's work = ``per_token x tokens + per_square x squares``."""
    per_token: float
    """Per real token: every matmul linear in tokens, plus the per-row heads at their ``seq_len`` rates."""
    per_square: float
    """Per squared attended-segment length: the attention products of every layer application of every model."""
    seq_len: int

    def at(self, tokens: float, squares: float) -> float:
        return self.per_token * tokens + self.per_square * squares

    @property
    def full_row_per_token(self) -> float:
        """Per token when every row is one full ``seq_len`` segment (the figure before the split)."""
        return self.per_token + self.per_square * self.seq_len


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


def split_forward_flops(pretraining_model: torch.nn.Module, seq_len: int, predictions: int) -> tuple[int, int]:
    """(forward FLOPs on one row of ``seq_len`` tokens, ``b``: forward FLOPs per squared segment length). ``b`` is the
    second difference of the counts at seq_len, seq_len - 1 and seq_len - 2 (the same predictions at all three)."""
    if seq_len < 3:
        raise ValueError(f"split_forward_flops: seq_len {seq_len} < 3 leaves no second difference to count")
    p = min(predictions, seq_len - 2)  # the same head work at all three lengths
    f0, f1, f2 = (forward_flops(pretraining_model, seq_len - d, p) for d in (0, 1, 2))
    second = f0 - 2 * f1 + f2
    if second % 2 or second < 0:
        raise ArithmeticError(f"split_forward_flops: counts {f0}, {f1}, {f2} are no quadratic in the length")
    # the full row at the run's predictions (a fourth count only when a row is shorter than predictions + 2)
    full = f0 if p == min(predictions, seq_len) else forward_flops(pretraining_model, seq_len, predictions)
    return full, second // 2


def train_flops(model: torch.nn.Module, seq_len: int, predictions: int) -> TrainFlops:
    """Training FLOPs of ``model`` (the module the objective built), split (module docstring), for rows of at most
    ``seq_len`` tokens with ``predictions`` MLM positions each (``data.masking.max_predictions_per_seq``)."""
    parts = _pretraining_models(model)
    if not parts:
        raise TypeError(f"train_flops: {type(model).__name__} holds no PretrainingModel to count")
    counts = [split_forward_flops(m, seq_len, predictions) for m in parts]
    full, square = sum(f for f, _ in counts), sum(b for _, b in counts)
    return TrainFlops(per_token=3.0 * (full - square * seq_len * seq_len) / seq_len, per_square=3.0 * square,
                      seq_len=seq_len)


def train_flops_per_token(model: torch.nn.Module, seq_len: int, predictions: int) -> float:
    """Training FLOPs per token of ``model`` when every row is one full segment of ``seq_len`` tokens (attention
    at ``seq_len``): the full-row figure. The loop's MFU uses ``train_flops`` (attention at the rows' lengths)."""
    parts = _pretraining_models(model)
    if not parts:
        raise TypeError(f"train_flops_per_token: {type(model).__name__} holds no PretrainingModel to count")
    return 3.0 * sum(forward_flops(m, seq_len, predictions) for m in parts) / seq_len
