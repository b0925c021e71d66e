"""One build_indexed run per output prefix (data_prep/prep_lock.py): a second launch on a live prefix is refused
naming the holder, a dead holder's lock is taken over, and under mpirun a refused launch's other ranks write nothing.
Found by review (two runs on one prefix punched zeros into each other's shards)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_prep import prep_lock
from data_prep import manifest as mf
from test_build_indexed import REPO, build, en_tokenizer, small_text  # noqa: F401 (fixtures)

HOLDER = """
import sys, time
from data_prep.prep_lock import PrefixLock
lock = PrefixLock(sys.argv[1], stale_s=6).acquire()   # heartbeat every second
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def live_holder(tmp_path):
    """A live run holding the lock of tmp_path/out/c (another process of this host, heartbeat moving)."""
    prefix = tmp_path / "out" / "c"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(prefix)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield prefix, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_run_on_a_live_prefix_is_refused_and_a_dead_holders_lock_is_taken_over(
        live_holder, en_tokenizer, tmp_path, capsys):
    """Reviewer fault 1: two runs on one prefix both wrote PREFIX.work/piece_*.bin ("wb"), the second's truncation
    punched zeros into the first's file, whose manifest then verified the holed bytes. Now the second is refused
    before it touches anything, naming the prefix and the holder; once the holder is SIGKILLed, the next run takes
    its lock over (same host, pid gone) and builds."""
    prefix, holder = live_holder
    src = small_text(tmp_path / "a.txt")
    assert build([src], en_tokenizer, prefix) == 2
    err = capsys.readouterr().err
    assert f"--output-prefix {prefix} is being built by another live run" in err, err
    assert f"pid {holder.pid}" in err and "started 20" in err and "host " in err
    assert "wait for that run to end" in err
    assert not Path(f"{prefix}.work").exists() and not mf.manifest_path(prefix).exists()  # nothing written
    holder.kill()
    holder.wait()
    assert build([src], en_tokenizer, prefix) == 0
    out, err = capsys.readouterr()
    assert "taking over the stale lock" in err and f"its process {holder.pid} on this host is gone" in err
    assert "wrote 1 shard(s)" in out
    assert not prep_lock.lock_dir(prefix).exists()  # released and removed at the end
    assert build([src], en_tokenizer, prefix) == 0  # the normal rerun: up to date
    assert "up to date" in capsys.readouterr().out


def test_a_lock_whose_heartbeat_stopped_on_another_host_is_taken_over(en_tokenizer, tmp_path, capsys):
    """A run on another node that died (node lost): its pid cannot be checked from here, so its lock is taken over
    once its heartbeat has not moved for --lock-stale-s of this run's watching."""
    prefix = tmp_path / "out" / "c"
    folder = prep_lock.lock_dir(prefix)
    folder.mkdir(parents=True)
    (folder / "run.lock").write_text(json.dumps({"host": "node-that-died", "pid": 12345, "token": "dead",
                                                 "started": time.time() - 3600, "interval_s": 0.2, "stale_s": 1}))
    (folder / "run.lock.dead.hb").write_text('{"beat": 7}')
    src = small_text(tmp_path / "a.txt")
    assert build([src], en_tokenizer, prefix, "--lock-stale-s", "1") == 0
    err = capsys.readouterr().err
    assert "taking over the stale lock" in err and "host node-that-died" in err, err
    assert "(> --lock-stale-s = 1)" in err and "checkpoint.lock_stale_s" not in err, err  # data prep's own setting
    assert not folder.exists()


@pytest.mark.multiproc
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (apt-get install openmpi-bin)")
def test_mpi_ranks_of_a_refused_launch_write_nothing(live_holder, en_tokenizer, tmp_path):
    """Under mpirun only rank 0 takes the lock; rank 1 waits until the lock names its own launch before it touches the
    work folder, so a refused launch's rank 1 never writes into the live run's files (mpirun stops it when rank 0
    exits with the refusal). tests/test_prep_mpi.py runs the accepted case (rank 1 goes on, same bytes)."""
    prefix, holder = live_holder
    src = small_text(tmp_path / "a.txt", docs=400)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    run = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, "data_prep/build_indexed.py",
                          "--input", str(src), "--tokenizer", en_tokenizer, "--chunk-size-mb", "0.004",
                          "--output-prefix", str(prefix)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0
    assert f"rank 0: --output-prefix {prefix} is being built by another live run" in run.stderr, run.stderr
    assert f"pid {holder.pid}" in run.stderr
    assert not Path(f"{prefix}.work").exists()
    assert holder.poll() is None  # the holder lives on, its lock untouched
    assert json.loads((prep_lock.lock_dir(prefix) / "run.lock").read_text())["pid"] == holder.pid


def test_the_ranks_of_one_mpirun_in_a_slurm_allocation_share_one_launch_id(monkeypatch):
    """mpirun inside an sbatch: the ranks on the batch host run in the batch step, the others in the step of the srun
    that started Open MPI's daemons. Keyed by Slurm's step first, their launch ids differed, so the other ranks never
    saw their rank 0's lock as their own and failed after waiting (found by review; no Slurm+MPI cluster here, so
    the environments are the ones each side gets, written out)."""
    from trainer.data.cache_file import launch_id
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "1234567")
    batch_host = launch_id()
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    remote = launch_id()
    assert batch_host == remote == prep_lock.launch_id()
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "7654321")  # another mpirun: another launch
    assert launch_id() != remote
