"""A received checkpoint runs no code (issue 21, item 5): a real DeepSpeed checkpoint (ZeRO 2, one rank, the stand-in
objective) whose ``rng_rank0.pt``, ``mp_rank_00_model_states.pt`` or optimizer shard is replaced by a pickle that
creates a marker file when unpickled (the rest of the file intact, so code that unpickles it carries on) is refused
with a message naming the file by every entry point that loads checkpoints: ``--resume``, ``checkpoint.init_from``,
``python -m trainer.export_hf``, ``python -m trainer.finetune`` and the universal conversion of a resume on another
world size. The marker must never appear. Normal resume at ZeRO 0-3 (whose files need DeepSpeed's allow-listed
classes) is covered by tests/test_trainer_multiproc.py, which loads through the same weights-only path.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_trainer_multiproc as launch  # noqa: E402  (the stand-in launcher's config and run helpers)

from trainer import safe_load  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FILES = ["rng_rank0.pt", "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]


class CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appearing is the proof that the load ran code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """A real 1-rank ZeRO-2 run of 2 steps: RUN/checkpoints/global_step2 with model states, optimizer shard, RNG."""
    tmp = tmp_path_factory.mktemp("untrusted")
    cfg = launch.make_config(tmp, "source", train={"steps": 2, "global_batch_size": 4, "micro_batch_size": 2,
                                                   "eval_every": 0, "eval_batches": 1},
                             schedule={"kind": "linear", "warmup_steps": 1, "decay_steps": 2})
    launch.run(cfg, 1)
    tag = tmp / "source" / "checkpoints" / "global_step2"
    assert sorted(p.name for p in tag.glob("*.pt")) == sorted(FILES)
    return tag


def poisoned(clean: Path, name: str, where: Path) -> tuple[Path, Path]:
    """A copy of the clean run's checkpoints folder under ``where`` with ``name`` poisoned; (checkpoint, marker)."""
    root = where / "received" / "checkpoints"
    shutil.copytree(clean.parent, root)
    marker = where / "marker_created_by_unpickling"
    f = root / clean.name / name
    obj = torch.load(f, map_location="cpu", weights_only=False)  # our own clean file
    obj["payload"] = CreatesFile(marker)
    torch.save(obj, f)
    return root / clean.name, marker


def outcome(fn) -> str:
    """Run an entry point; the text of whatever it raised (or the code it exited with) for the assertions."""
    try:
        return f"returned {fn()!r}"
    except SystemExit as err:
        return f"exit {err.code}"
    except BaseException as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"


@pytest.mark.parametrize("name", FILES)
def test_export_hf_refuses(clean, tmp_path, name, capsys):
    from trainer.export_hf import main

    ckpt, marker = poisoned(clean, name, tmp_path)
    said = outcome(lambda: main(["--checkpoint", str(ckpt), "--output", str(tmp_path / "hf")]))
    said += capsys.readouterr().err
    assert not marker.exists(), "loading the checkpoint ran the pickle's code"
    # the name pickle records for open: io.open on Python 3.11, _io.open on 3.12
    import io

    assert f"{ckpt / name}: refused to load: unpickling it would call {io.open.__module__}.open" in said, said
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("name", FILES)
def test_init_from_refuses(clean, tmp_path, name):
    """``checkpoint.init_from`` as trainer.pretrain calls it (rank 0 consolidates, outside any process group)."""
    from trainer.init_from import init_weights

    ckpt, marker = poisoned(clean, name, tmp_path)
    said = outcome(lambda: init_weights(ckpt.parent, tmp_path / "run", rank=0))
    assert not marker.exists(), "loading the checkpoint ran the pickle's code"
    assert said.startswith("UntrustedCheckpointError") and f"{ckpt / name}: refused to load" in said, said
    # rank 0 left its failure note, so the other ranks stop with its error instead of waiting for the weights
    assert any(p.name.startswith(".init_from_") and p.name.endswith(".failed") for p in (tmp_path / "run").iterdir())


@pytest.mark.parametrize("name", FILES)
def test_finetune_refuses(clean, tmp_path, name, en_corpus, capsys):
    from finetune_tasks import corpus_documents, write_cola
    from trainer.finetune.__main__ import main

    ckpt, marker = poisoned(clean, name, tmp_path)
    cola = write_cola(corpus_documents(en_corpus, 0, 600), tmp_path / "cola", 8, 4)
    code = outcome(lambda: main(["--checkpoint", str(ckpt), "--task", "cola", "--data", str(cola),
                                 "--set", f"run_dir={tmp_path / 'ft'}"]))
    err = capsys.readouterr().err
    assert not marker.exists(), "loading the checkpoint ran the pickle's code"
    assert code == "returned 2" and f"{ckpt / name}: refused to load" in err, (code, err)
    assert not (tmp_path / "ft").exists()


@pytest.mark.slow  # one launch per file (~10 s each alone)
@pytest.mark.parametrize("name", FILES)
def test_resume_refuses(clean, tmp_path, name):
    ckpt, marker = poisoned(clean, name, tmp_path)
    cfg = launch.make_config(tmp_path, "resumed", train={"steps": 4, "global_batch_size": 4, "micro_batch_size": 2,
                                                         "eval_every": 0, "eval_batches": 1},
                             schedule={"kind": "linear", "warmup_steps": 1, "decay_steps": 4})
    proc = launch.run(cfg, 1, "--resume", str(ckpt), expect=None)
    assert not marker.exists(), "loading the checkpoint ran the pickle's code"
    assert proc.returncode != 0 and f"{ckpt / name}: refused to load" in proc.stderr, proc.stderr[-3000:]
    # it trained and saved nothing (checkpoints/ holds only lineage.json, where this lineage was to start)
    assert not list((tmp_path / "resumed" / "checkpoints").glob("global_step*"))


