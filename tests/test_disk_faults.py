"""A full disk, for real where this machine lets a test mount a small tmpfs (root here; skipped, saying why, where
mounting is not permitted), and a checkpoint shard cut short:

- a checkpoint save on a full filesystem stops every rank with disk_space's one line and status ``disk_full``,
  whatever words torch's writer uses (torch 2.13: "basic_ios::clear: iostream error", then "unexpected pos N vs M"),
  and after any failed save while the filesystem is (nearly) full;
- a full disk outside a save (metrics.jsonl here) gives one line naming the file and status ``disk_full``;
- a metrics.jsonl an earlier run left with a cut last line loses that line, not the next record;
- a resume from a checkpoint whose DeepSpeed shard is cut short names the checkpoint, the file and the
  ``--resume PATH`` of the previous complete checkpoint, instead of DeepSpeed's traceback.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainer import disk_space
from trainer.disk_space import is_disk_full

REPO = Path(__file__).resolve().parents[1]

TORCH_213_WRITE = "basic_ios::clear: iostream error"
TORCH_213_CLOSE = "[enforce fail at inline_container.cc:672] . unexpected pos 4800 vs 4692"


@contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` for the block; unmounted after it, also when the block fails."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path} here ({(proc.stderr or proc.stdout).strip()}): these tests "
                    "fill a real filesystem and need root (or CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> None:
    """Write a filler file into ``folder`` until its filesystem is full, then free ``leave`` bytes of it. Only on a
    filesystem of a few MiB (the tests' tmpfs): never the machine's disk."""
    assert shutil.disk_usage(folder).total <= 16 << 20, f"{folder} is not on a small test tmpfs"
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))


# --- recognising a full disk ---------------------------------------------------------------------------------------

def test_torch_213s_writer_failure_is_a_full_disk():
    """The exact strings torch 2.13 raised writing a checkpoint to a full tmpfs (the reviewer's log), alone and
    chained as torch chains them (the close's error, with the write's as its context)."""
    assert is_disk_full(RuntimeError(TORCH_213_WRITE))
    assert is_disk_full(RuntimeError(TORCH_213_CLOSE))
    try:
        try:
            raise RuntimeError(TORCH_213_WRITE)
        except RuntimeError:
            raise RuntimeError(TORCH_213_CLOSE)
    except RuntimeError as err:
        assert is_disk_full(err)
    assert not is_disk_full(RuntimeError("CUDA out of memory"))
    assert not is_disk_full(ValueError("unexpected pos"))  # torch raises these as RuntimeError only


def test_a_failed_write_on_a_nearly_full_filesystem_counts_as_disk_full(tmp_path):
    """Words no pattern knows: what decides is the filesystem, full after the write failed."""
    unknown = RuntimeError("some future writer's words for a failed write")
    assert not is_disk_full(unknown, tmp_path)  # the test machine's /tmp is not full
    with tmpfs(tmp_path / "fs", "256k") as fs:
        fill(fs)
        assert disk_space.nearly_full(fs / "checkpoints" / "global_step2")  # a folder not made yet: its parent's
        assert is_disk_full(unknown, fs)
        assert not is_disk_full(None, fs)


def test_engine_save_on_a_full_filesystem_raises_enospc_naming_the_folder(tmp_path):
    """``Engine.save`` with a stand-in for DeepSpeed's engine whose save fills the filesystem and then raises in words
    no pattern knows. The fake cannot see what DeepSpeed really writes or raises (the real save on a full tmpfs is the
    next test's)."""
    from trainer.engine import Engine

    class FakeDeepSpeed:
        def __init__(self, fills: bool):
            self.fills = fills

        def save_checkpoint(self, root, tag, client_state, save_latest):
            Path(root, tag).mkdir(parents=True)
            if self.fills:
                fill(Path(root, tag))
            raise RuntimeError("some future writer's words for a failed write")

    eng = Engine.__new__(Engine)
    eng.engine = FakeDeepSpeed(fills=True)
    with tmpfs(tmp_path / "fs", "256k") as fs:
        with pytest.raises(OSError) as err:
            eng.save(fs, "global_step2", {})
        assert err.value.errno == errno.ENOSPC and err.value.filename == str(fs / "global_step2")
        assert "some future writer's words" in str(err.value)
        assert is_disk_full(err.value)
    eng.engine = FakeDeepSpeed(fills=False)
    with pytest.raises(RuntimeError, match="future writer"):  # not full: the error as it was
        eng.save(tmp_path / "roomy", "global_step2", {})


def _standin_run(tmp_path: Path, name: str, nproc: int = 1, *extra: str, expect=None, **sections):
    from test_trainer_multiproc import make_config, run
    cfg = make_config(tmp_path, name, **sections)
    return cfg, run(cfg, nproc, *extra, expect=expect)


def test_a_real_checkpoint_save_on_a_full_tmpfs_stops_with_disk_full(tmp_path):
    """A 1-rank run whose checkpoint folder is a tmpfs too small for one checkpoint: the first save fails in torch's
    writer, and the run stops with the one line and status disk_full (before the fix: a traceback, status
    failed)."""
    with tmpfs(tmp_path / "fs", "128k") as fs:
        fill(fs, leave=16 << 10)
        ckpts = fs / "checkpoints"
        cfg, proc = _standin_run(tmp_path, "run", train={"steps": 4, "eval_every": 0},
                                 checkpoint={"every_steps": 2, "keep_last": 2, "dir": str(ckpts)},
                                 objective={"name": "standin", "options": {"record_samples": False}})
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert f"disk full while saving global_step2 to {ckpts}; last complete checkpoint: none" in proc.stderr, \
            proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        status = json.loads((tmp_path / "run" / "status.json").read_text())
        assert status["status"] == "disk_full", status
        assert not (ckpts / "global_step2").exists()  # the partial folder is removed


# --- a full disk outside checkpoint saves --------------------------------------------------------------------------

def test_metrics_jsonl_on_a_full_disk_stops_with_one_line_naming_it(tmp_path):
    """metrics.jsonl is a link into a full tmpfs (so only its writes fail): the run stops with one line naming the
    file, status disk_full, no traceback (before: a bare 'OSError: [Errno 28] No space left on device' traceback,
    status failed)."""
    with tmpfs(tmp_path / "fs", "64k") as fs:
        fill(fs)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").symlink_to(fs / "metrics.jsonl")
        cfg, proc = _standin_run(tmp_path, "run", train={"steps": 2, "eval_every": 0},
                                 checkpoint={"every_steps": 0, "save_at_end": False},
                                 objective={"name": "standin", "options": {"record_samples": False}})
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        (line,) = [x for x in proc.stderr.splitlines() if "disk full" in x]
        assert f"writing {run_dir / 'metrics.jsonl'}" in line and "Free space there" in line, line
        assert "--resume auto" in line and "last complete checkpoint: none" in line, line
        status = json.loads((run_dir / "status.json").read_text())
        assert status["status"] == "disk_full" and "metrics.jsonl" in status["message"], status


def test_the_message_names_the_full_filesystems_when_the_error_names_no_file(tmp_path):
    """The data index cache's writer raises ENOSPC without a file name: the line names the run's folders that are
    on a full filesystem now."""
    with tmpfs(tmp_path / "fs", "64k") as fs:
        fill(fs)
        err = OSError(errno.ENOSPC, "No space left on device")
        line = disk_space.disk_full_elsewhere_message(
            err, [("run_dir", tmp_path / "run"), ("data index cache", fs / "index_cache")], None)
    assert f"full now: data index cache {fs / 'index_cache'} (" in line and "run_dir" not in line, line


def test_a_cut_last_line_of_metrics_jsonl_is_dropped_before_appending(tmp_path, capsys):
    """An earlier run stopped mid-record (a full disk): the next run's records start on their own line, and every
    line is JSON (before: the first new record was glued onto the cut one)."""
    from types import SimpleNamespace

    from trainer.metrics import MetricsLogger

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "lo')
    cfg = SimpleNamespace(tensorboard=False, progress_bar=False)
    m = MetricsLogger(tmp_path, cfg, rank=0, total_steps=4, start_step=1)
    m.log(2, {"loss": 2.25})
    m.close()
    lines = path.read_text().splitlines()
    # (every new record also says when it was logged: "time", unix seconds)
    assert [{k: v for k, v in json.loads(x).items() if k != "time"} for x in lines] == [
        {"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]
    assert "time" in json.loads(lines[1])
    assert f"{path} ended in a cut line" in capsys.readouterr().out
    m = MetricsLogger(tmp_path, cfg, rank=0, total_steps=4, start_step=2)  # a whole file: left as it is, nothing said
    m.close()
    assert path.read_text().splitlines() == lines and "cut line" not in capsys.readouterr().out


# --- a checkpoint shard cut short ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shard", ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"])
def test_a_cut_shard_names_the_checkpoint_and_the_resume_command_of_the_previous_one(tmp_path, shard):
    """A real 1-rank run saves global_step4 and global_step8; a shard of global_step8 is cut to half its size (a copy
    stopped half way). Resume says which checkpoint and file, and the --resume command of global_step4, in one line
    (before: DeepSpeed's traceback ending in 'OSError: [Errno 22] Invalid argument' or 'PytorchStreamReader failed
    reading zip archive')."""
    sections = dict(train={"steps": 8, "eval_every": 0}, schedule={"kind": "constant", "warmup_steps": 0},
                    checkpoint={"every_steps": 4, "keep_last": 3},
                    objective={"name": "standin", "options": {"record_samples": False}})
    cfg, _ = _standin_run(tmp_path, "run", 1, "--resume", "none", expect=0, **sections)
    root = tmp_path / "run" / "checkpoints"
    cut = root / "global_step8" / shard
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])

    from test_trainer_multiproc import run
    proc = run(cfg, 1, "--resume", "auto", "--set", "train.steps=12", expect=None)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if "is damaged" in x]
    assert f"checkpoint {root / 'global_step8'} is damaged: {cut} is cut short or corrupted" in line, line
    assert f"run the same command with --resume {root / 'global_step4'}" in line, line
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "failed" and "is damaged" in status["message"], status
