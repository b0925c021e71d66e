"""status.json is rank 0's: when rank 0 fails only because another rank's failure closed the collective under it (a
loader worker of rank 1 killed by the OOM killer: review reproduced status "Connection closed by peer" while the cause
was in rank 1's log), the status says so first and points at the other ranks' output. The gloo/NCCL messages are
the ones those libraries print; this checks our reading of them, not that every NCCL version words them so."""
from __future__ import annotations

import pytest

from trainer.failures import peer_failure_hint


@pytest.mark.parametrize("message", [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41231",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer",
    "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error",
])
def test_a_collective_that_lost_its_peer_points_at_the_other_ranks(message):
    hint = peer_failure_hint(RuntimeError(message))
    assert hint.startswith("another rank most likely failed first") and "that rank's output" in hint


@pytest.mark.parametrize("message", [
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms for recv operation to "
    "complete",  # what tests/test_hang_timeout.py's stuck rank gives rank 0
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=600000)",
])
def test_a_collective_timeout_says_another_rank_stopped_responding(message):
    hint = peer_failure_hint(RuntimeError(message))
    assert hint.startswith("a collective timed out (deepspeed.timeout_minutes): another rank most likely stopped "
                           "responding") and "data_wait_s" in hint


def test_a_rank_s_own_failure_gets_no_hint():
    assert peer_failure_hint(ValueError("model.vocab_size: 30000 is smaller than the tokenizer's 30522")) == ""
    assert peer_failure_hint(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == ""


def test_a_filesystem_error_on_intact_files_is_not_called_damage(tmp_path):
    """EIO/ESTALE reading a checkpoint whose files are all whole is the filesystem's trouble: the roll-back advice
    (--resume the previous checkpoint) would move the intact newer ones aside, so none is given and the traceback
    stands; a file that is no whole zip archive is damage, named with the checkpoint to resume instead."""
    import errno

    import torch

    from trainer import checkpoint
    from trainer.failures import damaged_checkpoint_error
    root = tmp_path / "checkpoints"
    for step in (4, 8):
        tag = root / f"global_step{step}"
        tag.mkdir(parents=True)
        torch.save({"w": torch.zeros(2)}, tag / "mp_rank_00_model_states.pt")
        (tag / checkpoint.STATE_FILE).write_text("{}")
    newest = root / "global_step8"
    assert damaged_checkpoint_error(newest, newest, OSError(errno.EIO, "Input/output error")) is None
    shard = newest / "mp_rank_00_model_states.pt"
    shard.write_bytes(shard.read_bytes()[:40])
    err = damaged_checkpoint_error(newest, newest, OSError(errno.EINVAL, "Invalid argument"))
    assert err is not None and f"{shard} is cut short" in err.one_line and f"--resume {root / 'global_step4'}" \
        in err.one_line


def test_resuming_with_another_model_says_which_settings_differ(tmp_path):
    """A resume whose config builds another model than the checkpoint holds (a model setting changed between
    launches, e.g. following a config refusal's advice on a run in flight; found by the upgrade review) ended in
    torch's multi-line state-dict traceback; it stops with one line naming the settings that differ and both ways
    on. A real 1-rank run of the stand-in trainer."""
    import json

    from test_trainer_multiproc import make_config, run
    cfg = make_config(tmp_path, "run", train={"steps": 2, "eval_every": 0}, checkpoint={"every_steps": 2})
    run(cfg, 1, "--resume", "none")
    proc = run(cfg, 1, "--resume", "auto", "--set", "train.steps=4", "--set", "model.hidden_size=48", expect=None)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    ckpt = tmp_path / "run" / "checkpoints" / "global_step2"
    assert f"checkpoint {ckpt} holds another model than this launch builds (model.hidden_size: 32 there, 48 here)" \
        in proc.stderr, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"


def test_another_model_names_the_objective_settings_that_differ(tmp_path):
    """A recipe that gained a head between launches (ernie_base's NSP on 2026-12-06: objective.options.nsp) builds a
    model the checkpoint lacks a part of; the message said "no model setting differs" and advised removing a --set
    the user never gave (diff review). It names the objective's options that differ."""
    import json

    from trainer import checkpoint
    from trainer.config import load_config
    from trainer.failures import other_model_error

    cfg = load_config("electra_small", world_size=1)
    saved = json.loads(cfg.model_dump_json())
    saved["objective"]["options"]["rtd_weight"] = 20.0
    tag = tmp_path / "global_step2"
    tag.mkdir()
    (tag / checkpoint.STATE_FILE).write_text(json.dumps({"config": saved}))
    err = other_model_error(tag, cfg, RuntimeError("Error(s) in loading state_dict for Model: missing heads.nsp"))
    assert err is not None and "objective.options.rtd_weight: 20.0 there, 50.0 here" in err.one_line, err
