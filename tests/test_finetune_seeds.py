"""How many seeds a fine-tuning runs: ``--seeds`` over ``--set train.seeds`` over the ``--config`` YAML, and the
same through ``eval.downstream`` (whose child command passes ``--seeds`` only when the task's ``seeds`` is given)."""
from __future__ import annotations

from trainer.finetune.__main__ import parse_args, sweep_configs
from trainer.finetune.downstream import DownstreamLauncher, EvalConfig


def _child_seeds(launcher, task) -> list[int]:
    cmd = launcher._command(task, 10, launcher.run_dir / "downstream" / "global_step10" / "rte" / "global_step10")
    args = parse_args(cmd[cmd.index("trainer.finetune") + 1:])
    return [cfg.train.seeds for _, cfg in sweep_configs(args, 1)]


def test_downstream_seeds_from_set_config_or_field(tmp_path):
    yaml = tmp_path / "ft.yaml"
    yaml.write_text("train: {seeds: 3}\n")
    base = {"task": "rte", "data": str(tmp_path / "rte"), "every_steps": 10}
    cfg = EvalConfig(downstream=[{**base, "set": ["train.seeds=5"]}, {**base, "config": str(yaml)},
                                 {**base, "config": str(yaml), "set": ["train.seeds=4"], "sweep": ["optim.lr=1e-5,2e-5"]},
                                 {**base, "set": ["train.seeds=5"], "seeds": 2}, base])
    launcher = DownstreamLauncher(cfg, tmp_path, 0, say=lambda *_: None)
    # before: `--seeds 1` on every child command, which beat set and config (1 seed each)
    assert [_child_seeds(launcher, t) for t in cfg.downstream] == [[5], [3], [4, 4], [2], [1]]


def test_command_line_precedence(tmp_path):
    yaml = tmp_path / "ft.yaml"
    yaml.write_text("train: {seeds: 3}\n")
    common = ["--checkpoint", "x", "--task", "rte", "--data", "d", "--config", str(yaml)]
    assert sweep_configs(parse_args(common), 1)[0][1].train.seeds == 3
    assert sweep_configs(parse_args([*common, "--set", "train.seeds=4"]), 1)[0][1].train.seeds == 4
    assert sweep_configs(parse_args([*common, "--set", "train.seeds=4", "--seeds", "2"]), 1)[0][1].train.seeds == 2
