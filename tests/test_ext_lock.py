"""A torch-extension build lock left behind by a killed build or load (trainer/ext_lock.py): every later start used
to wait on it forever, silently, deaf to SIGTERM. The decisions are tested on lock files in a temporary folder (no
build: an empty ``.so`` file stands for a built op, which is all the decision looks at), then one real 1-rank start
with a stale lock beside a copy of the built ``deepspeed_shm_comm`` op."""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from trainer import ext_lock
from trainer.ext_lock import ExtensionLockError, ExtensionLockWaitStopped, clear_stale_locks, judge

OP = "deepspeed_shm_comm"
REPO = Path(__file__).resolve().parents[1]


def op_folder(root: Path, built: bool, lock_age: float | None) -> Path:
    folder = root / OP
    folder.mkdir(parents=True)
    if built:
        (folder / f"{OP}.so").write_bytes(b"")
    if lock_age is not None:
        (folder / "lock").touch()
        old = time.time() - lock_age
        os.utime(folder / "lock", (old, old))
    return folder


def test_the_decision_for_each_kind_of_lock(tmp_path):
    now = time.time()
    a = op_folder(tmp_path / "a", built=True, lock_age=None)
    assert judge(a / "lock", OP, now, 300, False).action == "none"
    b = op_folder(tmp_path / "b", built=True, lock_age=2)  # another rank's load, right now
    assert judge(b / "lock", OP, now, 300, False).action == "wait"
    c = op_folder(tmp_path / "c", built=True, lock_age=900)  # a killed load
    assert judge(c / "lock", OP, now, 300, False).action == "remove"
    assert judge(c / "lock", OP, now, 300, True).action == "wait"  # ... unless a build runs in that folder here
    d = op_folder(tmp_path / "d", built=False, lock_age=900)  # a killed build
    verdict = judge(d / "lock", OP, now, 300, False)
    assert verdict.action == "stop"
    assert str(d / "lock") in verdict.message and "python -m trainer.build_ops" in verdict.message
    assert judge(d / "lock", OP, now, 300, False, allow_unbuilt=True).action == "remove"  # build_ops builds next


def test_a_stale_lock_beside_the_built_op_is_removed_and_said(tmp_path):
    folder = op_folder(tmp_path, built=True, lock_age=900)
    said = []
    clear_stale_locks([OP], say=said.append, stale_s=300, folder_of=lambda op: tmp_path / op)
    assert not (folder / "lock").exists()
    assert len(said) == 1 and str(folder / "lock") in said[0] and "removed the lock" in said[0]


def test_a_stale_lock_without_the_built_op_stops_naming_it(tmp_path):
    folder = op_folder(tmp_path, built=False, lock_age=900)
    with pytest.raises(ExtensionLockError, match="trainer.build_ops") as err:
        clear_stale_locks([OP], say=lambda _: None, stale_s=300, folder_of=lambda op: tmp_path / op)
    assert str(folder / "lock") in str(err.value) and (folder / "lock").exists()
    assert err.value.one_line == str(err.value)  # trainer.pretrain.main says it in one line


def test_a_fresh_lock_is_waited_for_and_never_removed(tmp_path):
    """Another rank's load holds the lock: waited for (said once) until that rank removes it."""
    folder = op_folder(tmp_path, built=True, lock_age=0)
    said, checks = [], []

    def other_rank_done():  # called once per wait round: the holder finishes on the second
        checks.append(1)
        assert (folder / "lock").exists()  # not removed by the waiter
        if len(checks) == 2:
            (folder / "lock").unlink()
        return False

    clear_stale_locks([OP], should_stop=other_rank_done, say=said.append, stale_s=300, poll_s=0.01,
                      folder_of=lambda op: tmp_path / op)
    assert len(checks) == 2 and len(said) == 1 and str(folder / "lock") in said[0] and "waiting" in said[0]


