"""What the checkpoint copy of a downstream fine-tuning holds (``eval.downstream``, trainer/finetune/downstream.py).
A module of its own because downstream.py sits at the 500-line limit and downstream_runner.py holds the runner's
loop; standard library only at import time (the launcher side must not import torch or deepspeed).

The copy holds what ``trainer.finetune.model.load_source`` reads, hard-linked: ``bertfamily.json`` (the run's config;
the tokenizer is the one the config names, never in the checkpoint) and the weights. DeepSpeed's RNG states
(``rng_rank*.pt``) are never copied. The optimizer files (``*optim_states.pt``) are copied only where they hold the
weights: ``trainer.engine.consolidated_fp32_state_dict`` reads the fp32 weights from them when they exist, else the
``module`` of ``mp_rank_00_model_states.pt``, and that module is the full fp32 model only in fp32 runs at ZeRO 1 or 2
(the same tensors: checked on a real checkpoint). bf16/fp16 runs (every GPU recipe) keep their fp32 master weights only
in the optimizer files (the module is bf16), and ZeRO-3's module is empty, so there the copy is the checkpoint less
its RNG states: a smaller copy would need a conversion (reading gigabytes) on rank 0 at every due step.
"""
from __future__ import annotations

import json
from pathlib import Path

STATE_FILE = "bertfamily.json"
"""trainer.checkpoint.STATE_FILE (not imported: trainer.checkpoint imports torch)."""
NEVER_COPIED = ("universal", ".universal*", "rng_rank*.pt")
OPTIMIZER_FILES = "*optim_states.pt"


def read_state(tag_dir: Path) -> dict:
    """The checkpoint's ``bertfamily.json``, {} where it cannot be read (a fake or damaged one: the loader says so)."""
    try:
        state = json.loads((Path(tag_dir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def not_copied(tag_dir: Path) -> tuple[str, ...]:
    """The file patterns of ``tag_dir`` a fine-tuning never reads (module docstring)."""
    state = read_state(tag_dir)
    precision = ((state.get("config") or {}).get("deepspeed") or {}).get("precision")
    weights_in_module = state.get("zero_stage") in (1, 2) and precision == "fp32" and \
        not any(Path(tag_dir).glob("bf16_*optim_states.pt"))
    return NEVER_COPIED + ((OPTIMIZER_FILES,) if weights_in_module else ())

