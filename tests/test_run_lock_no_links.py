"""The run lock (and data prep's, a ``RunLock``) on filesystems it finds hostile (found by review):

- no hard links (gcsfuse, blobfuse2, many SMB mounts: ``link`` raises EOPNOTSUPP/EPERM/ENOSYS): both locks stopped
  with a raw traceback at start. They now create their files with O_CREAT|O_EXCL, say so once, and keep the lock's
  semantics: a live holder is refused, a stale lock is taken over, of eight contenders exactly one wins.
- a sticky (``+t``) shared folder, where only the owner of a colleague's stale ``run.lock`` may replace it: the
  takeover stopped with a bare PermissionError and left ``run.lock.<token>.new`` behind. Now nothing is left, and
  the error says whose file blocks the folder and what to do. (The tests run as root, where the sticky bit
  restricts nothing, so the refused rename is mocked.)
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from test_run_lock import _foreign_lock, eight_contenders

import trainer.run_lock as run_lock
from data_prep import prep_lock
from trainer.run_lock import LOCK_NAME, RunLock, RunLockedError



def _no_links(monkeypatch, code: int = errno.EOPNOTSUPP) -> None:
    def link(src, dst):
        raise OSError(code, os.strerror(code), str(src), None, str(dst))

    monkeypatch.setattr(run_lock.os, "link", link)
    monkeypatch.setattr(run_lock, "_said_no_hard_links", False, raising=False)


@pytest.mark.parametrize("no_links", [errno.EOPNOTSUPP, errno.EPERM, errno.ENOSYS])
def test_without_hard_links_a_live_lock_refuses_and_a_stale_one_is_taken_over(tmp_path, monkeypatch, no_links,
                                                                               capsys):
    _no_links(monkeypatch, no_links)
    first = RunLock(tmp_path / "a", stale_s=30, interval_s=0.1).acquire()
    assert json.loads((tmp_path / "a" / LOCK_NAME).read_text())["token"] == first.token
    with pytest.raises(RunLockedError, match="in use by a live launch"):
        RunLock(tmp_path / "a", stale_s=30, interval_s=0.1).acquire()
    first.release()
    assert not list((tmp_path / "a").iterdir())  # no lock, heartbeat, .tmp or claim file left
    # another host's lock whose heartbeat does not move: taken over (the claim file is made by O_EXCL too)
    _foreign_lock(tmp_path / "b", heartbeat_age=0)
    lock = RunLock(tmp_path / "b", stale_s=1, interval_s=0.1).acquire()
    assert json.loads((tmp_path / "b" / LOCK_NAME).read_text())["token"] == lock.token
    assert not list((tmp_path / "b").glob("*.takeover")) and not list((tmp_path / "b").glob("*.tmp"))
    lock.release()
    err = capsys.readouterr().err
    assert "taking over the stale lock" in err
    assert err.count("has no hard links") == 1, err  # said once per process
    assert f"(link: {os.strerror(no_links)})" in err and "O_CREAT|O_EXCL" in err


def test_without_hard_links_the_prep_lock_refuses_a_second_run(tmp_path, monkeypatch):
    _no_links(monkeypatch)
    prefix = tmp_path / "out" / "corpus"
    prefix.parent.mkdir()
    with prep_lock.holding(prefix, stale_s=6, rank=0) as lock:
        assert lock.owns()
        with pytest.raises(prep_lock.PrefixLockedError, match="is being built by another live run"):
            prep_lock.take(prefix, stale_s=6, rank=0)
    assert not prep_lock.lock_dir(prefix).exists()


def test_an_error_other_than_no_hard_links_is_not_hidden(tmp_path, monkeypatch):
    def link(src, dst):
        raise OSError(errno.EIO, "Input/output error", str(src))

    monkeypatch.setattr(run_lock.os, "link", link)
    with pytest.raises(OSError, match="Input/output error"):
        RunLock(tmp_path, stale_s=30).acquire()


NO_LINKS = "import errno, os\ndef _link(src, dst):\n    raise OSError(errno.EOPNOTSUPP, 'Operation not supported')\n" \
           "os.link = _link\n"


def test_without_hard_links_eight_contenders_on_one_stale_lock_exactly_one_wins(tmp_path):
    eight_contenders(tmp_path, NO_LINKS)


def test_a_stale_lock_that_cannot_be_replaced_in_a_sticky_folder_leaves_nothing_and_says_what_to_do(
        tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    _foreign_lock(folder, heartbeat_age=0)
    folder.chmod(folder.stat().st_mode | stat.S_ISVTX)
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == LOCK_NAME:  # what the kernel answers a non-owner in a sticky folder
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(run_lock.os, "replace", replace)
    with pytest.raises(RunLockedError) as err:
        RunLock(folder, stale_s=1, interval_s=0.1).acquire()
    message = str(err.value)
    assert f"cannot take over the stale lock of {folder}" in message
    assert "sticky bit (+t)" in message and f"remove {folder / LOCK_NAME}" in message
    assert "Several users, one project folder" in message
    # only the colleague's stale lock and heartbeat-less state remain: no .new, .claim or .takeover of ours
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]
