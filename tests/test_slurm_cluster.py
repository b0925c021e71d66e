"""The local two-node Slurm cluster of tests/slurm_cluster.py: what the slurm/ templates rely on from it.

A 2-node job runs one task per node and sees each node's NodeAddr; mpi4py ranks under ``srun --mpi=pmix`` span both
nodes (slurm/build_indexed.sh); ``scontrol requeue`` restarts a batch job with SLURM_RESTART_COUNT=1; and stopping
the cluster leaves no process of it behind.
"""
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from slurm_cluster import MARKER, SlurmCluster, missing_binaries, slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm]
VENV_ACTIVATE = Path(sys.executable).parent / "activate"


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    return path


def test_two_node_job_runs_one_task_per_node(slurm_cluster, tmp_path):
    script = _script(tmp_path / "where.sh", """
srun --label bash -c 'echo "node=$SLURMD_NODENAME id=$SLURM_NODEID"'
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    scontrol show node -o "$n" | tr ' ' '\\n' | grep '^NodeAddr='
done
""")
    job = slurm_cluster.sbatch(script, "--nodes=2", f"--output={tmp_path}/%j.out", cwd=tmp_path)
    info = slurm_cluster.wait_job(job, 60)
    out = (tmp_path / f"{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert "node=n1 id=0" in out and "node=n2 id=1" in out, out
    assert out.count("NodeAddr=127.0.0.1") == 2, out


def test_mpi4py_ranks_span_both_nodes_under_srun_pmix(slurm_cluster, tmp_path):
    script = _script(tmp_path / "mpi.sh", f"""
. {VENV_ACTIVATE}
srun --mpi=pmix python -c '
from mpi4py import MPI
import os
c = MPI.COMM_WORLD
print("rank", c.Get_rank(), "of", c.Get_size(), "on", os.environ["SLURMD_NODENAME"], "sum", c.allreduce(c.Get_rank() + 1))'
""")
    job = slurm_cluster.sbatch(script, "--nodes=2", f"--output={tmp_path}/%j.out", cwd=tmp_path)
    info = slurm_cluster.wait_job(job, 90)
    out = (tmp_path / f"{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert "rank 0 of 2 on n1 sum 3" in out and "rank 1 of 2 on n2 sum 3" in out, out


def test_scontrol_requeue_restarts_the_batch_script(slurm_cluster, tmp_path):
    """The preemption path the templates use: SIGTERM reaches the batch shell and its steps, then the job runs again
    from the top with SLURM_RESTART_COUNT=1 (the harness skips Slurm's 2-minute requeue hold with StartTime=now)."""
    script = _script(tmp_path / "requeue.sh", """#SBATCH --requeue
#SBATCH --open-mode=append
echo "start restart=${SLURM_RESTART_COUNT:-0}"
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then exit 0; fi
got=0
trap 'echo "batch got TERM"; got=1' TERM
srun bash -c 'trap "echo task $SLURM_NODEID got TERM; exit 0" TERM; touch running; while :; do sleep 0.2; done' &
wait
# the step can end (its tasks got their TERM) before the batch shell's own TERM is delivered: under load the script
# then ended first and never printed its line. Wait for it (at most 20 s, inside KillWait's 30)
for _ in $(seq 100); do [ "$got" = 1 ] && break; sleep 0.2; done
""")
    job = slurm_cluster.sbatch(script, "--nodes=2", f"--output={tmp_path}/%j.out", cwd=tmp_path)
    slurm_cluster.wait_job(job, 60, {"RUNNING"})
    deadline = time.monotonic() + 60
    while not (tmp_path / "running").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    slurm_cluster.client("scontrol", "requeue", str(job))
    slurm_cluster.release_requeued(job, timeout=90)
    info = slurm_cluster.wait_job(job, 90)
    out = (tmp_path / f"{job}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", out
    assert "start restart=0" in out and "start restart=1" in out, out
    assert "task 0 got TERM" in out and "task 1 got TERM" in out and "batch got TERM" in out, out


@pytest.mark.skipif(bool(missing_binaries()), reason="Slurm/munge not installed (the fixture tests cover CI)")
def test_stop_leaves_no_process_behind(tmp_path):
    """A cluster stopped with a job still running: daemons, slurmstepd and the job's processes are all gone."""
    with SlurmCluster(tmp_path / "c") as cluster:
        script = _script(tmp_path / "sleep.sh", "srun sleep 300\n")
        job = cluster.sbatch(script, "--nodes=2", f"--output={tmp_path}/%j.out", cwd=tmp_path)
        cluster.wait_job(job, 60, {"RUNNING"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(_name(p) == "sleep" for p in _marked(cluster.root)) < 2:
            time.sleep(0.3)
        daemons = [p.pid for p in cluster.procs.values()]
        before = _marked(cluster.root)
        names = {pid: _name(pid) for pid in before}
        # what the stop has to end really ran: the daemons and the job's sleep on each of 2 nodes (slurmstepd does
        # not carry the marker: slurmd starts it with an environment of its own)
        assert set(daemons) <= set(before), (daemons, names)
        assert sum(n == "sleep" for n in names.values()) >= 2, names
    assert _marked(cluster.root) == [], "processes of the stopped cluster still running"
    alive = [pid for pid in before + daemons
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, {pid: _name(pid) for pid in alive}


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _marked(root: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == str(root):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found
