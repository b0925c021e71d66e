"""A checkpoint's ``bertfamily.json`` read back from elsewhere: damaged (a failing disk, a copy stopped half way; our
own writes are atomic), another program's, or written by a newer bertfamily. Each is refused by name with what to do,
instead of a JSON traceback on every rank or a silent misreading; the earlier checkpoint it names resumes."""
from __future__ import annotations

import json

import pytest

from trainer import checkpoint


def test_a_cut_state_file_is_named_with_the_checkpoint_to_resume_instead_and_that_resume_works(tmp_path):
    from test_trainer_multiproc import make_config, run

    cfg = make_config(tmp_path, "run", train={"steps": 8, "eval_every": 0},
                      schedule={"kind": "constant", "warmup_steps": 0}, checkpoint={"every_steps": 4, "keep_last": 3})
    root = tmp_path / "run" / "checkpoints"
    run(cfg, 1, "--resume", "none")
    state = root / "global_step8" / checkpoint.STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])

    proc = run(cfg, 1, "--resume", "auto", "--set", "train.steps=12", expect=None)
    assert proc.returncode != 0
    assert f"{state} is damaged" in proc.stderr and f"--resume {root / 'global_step4'}" in proc.stderr, proc.stderr
    assert "JSONDecodeError" not in proc.stderr and "Traceback" not in proc.stderr  # one line, no traceback
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"

    proc = run(cfg, 1, "--resume", str(root / "global_step4"), "--set", "train.steps=12")
    assert f"resumed from {root / 'global_step4'} at step 4" in proc.stdout
    assert checkpoint.find_latest(root) == root / "global_step12"
    (aside,) = root.glob("abandoned-*")  # the damaged one is moved aside, not deleted
    assert (aside / "global_step8" / checkpoint.STATE_FILE).stat().st_size > 0
    moved = json.loads((aside / "moved.json").read_text())["moved"]
    assert {"tag": "global_step8", "complete": True, "run_id": None} in moved


@pytest.mark.parametrize("record, said", [
    ({"format": "bertfamily-checkpoint", "version": 2, "step": 4, "consumed_samples": 32, "config": {}},
     "format version 2 was written by a newer bertfamily"),
    ({"format": "someone-else", "step": 4, "consumed_samples": 32, "config": {}}, "not a bertfamily checkpoint"),
    ([1, 2], "not a bertfamily checkpoint"),
])
def test_a_newer_foreign_or_incomplete_state_is_refused_by_name(tmp_path, record, said):
    tag = tmp_path / "checkpoints" / "global_step4"
    tag.mkdir(parents=True)
    (tag / checkpoint.STATE_FILE).write_text(json.dumps(record))
    with pytest.raises(checkpoint.CheckpointStateError, match=said) as err:
        checkpoint.read_state(tag)
    assert str(tag / checkpoint.STATE_FILE) in str(err.value)
    with pytest.raises(checkpoint.CheckpointStateError, match=said):  # the export's and fine-tuning's read too,
        checkpoint.load_model_state(tag.parent)  # before any weights
