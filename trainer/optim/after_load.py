"""An optimizer's state after a DeepSpeed checkpoint load, put back to what this run needs (``Engine.load`` calls
these after every load): the config's per-group settings, one tensor per state entry, and fused optimizers' step
counts on their parameters' device. Each repairs what a DeepSpeed 0.19.8 load leaves otherwise (see each docstring);
none is a copy of a DeepSpeed or torch function: torch's ``load_state_dict`` does the last one for itself, but the
universal load bypasses it."""
import torch


# Set by the learning-rate schedule after a load (``WarmupDecayLR.sync_lr``), not taken from the config here.
_SCHEDULE_KEYS = ("lr", "initial_lr")


def restore_group_settings(optimizer: torch.optim.Optimizer, settings: list[dict]) -> list[str]:
    """Put each param group's settings back to ``settings`` (the groups as built from this run's config); returns
    what differed in the loaded groups, as ``"weight_decay of group 1: 0.01 -> 0.0"`` lines.

    A DeepSpeed load overwrites them with the checkpoint's: torch's ``load_state_dict`` takes the saved groups'
    hyperparameters (so a resume or roll-back with ``--set optim.betas=...`` trained with the old ones while its
    checkpoints recorded the new), and DeepSpeed 0.19.8's ZeRO-3 universal load (a world-size change) copies
    group 0's onto every group (``load_hp_checkpoint_state_from_checkpoint_dir_stage3``): weight decay on biases
    and LayerNorm, LAMB's trust ratio on them too. The learning rate is the schedule's (``sync_lr``)."""
    changed = []
    for i, (group, wanted) in enumerate(zip(optimizer.param_groups, settings)):
        for key, value in wanted.items():
            if key not in _SCHEDULE_KEYS and not _same(group.get(key), value):
                changed.append(f"{key} of group {i}: {group.get(key)} -> {value}")
            group[key] = value
    return changed


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


def untie_state_tensors(optimizer: torch.optim.Optimizer) -> int:
    """Give every optimizer state entry its own tensors; returns how many were shared.

    DeepSpeed 0.19.8's ZeRO-3 universal load assigns one ``step`` tensor object to the state of every sub-group;
    AdamW increments it in place once per group, so with two groups it counted two steps per step (bias correction
    running ahead: losses diverged from an uninterrupted run) and saved the wrong count into later checkpoints."""
    seen, untied = set(), 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                if id(value) in seen:
                    state[key] = value.clone()
                    untied += 1
                else:
                    seen.add(id(value))
    return untied


def place_step_tensors(optimizer: torch.optim.Optimizer) -> int:
    """Move each ``step`` tensor of a fused (or capturable) torch optimizer to its parameter's device; returns how many
    moved.

    torch's own ``load_state_dict`` does this for fused optimizers, but DeepSpeed's universal load assigns the
    converter's CPU ``step`` tensor directly (``base_optimizer.py``, ``bf16_optimizer.py``, ZeRO 1-3), and
    ``AdamW(fused=True)`` (the adamw recipes' optimizer on a GPU without a prebuilt FusedAdam) then stops at the
    first step after a resume on another world size: "Expected all tensors to be on the same device ... cuda:0 and
    cpu ... state_steps" (pytorch#111123)."""
    moved = 0
    for group in optimizer.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            continue
        for param in group["params"]:
            state = optimizer.state.get(param) or {}
            step = state.get("step")
            if torch.is_tensor(step) and step.device != param.device:
                state["step"] = step.to(param.device, torch.float32)
                moved += 1
    return moved
