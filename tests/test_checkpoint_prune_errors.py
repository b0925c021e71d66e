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
