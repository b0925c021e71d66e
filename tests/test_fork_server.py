"""tests/fork_server.py, the suite's launcher for single-process runs and groups of ranks: a fork of a process that has
imported torch, DeepSpeed and the trainer must give what ``subprocess.run`` gives for the same command (exit status,
output, the environment, cwd and argv it sees), and refuse what it cannot give; forked ranks must see what torchrun's
ranks see (variables, session, threads, a working gloo group) and be stopped as torchrun stops them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fork_server

REPO = Path(__file__).resolve().parents[1]

COMMANDS = {
    "exit 0 with output on both streams": "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr)",
    "sys.exit(3)": "import sys; print('before'); sys.exit(3)",
    "sys.exit(message)": "import sys; sys.exit('stopped: a message')",
    "uncaught exception": "def f():\n    raise ValueError('boom')\nf()",
    "atexit and a non-daemon thread": (
        "import atexit, threading, time\natexit.register(print, 'atexit ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread finished'))).start()"),
    "os._exit skips atexit": "import atexit, os, sys\natexit.register(print, 'never')\nprint('x', flush=True)\nos._exit(4)",
    "environment, cwd and __name__": (
        "import os, sys; print(os.environ['FORK_SERVER_PROBE'], os.getcwd(), __name__, sys.argv[0])"),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_fork_gives_what_a_new_interpreter_gives(name, tmp_path):
    cmd = [sys.executable, "-c", COMMANDS[name], "a1", "--b"]
    env = dict(os.environ, FORK_SERVER_PROBE="probe-value")
    fresh = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    forked = fork_server.run(cmd, cwd=tmp_path, env=env, timeout=60)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    # a traceback names the same frames and error; nothing else may differ
    assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], (forked.stderr, fresh.stderr)
    assert len(forked.stderr.splitlines()) == len(fresh.stderr.splitlines()), (forked.stderr, fresh.stderr)


def test_modules_and_scripts_run_as_main_with_their_arguments(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n")
    for cmd in ([sys.executable, str(script), "x", "y"], [sys.executable, "-m", "json.tool", "--sort-keys"]):
        fresh = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, input="")
        forked = fork_server.run(cmd, cwd=tmp_path, timeout=60)
        assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout), (forked, fresh)
    # the trainer's CLI as __main__: its own argument errors, exit status 2 as argparse gives it
    forked = fork_server.run([sys.executable, "-m", "trainer.pretrain", "--config", "tiny_bert", "--no-such-flag"], cwd=REPO, timeout=60)
    assert forked.returncode == 2 and "unrecognized arguments: --no-such-flag" in forked.stderr, forked
    assert "RuntimeWarning" not in forked.stderr  # runpy's warning about a module already imported


def test_each_child_is_its_own_process_with_fresh_random_state(tmp_path):
    code = "import os, random, numpy; print(os.getpid(), random.random(), numpy.random.random())"
    a, b = (fork_server.run([sys.executable, "-c", code], timeout=60).stdout.split() for _ in range(2))
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2], (a, b)
    assert int(a[0]) != os.getpid()


def test_omp_num_threads_in_the_request_sets_torchs_threads():
    code = "import torch; print(torch.get_num_threads())"
    one = fork_server.run([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=60)
    fresh = subprocess.run([sys.executable, "-c", code], env={k: v for k, v in os.environ.items()
                                                             if k != "OMP_NUM_THREADS"}, capture_output=True, text=True)
    default = fork_server.run([sys.executable, "-c", code], env={k: v for k, v in os.environ.items()
                                                                if k != "OMP_NUM_THREADS"}, timeout=60)
    assert one.stdout.strip() == "1"
    assert default.stdout == fresh.stdout


def test_a_child_past_its_timeout_is_killed_and_the_server_goes_on():
    """The kill keeps what the child printed before it. A child starved of CPU may not have printed within a short
    timeout, so the timeout grows (2, 8, 32 s) until it has: idle, one 2 s try; under load, still a pass."""
    for timeout in (2, 8, 32):
        with pytest.raises(subprocess.TimeoutExpired) as err:
            fork_server.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"],
                            timeout=timeout)
        if "started" in err.value.stdout:
            break
    assert "started" in err.value.stdout, err.value
    assert fork_server.run([sys.executable, "-c", "print('next')"], timeout=60).stdout == "next\n"


def test_what_only_a_new_interpreter_gives_is_refused():
    with pytest.raises(ValueError, match="PYTHONPATH"):
        fork_server.run([sys.executable, "-c", "pass"], env=dict(os.environ, PYTHONPATH="/elsewhere"))
    with pytest.raises(ValueError, match="not a"):
        fork_server.run(["torchrun", "x.py"])
    with pytest.raises(ValueError, match="not a"):
        fork_server.run([sys.executable, "-X", "importtime", "-c", "pass"])


def test_the_accelerator_choice_of_the_imports_is_accepted_set_or_unset():
    """DS_ACCELERATOR: the product's import sets it (cpu here) where it is unset, so a request with it unset or set to
    that value imports as the server did, whatever the test process's own environment holds when the server starts;
    another value is refused."""
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("with a GPU build of torch the product's import leaves DS_ACCELERATOR unset (known_noise)")
    code = "import os; print(os.environ.get('DS_ACCELERATOR'))"
    bare = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    assert fork_server.run([sys.executable, "-c", code], env=bare, timeout=60).stdout == "None\n"
    assert fork_server.run([sys.executable, "-c", code], env=dict(bare, DS_ACCELERATOR="cpu"),
                           timeout=60).stdout == "cpu\n"
    with pytest.raises(ValueError, match="DS_ACCELERATOR"):
        fork_server.run([sys.executable, "-c", code], env=dict(bare, DS_ACCELERATOR="cuda"))


# ------------------------------------------------------------------------------------------- groups of ranks
# What a rank sees: the variables torchrun set (new or changed from the launching environment), its session, its
# threads, and a real all-reduce over the group's rendezvous; written to OUT/rank<r>.json (torchrun interleaves the
# ranks' consoles).
RANK_PROBE = """
import json, os, sys
import torch, torch.distributed as dist
base = json.load(open(sys.argv[1]))
new = {k: v for k, v in os.environ.items() if base.get(k) != v}
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
json.dump({"env": new, "sum": t.item(), "session_leader": os.getsid(0) == os.getpid(),
           "threads": torch.get_num_threads(), "world": dist.get_world_size()},
          open(os.path.join(sys.argv[2], "rank%d.json" % dist.get_rank()), "w"))
