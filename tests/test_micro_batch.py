"""``train.micro_batch_size`` is a per-GPU ceiling (trainer/config.py ``batch_plan``): every shipped recipe passes
``--check`` at the cluster sizes users run, the arithmetic picks the largest micro-batch that fits, and only a global
batch that the ranks cannot share evenly is refused, with the world sizes that can."""
from __future__ import annotations

import pytest

from trainer.config import RECIPES_DIR, ConfigError, TrainConfig, batch_plan, ceiling_note, load_config
from trainer.pretrain import main

RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
TINY = {name for name in RECIPES if name.startswith("tiny_")}  # tests and quickstart: global batch 16
# The tiny recipes resolve model.vocab_size/pad_token_id from a corpus's tokenizer (auto); --check only needs numbers.
NO_CORPUS = ["--set", "model.vocab_size=1024", "--set", "model.pad_token_id=1"]


def train(global_batch: int, ceiling: int, accum: int | None = None) -> TrainConfig:
    return TrainConfig(steps=1, global_batch_size=global_batch, micro_batch_size=ceiling,
                       gradient_accumulation_steps=accum)


@pytest.mark.parametrize("world_size", [1, 8, 16, 32, 64])
def test_check_accepts_every_shipped_recipe_at_cluster_sizes(world_size, monkeypatch, capsys):
    """In-process ``--check`` (as the Slurm templates run it, with WORLD_SIZE): every recipe but the tiny ones at every
    size; a tiny recipe (global batch 16) exactly where 16 sequences can be shared, refused with the sizes that work
    elsewhere. Before the ceiling, 16 of the 56 production recipe x {8, 16, 32, 64} launches were refused."""
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    for name in RECIPES:
        status = main(["--config", name, "--check", *NO_CORPUS])
        out, err = capsys.readouterr()
        if name in TINY and 16 % world_size:
            assert status == 2, (name, err)
            assert f"cannot be split evenly over {world_size} data-parallel ranks" in err, err
            assert "world sizes that work with it: 1, 2, 4, 8, 16." in err, err
            continue
        assert status == 0, (name, world_size, err)
        cfg = load_config(name, NO_CORPUS[1::2], world_size=world_size)
        micro, accum = batch_plan(cfg.train, world_size)
        assert micro * accum * world_size == cfg.train.global_batch_size and micro <= cfg.train.micro_batch_size
        assert (ceiling_note(cfg.train, world_size) or f"micro batch {micro} x accumulation {accum}") in err, err


def test_the_largest_micro_batch_within_the_ceiling_that_divides_the_share():
    assert batch_plan(train(128, 128), 8) == (16, 1)  # electra_small on 8 ranks (was refused)
    assert batch_plan(train(128, 128), 1) == (128, 1)
    assert batch_plan(train(256, 32), 16) == (16, 1)  # bert_base on 16 ranks (was refused)
    assert batch_plan(train(768, 32), 16) == (24, 2)  # share 48: 32 does not divide it, 24 does
    assert batch_plan(train(768, 32), 8) == (32, 3)  # the ceiling itself when it divides the share
    assert batch_plan(train(8192, 32), 64) == (32, 4)
    assert batch_plan(train(14, 4), 2) == (1, 7)  # share 7 (prime): nothing between 1 and the ceiling divides it
    note = ceiling_note(train(768, 32), 16)
    assert note == ("train.micro_batch_size=32 is a per-GPU ceiling: on 16 ranks each rank's share of "
                    "train.global_batch_size=768 is 48 sequences, so the micro-batch is 24 (the largest not above "
                    "the ceiling that divides 48) x accumulation 2")
    assert ceiling_note(train(768, 32), 8) == ""


def test_explicit_accumulation_is_kept_within_the_ceiling():
    assert batch_plan(train(16, 2, accum=2), 4) == (2, 2)
    assert batch_plan(train(64, 16, accum=2), 4) == (8, 2)  # below the ceiling is fine
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps=2 does not fit: .* over 2 data-parallel ranks "
                                          r"is 8 sequences per rank, which is not 2 micro-batches of at most "
                                          r"train.micro_batch_size=2"):
        batch_plan(train(16, 2, accum=2), 2)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps=3 does not fit"):
        batch_plan(train(16, 8, accum=3), 2)  # 8 per rank is not 3 whole micro-batches


def test_refused_only_when_the_ranks_cannot_share_the_global_batch():
    with pytest.raises(ConfigError) as err:
        batch_plan(train(24, 8), 5)
    assert str(err.value) == (
        "train.global_batch_size=24 cannot be split evenly over 5 data-parallel ranks (24 / 5 = 4.8 sequences each); "
        "world sizes that work with it: 1, 2, 3, 4, 6, 8, 12, 24. Launch on one of those, or set "
        "train.global_batch_size to a multiple of 5")
    with pytest.raises(ConfigError, match=r"tiny_roberta.yaml: train.global_batch_size=16 cannot be split evenly over "
                                          r"32 data-parallel ranks"):
        load_config("tiny_roberta", NO_CORPUS[1::2], world_size=32)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_run_uses_the_micro_batch_below_the_ceiling_and_says_so_once(tmp_path):
    """torchrun, 2 ranks, the stand-in objective: global batch 8 with a ceiling of 16 (refused before) trains with
    micro-batches of 4, DeepSpeed's own batch check agreeing, and every step's 8 samples are trained once."""
    from test_trainer_multiproc import make_config, run, samples_per_step

    cfg = make_config(tmp_path, "ceiling", train={"steps": 2, "global_batch_size": 8, "micro_batch_size": 16,
                                                   "eval_every": 0}, checkpoint={"every_steps": 0})
    proc = run(cfg, 2)
    text = proc.stdout + proc.stderr
    assert text.count("train.micro_batch_size=16 is a per-GPU ceiling") == 1, text[-3000:]
    assert "micro batch 4 x accumulation 1 x 2 ranks = 8 sequences per step" in text, text[-3000:]
    assert samples_per_step(tmp_path / "ceiling") == {1: list(range(8)), 2: list(range(8, 16))}
