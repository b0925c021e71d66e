"""Where ZeRO put each parameter: the partition layout that makes ``Lamb`` exact under ZeRO 1, 2 and 3.

Why this module reaches into DeepSpeed's internals (the only one besides ``trainer/engine.py`` that imports deepspeed):
LAMB's trust ratio is a per-parameter norm, and DeepSpeed hands a client optimizer flat fp32 partitions whose element
ranges belong to parameters it does not name. No public DeepSpeed API says which range is which parameter, so we read
the same bookkeeping DeepSpeed's own ``safe_get_full_fp32_param`` and universal checkpoints rely on. Checked against
DeepSpeed 0.19.8; ``tests/test_lamb_zero.py`` fails (rather than training silently wrong) if these fields move.

- ZeRO 1/2 (``DeepSpeedZeroOptimizer``) and the bf16 ZeRO-1 wrapper (``BF16_Optimizer``): each param group is
  flattened (with alignment padding, optionally round-robin reordered) and cut into equal partitions; the client
  optimizer's group ``i`` holds this rank's fp32 slice. Every low-precision parameter that overlaps the slice carries
  ``param._hp_mapping.hp_fragment_address`` = (start in the slice, numel). A parameter may be split across ranks.
- ZeRO 3 (``DeepSpeedZeroOptimizer_Stage3``): every parameter is split on its own, rank r holding elements
  ``[r*ps, min((r+1)*ps, numel))`` with ``ps = param.partition_numel()`` (padded on the last rank); sub-group ``k``'s
  fp32 tensor ``fp32_partitioned_groups_flat[k]`` is the concatenation of its parameters' ``ps``-sized pieces, and
  DeepSpeed steps the client optimizer once per sub-group (with only that tensor in its group).
- No ZeRO with fp32, or the unfused fp16/bf16 wrapper: the optimizer sees whole parameters; nothing to bind.

"""
from __future__ import annotations

import torch
import torch.distributed as dist

from trainer.optim.lamb import Lamb, PartitionLayout


def _client_optimizer(engine) -> tuple[object, torch.optim.Optimizer]:
    """(DeepSpeed's optimizer wrapper or the optimizer itself, the client optimizer inside it)."""
    wrapper = engine.optimizer
    inner = wrapper
    for _ in range(4):  # wrappers nest at most a couple deep (ZeRO / fp16 -> client)
        if isinstance(inner, torch.optim.Optimizer) and not hasattr(inner, "optimizer"):
            break
        inner = getattr(inner, "optimizer", inner)
    return wrapper, inner


def _names(engine) -> dict[int, str]:
    return {id(p): n for n, p in engine.module.named_parameters()}


def _one_group(groups, what: str):
    first = groups[0]
    if any(g is not first for g in groups):
        raise NotImplementedError(f"Lamb under ZeRO: {what} use different data-parallel groups (MoE expert "
                                  "parallelism?); per-parameter trust ratios across several groups are not supported")
    return first


def _fragment_layout(wrapper, lp_groups, hp_flats, lamb: Lamb, names: dict[int, str]) -> PartitionLayout:
    """ZeRO 1/2 and BF16_Optimizer: slots from each parameter's ``_hp_mapping`` fragment address."""
    for i, flat in enumerate(hp_flats):
        if lamb.param_groups[i]["params"][0] is not flat:
            raise RuntimeError(f"Lamb under ZeRO: param group {i} does not hold DeepSpeed's flat fp32 partition "
                               "(DeepSpeed's internals changed?); refusing to train with wrong trust ratios")
    all_params = [p for group in lp_groups for p in group]
    layout = PartitionLayout(num_slots=len(all_params), slot_names=[names.get(id(p), "?") for p in all_params],
                             process_group=_one_group(wrapper.real_dp_process_group, "param groups"))
    slot = 0
    for i, (group, flat) in enumerate(zip(lp_groups, hp_flats)):
        first_slot, slot = slot, slot + len(group)
        if lamb.param_groups[i]["exclude_from_trust_ratio"]:
            continue  # ratio 1: no norms needed
        pieces = []
        for j, p in enumerate(group):
            mapping = getattr(p, "_hp_mapping", None)
            if mapping is not None:  # None: no piece of this parameter on this rank
                address = mapping.get_hp_fragment_address()
                pieces.append((address.start, address.numel, first_slot + j))
        layout.add(flat, pieces)
    return layout


