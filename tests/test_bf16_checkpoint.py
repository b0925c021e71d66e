"""Checkpoints of DeepSpeed's BF16_Optimizer (ZeRO-1, bf16 weights, fp32 gradient accumulation: the
``ds_configs/zero1_bf16*.json`` every GPU recipe ships with) give their fp32 master weights to everything that reads a
checkpoint's full weights: ``checkpoint.init_from`` (bert_base phase 2 starts from phase 1's), the Hugging Face
export and fine-tuning. DeepSpeed's zero_to_fp32 refused them ("... is not a zero checkpoint"), so phase 2 of
slurm/bert_base.sh failed at its start after phase 1's days of training, and on every resubmission.

Real 2-rank runs of the stand-in trainer in bf16 on the CPU (DeepSpeed's BF16_Optimizer as on a GPU, tiny sizes)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer import checkpoint, safe_load

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def test_a_bf16_optimizer_checkpoint_consolidates_to_its_fp32_masters_and_phase_2_starts_from_it(tmp_path):
    from test_trainer_multiproc import make_config, run
    from trainer.engine import checkpoint_globals, consolidated_fp32_state_dict

    bf16 = {"config": str(REPO / "ds_configs" / "zero1_bf16.json")}
    phase1 = make_config(tmp_path, "phase1", deepspeed=bf16, train={"steps": 4, "eval_every": 0},
                         checkpoint={"every_steps": 4, "keep_last": 2})
    run(phase1, 2, "--resume", "none")
    tag = tmp_path / "phase1" / "checkpoints" / "global_step4"
    assert sorted(p.name for p in tag.glob("*optim_states.pt")) == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]

    masters = consolidated_fp32_state_dict(tag.parent, tag.name)
    weights = safe_load.load(tag / "mp_rank_00_model_states.pt", checkpoint_globals())["module"]
    assert set(masters) == set(weights)
    for name, w in weights.items():
        assert masters[name].dtype == torch.float32 and w.dtype == torch.bfloat16, name
        # the bf16 weights are these masters rounded, and the masters hold more than bf16 does: fp32 masters, not
        # the bf16 weights widened
        assert torch.equal(masters[name].to(torch.bfloat16), w), name
    assert any(not torch.equal(masters[n], w.float()) for n, w in weights.items())

    phase2 = make_config(tmp_path, "phase2", deepspeed=bf16, train={"steps": 2, "eval_every": 0},
                         checkpoint={"every_steps": 2, "keep_last": 2, "init_from": str(tag.parent)})
    proc = run(phase2, 2, "--resume", "none")
    assert f"initialised from {tag.parent}" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert checkpoint.find_latest(tmp_path / "phase2" / "checkpoints").name == "global_step2"


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_checkpoints_of_zero_2_and_3_still_consolidate(tmp_path, stage):
    """DeepSpeed names every bf16 run's optimizer files bf16_zero_pp_rank_*: ZeRO-2 and ZeRO-3 in bf16 (a recipe with
    zero3_offload.json, --set deepspeed.zero_stage=3) are zero_to_fp32's to read, and a first version of this fix
    sent them to the BF16_Optimizer merge (KeyError; found by review)."""
    from test_trainer_multiproc import make_config, run
    from trainer.engine import checkpoint_globals, consolidated_fp32_state_dict

    cfg = make_config(tmp_path, "z", deepspeed={"config": str(REPO / "ds_configs" / "zero1_bf16.json"),
                                               "zero_stage": stage},
                      train={"steps": 2, "eval_every": 0}, checkpoint={"every_steps": 2, "keep_last": 2})
    run(cfg, 2, "--resume", "none")
    tag = tmp_path / "z" / "checkpoints" / "global_step2"
    assert any(tag.glob("bf16_zero_pp_rank_*_optim_states.pt"))
    masters = consolidated_fp32_state_dict(tag.parent, tag.name)
    model_states = sorted(tag.glob("*model_states.pt"))[0]
    weights = safe_load.load(model_states, checkpoint_globals())["module"]
    shared = [n for n, w in weights.items() if w.numel()]  # ZeRO-3's module holds empty placeholders
    assert masters and all(masters[n].dtype == torch.float32 for n in masters)
    if stage == 2:
        assert all(torch.equal(masters[n].to(torch.bfloat16), weights[n]) for n in shared)
