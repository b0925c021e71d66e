"""What a launch says at start for an operator reading the job log (trainer/run_banner.py), and --check's note when
the recipe evaluates nothing (found by the operations review: only the job log's start said so, among DeepSpeed's
warnings, and the production recipes set eval_every with no held-out data)."""
from __future__ import annotations

import torch

from trainer.config import load_config
from trainer.pretrain import main
from trainer.run_banner import parameter_count, schedule_line, start_banner

NUMS = ["model.vocab_size=1024", "model.pad_token_id=1"]


def test_the_start_banner_says_model_size_precision_steps_schedule_and_checkpoints():
    cfg = load_config("albert_xxlarge", [*NUMS, "model.preset=tiny-albert"])
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))  # 283 parameters
    line = start_banner(cfg, model, "bf16", 100)
    assert line.startswith(f"run: albert {cfg.model.num_layers} x {cfg.model.hidden_size}, 283 parameters, bf16; "
                           f"steps 101 to {cfg.train.steps:,} ({cfg.train.steps - 100:,} to go); "), line
    assert f"peak lr {cfg.optim.lr:g} (lamb), warmup {cfg.schedule.warmup_steps:,} steps, then polynomial" in line
    assert f"checkpoint every {cfg.checkpoint.every_steps:,} steps, keeping the last {cfg.checkpoint.keep_last}" \
        in line and line.endswith(f"log every {cfg.logging.every_steps:,} steps")


def test_the_schedule_line_follows_the_kind_and_the_decay_end():
    cfg = load_config("roberta_large", NUMS)
    assert schedule_line(cfg).endswith(f"then linear decay to 0 x peak at step {cfg.train.steps:,}")
    cfg = load_config("roberta_large", [*NUMS, "schedule.kind=constant"])
    assert schedule_line(cfg).endswith("then constant")
    cfg = load_config("roberta_large", [*NUMS, "schedule.end_ratio=0.1", "schedule.decay_steps=1000"])
    assert schedule_line(cfg).endswith("then linear decay to 0.1 x peak at step 1,000")


def test_a_zero3_partitioned_parameter_counts_whole():
    p = torch.nn.Parameter(torch.empty(0))
    p.ds_numel = 1000  # what DeepSpeed's ZeRO-3 leaves on a rank (a stand-in: no engine here)
    model = torch.nn.Module()
    model.w = p
    assert parameter_count(model) == 1000


def test_check_says_when_the_recipe_evaluates_nothing(capsys):
    assert main(["--config", "roberta_large", "--check", *[x for s in NUMS for x in ("--set", s)]]) == 0
    assert "evaluation is off: train.eval_every=5000 but no held-out data is set" in capsys.readouterr().err
    assert main(["--config", "roberta_large", "--check", *[x for s in [*NUMS, "data.valid_split=0.005"]
                                                          for x in ("--set", s)]]) == 0
    assert "evaluation is off" not in capsys.readouterr().err