def _stage3_layout(wrapper, lamb: Lamb, names: dict[int, str]) -> PartitionLayout:
    sub_groups = wrapper.fp16_groups
    flats = wrapper.fp32_partitioned_groups_flat
    all_params = [p for group in sub_groups for p in group]
    group = _one_group(wrapper.sub_group_process_groups, "ZeRO-3 sub-groups")
    layout = PartitionLayout(num_slots=len(all_params), slot_names=[names.get(id(p), "?") for p in all_params],
                             process_group=group)
    rank = dist.get_rank(group)
    slot = 0
    for k, (params, flat) in enumerate(zip(sub_groups, flats)):
        first_slot, slot = slot, slot + len(params)
        if lamb.param_groups[wrapper.sub_group_to_group_id[k]]["exclude_from_trust_ratio"]:
            continue
        if flat.numel() == 0:
            raise NotImplementedError(f"Lamb under ZeRO-3: sub-group {k}'s fp32 partition is swapped out (NVMe); "
                                      "not supported")
        pieces, offset = [], 0
        for j, p in enumerate(params):
            piece = p.partition_numel()
            valid = max(0, min(piece, p.ds_numel - rank * piece))  # the last ranks hold padding
            pieces.append((offset, valid, first_slot + j))
            offset += piece
        if offset != flat.numel():
            raise RuntimeError(f"Lamb under ZeRO-3: sub-group {k} pieces add up to {offset} elements but its fp32 "
                               f"partition has {flat.numel()} (DeepSpeed's internals changed?)")
        layout.add(flat, pieces)
    return layout


def bind_zero_layout(engine) -> PartitionLayout | None:
    """Attach the partition layout of ``engine``'s ZeRO optimizer to its ``Lamb`` (see ``lamb.bind_zero_layout``)."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    wrapper, lamb = _client_optimizer(engine)
    if not isinstance(lamb, Lamb):
        if type(lamb).__name__ == "FusedLamb" and wrapper is not lamb:
            raise RuntimeError("DeepSpeed's FusedLamb under a ZeRO/fp16 wrapper computes trust ratios over flat "
                               "partitions; use trainer.optim.lamb.Lamb there")
        raise TypeError(f"bind_zero_layout: the engine's optimizer is {type(lamb).__name__}, not Lamb")
    names = _names(engine)
    if isinstance(wrapper, DeepSpeedZeroOptimizer_Stage3):
        if getattr(wrapper, "swap_optimizer", False):
            raise NotImplementedError("Lamb under ZeRO-3 with optimizer state on NVMe is not supported (the fp32 "
                                      "partitions are swapped out between steps); offload to cpu instead")
        layout = _stage3_layout(wrapper, lamb, names)
    elif isinstance(wrapper, DeepSpeedZeroOptimizer):
        layout = _fragment_layout(wrapper, wrapper.bit16_groups, wrapper.single_partition_of_fp32_groups, lamb, names)
    elif isinstance(wrapper, BF16_Optimizer):
        layout = _fragment_layout(wrapper, wrapper.bf16_groups, wrapper.fp32_groups_flat_partition, lamb, names)
    elif isinstance(wrapper, FP16_Optimizer):
        raise RuntimeError("Lamb under DeepSpeed's fused fp16 wrapper, which flattens each group into one tensor: "
                           "not supported (DeepSpeed only picks that wrapper for FusedAdam)")
    else:
        layout = None  # whole parameters: the per-tensor ratio is already the per-parameter one
    lamb.partition_layout = layout
    return layout
