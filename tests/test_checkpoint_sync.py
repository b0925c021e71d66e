"""A checkpoint's files reach the disk before it is marked complete: each rank fsyncs what it wrote (DeepSpeed's
shards of its rank, its RNG file; rank 0 the unranked files and the folder), since neither DeepSpeed nor torch.save
does, and a node crash with shards in its cache otherwise left a "complete" checkpoint with a cut shard after the
older ones were pruned. A write error that NFS reports only at fsync (ENOSPC) fails the save as a full disk.

``FakeEngine`` (tests/test_checkpoint.py) writes one shard where DeepSpeed writes its own: this proves which files our
side syncs, not DeepSpeed's file layout; ``os.fsync`` is recorded or made to fail, so no real disk error is seen."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from test_checkpoint import FakeEngine
from trainer import checkpoint
from trainer.checkpoint import TrainState


class RankedEngine(FakeEngine):
    """Writes the files DeepSpeed's ZeRO-1 save writes on each of 2 ranks, as one process would see the folder."""

    def save(self, root: Path, tag: str, client_state: dict) -> None:
        tag_dir = Path(root) / tag
        tag_dir.mkdir(parents=True, exist_ok=True)
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_1_mp_rank_00_optim_states.pt", "rng_rank1.pt"):
            (tag_dir / name).write_bytes(b"x" * 64)


def test_each_rank_syncs_its_own_files_before_the_checkpoint_is_complete(tmp_path, monkeypatch):
    synced, complete_at_sync = [], []
    real = os.fsync

    def record(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(Path(name).name)
        complete_at_sync.append(checkpoint.is_complete(tmp_path / "global_step2"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    checkpoint.save(RankedEngine(), tmp_path, TrainState(step=2, consumed_samples=16), {"seed": 1}, rank=0,
                    world_size=1, keep_last=2)
    ours = [n for n, done in zip(synced, complete_at_sync) if not done and not n.startswith(".bertfamily.json")]
    assert sorted(ours) == ["global_step2", "mp_rank_00_model_states.pt", "rng_rank0.pt",
                            "zero_pp_rank_0_mp_rank_00_optim_states.pt"]  # not rank 1's
    assert checkpoint.is_complete(tmp_path / "global_step2")


def test_a_full_disk_reported_at_fsync_fails_the_save_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint.save(RankedEngine(), tmp_path, TrainState(step=2, consumed_samples=16), {"seed": 1}, rank=0,
                    world_size=1, keep_last=2)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(checkpoint.DiskFullError, match="global_step2"):
        checkpoint.save(RankedEngine(), tmp_path, TrainState(step=4, consumed_samples=32), {"seed": 1}, rank=0,
                        world_size=1, keep_last=2)
    assert not (tmp_path / "global_step4").exists()
    assert checkpoint.find_latest(tmp_path) == tmp_path / "global_step2"
