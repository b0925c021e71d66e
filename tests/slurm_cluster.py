"""A real two-node Slurm cluster on this machine, for the tests of ``slurm/``.

``munged``, one ``slurmctld`` and one ``slurmd -N NAME`` per simulated node run in the foreground as children of the
test process, with every path (munge key and socket, state, spool, pid and log files) under one temporary folder and
non-default ports picked free at start, so nothing touches the machine's own Slurm or munge. Clients reach the
cluster through ``SLURM_CONF`` in ``SlurmCluster.env``. The shape (proctrack/linuxproc, task/none, cons_tres,
``NodeAddr=127.0.0.1`` with one ``Port=`` per node) is the one PLATFORM.md records as working with Debian's Slurm
22.05.

Why our own harness: no library starts a throw-away Slurm cluster (pyslurm and submitit talk to a running one).

Teardown stops only what this harness started: the daemons by their Popen PIDs, then any job process left behind
(``slurmstepd`` daemonizes, so it is no child of ours) found by the marker variable ``BERTFAMILY_SLURM_CLUSTER=<root>``
that every daemon and every job inherits. Daemons also get ``PR_SET_PDEATHSIG`` so that a test process killed hard
(pytest-timeout, Ctrl-C twice) does not leave a cluster running.

Tests use the ``slurm_cluster`` fixture below (``from slurm_cluster import slurm_cluster``; pytest puts tests/ on
sys.path): one cluster per pytest session (``slurm_cluster_session``, which conftest.py makes visible to every
module), ~2 s to start plus the first jobs' warm-up, shared by the Slurm test modules of that session (under
pytest-xdist, of that worker: each worker that gets a Slurm module runs its own cluster, on its own ports and
folders). At the end of each module its leftover jobs are cancelled and drained nodes resumed, so a module never sees
another's jobs or a drained node. Without the Slurm/munge programs the fixture skips, except under CI (``CI=true``),
where it fails so that CI can never pass by skipping the cluster tests.
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER = "BERTFAMILY_SLURM_CLUSTER"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
# Daemons live in sbin, which a non-root PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def missing_binaries() -> list[str]:
    """The Slurm/munge programs this harness needs that are not installed (empty when all are)."""
    return [b for b in DAEMONS + CLIENTS if shutil.which(b, path=SEARCH_PATH) is None]


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free right now (held open together so they differ; a tiny race with other programs)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """preexec_fn: the daemon gets SIGTERM when the test process dies, whatever killed it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def parse_record(text: str) -> dict[str, str]:
    """``scontrol show ... -o`` output (``Key=Value Key2=Value2``) as a dict; values never contain spaces in the
    fields we read (JobState, ExitCode, NodeAddr, State, Restarts, BatchHost)."""
    out = {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out.setdefault(k, v)
    return out


class SlurmCluster:
    """Start/stop a local Slurm cluster; submit and watch jobs. See the module docstring."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = ("n1", "n2"), cpus_per_node: int = 1,
                 kill_wait: int = 30):
        self.root = Path(root).resolve()
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.kill_wait = kill_wait
        self.conf = self.root / "etc" / "slurm.conf"
        self.log_dir = self.root / "log"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ)
        # The venv's bin first (launched jobs inherit it; DeepSpeed recompiles with another ninja), sbin for daemons.
        self.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), SEARCH_PATH])
        # The jobs activate BERTFAMILY_VENV (slurm/common.sh; default: the checkout's .venv, which `make test` runs
        # and so the default is what the tests see). A suite run from another interpreter (another torch) launches
        # that one instead, not .venv beside it, whose DeepSpeed ops, built into the same TORCH_EXTENSIONS_DIR, would
        # then fail to load in the other.
        if "BERTFAMILY_VENV" not in os.environ and Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
            self.env["BERTFAMILY_VENV"] = sys.prefix if sys.prefix != sys.base_prefix else "none"
        self.env["SLURM_CONF"] = str(self.conf)
        self.env[MARKER] = str(self.root)
        for key in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if key != "SLURM_CONF":  # a test run inside a Slurm job must not leak that job's settings into ours
                del self.env[key]

    # ----------------------------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"Slurm/munge programs not installed: {missing} (apt-get install slurm-wlm munge)")
        for sub in ("etc", "log", "state", "munge") + tuple(f"{d}/{n}" for n in self.nodes for d in ("spool", "tmp")):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._wait_for(lambda: self._client_ok("scontrol", "ping"), timeout, "slurmctld to answer ping")
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
            self._wait_for(self.all_idle, timeout, f"nodes {self.nodes} to become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def cancel_all(self) -> None:
        """Cancel every queued or running job and wait (bounded) until the queue is empty."""
        ids = self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if ids:
            self.client("scancel", *ids, check=False)
            self._wait_for(lambda: not self.client("squeue", "-h", "-o", "%i", check=False).stdout.split(),
                           self.kill_wait + 15, "jobs to end", raise_on_timeout=False)

    def stop(self) -> None:
        """Cancel every job, stop the daemons we started (by PID), then kill job leftovers carrying our marker."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.cancel_all()
        for name in reversed(list(self.procs)):  # slurmd before slurmctld before munged
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()
        self.kill_leftovers()

    def processes(self, match=lambda cmd, env: True) -> list[psutil.Process]:
        """The live processes (other than this one) whose environment carries this cluster's marker and for which
        ``match(command line, environment)`` holds: a job's tasks, found by ``SLURM_NODEID``, ``SLURM_STEP_ID`` ..."""
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.pid == os.getpid():
                continue
            try:
                env = proc.environ()
                if env.get(MARKER) == str(self.root) and match(" ".join(proc.info["cmdline"] or []), env):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return found

    def kill_leftovers(self) -> list[int]:
        """SIGKILL processes (other than this one) whose environment carries this cluster's marker."""
        killed = []
        for proc in self.processes():
            try:
                proc.kill()
                killed.append(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return killed

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------------------------------------- clients
    def client(self, *args: str, check: bool = True, timeout: float = 30.0, cwd: Path | None = None,
               env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; on failure the message includes its stderr."""
        res = subprocess.run(list(args), env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True,
                             timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def sbatch(self, script: Path | str, *flags: str, args: tuple[str, ...] = (), env: dict | None = None,
               cwd: Path | None = None) -> int:
        """``sbatch FLAGS SCRIPT ARGS`` (sbatch reads its flags before the script, the script gets ARGS); the job id."""
        out = self.client("sbatch", "--parsable", *flags, str(script), *args, env=env, cwd=cwd).stdout.strip()
        return int(out.split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        res = self.client("scontrol", "show", "job", "-o", str(job_id), check=False)
        return parse_record(res.stdout) if res.returncode == 0 else {}

    def node(self, name: str) -> dict[str, str]:
        return parse_record(self.client("scontrol", "show", "node", "-o", name).stdout)

    def all_idle(self, strict: bool = False) -> bool:
        """Every node idle and in service (strict: also done cleaning up after a job, no +COMPLETING flag); a
        drained node (IDLE+DRAIN) is not."""
        try:
            states = [self.node(n).get("State", "") for n in self.nodes]
            return all((s == "IDLE") if strict else (s.split("+")[0] == "IDLE" and "DRAIN" not in s)
                       for s in states)
        except RuntimeError:
            return False

    def wait_job(self, job_id: int, timeout: float, states: set[str] = FINISHED) -> dict[str, str]:
        """Poll (every 0.5 s, cheap) until the job is in one of ``states``; raise with its log tail on timeout."""
        info: dict[str, str] = {}

        def reached() -> bool:
            nonlocal info
            info = self.job(job_id)
            return info.get("JobState") in states

        if not self._wait_for(reached, timeout, "", raise_on_timeout=False):
            raise TimeoutError(f"job {job_id} not in {sorted(states)} after {timeout:.0f} s (state "
                               f"{info.get('JobState')}); output:\n{self.job_output(job_id)}")
        return info

    def release_requeued(self, job_id: int, timeout: float = 90.0) -> None:
        """A requeued job waits with Reason=BeginTime for 2 minutes (Slurm's fixed requeue hold); start it now.
        Returns once the job has left that hold (it may already be running or done)."""
        deadline = time.monotonic() + timeout
        idle_since = None
        held = False
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") == "PENDING":
                # Only once the previous run has left the nodes, and 2 s later: slurmd refuses a launch whose
                # credential is not newer than the revocation of the killed run's (1-second resolution: a release in
                # the same second failed the job, "Job credential revoked"), which Slurm's 2-minute hold avoids.
                if info.get("Reason") != "BeginTime":
                    # Out of the hold only if it was seen in it: right after the requeue, under load, a poll can
                    # find the job PENDING before Slurm has set the hold (Reason=None), and returning then left the
                    # job to sit out the whole 2 minutes
                    if held:
                        return
                else:
                    held = True
                    idle = self.all_idle(strict=True)
                    idle_since = (idle_since or time.monotonic()) if idle else None
                    if idle and time.monotonic() - idle_since >= 2.0:
                        self.client("scontrol", "update", f"jobid={job_id}", "StartTime=now", check=False)
            elif info.get("JobState") in {"RUNNING"} | FINISHED and int(info.get("Restarts", "0")) > 0:
                return
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} was not requeued within {timeout:.0f} s: {self.job(job_id)}")

    def job_output(self, job_id: int, tail: int = 60) -> str:
        path = self.job(job_id).get("StdOut")
        if not path or not Path(path).exists():
            return f"(no output file {path!r})"
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-tail:])

    def resume_nodes(self) -> None:
        """Put drained/down nodes back to service (a killed job can drain a node) and wait until idle."""
        if not self.all_idle():
            for n in self.nodes:
                state = self.node(n).get("State", "")
                if any(s in state for s in ("DRAIN", "DOWN", "FAIL")):
                    self.client("scontrol", "update", f"nodename={n}", "state=resume", check=False)
            self._wait_for(self.all_idle, 60, "nodes to be idle again")

    # ----------------------------------------------------------------------------------------------- internals
    def _client_ok(self, *args: str) -> bool:
        try:
            return self.client(*args, check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _wait_for(self, cond, timeout: float, what: str, raise_on_timeout: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_daemons()
            if cond():
                return True
            time.sleep(0.5)
        if raise_on_timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; logs in {self.log_dir}:\n"
                               + self._log_tails())
        return False

    def _check_daemons(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"Slurm daemons exited: {dead}; logs in {self.log_dir}:\n" + self._log_tails())

    def _log_tails(self, lines: int = 15) -> str:
        parts = []
        for f in sorted(self.log_dir.glob("*")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.log_dir / f"{name}.stdout", "wb")
        argv = [shutil.which(argv[0], path=SEARCH_PATH)] + argv[1:]
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, cwd=self.root)
        log.close()

    def _start_munge(self) -> None:
        m = self.root / "munge"
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        m.chmod(0o700)
        self.munge_socket = m / "munge.socket"
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                               f"--pid-file={m / 'munged.pid'}", f"--log-file={self.log_dir / 'munged.log'}",
                               f"--seed-file={m / 'munged.seed'}"])
        self._wait_for(self.munge_socket.exists, 20, "munged's socket")

    def _write_conf(self) -> None:
        r = self.root
        ports = free_ports(1 + len(self.nodes))
        self.ctld_port, self.node_ports = ports[0], dict(zip(self.nodes, ports[1:]))
        host = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=bertfamily-test",
            # Job ids from a random start: the templates derive MASTER_PORT from the job id, so two test clusters on
            # one machine (parallel test runs) numbering jobs from 1 would rendezvous on the same ports
            f"FirstJobId={random.SystemRandom().randrange(1, 4000)}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={ports[1]}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.%n.log'}",
            # Per node: pmix creates its client folder under TmpFS with a name that is the same on both nodes.
            f"TmpFS={r / 'tmp' / '%n'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            # The node's real core count exceeds CPUs=; use the configured value instead of draining the node.
            "SlurmdParameters=config_overrides",
            f"KillWait={self.kill_wait}",
            "MinJobAge=3600",  # finished jobs stay visible to `scontrol show job` (no accounting database here)
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for n in self.nodes:
            lines.append(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} Port={self.node_ports[n]} "
                         f"CPUs={self.cpus_per_node} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def slurm_cluster_session(tmp_path_factory):
    """The session's running two-node cluster (n1, n2), started on first use and stopped at the end of the session."""
    missing = missing_binaries()
    if missing:
        msg = f"Slurm/munge programs missing: {missing} (apt-get install slurm-wlm munge; .ci/run does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " -- CI must run the Slurm tests, not skip them")
        pytest.skip(msg)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def slurm_cluster(slurm_cluster_session):
    """The session's cluster for one module; jobs it leaves are cancelled and its drained nodes resumed at the end."""
    cluster = slurm_cluster_session
    cluster.resume_nodes()
    yield cluster
    if cluster.procs.get("slurmctld") is not None and cluster.procs["slurmctld"].poll() is None:
        cluster.cancel_all()
        cluster.resume_nodes()
