"""Pruning that cannot delete an old checkpoint (a colleague's files in a shared project folder without group
write) says so, once per save, naming the folder and the error: it used ``rmtree(ignore_errors=True)``, so
``checkpoint.keep_last`` was exceeded without a word and the disk filled (found by review). The save itself stands.
(The tests run as root, where permissions refuse nothing, so the refused unlink is mocked.)"""
from __future__ import annotations

import errno
import os

from test_checkpoint import _save


def _refuse_unlinks_in(monkeypatch, name: str) -> None:
    real_unlink = os.unlink

    def unlink(path, *, dir_fd=None):
        where = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.path.abspath(path)
        if name in where.split(os.sep):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)


def test_a_checkpoint_that_cannot_be_pruned_is_reported_once_per_save(tmp_path, monkeypatch, capsys):
    root = tmp_path / "checkpoints"
    _save(root, 1, keep_last=1)
    _refuse_unlinks_in(monkeypatch, "global_step1")
    _save(root, 2, keep_last=1)
    err = capsys.readouterr().err
    assert err.count("warning: checkpoints: could not delete") == 1, err
    assert (f"could not delete 1 old checkpoint folder(s) in {root} (global_step1; global_step1: "
            "PermissionError: [Errno 13] Permission denied") in err
    assert "checkpoint.keep_last = 1 is exceeded" in err
    assert (root / "global_step2" / "bertfamily.json").exists() and (root / "latest").read_text() == "global_step2"
    _save(root, 3, keep_last=1)  # step 2 goes; step 1 still cannot: said again, once
    err = capsys.readouterr().err
    assert err.count("warning: checkpoints: could not delete") == 1 and "(global_step1; " in err, err
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["global_step1", "global_step3"]
    monkeypatch.undo()
    _save(root, 4, keep_last=1)  # deletable again: pruned, and nothing said
    assert "could not delete" not in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["global_step4"]


def test_off_schedule_checkpoints_do_not_push_the_periodic_ones_out(tmp_path):
    """every_steps 10, keep_last 3: periodic 10, 20, 30, then three launches preempted a step or two later (32, 34,
    36). Before, keep_last counted them and only 32/34/36 were left (found by review); now 10, 20, 30 and the newest
    (36) stay, and a later periodic save (40) lets 36 go."""
    import json

    from trainer import checkpoint

    root = tmp_path / "checkpoints"

    def save(step: int) -> None:
        (root / f"global_step{step}").mkdir(parents=True)
        (root / f"global_step{step}" / checkpoint.STATE_FILE).write_text(json.dumps({"step": step}))
        checkpoint.prune(root, 3, 10)

    for step in (10, 20, 30, 32, 34, 36):
        save(step)
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == \
        ["global_step10", "global_step20", "global_step30", "global_step36"]
    save(40)
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == \
        ["global_step20", "global_step30", "global_step40"]
    checkpoint.prune(root, 2)  # no periodic saves (every_steps 0): the newest keep_last, as before
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["global_step30", "global_step40"]
