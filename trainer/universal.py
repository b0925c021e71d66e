"""Resume on another world size or ZeRO stage: whether a checkpoint needs DeepSpeed's universal form
(``needs_universal``), which stage changes DeepSpeed can load at all (``zero_stage_change_error``), and the one
conversion rank 0 makes beside the checkpoint while the other ranks wait on the filesystem (``prepare_universal``).

The collective parts (``_barrier``, waiting for rank 0) are ``trainer.checkpoint``'s, called through the module so
that a test's stand-in for them applies here too.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainer import checkpoint


def needs_universal(tag_dir: Path, world_size: int, zero_stage: int | None = None) -> bool:
    """ZeRO-partitioned optimizer state saved on another world size (or ZeRO stage) must go through the universal
    format; stage-0 checkpoints hold whole tensors and load anywhere."""
    saved = checkpoint.read_state(tag_dir)
    other_stage = zero_stage is not None and zero_stage != saved["zero_stage"]
    return saved["zero_stage"] > 0 and (saved["world_size"] != world_size or other_stage)


def zero_stage_change_error(tag_dir: Path, zero_stage: int) -> str | None:
    """Why a resume of ``tag_dir`` at ZeRO stage ``zero_stage`` cannot work, or None when it can.

    Any world size at the checkpoint's own stage loads (stage 0 directly, 1-3 through the universal checkpoint), and
    so do ZeRO-1 <-> ZeRO-2 (the same flat partitions). DeepSpeed 0.19.8 fails on every other change, deep in its
    load and with no word of why: from ZeRO-0 (the optimizer state is a whole torch state dict, no ZeRO shards:
    FileNotFoundError ..._optim_states.pt), to ZeRO-0 (its load takes no universal checkpoint: AttributeError), and
    to or from ZeRO-3 (its model-state files are per rank: a bare AssertionError in check_ckpt_list). Checked
    before anything is moved, converted or built."""
    saved = checkpoint.read_state(tag_dir)["zero_stage"]
    if saved == zero_stage or {saved, zero_stage} == {1, 2}:
        return None
    return (f"{tag_dir} was saved at ZeRO-{saved}; this launch runs ZeRO-{zero_stage}. A resume can change the world "
            "size at any stage, and the stage only between 1 and 2 (DeepSpeed cannot load ZeRO-0 <-> 1/2/3 or "
            "ZeRO-3 <-> 1/2 optimizer state). Resume at ZeRO-{0} (--set deepspeed.zero_stage={0}, or the "
            "deepspeed.config it ran with), or start a new run (another run_dir) from its weights with --set "
            "checkpoint.init_from={1} (weights only: optimizer state, lr schedule and data order start over)"
            ).format(saved, tag_dir)


CONVERSION_SPACE = 1.8
"""Free space a conversion needs, in checkpoints: DeepSpeed's converter writes its per-parameter extraction beside the
merged result (albert_xxlarge, fp32: the folder grew from 3.57 GB to 9.82 GB at the peak, 1.75x the checkpoint, and
4.46 GB stayed; measured by review on 2026-12-06)."""


def check_space_for_conversion(tag_dir: Path) -> None:
    """Refuse a conversion the filesystem cannot hold, before minutes of work, naming the sizes (ENOSPC, so the
    trainer reports it as disk full: exit 1 with this line)."""
    import errno

    from trainer.disk_space import _size, folder_bytes, free_bytes

    size = folder_bytes(Path(tag_dir), skip=checkpoint.UNIVERSAL)
    free = free_bytes(tag_dir)
    need = int(CONVERSION_SPACE * size)
    if free is not None and free < need:
        saved = checkpoint.read_state(tag_dir)
        raise OSError(errno.ENOSPC, (
            f"converting {tag_dir} ({_size(size)}) to DeepSpeed's universal form needs about {_size(need)} free "
            f"beside it ({CONVERSION_SPACE}x the checkpoint), {_size(free)} are free: free space there, or resume on "
            f"the {saved.get('world_size')} ranks at ZeRO-{saved.get('zero_stage')} it was saved with (no "
            "conversion)"))


def prepare_universal(tag_dir: Path, rank: int, wait_s: float | None = None, poll_s: float = 2.0) -> Path:
    """Collective: rank 0 converts ``tag_dir`` once (kept beside it for later restarts); returns the folder.

    The other ranks wait for the finished folder (or rank 0's failure note) on the shared filesystem, not in a
    collective: converting a large model's ZeRO state can outlast the process group's timeout (DeepSpeed's
    ``timeout_minutes``, 10 by default), which would kill the waiting ranks mid-conversion. They give up after
    ``wait_s`` (default 4 h, env ``BERTFAMILY_UNIVERSAL_WAIT_S``) with a message naming the folder."""
    from trainer.engine import convert_to_universal  # deepspeed: loaded only by the calls that need it
    out = Path(tag_dir) / checkpoint.UNIVERSAL
    if (out / ".complete").exists() and not os.access(tag_dir, os.W_OK):
        return out  # converted before (by its owner): nothing to write, every rank reads it
    if not os.access(tag_dir, os.W_OK):
        # every rank sees the same mount and stops here alike: rank 0 could not write its failure note there either
        saved = checkpoint.read_state(tag_dir)
        raise PermissionError(
            f"resume from {tag_dir} on another world size (or ZeRO stage) converts it to DeepSpeed's universal form "
            f"beside it, in {out}, but that folder is not writable (a read-only mount or another "
            f"user's checkpoint). Copy the checkpoint folder into this run's checkpoints folder and resume from the "
            f"copy, or resume on the {saved.get('world_size')} ranks at ZeRO-{saved.get('zero_stage')} it was saved "
            "with (no conversion)")
    failed = Path(tag_dir) / f".{checkpoint.UNIVERSAL}.failed"
    if rank == 0:
        failed.unlink(missing_ok=True)  # a note from an earlier launch; cleared before anyone looks
    checkpoint._barrier()
    if rank == 0 and not (out / ".complete").exists():
        tmp = Path(tag_dir) / f".{checkpoint.UNIVERSAL}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        try:
            check_space_for_conversion(tag_dir)
            convert_to_universal(tag_dir, tmp)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)  # a partial conversion (a preemption kills the converter too)
            failed.write_text(f"{type(err).__name__}: {err}\n")
            raise
        (tmp / ".complete").write_text("")
        os.replace(tmp, out)
    elif rank != 0:
        checkpoint._wait_for_rank0(out / ".complete", failed, rank, f"convert {tag_dir} to a universal checkpoint",
                                   out, wait_s, poll_s)
    checkpoint._barrier()
    return out
