"""A resume on another world size converts the checkpoint beside itself (``global_stepN/universal/``): from a
read-only checkpoint (a read-only mount, another user's run) rank 0's first write raised a bare ``OSError: [Errno
30]`` while the other ranks waited for its failure note, which it could not write there either. Every rank now stops
at once with what to do.

``os.access`` is made to answer "not writable" (tests run as root, for whom permission bits do not stop writes): this
proves our check and message, not a real read-only mount's behaviour."""
from __future__ import annotations

import json
import os

import pytest

from trainer import checkpoint, universal


@pytest.mark.parametrize("rank", [0, 1])
def test_a_read_only_checkpoint_on_another_world_size_stops_every_rank_with_what_to_do(tmp_path, monkeypatch, rank):
    tag = tmp_path / "checkpoints" / "global_step4"
    tag.mkdir(parents=True)
    (tag / checkpoint.STATE_FILE).write_text(json.dumps({"step": 4, "consumed_samples": 8, "config": {},
                                                         "world_size": 2, "zero_stage": 1}))
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if mode == os.W_OK and str(path) == str(tag)
                        else real(path, mode))
    barriers = []
    monkeypatch.setattr(checkpoint, "_barrier", lambda: barriers.append(1))
    with pytest.raises(PermissionError, match=r"not writable .* Copy the checkpoint folder into this run's checkpoints "
                                              r"folder .* or resume on the 2 ranks at ZeRO-1"):
        universal.prepare_universal(tag, rank=rank, wait_s=1, poll_s=0.01)
    assert not barriers  # no rank went on to wait for the others


def test_a_read_only_checkpoint_converted_before_is_read_as_it_is(tmp_path, monkeypatch):
    """Another user's checkpoint that its owner already converted loaded before the check above (nothing had to be
    written), and still does (found by review)."""
    tag = tmp_path / "checkpoints" / "global_step4"
    (tag / checkpoint.UNIVERSAL).mkdir(parents=True)
    (tag / checkpoint.UNIVERSAL / ".complete").write_text("")
    (tag / checkpoint.STATE_FILE).write_text(json.dumps({"step": 4, "consumed_samples": 8, "config": {},
                                                         "world_size": 2, "zero_stage": 1}))
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if mode == os.W_OK and str(path) == str(tag)
                        else real(path, mode))
    monkeypatch.setattr(checkpoint, "_barrier", lambda: None)
    assert universal.prepare_universal(tag, rank=0) == tag / checkpoint.UNIVERSAL
    assert universal.prepare_universal(tag, rank=1, wait_s=1, poll_s=0.01) == tag / checkpoint.UNIVERSAL
