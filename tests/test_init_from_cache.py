"""checkpoint.init_from's one-file hand-over from rank 0 to the other ranks (trainer/init_from.py) is made anew by
every launch: a file left by a launch that died before removing it named the source by its path only, so a phase 2
relaunched after phase 1 was redone at the same path started silently from the old phase 1's weights.

Two ranks run as threads with a threading barrier in place of the process group's, and the consolidation is a stand-in
returning known weights: this proves which file each rank reads, not DeepSpeed's consolidation."""
from __future__ import annotations

import json
import threading

import torch

from trainer import checkpoint, init_from


def test_a_leftover_hand_over_file_is_never_read(tmp_path, monkeypatch):
    import trainer.engine

    source = tmp_path / "phase1" / "checkpoints" / "global_step4"
    source.mkdir(parents=True)
    (source / checkpoint.STATE_FILE).write_text(json.dumps({"step": 4, "consumed_samples": 8, "config": {}}))
    cache = tmp_path / "phase2"
    ranks = threading.Barrier(2)
    monkeypatch.setattr(checkpoint, "_barrier", lambda: ranks.wait(timeout=60))
    monkeypatch.setattr(trainer.engine, "consolidated_fp32_state_dict", lambda root, tag: {"w": torch.full((3,), 2.0)})
    # what a launch that died between its consolidation of the old phase 1 and the removal left behind (named by the
    # source only, as before the launch was in the name; a file named for another launch is never this one's name)
    key_file = "init_from_" + __import__("hashlib").sha256(str(source.resolve()).encode()).hexdigest()[:12] + ".pt"
    cache.mkdir()
    torch.save({"w": torch.full((3,), 1.0)}, cache / key_file)

    got = {}
    reader = threading.Thread(target=lambda: got.update(
        r1=init_from.init_weights(source.parent, cache, rank=1, wait_s=30, poll_s=0.01)))
    reader.start()
    got["r0"] = init_from.init_weights(source.parent, cache, rank=0)
    reader.join()
    assert torch.equal(got["r0"]["w"], torch.full((3,), 2.0)) and torch.equal(got["r1"]["w"], torch.full((3,), 2.0))
    assert not list(cache.glob("init_from_*.pt"))


def test_a_save_cut_by_a_kill_leaves_no_weights_file_behind(tmp_path, monkeypatch):
    """A kill (here: a KeyboardInterrupt, as SIGINT raises) during rank 0's save of the hand-over file left a whole
    fp32 weights file, init_from_<key>.tmp, that no later launch removed (review); the next launch removes any
    left, and a failed save removes its own."""
    import trainer.engine

    source = tmp_path / "phase1" / "checkpoints" / "global_step4"
    source.mkdir(parents=True)
    (source / checkpoint.STATE_FILE).write_text(json.dumps({"step": 4, "consumed_samples": 8, "config": {}}))
    cache = tmp_path / "phase2"
    cache.mkdir()
    (cache / "init_from_0123456789ab.tmp").write_bytes(b"x" * 1024)  # what an earlier killed launch left
    monkeypatch.setattr(checkpoint, "_barrier", lambda: None)
    monkeypatch.setattr(trainer.engine, "consolidated_fp32_state_dict", lambda root, tag: {"w": torch.ones(3)})
    real_save = torch.save

    def killed(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    try:
        init_from.init_weights(source.parent, cache, rank=0)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the stand-in kill did not reach init_weights")
    assert not list(cache.glob("init_from_*")), list(cache.iterdir())
