"""What a resume may change besides the world size: real one-process runs of a tiny recipe on the shared English
corpus (tests/test_trainer_recipes.py's shards), stopped at step 4 and resumed with another setting."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import fork_server
from trainer import checkpoint, universal
from test_trainer_recipes import corpus  # noqa: F401 (fixture: byte-level BPE shards of the English corpus)

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow]


def pretrain(run_dir: Path, corpus: Path, *sets: str, resume: str = "auto", expect: int = 0):
    args = [sys.executable, "-m", "trainer.pretrain", "--config", "tiny_bert", "--resume", resume]
    for kv in (f"run_dir={run_dir}", f"data.corpora.0.prefix={corpus}", "train.steps=8", "train.eval_every=0",
               "checkpoint.every_steps=4", "logging.every_steps=1", "logging.progress_bar=false",
               "logging.tensorboard=false", "data.num_workers=0", *sets):
        args += ["--set", kv]
    proc = fork_server.run(args, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "split" not in r]


def test_resume_with_another_global_batch_reads_on_from_the_consumed_position(tmp_path, corpus):  # noqa: F811
    """16 x 4 steps, then 8 or 48 per step to step 8. Before: 16 -> 8 trained to step 4 of the rest and then
    stopped with a bare StopIteration (the loader ended at train.steps x the new batch); 16 -> 48 refused at start
    with "consumed_samples 64 is not at a step boundary ...; a checkpoint is taken between steps only"."""
    first = tmp_path / "first"
    pretrain(first, corpus, "train.global_batch_size=16", "train.stop_at_step=4")
    step4 = first / "checkpoints" / "global_step4"
    for G in (8, 48):
        run_dir = tmp_path / f"g{G}"
        proc = pretrain(run_dir, corpus, f"train.global_batch_size={G}", resume=str(step4))
        assert f"train.global_batch_size 16 -> {G} from step 4" in proc.stdout
        recs = train_records(run_dir)
        assert [r["step"] for r in recs] == [5, 6, 7, 8]
        assert [r["consumed_samples"] for r in recs] == [64 + G * k for k in range(1, 5)]


def test_a_changed_global_batch_is_refused_where_samples_number_their_step_by_position(corpus, monkeypatch):
    """ERNIE's components (its own ``build_components``) give a sample the step position // global batch: another
    batch mid-run would shift every later sample's knowledge-masking level and task, so the resume is refused before
    anything is loaded, saying what to do."""
    from types import SimpleNamespace

    import trainer.objectives
    from trainer.config import load_config
    from trainer.pretrain import global_batch_change

    cfg = load_config("tiny_bert", [f"data.corpora.0.prefix={corpus}", "train.global_batch_size=8"], world_size=1)
    saved = {"step": 4, "consumed_samples": 64, "config": {"train": {"global_batch_size": 16}}}
    assert global_batch_change(saved, cfg, "CKPT").startswith("resume: train.global_batch_size 16 -> 8 from step 4")
    assert global_batch_change({**saved, "config": {"train": {"global_batch_size": 8}}}, cfg, "CKPT") is None
    monkeypatch.setattr(trainer.objectives, "get_objective", lambda _: SimpleNamespace(build_components=None))
    with pytest.raises(ValueError, match=r"global_batch_size=16; this launch sets 8.*train.global_batch_size=16, or "
                                         r"start a new run .*checkpoint.init_from=CKPT"):
        global_batch_change(saved, cfg, "CKPT")


def _saved_at(tmp_path: Path, stage: int) -> Path:
    tag = tmp_path / f"z{stage}" / "global_step4"
    tag.mkdir(parents=True)
    (tag / "bertfamily.json").write_text(json.dumps({"step": 4, "zero_stage": stage, "world_size": 2}))
    return tag


@pytest.mark.parametrize("saved, now, ok", [(0, 0, True), (1, 2, True), (2, 1, True), (3, 3, True), (0, 1, False),
                                            (2, 0, False), (1, 3, False), (3, 1, False), (2, 3, False)])
def test_which_zero_stage_changes_a_resume_takes(tmp_path, saved, now, ok):
    why = universal.zero_stage_change_error(_saved_at(tmp_path, saved), now)
    assert (why is None) == ok, why
    if not ok:
        assert f"saved at ZeRO-{saved}; this launch runs ZeRO-{now}" in why
        assert f"--set deepspeed.zero_stage={saved}" in why and "checkpoint.init_from=" in why


@pytest.mark.multiproc
def test_an_unsupported_zero_stage_change_is_refused_before_anything_is_loaded(tmp_path):
    """ZeRO-0 -> ZeRO-1 failed inside DeepSpeed's load with FileNotFoundError zero_pp_rank_0_..._optim_states.pt
    (2 -> 0: AttributeError 'NoneType' has no attribute 'copy'; 1 <-> 3: a bare AssertionError, after converting)."""
    from test_trainer_multiproc import make_config, run

    zero = {s: {"config": str(REPO / "ds_configs" / f"zero{s}.json")} for s in (0, 1)}
    cfg = make_config(tmp_path, "run", deepspeed=zero[0], checkpoint={"every_steps": 4}, train={"eval_every": 0})
    run(cfg, 1, "--set", "train.stop_at_step=4")
    proc = run(cfg, 1, "--set", f"deepspeed.config={zero[1]['config']}", expect=1)
    assert "was saved at ZeRO-0; this launch runs ZeRO-1" in proc.stderr
    assert "optim_states" not in proc.stderr and "DeepSpeed's universal" not in proc.stdout
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "global_step4"


@pytest.mark.multiproc
def test_relaunching_a_stopped_run_with_the_same_stop_at_step_trains_nothing(tmp_path):
    """Before: each relaunch trained one more step, saved it and pruned a regular checkpoint (keep_last)."""
    from test_trainer_multiproc import losses, make_config, run

    cfg = make_config(tmp_path, "run", checkpoint={"every_steps": 2, "keep_last": 2}, train={"eval_every": 0})
    run(cfg, 1, "--set", "train.stop_at_step=4")
    proc = run(cfg, 1, "--set", "train.stop_at_step=4")
    assert "nothing to train: resumed at step 4, train.stop_at_step=4" in proc.stdout + proc.stderr
    assert sorted(losses(tmp_path / "run")) == [1, 2, 3, 4]
    root = tmp_path / "run" / "checkpoints"
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["global_step2", "global_step4"]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "stopped"


def test_a_resume_says_which_model_settings_changed_since_the_checkpoint():
    """An upgrade changed a preset under a running job (ernie2-base's LayerNorm eps, 1e-12 -> 1e-5 on 2026-12-06):
    the resume continues with the launch's value, said with the --set that keeps the old one; before, nothing was
    said (diff review). The function the trainer prints from; the print itself is one line in pretrain.run."""
    from trainer.init_from import resume_field_changes
    from trainer.models import get_preset

    now = get_preset("tiny", layer_norm_eps=1e-5)
    saved = {"model": {**get_preset("tiny").model_dump(), "layer_norm_eps": 1e-12}}
    note = resume_field_changes(saved, now)
    assert note and "layer_norm_eps 1e-12 in the checkpoint's run, 1e-05 now" in note
    assert "--set model.layer_norm_eps=1e-12" in note
    assert resume_field_changes({"model": now.model_dump()}, now) is None
    assert resume_field_changes({}, now) is None  # an old checkpoint without a recorded config
