"""Where a downstream fine-tuning's files live, what its checkpoint copy holds, and which queued ones a roll-back
abandoned (``eval.downstream``, trainer/finetune/downstream.py). A module of its own because downstream.py sits at
the 500-line limit and downstream_runner.py holds the runner's loop; standard library only at import time (the
launcher side must not import torch or deepspeed).

Folder of a fine-tuning of step s: ``RUN_DIR/downstream/global_step<s>-<run id>/<task>/`` (finetune.log,
``finetune.exit``, finetune/ and the copy ``global_step<s>/``), the run id being the checkpoint's ``bertfamily.json``
``run_id``. A roll-back starts a new run id, so the abandoned lineage's fine-tuning of step s and the new lineage's
never share a folder (they did: the first to end deleted the copy the other read, and the second overwrote the
first's finetune.log). A checkpoint saved without a run id keeps ``global_step<s>/<task>/``.

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
ABANDONED = "abandoned-"
"""trainer.checkpoint.ABANDONED: a roll-back moves newer checkpoints into ``<checkpoints>/abandoned-<stamp>-<id>/``."""
NEVER_COPIED = ("universal", ".universal*", "rng_rank*.pt")
OPTIMIZER_FILES = "*optim_states.pt"


def read_state(tag_dir: Path) -> dict:
    """The checkpoint's ``bertfamily.json``, {} where it cannot be read (a fake or damaged one: the loader says so)."""
    try:
        state = json.loads((Path(tag_dir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def run_id_of(tag_dir: Path) -> str | None:
    run_id = read_state(tag_dir).get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def job_folder(run_dir: Path, tag_name: str, task: str, run_id: str | None) -> Path:
    """``RUN_DIR/downstream/<tag>-<run id>/<task>`` (``<tag>/<task>`` without a run id; the task name made safe)."""
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in task.lower())
    return Path(run_dir) / "downstream" / (f"{tag_name}-{run_id}" if run_id else tag_name) / slug


def run_id_of_copy(copy: Path) -> str | None:
    """The run id in a copy's path (``job_folder``): how the child's score record gets it after ``--cleanup``
    removed the copy (and its ``bertfamily.json``) and without a command-line option of ``trainer.finetune``."""
    tag, _, run_id = Path(copy).parent.parent.name.partition("-")
    return run_id if tag == Path(copy).name and run_id else None


def not_copied(tag_dir: Path) -> tuple[str, ...]:
    """The file patterns of ``tag_dir`` a fine-tuning never reads (module docstring)."""
    state = read_state(tag_dir)
    precision = ((state.get("config") or {}).get("deepspeed") or {}).get("precision")
    weights_in_module = state.get("zero_stage") in (1, 2) and precision == "fp32" and \
        not any(Path(tag_dir).glob("bf16_*optim_states.pt"))
    return NEVER_COPIED + ((OPTIMIZER_FILES,) if weights_in_module else ())


def abandoned(run_dir: Path, origin: Path | None, tag_name: str, run_id: str | None) -> Path | None:
    """Where a roll-back moved the checkpoint a queued fine-tuning was copied from (``<checkpoints>/abandoned-*/<tag>``
    holding that run id), or None: still of the run's lineage, or pruned by ``keep_last`` (the copy outlives that on
    purpose), or saved without a run id (no lineage to tell)."""
    if run_id is None:
        return None
    root = Path(origin).parent if origin is not None else Path(run_dir) / "checkpoints"
    for aside in sorted(root.glob(f"{ABANDONED}*")):
        if run_id_of(aside / tag_name) == run_id:
            return aside / tag_name
    return None
