"""Checkpoint atomicity without DeepSpeed: a process SIGKILLed in the middle of writing a checkpoint leaves the
previous one complete, ``latest`` pointing at it, and ``--resume auto`` choosing it; keep-last-K; resume paths."""
from __future__ import annotations

import json
import time
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fork_server
from trainer import checkpoint, init_from, universal
from trainer.checkpoint import TrainState

REPO = Path(__file__).resolve().parents[1]


class FakeEngine:
    """Writes a DeepSpeed-like shard; ``die_in_save`` makes the process SIGKILL itself halfway through the write. The
    fake proves our side of the seam (what checkpoint.save does around the engine's write: tag folder, state file,
    ``latest``, pruning, a death mid-write), not DeepSpeed's real save layout nor a multi-rank save's shards."""
    zero_stage = 2

    def __init__(self, die_in_save: bool = False):
        self.die_in_save = die_in_save

    def save(self, root: Path, tag: str, client_state: dict) -> None:
        tag_dir = Path(root) / tag
        tag_dir.mkdir(parents=True, exist_ok=True)
        with open(tag_dir / "mp_rank_00_model_states.pt", "wb") as f:
            f.write(b"x" * 4096)
            f.flush()
            if self.die_in_save:
                os.kill(os.getpid(), signal.SIGKILL)
            f.write(b"y" * 4096)


def _save(root: Path, step: int, keep_last: int = 3, die: bool = False) -> None:
    checkpoint.save(FakeEngine(die), root, TrainState(step=step, consumed_samples=8 * step), {"seed": 1}, rank=0,
                    world_size=1, keep_last=keep_last)