def test_sigterm_ends_the_wait(tmp_path):
    op_folder(tmp_path, built=True, lock_age=0)
    with pytest.raises(ExtensionLockWaitStopped, match="stopped by a signal"):
        clear_stale_locks([OP], should_stop=lambda: True, say=lambda _: None, stale_s=300, poll_s=0.01,
                          folder_of=lambda op: tmp_path / op)
    assert (tmp_path / OP / "lock").exists()


def test_the_second_rank_leaves_the_fresh_lock_the_first_ranks_load_took(tmp_path):
    """Two ranks found the same stale lock; the first removed it and its load took a fresh one. The second rank's
    removal is decided again under the folder's flock, on that fresh lock: left alone. And while one rank holds the
    flock, the other's removal waits for it."""
    import fcntl

    folder = op_folder(tmp_path, built=True, lock_age=0)  # the first rank's load, now
    verdict = ext_lock._remove_if_still_stale(folder / "lock", OP, 300, False, time.time)
    assert verdict.action == "wait" and (folder / "lock").exists()

    old = time.time() - 900
    os.utime(folder / "lock", (old, old))  # stale now; another rank holds the flock while deciding
    guard = os.open(folder / ext_lock._GUARD, os.O_CREAT | os.O_RDWR)
    fcntl.flock(guard, fcntl.LOCK_EX)
    result = []
    t = threading.Thread(target=lambda: result.append(
        ext_lock._remove_if_still_stale(folder / "lock", OP, 300, False, time.time)))
    t.start()
    t.join(0.5)
    assert (folder / "lock").exists() and not result  # waiting for the flock (a slow machine only waits longer)
    os.close(guard)
    t.join(60)
    assert result[0].action == "remove" and not (folder / "lock").exists()


def test_the_build_folder_follows_torch_extensions_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert ext_lock.build_dir(OP) == tmp_path / OP


def test_a_real_start_with_a_stale_lock_on_the_built_shm_op_trains(tmp_path):
    """A 1-rank run of the stand-in trainer on the CPU accelerator, whose TORCH_EXTENSIONS_DIR holds a copy of the
    built deepspeed_shm_comm op and a lock left 15 minutes ago: it starts, says it removed the lock, and trains
    (before: it waited on the lock forever, here until the test's timeout)."""
    import subprocess

    import fork_server
    from test_trainer_multiproc import command, make_config

    built = ext_lock.build_dir(OP)  # where this machine's runs load it from
    env = dict(os.environ)
    if not (built / f"{OP}.so").is_file():
        pytest.skip(f"{OP} is not built in {built} (python -m trainer.build_ops builds it)")
    ext = tmp_path / "ext"
    shutil.copytree(built, ext / OP, ignore=shutil.ignore_patterns("lock", ext_lock._GUARD))  # mtimes kept
    (ext / OP / "lock").touch()
    old = time.time() - 900
    os.utime(ext / OP / "lock", (old, old))
    cfg = make_config(tmp_path, "run", train={"steps": 2, "eval_every": 0},
                      checkpoint={"every_steps": 0, "save_at_end": False},
                      objective={"name": "standin", "options": {"record_samples": False}})
    env.update(TORCH_EXTENSIONS_DIR=str(ext), OMP_NUM_THREADS="1")
    try:
        proc = fork_server.run(command(cfg, 1), cwd=REPO, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the start waited on {ext / OP / 'lock'} for 120 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{ext / OP / 'lock'}: a stale build lock" in proc.stderr and "removed the lock" in proc.stderr
    assert not (ext / OP / "lock").exists()
    assert "train step 2" in proc.stdout


def _can_mount_read_only(tmp_path) -> bool:
    import subprocess
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        proc = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{probe}" "{probe}" && '
                               f'! touch "{probe}/x" 2>/dev/null'], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def test_a_built_op_in_a_read_only_extensions_folder_is_loaded_and_trains(tmp_path):
    """TORCH_EXTENSIONS_DIR holding the built deepspeed_shm_comm op, bind-mounted read-only (an Apptainer/SquashFS
    image, a read-only software stack; a folder another user built with umask 022 is the same to os.access): a 1-rank
    start loads the op from its library and trains (before: torch's lock, `OSError: [Errno 30] Read-only file
    system: '.../deepspeed_shm_comm/lock'`, at every start; review F4). Needs root's `unshare -m` to mount: skipped
    elsewhere. The other-user case is not run (tests run as root, whom permissions do not stop)."""
    import subprocess

    from test_trainer_multiproc import command, make_config

    built = ext_lock.build_dir(OP)
    if not (built / f"{OP}.so").is_file():
        pytest.skip(f"{OP} is not built in {built} (python -m trainer.build_ops builds it)")
    if not _can_mount_read_only(tmp_path):
        pytest.skip("cannot bind-mount read-only here (needs root and unshare -m)")
    ext = tmp_path / "ext"
    shutil.copytree(built, ext / OP, ignore=shutil.ignore_patterns("lock", ext_lock._GUARD))  # mtimes kept
    cfg = make_config(tmp_path, "run", train={"steps": 2, "eval_every": 0},
                      checkpoint={"every_steps": 0, "save_at_end": False},
                      objective={"name": "standin", "options": {"record_samples": False}})
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext), OMP_NUM_THREADS="1")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(ext),
                           *command(cfg, 1)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"note: {ext / OP} is not writable by this user: loaded the built {OP} op" in proc.stderr
    assert "train step 2" in proc.stdout
    assert not (ext / OP / "lock").exists()


