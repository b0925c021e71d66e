"""eval.downstream across a roll-back (review of long runs, finding 3): the abandoned lineage's queued fine-tuning of
step s and the new lineage's shared one copy path, so the first to end deleted the copy the second read (recorded
downstream_failed) and the second overwrote the first's finetune.log. The run id is in the path and the records,
and a queued fine-tuning whose checkpoint a roll-back moved aside is dropped."""
from __future__ import annotations

import json
import time
from pathlib import Path

OLD, NEW = "a" * 32, "b" * 32


def checkpoint(root: Path, step: int, run_id: str) -> Path:
    tag = root / f"global_step{step}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x" * 64)
    (tag / "bertfamily.json").write_text(json.dumps({"step": step, "run_id": run_id}))
    return tag


def test_a_roll_back_drops_the_abandoned_queued_fine_tuning_and_keeps_the_lineages_apart(tmp_path, monkeypatch):
    from trainer.finetune.downstream import DownstreamLauncher, EvalConfig

    monkeypatch.setattr("trainer.finetune.downstream.CHAIN_POLL_S", 0.05)
    gate, log = tmp_path / "gate", tmp_path / "children.log"
    child = (f'echo "$*" >> {log}; i=0; while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); '
             'done')
    cfg = EvalConfig(downstream=[{"task": "rte", "data": str(tmp_path / "rte"), "every_steps": 20}],
                     command_prefix=["sh", "-c", child, "child"])
    said = []
    ckpts = tmp_path / "checkpoints"
    first = DownstreamLauncher(cfg, tmp_path, 0, say=said.append)
    first.launch(20, checkpoint(ckpts, 20, OLD))  # runs (the gate holds it)
    first.launch(40, checkpoint(ckpts, 40, OLD))  # queued behind it: max_running 1
    first.suspend()
    old_copy = first.queued[0].copy
    assert OLD in str(old_copy) and old_copy.is_dir()
    # the roll-back to step 30 (trainer.checkpoint.begin_lineage) moves step 40 aside; the new lineage saves its own
    aside = ckpts / f"abandoned-20260101T000000Z-{NEW[:12]}"
    aside.mkdir()
    (ckpts / "global_step40").rename(aside / "global_step40")
    said.clear()
    second = DownstreamLauncher(cfg, tmp_path, 0, say=said.append)
    assert second.queued == [] and not old_copy.exists(), (second.queued, said)
    assert any("dropped 1 queued fine-tuning(s) of an abandoned lineage" in s and "rte at step 40" in s
               for s in said), said
    second.launch(40, checkpoint(ckpts, 40, NEW))
    new_copy = second.queued[0].copy
    assert NEW in str(new_copy) and new_copy.parent != old_copy.parent and new_copy.is_dir()
    second.finish()
    gate.write_text("")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (new_copy.parent / "finetune.exit").exists():
        time.sleep(0.05)
    assert (new_copy.parent / "finetune.exit").read_text().strip() == "0"
    assert str(new_copy) in (tmp_path / "children.log").read_text()
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing failed


def test_records_carry_the_checkpoint_s_run_id(tmp_path):
    from trainer.finetune.downstream_copy import job_folder, run_id_of_copy
    from trainer.finetune.downstream_runner import _record_failure

    copy = job_folder(tmp_path, "global_step40", "STS-B", NEW) / "global_step40"
    assert copy == tmp_path / "downstream" / f"global_step40-{NEW}" / "sts-b" / "global_step40"
    assert run_id_of_copy(copy) == NEW  # the child's score record (after --cleanup removed the copy)
    assert run_id_of_copy(job_folder(tmp_path, "global_step40", "rte", None) / "global_step40") is None
    _record_failure(tmp_path, "rte", 40, "exit 3", run_id=NEW)
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["run_id"] == NEW


def test_the_helper_s_names_are_the_checkpoint_module_s():
    from trainer import checkpoint
    from trainer.finetune import downstream_copy

    assert (downstream_copy.STATE_FILE, downstream_copy.ABANDONED) == (checkpoint.STATE_FILE, checkpoint.ABANDONED)