dist.destroy_process_group()
"""
# differ by construction between two launches (or name a launch's own temporary folder)
PER_LAUNCH = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}


def test_forked_ranks_see_what_torchrun_gives_its_ranks(tmp_path):
    nproc = 3  # the first, a middle and the last rank
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    (tmp_path / "base.json").write_text(json.dumps(env))
    seen = {}
    for how in ("torchrun", "fork"):
        out = tmp_path / how
        out.mkdir()
        cmd = [sys.executable, "-c", RANK_PROBE, str(tmp_path / "base.json"), str(out)]
        if how == "torchrun":
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                   str(nproc), "--no-python", *cmd], env=env, capture_output=True, text=True,
                                  timeout=120)
        else:
            proc = fork_server.run_ranks(cmd, nproc, env=env, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen[how] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    for rank, (real, forked) in enumerate(zip(seen["torchrun"], seen["fork"])):
        assert sorted(forked["env"]) == sorted(real["env"]), rank
        assert {k: v for k, v in forked["env"].items() if k not in PER_LAUNCH} == \
            {k: v for k, v in real["env"].items() if k not in PER_LAUNCH}, rank
        assert forked["env"]["MASTER_PORT"] != "0"
        for key in ("sum", "session_leader", "threads", "world"):
            assert forked[key] == real[key], (rank, key, forked[key], real[key])
    assert seen["fork"][0]["sum"] == nproc * (nproc + 1) / 2


def test_a_failed_rank_stops_the_others_and_its_status_is_returned(tmp_path):
    """Rank 1 exits 3; rank 0, blocked in a barrier that rank 1 never joins, is stopped (SIGTERM, as torchrun's agent
    sends it) instead of waiting out gloo's timeout."""
    code = ("import sys, torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "if dist.get_rank() == 1:\n    print('rank 1 fails', flush=True)\n    sys.exit(3)\n"
            "dist.barrier()\nprint('never')\n")
    proc = fork_server.run_ranks([sys.executable, "-c", code], 2, timeout=120)
    # rank 0 ended by SIGTERM (-15): stopped, not failed by gloo's timeout nor SIGKILLed after GROUP_GRACE_S
    assert proc.returncodes == [-15, 3] and proc.returncode == 3, (proc.returncodes, proc.stderr)
    assert "rank 1 fails" in proc.stdout and "never" not in proc.stdout


def test_a_group_past_its_timeout_is_killed_with_its_children(tmp_path):
    """Every rank's session is killed: the rank and what it started (a data-loader worker stands in as a child)."""
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(f'{os.getpid()} {child.pid}')\n"
            "time.sleep(600)\n")
    import psutil

    def written() -> list[str]:
        return [w for r in (0, 1) if (tmp_path / str(r)).exists() for w in (tmp_path / str(r)).read_text().split()]

    for timeout in (5, 20, 60):  # both ranks must have started their child before the kill: longer when starved
        with pytest.raises(subprocess.TimeoutExpired):
            fork_server.run_ranks([sys.executable, "-c", code, str(tmp_path)], 2, timeout=timeout)
        if len(written()) == 4:
            break
    pids = [int(p) for p in written()]
    assert len(pids) == 4, pids

    def running(pid: int) -> bool:  # a zombie has ended (nobody may reap an orphan in a container)
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30  # the kill is sent; the kernel ends the processes when they are scheduled
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, alive
    assert fork_server.run([sys.executable, "-c", "print('next')"], timeout=60).stdout == "next\n"