def test_kill_during_checkpoint_write_leaves_previous_loadable(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 10)
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'tests'); import test_checkpoint as t; "
            f"t._save(Path({str(root)!r}), 20, die=True)")
    proc = fork_server.run([sys.executable, "-c", code], cwd=REPO, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (root / "global_step20" / "mp_rank_00_model_states.pt").stat().st_size == 4096  # really half-written
    assert not checkpoint.is_complete(root / "global_step20")
    assert (root / "latest").read_text() == "global_step10"
    assert checkpoint.resolve_resume(root, "auto") == root / "global_step10"
    assert checkpoint.read_state(root / "global_step10")["consumed_samples"] == 80
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        checkpoint.resolve_resume(root / "global_step20", str(root / "global_step20"))
    # the next save of step 20 replaces the debris; a later complete save prunes it
    _save(root, 20)
    assert checkpoint.is_complete(root / "global_step20")
    assert (root / "global_step20" / "mp_rank_00_model_states.pt").stat().st_size == 8192


def test_latest_pointer_lost_or_stale_falls_back_to_newest_complete(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _save(root, step)
    (root / "latest").unlink()
    assert checkpoint.find_latest(root) == root / "global_step3"
    (root / "latest").write_text("global_step99")
    assert checkpoint.find_latest(root) == root / "global_step3"
    assert checkpoint.resolve_resume(root, "none") is None
    assert checkpoint.resolve_resume(tmp_path / "empty", "auto") is None
    assert checkpoint.resolve_resume(root, str(root)) == root / "global_step3"


def test_a_stale_latest_naming_an_older_checkpoint_does_not_make_resume_auto_a_roll_back(tmp_path):
    """A kill after global_step8's state file and before ``latest`` moved: ``latest`` still names global_step4.
    Before, --resume auto took global_step4 and begin_lineage moved the complete global_step8 aside."""
    root = tmp_path / "checkpoints"
    _save(root, 4)
    _save(root, 8)
    (root / "latest").write_text("global_step4")
    assert checkpoint.find_latest(root) == root / "global_step8"
    resume = checkpoint.resolve_resume(root, "auto")
    assert resume == root / "global_step8"
    checkpoint.begin_lineage(root, resume, rank=0)
    assert checkpoint.complete_checkpoints(root) == [root / "global_step4", root / "global_step8"]
    assert not list(root.glob("abandoned-*"))


def test_keep_last_k_and_incomplete_debris_pruned(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 1, keep_last=2)
    (root / "global_step2").mkdir()  # an interrupted save
    for step in (3, 4, 5):
        _save(root, step, keep_last=2)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["global_step4", "global_step5"]
    state = json.loads((root / "global_step5" / "bertfamily.json").read_text())
    assert state["step"] == 5 and state["world_size"] == 1 and state["config"] == {"seed": 1}
    assert (root / "global_step5" / "rng_rank0.pt").exists()


def test_rng_round_trip_and_world_size_change(tmp_path):
    import random

    import torch
    root = tmp_path / "checkpoints"
    torch.manual_seed(3)
    random.seed(3)
    _save(root, 7)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    checkpoint.restore_rng(root / "global_step7", rank=0, world_size=1, seed=1, step=7)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    checkpoint.restore_rng(root / "global_step7", rank=0, world_size=2, seed=1, step=7)  # other world size: reseed
    assert not torch.equal(torch.rand(3), expected[0])
    assert universal.needs_universal(root / "global_step7", 2) and not universal.needs_universal(
        root / "global_step7", 1)


def test_peak_flops_measurement_leaves_the_restored_rng_stream_alone():
    """The trainer measures the matmul peak after restoring a checkpoint's RNG state: the measurement must not draw
    from torch's global stream, or dropout and ELECTRA's sampling in a resumed run shift from the uninterrupted one."""
    import torch

    from trainer.metrics import measure_peak_flops

    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    assert measure_peak_flops("cpu", torch.float32, n=64) > 0
    assert torch.equal(torch.rand(4), expected)


def test_init_from_is_consolidated_once_by_rank_0(tmp_path, monkeypatch):
    """checkpoint.init_from: rank 0 consolidates the source checkpoint and writes one file; another rank waits for
    that file and reads it instead of consolidating every shard itself; the file is gone afterwards."""
    import threading

    import torch

    source = tmp_path / "phase1" / "global_step9"
    source.mkdir(parents=True)
    (source / checkpoint.STATE_FILE).write_text(json.dumps({"config": {"x": 1}}))
    calls = []

    def consolidate(root, tag):
        calls.append(tag)
        time.sleep(0.3)
        return {"w": torch.arange(4.0)}

    import trainer.engine
    monkeypatch.setattr(trainer.engine, "consolidated_fp32_state_dict", consolidate)
    cache = tmp_path / "run"
    got = {}
    ranks = threading.Barrier(2)  # the process group's barrier, for two ranks running as threads
    monkeypatch.setattr(checkpoint, "_barrier", lambda: ranks.wait(timeout=60))
    reader = threading.Thread(target=lambda: got.update(r1=init_from.init_weights(source, cache, rank=1, wait_s=30,
                                                                                    poll_s=0.02)))
    reader.start()
    got["r0"] = init_from.init_weights(source, cache, rank=0)
    reader.join()
    assert calls == ["global_step9"]  # one consolidation, on rank 0
    assert torch.equal(got["r0"]["w"], torch.arange(4.0)) and torch.equal(got["r1"]["w"], torch.arange(4.0))
    assert not list(cache.glob("init_from_*.pt"))

    def broken(root, tag):
        raise OSError("shard missing")

    monkeypatch.setattr(trainer.engine, "consolidated_fp32_state_dict", broken)
    monkeypatch.setattr(checkpoint, "_barrier", lambda: None)  # one rank at a time below
    with pytest.raises(OSError, match="shard missing"):
        init_from.init_weights(source, cache, rank=0)
    with pytest.raises(RuntimeError, match="rank 0 failed to consolidate.*init_from.*OSError: shard missing"):
        init_from.init_weights(source, cache, rank=1, wait_s=5, poll_s=0.02)


def test_a_save_replaces_another_lineages_checkpoint_of_its_step_and_skips_its_own(tmp_path, capsys):
    """Lineage (issue 21): a complete checkpoint of this step is "already saved" only if this run wrote it; one of
    another run id is moved aside (never deleted) and saved again."""
    root = tmp_path / "checkpoints"
    checkpoint.save(FakeEngine(), root, TrainState(step=8), {"lr": 1}, rank=0, world_size=1, keep_last=3,
                    run_id="old")
    assert checkpoint.read_state(root / "global_step8")["run_id"] == "old"
    checkpoint.save(FakeEngine(), root, TrainState(step=8), {"lr": 2}, rank=0, world_size=1, keep_last=3,
                    run_id="new")
    assert checkpoint.read_state(root / "global_step8")["config"] == {"lr": 2}
    assert checkpoint.read_state(root / "global_step8")["run_id"] == "new"
    (aside,) = root.glob("abandoned-*")
    assert checkpoint.read_state(aside / "global_step8")["run_id"] == "old"
    assert json.loads((aside / "moved.json").read_text())["moved"][0]["run_id"] == "old"
    assert "belonged to another run" in capsys.readouterr().err
    before = (root / "global_step8" / checkpoint.STATE_FILE).stat().st_mtime_ns
    checkpoint.save(FakeEngine(), root, TrainState(step=8), {"lr": 3}, rank=0, world_size=1, keep_last=3,
                    run_id="new")  # the same run again (a preemption right after a periodic save): nothing written
    assert (root / "global_step8" / checkpoint.STATE_FILE).stat().st_mtime_ns == before
    assert checkpoint.complete_checkpoints(root) == [root / "global_step8"]  # the moved one is not a candidate


@pytest.mark.slow
@pytest.mark.multiproc
def test_rollback_and_fresh_start_in_a_used_folder_start_new_lineages(tmp_path):
    """Real 1-rank runs of the stand-in trainer. A roll-back to step 4 with another learning rate writes its own
    checkpoints at 8 and 12 (main skipped them as "already saved" and a later --resume auto continued the abandoned
    weights); --resume auto then continues the new lineage; --resume none in the used folder keeps its new
    checkpoints and a valid ``latest`` (main pruned them right after writing them). Nothing is deleted: the
    abandoned checkpoints are moved aside."""
    from test_trainer_multiproc import make_config, run

    cfg = make_config(tmp_path, "run", train={"steps": 12, "eval_every": 0},
                      schedule={"kind": "constant", "warmup_steps": 0},
                      checkpoint={"every_steps": 4, "keep_last": 3})
    root = tmp_path / "run" / "checkpoints"
    run(cfg, 1, "--resume", "none")
    first = checkpoint.read_state(root / "global_step12")
    weights_a = (root / "global_step12" / "mp_rank_00_model_states.pt").read_bytes()
    assert first["run_id"] and first["config"]["optim"]["lr"] == 3e-3

    proc = run(cfg, 1, "--resume", str(root / "global_step4"), "--set", "optim.lr=1e-3")
    assert "moved aside" in proc.stderr
    for step in (8, 12):
        state = checkpoint.read_state(root / f"global_step{step}")
        assert state["config"]["optim"]["lr"] == 1e-3, step  # really written by the roll-back
        assert state["run_id"] not in ("", first["run_id"])
    second = checkpoint.read_state(root / "global_step12")
    assert (root / "global_step12" / "mp_rank_00_model_states.pt").read_bytes() != weights_a
    assert (root / "latest").read_text() == "global_step12"
    (aside,) = root.glob("abandoned-*")
    assert sorted(p.name for p in aside.iterdir() if p.is_dir()) == ["global_step12", "global_step8"]
    assert checkpoint.read_state(aside / "global_step12")["run_id"] == first["run_id"]
    assert (aside / "global_step12" / "mp_rank_00_model_states.pt").read_bytes() == weights_a

    proc = run(cfg, 1, "--resume", "auto", "--set", "train.steps=16", "--set", "optim.lr=1e-3")
    assert f"resumed from {root / 'global_step12'} at step 12" in proc.stdout
    assert "moved aside" not in proc.stderr
    assert checkpoint.read_state(root / "global_step16")["run_id"] == second["run_id"]  # same lineage continues
    assert len(list(root.glob("abandoned-*"))) == 1

    proc = run(cfg, 1, "--resume", "none", "--set", "train.steps=8")
    assert "moved aside" in proc.stderr
    assert (root / "latest").read_text() == "global_step8"
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["global_step4", "global_step8"]
    third = checkpoint.read_state(root / "global_step8")
    assert third["run_id"] not in (first["run_id"], second["run_id"])
    assert checkpoint.resolve_resume(root, "auto") == root / "global_step8"
    kept = sorted(p.parent.name + "/" + p.name for p in root.glob("abandoned-*/global_step*"))
    assert len(kept) == 5  # 8, 12 of the first run; 8, 12, 16 of the roll-back (keep_last pruned its step 4)


class FullDiskEngine(FakeEngine):
    """A shard write that runs out of space half-way, as ``write(2)`` does on a full filesystem. The fake proves our
    side of the seam (the error reaching checkpoint.save and the partial folder removed), not DeepSpeed's real save
    layout, multi-rank shards, nor a real filesystem's behaviour (a short write, NFS reporting it only at close)."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.error = error

    def save(self, root: Path, tag: str, client_state: dict) -> None:
        tag_dir = Path(root) / tag
        tag_dir.mkdir(parents=True, exist_ok=True)
        with open(tag_dir / "mp_rank_00_model_states.pt", "wb") as f:
            f.write(b"x" * 4096)
        raise self.error


@pytest.mark.parametrize("error", [
    OSError(28, "No space left on device"),
    OSError(122, "Disk quota exceeded"),
    RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/3: "
                 "file write failed"),
], ids=["ENOSPC", "EDQUOT", "torch-writer"])
def test_disk_full_while_saving_removes_the_partial_folder_and_keeps_latest(tmp_path, error):
    root = tmp_path / "checkpoints"
    _save(root, 10)
    with pytest.raises(checkpoint.DiskFullError) as caught:
        checkpoint.save(FullDiskEngine(error), root, TrainState(step=20), {}, rank=0, world_size=1, keep_last=3)
    assert str(caught.value).startswith(f"disk full while saving global_step20 to {root}; last complete "
                                        f"checkpoint: {root / 'global_step10'}")
    assert "\n" not in str(caught.value)
    assert not (root / "global_step20").exists()  # the partial folder is gone
    assert (root / "latest").read_text() == "global_step10" and checkpoint.is_complete(root / "global_step10")
    assert sorted(p.name for p in root.iterdir()) == ["global_step10", "latest"]


def test_disk_full_writing_the_state_file_or_latest_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 10)
    real_open = open

    def full_for(name):
        def fake_open(path, mode="r", *args, **kwargs):
            if name in str(path) and "w" in mode:
                raise OSError(28, "No space left on device", str(path))
            return real_open(path, mode, *args, **kwargs)
        return fake_open

    import builtins
    for name in (checkpoint.STATE_FILE, checkpoint.LATEST):
        monkeypatch.setattr(builtins, "open", full_for(f".{name}.tmp"))
        with pytest.raises(checkpoint.DiskFullError, match="disk full while saving global_step20"):
            _save(root, 20)
        monkeypatch.setattr(builtins, "open", real_open)
        assert sorted(p.name for p in root.iterdir()) == ["global_step10", "latest"], name
        assert (root / "latest").read_text() == "global_step10"


def test_free_space_check_warns_before_a_save_that_would_not_fit(tmp_path, monkeypatch, capsys):
    import collections

    from trainer import disk_space
    root = tmp_path / "checkpoints"
    _save(root, 10)
    size = checkpoint.folder_bytes(root / "global_step10")
    assert size > 8192  # the shard and the RNG state
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda p: usage(10**12, 10**12 - size + 1, size - 1))
    _save(root, 20)
    assert "the last checkpoint (global_step10) took" in capsys.readouterr().err
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda p: usage(10**12, 0, size * 2))
    _save(root, 30)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiproc
def test_disk_full_in_a_real_two_rank_run_stops_every_rank_with_one_line(tmp_path):
    """torchrun, 2 ranks, ZeRO-2: rank 0's model-state write inside DeepSpeed's save_checkpoint hits ENOSPC at step
    4 (rank 1's writes succeed, so the ranks must agree). Both ranks stop with the one line and no traceback,
    status.json says disk_full, the partial global_step4 is gone and latest still names step 2."""
    from test_trainer_multiproc import TIMEOUT, make_config

    cfg = make_config(tmp_path, "run", train={"steps": 8, "eval_every": 0}, checkpoint={"every_steps": 2})
    worker = REPO / "tests" / "fault_worker.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker),
           "--config", str(cfg), "--resume", "none"]
    env = dict(os.environ, OMP_NUM_THREADS="1", BERTFAMILY_TEST_ENOSPC="global_step4/mp_rank_00_model_states")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    root = tmp_path / "run" / "checkpoints"
    line = f"error: disk full while saving global_step4 to {root}; last complete checkpoint: {root / 'global_step2'}"
    assert out.count(line) == 2, out[-5000:]  # one line per rank
    assert "rank 0: error: disk full" in out and "rank 1: error: disk full" in out
    # no traceback from the trainer (torchrun itself prints one for the non-zero exit: that is the launcher's report)
    assert "training failed" not in out and f'File "{REPO / "trainer"}' not in out, out[-5000:]
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "disk_full" and status["step"] == 4 and "global_step4" in status["message"]
    assert not (root / "global_step4").exists()
    assert (root / "latest").read_text() == "global_step2" and checkpoint.is_complete(root / "global_step2")


def test_init_from_takes_model_and_hugging_face_folders_and_refuses_another_vocabulary(tmp_path):
    """checkpoint.init_from names a trainer checkpoint, our model folder or a Hugging Face folder (README: "a local
    Hugging Face folder can be imported as the start of continued pretraining"); the last two were refused as "not a
    complete checkpoint". A source trained with another vocabulary is refused by rank 0 with both sizes: fitting its
    rows would cut or pad real rows."""
    import torch

    from trainer.models import PretrainingModel, get_preset
    from trainer.models.hf_convert import export_hf
    from trainer.models.model_folder import save_model_folder
    from trainer.models.presets import BERT_HEADS

    cfg = get_preset("tiny", vocab_size=120)
    torch.manual_seed(3)
    model = PretrainingModel(cfg, BERT_HEADS)
    export_hf(cfg, model.state_dict(), tmp_path / "hf")
    save_model_folder(model, cfg, tmp_path / "folder")
    for source in ("hf", "folder"):
        weights = init_from.init_weights(tmp_path / source, tmp_path / "run", rank=0, vocab_size=(120, 128))
        for key, value in model.state_dict().items():
            got = weights[key][:120] if key.endswith(("word.weight", "decoder.weight", "decoder.bias")) else weights[key]
            want = value[:120] if key.endswith(("word.weight", "decoder.weight", "decoder.bias")) else value
            assert torch.equal(got, want), (source, key)
        # model rows above the tokenizer's (NVIDIA's 30528 for 30522) are padding: accepted above; another
        # tokenizer, larger or smaller, is refused
        for corpus, rows in ((300, 300), (100, 100)):
            with pytest.raises(ValueError, match=rf"{source}: trained with a vocabulary of 120 tokens; this run's "
                                                 rf"corpus tokenizer has {corpus} and its model {rows} rows"):
                init_from.init_weights(tmp_path / source, tmp_path / "run", rank=0, vocab_size=(corpus, rows))
    with pytest.raises(FileNotFoundError, match=r"not a trainer checkpoint .*not a model folder .*not a Hugging Face"):
        init_from.init_weights(tmp_path / "run", tmp_path / "run2", rank=0)


def test_init_from_names_new_heads_and_stops_on_another_architecture():
    """What the source lacks: a head starts new and is named; an ELECTRA generator missing entirely starts new; an
    encoder tensor missing or of another shape stops the run (it trained from random weights and exited 0)."""
    import torch

    from trainer.models import ElectraPretrainingModel, PretrainingModel, get_preset
    from trainer.models.presets import BERT_HEADS, ROBERTA_HEADS
    from trainer.pretrain import load_init_weights

    cfg = get_preset("tiny", vocab_size=120)
    mlm_only = PretrainingModel(cfg, ROBERTA_HEADS).state_dict()
    target = PretrainingModel(cfg, BERT_HEADS)
    said = load_init_weights(target, mlm_only, "SRC")
    assert said == "initialised from SRC; new heads (not in the source): ['nsp']"
    assert torch.equal(target.state_dict()["encoder.embeddings.word.weight"], mlm_only["encoder.embeddings.word.weight"])
    wider = PretrainingModel(cfg.replace(hidden_size=96, num_heads=4, intermediate_size=128), BERT_HEADS).state_dict()
    with pytest.raises(ValueError, match=r"SRC: \d+ tensors have another shape .*\(\d+, 96\) there, \(\d+, 64\) here"):
        load_init_weights(target, wider, "SRC")
    partial = {k: v for k, v in mlm_only.items() if not k.startswith("encoder.attention.1.")}
    with pytest.raises(ValueError, match=r"SRC: the source lacks 6 of this model's \d+ encoder tensors"):
        load_init_weights(target, partial, "SRC")
    ecfg = get_preset("tiny-electra", vocab_size=120)
    electra = ElectraPretrainingModel(ecfg)
    disc = {k: v for k, v in electra.state_dict().items() if k.startswith("discriminator.")}
    assert "ELECTRA generator: new" in load_init_weights(ElectraPretrainingModel(ecfg), disc, "SRC")
