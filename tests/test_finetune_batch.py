"""Fine-tuning's micro-batch is a per-rank ceiling, as pretraining's: README's data-parallel command
(`torchrun --nproc_per_node 8 -m trainer.finetune ...` with the defaults, global 32 and micro 32) was refused on any
world size above 1 ("not a multiple of train.micro_batch_size=32 x 2 ranks"; found by the docs review)."""
from __future__ import annotations

import pytest

from trainer.config import ConfigError
from trainer.finetune.config import batch_split, load_finetune_config


@pytest.mark.parametrize("world, sets, expected", [
    (1, [], (32, 1)),
    (2, [], (16, 1)),
    (8, [], (4, 1)),
    (1, ["train.micro_batch_size=12"], (8, 4)),  # the largest divisor of 32 up to 12
    (2, ["train.global_batch_size=48", "train.micro_batch_size=16"], (12, 2)),
])
def test_the_micro_batch_is_the_largest_that_divides_each_ranks_share(world, sets, expected):
    cfg = load_finetune_config(None, ["task.name=rte", "task.data=unused", *sets])
    micro, accum = batch_split(cfg, world)
    assert (micro, accum) == expected and micro * accum * world == cfg.train.global_batch_size


def test_a_global_batch_the_ranks_cannot_share_is_refused_with_what_to_do():
    cfg = load_finetune_config(None, ["task.name=rte", "task.data=unused", "train.global_batch_size=30"])
    with pytest.raises(ConfigError, match=r"train.global_batch_size=30 cannot be split evenly over 4 ranks"):
        batch_split(cfg, 4)
