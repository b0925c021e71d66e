"""The lines a launch says once at start about what it will do, for an operator reading a job log: the model's size,
the precision, the steps left, the learning-rate schedule and the checkpoint policy (the rest of the start lines
say the world size and batch, the corpus and how many times it is read, and the MFU denominator). Everything here is
in RUN_DIR/config.json too; a job log should not need it to tell a misconfigured launch from a healthy one."""
from __future__ import annotations

import torch


def parameter_count(model: torch.nn.Module) -> int:
    """Parameters of ``model``, whole: under ZeRO-3 a rank holds a partition (``numel()`` 0) and DeepSpeed keeps the
    full size in ``ds_numel``."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def schedule_line(cfg) -> str:
    s, steps = cfg.schedule, cfg.train.steps
    peak = f"peak lr {cfg.optim.lr:g} ({cfg.optim.name})"
    warm = f", warmup {s.warmup_steps:,} steps" if s.warmup_steps else ""
    if s.kind == "constant":
        return f"{peak}{warm}, then constant"
    end = s.decay_steps or steps
    shape = f"polynomial (power {s.power:g})" if s.kind == "polynomial" else "linear"
    return f"{peak}{warm}, then {shape} decay to {s.end_ratio:g} x peak at step {end:,}"


def start_banner(cfg, model: torch.nn.Module, precision: str, step: int) -> str:
    """One line: model, precision, steps, schedule, checkpoints."""
    ck = cfg.checkpoint
    saves = (f"checkpoint every {ck.every_steps:,} steps, keeping the last {ck.keep_last}" if ck.every_steps
             else "no periodic checkpoints") + (" and one at the end" if ck.save_at_end else "")
    left = cfg.train.steps - step
    m = cfg.model
    return (f"run: {m.family} {m.num_layers} x {m.hidden_size}, {_count(parameter_count(model))} parameters, "
            f"{precision}; "
            f"steps {step + 1:,} to {cfg.train.steps:,} ({left:,} to go); {schedule_line(cfg)}; {saves}; "
            f"log every {cfg.logging.every_steps:,} steps")
