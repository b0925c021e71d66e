"""Full fp32 weights from a checkpoint of DeepSpeed's ``BF16_Optimizer``: what every GPU recipe saves.

DeepSpeed runs ZeRO-1 with bf16 weights and fp32 gradient accumulation (``ds_configs/zero1_bf16*.json``, the recipes'
configs) through ``BF16_Optimizer``, which saves ``bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt``: each rank's
fp32 master partition of each parameter group (``single_partition_of_fp32_groups``) and its ``partition_count``, laid
out as ZeRO-1/2 lays out its own, but without the ``zero_stage`` key. DeepSpeed's ``zero_to_fp32`` refuses such a
file ("... is not a zero checkpoint", DeepSpeed 0.19.8), so the Hugging Face export, ``checkpoint.init_from``
(bert_base phase 2) and fine-tuning could not read any GPU recipe's checkpoint. Here the partitions are read and
handed to zero_to_fp32's own ZeRO-1/2 merge, which rebuilds each parameter (and the buffers, frozen and shared
parameters) from the model states; nothing of the layout is re-implemented. tests/test_bf16_checkpoint.py checks
that the masters round to the bf16 weights saved beside them and hold more than bf16 does, and that bf16 checkpoints
of ZeRO-2 and ZeRO-3 (also named ``bf16_zero_pp_rank_*``, with ``zero_stage``) still go to zero_to_fp32.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from trainer import safe_load

_RANK = re.compile(r"bf16_zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def is_bf16_optimizer_checkpoint(tag_dir: Path, allowed: list) -> bool:
    """Whether ``tag_dir`` holds BF16_Optimizer's files. DeepSpeed names every bf16 run's optimizer files
    ``bf16_zero_pp_rank_*`` (ZeRO-2 and ZeRO-3 in bf16 too, which zero_to_fp32 reads); only BF16_Optimizer's lack
    the ``zero_stage`` key. Read with ``mmap``: the tensors are not loaded to answer."""
    found = sorted(Path(tag_dir).glob("bf16_zero_pp_rank_*_mp_rank_00_optim_states.pt"))
    if not found:
        return False
    with torch.serialization.safe_globals(list(allowed)):
        state = torch.load(found[0], map_location="cpu", weights_only=True, mmap=True)["optimizer_state_dict"]
    return "zero_stage" not in state and "single_partition_of_fp32_groups" in state


def bf16_zero1_state_dict(tag_dir: Path, allowed: list) -> dict[str, torch.Tensor]:
    """The fp32 master weights of a ``BF16_Optimizer`` checkpoint folder, by parameter name, loaded weights-only
    with ``allowed`` globals (``engine.checkpoint_globals``)."""
    from deepspeed.utils import zero_to_fp32

    tag_dir = Path(tag_dir)
    ranked = sorted((int(m.group(1)), f) for f in tag_dir.iterdir() if (m := _RANK.search(f.name)))
    partitions = []
    for rank, path in ranked:
        state = safe_load.load(path, allowed)["optimizer_state_dict"]
        world = max(state["partition_count"]) if isinstance(state["partition_count"], list) else \
            state["partition_count"]
        partitions.append(state["single_partition_of_fp32_groups"])  # (the Adam moments are dropped with state)
    if [r for r, _ in ranked] != list(range(world)):
        raise FileNotFoundError(f"{tag_dir}: BF16 optimizer partitions of ranks {[r for r, _ in ranked]}, but the "
                                f"checkpoint was saved by {world} ranks: a rank's file is missing (a save "
                                "interrupted, or files copied only in part)")
    with safe_load.weights_only_loads([tag_dir], allowed):  # zero_to_fp32 passes weights_only=False
        models = zero_to_fp32.parse_model_states(zero_to_fp32.get_model_state_files(str(tag_dir)))
    return zero_to_fp32._get_fp32_state_dict_from_zero2_checkpoint(world, partitions, models, False)