@pytest.mark.slow  # DeepSpeed's converter in a child process (~10 s)
@pytest.mark.parametrize("name", FILES[1:])
def test_universal_conversion_refuses(clean, tmp_path, name):
    """What a resume on another world size runs first (rank 0): DeepSpeed's converter, which loads with
    weights_only=False itself, runs under trainer.safe_run."""
    from trainer.engine import convert_to_universal

    ckpt, marker = poisoned(clean, name, tmp_path)
    said = outcome(lambda: convert_to_universal(ckpt, tmp_path / "universal"))
    assert not marker.exists(), "the converter ran the pickle's code"
    assert said.startswith("UntrustedCheckpointError") and f"{ckpt / name}: refused to load" in said, said


def test_clean_checkpoint_loads_with_the_allow_list_and_rng_is_plain_data(clean, tmp_path):
    from trainer.checkpoint import load_model_state
    from trainer.engine import checkpoint_globals

    state, config = load_model_state(clean)
    assert state and all(v.dtype == torch.float32 for v in state.values())
    for f in clean.glob("*.pt"):
        assert safe_load.unsafe_globals(f, checkpoint_globals()) == [], f  # nothing beyond the allow-list
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(clean / "rng_rank0.pt")) == []  # plain data


def test_fp16_dynamic_loss_scaler_as_deepspeed_builds_it_is_allowed(tmp_path):
    """fp16 runs only on GPUs, so no CPU save holds its scaler: this pickles the object ZeRO's fp16 optimizers put in
    their shards (CreateLossScaler with dynamic scaling, stage_1_and_2.py / stage3.py) and loads it weights-only.
    What it cannot see: any other object a GPU-only path might add to a shard."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from trainer.engine import checkpoint_globals

    args = {"init_scale": 2**16, "scale_window": 1000, "min_scale": 1, "delayed_shift": 2, "consecutive_hysteresis":
            False, "raise_error_at_min_scale": True}
    scaler = CreateLossScaler(torch.float16, 0, True, args)
    assert type(scaler).__name__ == "DynamicLossScaler"
    torch.save({"loss_scaler": scaler, "x": torch.ones(2)}, tmp_path / "shard.pt")
    loaded = safe_load.load(tmp_path / "shard.pt", checkpoint_globals())["loss_scaler"]
    assert loaded.cur_scale == 2**16 and loaded.scale_window == 1000
    with pytest.raises(safe_load.UntrustedCheckpointError, match="shard.pt: refused to load: unpickling it would "
                                                                 "call deepspeed.runtime.fp16.loss_scaler"):
        safe_load.load(tmp_path / "shard.pt")


def test_old_rng_files_with_numpy_arrays_still_restore(tmp_path):
    """rng_rank*.pt written before the plain-data format hold numpy's key array: allowed (numpy's array classes run
    no code of the file's choosing), so runs started on the old code resume."""
    import random

    import numpy as np
    from trainer import checkpoint

    np.random.seed(4)
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(old, tmp_path / "rng_rank0.pt")
    expected = np.random.rand(3)
    np.random.seed(9)
    checkpoint.set_rng_state(safe_load.load(tmp_path / "rng_rank0.pt", safe_load.numpy_rng_globals()))
    assert np.array_equal(np.random.rand(3), expected)
    checkpoint.set_rng_state(checkpoint.rng_state())  # the new format round-trips too


def test_finetune_results_go_beside_a_received_checkpoint_not_to_its_configs_run_dir(tmp_path):
    """A received checkpoint whose config names run_dir=<its maker's folder>: the results folder is the received
    copy's run folder instead (``--set run_dir`` still wins, trainer/finetune/__main__.py). The checkpoint is a
    ZeRO-0 layout written here (one ``mp_rank_00_model_states.pt`` holding ``module``, as DeepSpeed writes it, and
    our ``bertfamily.json``) of a tiny BERT, since fine-tuning needs an encoder, which the stand-in objective lacks."""
    import json

    from trainer.finetune.model import load_source
    from trainer.models import PretrainingModel, get_preset
    from trainer.models.presets import BERT_HEADS

    cfg = get_preset("tiny", vocab_size=120, pad_token_id=0)
    tag = tmp_path / "received" / "checkpoints" / "global_step3"
    tag.mkdir(parents=True)
    torch.save({"module": PretrainingModel(cfg, BERT_HEADS).state_dict()}, tag / "mp_rank_00_model_states.pt")
    elsewhere = tmp_path / "someone_elses_run"
    (tag / "bertfamily.json").write_text(json.dumps({"step": 3, "world_size": 1, "zero_stage": 0, "config": {
        "model": cfg.model_dump(mode="json"), "run_dir": str(elsewhere), "data": {}}}))
    source = load_source(tag)
    assert source.run_dir == tmp_path / "received"
    assert load_source(tag.parent).run_dir == tmp_path / "received"
