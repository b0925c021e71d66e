"""The run lock's "dead at once" rule needs the holder to have run on this machine, in this pid namespace: a host
name is shared by containers started with one fixed ``--hostname`` and by two clusters that mount one filesystem and
each have a node ``gpu001``. There a live holder whose pid did not exist here was taken over at once, and stopped."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer.run_lock import LOCK_NAME, RunLock, RunLockedError


@pytest.mark.parametrize("other", ["boot_id", "pid_ns"])
def test_a_live_holder_on_another_machine_with_this_host_name_is_not_taken_over(tmp_path, other):
    holder = RunLock(tmp_path, stale_s=30, interval_s=0.1)
    holder.info["pid"] = 4_000_000  # no such process here
    holder.info[other] = "another machine" if other == "boot_id" else 1
    holder.acquire()  # beats in its thread: alive
    try:
        with pytest.raises(RunLockedError, match="its heartbeat is moving"):
            RunLock(tmp_path, stale_s=30, interval_s=0.1).acquire()
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == holder.token
        assert not holder.lost
    finally:
        holder.release()


def test_a_dead_holder_on_this_machine_is_still_taken_over_at_once(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = RunLock(tmp_path, stale_s=3600)
    holder.info["pid"] = dead.pid
    holder.acquire()
    holder._stop.set()  # its heartbeat stops, as a killed launch's does
    holder._thread.join()
    lock = RunLock(tmp_path, stale_s=3600).acquire()  # stale_s of an hour: only "dead at once" can take it
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == lock.token
    lock.release()
    assert f"its process {dead.pid} on this host is gone" in capsys.readouterr().err
