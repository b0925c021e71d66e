"""FLOPs per token as applied (trainer/flops.py) against the closed form, for every preset and the ELECTRA pair.

The closed form, per token of a row of T tokens with P MLM predictions, forward (x3 for training):
  every applied layer (L of them, shared or not): 2 (4 H^2 + 2 H I) for the linear maps + 4 T H for the score and
  value products; the E->H projection when E != H: 2 E H; an MLM head at P/T of the tokens: 2 (H E + E V), V the
  padded vocabulary the decoder GEMM runs on (ModelConfig.padded_vocab_size: 30,528 for 30,522, +0.02 %);
  a sequence head (pooler + classifier) once per row: 2 (H^2 + H n) / T; a token head at every token: 2 (H^2 + H n).
The split the loop's MFU uses (``train_flops``): the 4 T H of each applied layer is attention, 4 H per squared
segment length per layer (``per_square`` = 3 x 4 H L summed over the models); all the rest is ``per_token``.
"""
from __future__ import annotations

import pytest
import torch

from trainer.flops import train_flops, train_flops_per_token
from trainer.models import get_preset
from trainer.models.presets import PRESET_ROWS, counted_model

T, P = 512, 76


def closed_form(cfg, heads, seq_len: int, predictions: int) -> float:
    H, I, E, V, L = cfg.hidden_size, cfg.ffn_size, cfg.emb_size, cfg.padded_vocab_size, cfg.num_layers
    fwd = L * (2 * (4 * H * H + 2 * H * I) + 4 * seq_len * H)
    fwd += 2 * E * H if E != H else 0
    for spec in heads.values():
        if spec.kind == "mlm":
            fwd += 2 * (H * E + E * V) * predictions / seq_len
        elif spec.kind == "sequence":
            fwd += 2 * (H * H + H * spec.num_labels) / seq_len
        else:
            fwd += 2 * (H * H + H * spec.num_labels)
    return 3.0 * fwd


def closed_form_square(cfg) -> float:
    """Training FLOPs per squared attended-segment length: QK^T and AV, 2 T^2 H each, per applied layer."""
    return 3.0 * 4 * cfg.hidden_size * cfg.num_layers


def assert_split(got, configs_heads) -> None:
    """``train_flops``' two parts (``got``) against their closed forms, and together the full-row figure."""
    square = sum(closed_form_square(cfg) for cfg, _ in configs_heads)
    full = sum(closed_form(cfg, heads, T, P) for cfg, heads in configs_heads)
    assert got.per_square == pytest.approx(square, rel=1e-12)
    assert got.per_token == pytest.approx(full - square * T, rel=1e-12)  # so full_row_per_token == full


@pytest.mark.parametrize("name", list(PRESET_ROWS))
def test_flops_per_token_and_its_split_equal_the_closed_form_for_every_preset(name):
    """The full-row figure and its two parts (3 meta forwards: one test per preset, as the suite's time allows)."""
    row = PRESET_ROWS[name]
    got = train_flops(counted_model(name), T, P)
    assert got.full_row_per_token == pytest.approx(closed_form(row.config, row.heads, T, P), rel=1e-12)
    assert_split(got, [(row.config, row.heads)])


def test_attention_part_at_short_lengths_and_few_predictions():
    """A row shorter than its predictions (tiny configurations): the second difference holds the head work fixed."""
    model = counted_model("bert-base")
    got = train_flops(model, 8, 20)
    assert got.per_square == closed_form_square(model.cfg)
    assert got.full_row_per_token == pytest.approx(train_flops_per_token(model, 8, 20), rel=1e-12)


def test_albert_counts_its_shared_layer_once_per_application():
    got = train_flops_per_token(counted_model("albert-xxlarge"), T, P)
    assert got / 1e9 == pytest.approx(14.80, abs=0.01)  # the parameter count said 1.62: one layer of 12
    unshared = counted_model("albert-xxlarge").cfg.replace(sharing="none")
    from trainer.models.heads import PretrainingModel
    with torch.device("meta"):
        model = PretrainingModel(unshared, PRESET_ROWS["albert-xxlarge"].heads)
    assert train_flops_per_token(model, T, P) == got  # sharing saves parameters, not compute
    shared = train_flops(counted_model("albert-xxlarge"), T, P)
    assert shared.per_square == train_flops(model, T, P).per_square == closed_form_square(unshared)


def test_electra_counts_generator_and_discriminator():
    from trainer.objectives import get_objective

    cfg = get_preset("electra-base")
    with torch.device("meta"):
        model = get_objective({"name": "electra"}).build_model(cfg)
    disc, gen = PRESET_ROWS["electra-base"], PRESET_ROWS["electra-base-generator"]
    expected = closed_form(disc.config, disc.heads, T, P) + closed_form(gen.config, gen.heads, T, P)
    assert train_flops_per_token(model, T, P) == pytest.approx(expected, rel=1e-12)
    assert_split(train_flops(model, T, P), [(disc.config, disc.heads), (gen.config, gen.heads)])


def test_ernie2_counts_its_task_heads():
    from trainer.config import load_config
    from trainer.objectives import get_objective

    run = load_config("ernie2_base", ["model.vocab_size=30522", "model.pad_token_id=0"])  # 'auto' reads a corpus
    objective, cfg = get_objective(run.objective), run.model
    with torch.device("meta"):
        model = objective.build_model(cfg)
    heads = model.head_specs
    assert len(heads) > 2  # MLM + the sentence-level tasks' heads
    assert train_flops_per_token(model, T, P) == pytest.approx(closed_form(cfg, heads, T, P), rel=1e-12)
    assert_split(train_flops(model, T, P), [(cfg, heads)])