def test_an_unwritable_folder_whose_op_is_unbuilt_or_out_of_date_stops_with_one_line(tmp_path):
    src = tmp_path / "src.cpp"
    src.write_text("")
    folder = tmp_path / "ext" / OP
    folder.mkdir(parents=True)
    with pytest.raises(ext_lock.ExtensionFolderError, match="is not built there"):
        ext_lock.readonly_build(folder, OP, [str(src)], ["-O2"])
    (folder / "build.ninja").write_text(f"cflags = -DX -O2 -fopenmp\nbuild a.o: compile {src}\n")
    (folder / f"{OP}.so").write_bytes(b"")
    assert ext_lock.readonly_build(folder, OP, [str(src)], ["-O2", "-fopenmp"]) == folder / f"{OP}.so"
    with pytest.raises(ext_lock.ExtensionFolderError, match="other sources"):
        ext_lock.readonly_build(folder, OP, [str(tmp_path / "elsewhere.cpp")], ["-O2"])
    with pytest.raises(ext_lock.ExtensionFolderError, match="other flags .*-D__AVX512__"):
        ext_lock.readonly_build(folder, OP, [str(src)], ["-O2", "-D__AVX512__"])
    later = time.time() + 60
    os.utime(src, (later, later))
    with pytest.raises(ext_lock.ExtensionFolderError, match="a source is newer") as err:
        ext_lock.readonly_build(folder, OP, [str(src)], ["-O2"])
    assert "TORCH_EXTENSIONS_DIR" in err.value.one_line and "trainer.build_ops" in err.value.one_line


def test_no_home_or_an_unwritable_one_stops_with_one_line_naming_torch_extensions_dir(tmp_path, monkeypatch):
    """No HOME and no passwd entry: torch would create a literal './~/.cache' in the working folder; a HOME where
    .cache cannot be created (a file here, as root writes a read-only one): a raw makedirs traceback (review F4)."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home-is-a-file"))
    (tmp_path / "home-is-a-file").write_text("")
    with pytest.raises(ext_lock.ExtensionFolderError, match="cannot create torch's extensions folder.*"
                                                             "set TORCH_EXTENSIONS_DIR"):
        ext_lock.build_dir(OP)
    monkeypatch.delenv("HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # what it returns without HOME and a passwd entry
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ext_lock.ExtensionFolderError, match="no home directory.*set TORCH_EXTENSIONS_DIR"):
        ext_lock.build_dir(OP)
    assert not (tmp_path / "~").exists()
