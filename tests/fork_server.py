"""Launch ``python -m MODULE ARGS`` / ``python SCRIPT ARGS`` / ``python -c CODE ARGS`` as a fork of a process that has
already imported torch, torch._dynamo, DeepSpeed and the trainer, instead of a new interpreter: ``run(cmd, ...)`` is a
drop-in for ``subprocess.run(cmd, capture_output=True, text=True, ...)`` for the single-process launches of the suite,
and ``run_ranks(cmd, nproc, ...)`` for ``torchrun --standalone --nproc_per_node NPROC`` where what a test checks is
the ranks' work, not the launcher (the ranks get torchrun's variables and rendezvous store; tests/test_fork_server.py
compares them with torchrun's).

Why: a new process that trains spends ~3.5-4 CPU-s importing torch (1.7 s), torch._dynamo (1.2 s: torch's optimizer
imports it on construction), DeepSpeed and the trainer before its first step, on a 2-core machine where the suite is
CPU-bound; a test that runs a few steps pays that import many times over. A fork of an interpreter that has done the
imports (the ``zygote`` pattern) pays nothing for them.

What the child still is: a real process (its own pid, memory, signal dispositions, file descriptors, exit status),
running the module or script as ``__main__`` through ``runpy`` (so the ``if __name__ == "__main__"`` path and
``sys.exit`` codes are the real ones), with the request's cwd, environment and argv, stdin from /dev/null, stdout and
stderr to files; an uncaught exception prints its traceback and exits 1, atexit handlers and non-daemon threads run
at exit, as in any interpreter. Python's and numpy's global random states are reseeded from the OS (a fork would
otherwise share the server's). ``OMP_NUM_THREADS`` in the request's environment is applied with
``torch.set_num_threads`` (OpenMP read it when the server loaded torch); a request without it gets the count a new
interpreter picks.

What it cannot see, so launches that depend on these use ``subprocess`` (``run`` refuses the ones it can detect):
import-time behaviour (what importing torch, DeepSpeed or the trainer prints or costs, environment variables read
at import such as ``PYTHONPATH`` or ``DS_ACCELERATOR``), interpreter start-up options, and launches that signal,
kill or wait on a process group (a single child shares the server's group). For groups: torchrun's agent itself
(forwarding signals, restarts, its exit status and report, multi-node rendezvous); the suite keeps torchrun for
those (tests/test_preemption.py, test_trainer_multiproc.py's kill -9, test_run_lock.py, test_checkpoint.py's disk
full, fine-tuning on 2 ranks, every Slurm test).

The server is started on first use, one per test process (each pytest-xdist worker has its own), and exits when its
stdin closes (at the end of the test process).
"""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_THIS_FILE = str(Path(__file__).resolve())
# What a trainer launch imports before its first step (measured with -X importtime and py-spy): the server imports
# them once. trainer.engine picks the CPU accelerator and imports DeepSpeed (as a rank does).
PRELOAD = ("trainer.engine", "trainer.pretrain", "trainer.loop", "trainer.checkpoint", "trainer.export_hf",
           "trainer.finetune", "torch._dynamo", "torch.optim", "torch.utils.tensorboard", "deepspeed",
           "test_trainer_standin")
# Whether the server's torch read OMP_NUM_THREADS when it loaded (tests/conftest.py sets it): a child whose request
# lacks it then gets the count a new interpreter would pick, not the server's.
SERVER_THREADS_SET = bool(os.environ.get("OMP_NUM_THREADS"))
# Read at import (by the server, for every child): a request that changes them would not take effect.
IMPORT_TIME_ENV = ("PYTHONPATH", "DS_ACCELERATOR", "PYTHONWARNINGS", "TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE",
                   "PYTHONHASHSEED")


# ----------------------------------------------------------------------------------------------------------- server
def _serve(preload: list[str]) -> dict | None:
    """Import ``preload``, then fork once per request line on stdin. Returns the request in a child (which then runs
    it); returns None in the server when stdin closes."""
    import importlib

    sys.path.insert(0, str(REPO / "tests"))
    # the replies keep the pipe; what the imports print goes to stderr (DeepSpeed's "Setting accelerator to CPU" with
    # a CUDA build of torch on a machine without a GPU), where it is seen and cannot be read as a reply
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for name in preload:
        importlib.import_module(name)
    requests = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    # the environment the imports left (trainer.engine sets DS_ACCELERATOR): what requests are compared with
    replies.write(json.dumps({"env": {k: os.environ.get(k) for k in IMPORT_TIME_ENV},
                              "path": [os.path.abspath(p) for p in sys.path] + [str(REPO)]}) + "\n")
    replies.flush()
    # the imported objects into gc's permanent generation: a child's collections skip them instead of touching (and
    # so copying) every page of the server's heap
    gc.collect()
    gc.freeze()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for rank in request.get("ranks") or [{}]:  # a group: one fork per rank, each with its own variables and files
            pid = os.fork()
            if pid == 0:
                requests.close()
                replies.close()
                return {**request, **rank}
            pids.append(pid)
        replies.write(json.dumps({"pids": pids}) + "\n")
        replies.flush()
        codes, first_failed = _wait_group(pids)
        replies.write(json.dumps({"returncodes": codes, "first_failed": first_failed}) + "\n")
        replies.flush()
    return None


# torchrun's grace period: after one rank fails, the others get SIGTERM and this long before SIGKILL
GROUP_GRACE_S = 30.0


def _wait_group(pids: list[int]) -> tuple[list[int], int | None]:
    """Wait for every process of a launch; once one exits non-zero, stop the others as torchrun's agent does (SIGTERM
    to each rank's session, SIGKILL after ``GROUP_GRACE_S``). Returns the exit statuses in launch order and the index
    of the first process that failed (None if none did)."""
    import time

    codes: dict[int, int] = {}
    failed_at = first_failed = None
    while len(codes) < len(pids):
        pid, status = os.waitpid(-1, 0 if failed_at is None else os.WNOHANG)
        if pid == 0:  # stopping the survivors
            if time.monotonic() - failed_at > GROUP_GRACE_S:
                _signal_group([p for p in pids if p not in codes], signal.SIGKILL)
            time.sleep(0.05)
            continue
        codes[pid] = os.waitstatus_to_exitcode(status)
        if codes[pid] != 0 and failed_at is None:
            failed_at, first_failed = time.monotonic(), pids.index(pid)
            _signal_group([p for p in pids if p not in codes], signal.SIGTERM)
    return [codes[p] for p in pids], first_failed


def _signal_group(pids: list[int], sig: int) -> None:
    """``sig`` to each process's session (a rank and its data-loader workers), or to the process alone."""
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _child(request: dict) -> None:
    """Become the launched process: cwd, environment, fds, argv, random states; then run the target as __main__
    (SystemExit and uncaught exceptions propagate to the interpreter, which exits as a launched one would)."""
    import random
    import runpy

    if request.get("ranks"):  # a rank of a group: its own session, as torchrun starts each rank
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_TRUNC)):
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)
    # PYTHONPATH's folders (accepted by the client: ones the imports already came from) where a new process has them
    sys.path[1:1] = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = request["env"].get("OMP_NUM_THREADS")
    if not threads and SERVER_THREADS_SET:  # what a new interpreter without the variable picks (torch's rule: cores)
        threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 env=request["env"], capture_output=True, text=True, check=True).stdout
    if threads:
        import torch
        torch.set_num_threads(int(threads))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["code"] is not None:
        sys.argv = ["-c", *request["args"]]
        sys.path[0] = ""
        main = type(sys)("__main__")
        sys.modules["__main__"] = main
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    elif request["module"]:
        sys.argv = [request["module"], *request["args"]]
        sys.path[0] = request["cwd"]
        sys.modules.pop(request["module"], None)  # as in a fresh `python -m`: the module runs once, as __main__
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        script = os.path.join(request["cwd"], request["script"])
        sys.argv = [request["script"], *request["args"]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


# ----------------------------------------------------------------------------------------------------------- client
class ForkServer:
    def __init__(self, preload: tuple[str, ...] = PRELOAD):
        # DS_ACCELERATOR unset, as in a new process: the product's import sets it (to cpu here), so a request with it
        # unset or with the value the import chose imports the same as the server did
        env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
        self.before = {k: env.get(k) for k in IMPORT_TIME_ENV}  # what the server's imports see
        self.after: dict | None = None  # what they leave (trainer.engine sets DS_ACCELERATOR): the first reply
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=REPO, env=env, text=True)
        self._buffer = b""

    def _reply(self, timeout: float | None) -> dict | None:
        """The server's next reply line, None after ``timeout`` seconds (read from the raw pipe into our own buffer:
        select() cannot see lines a buffered reader already holds)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the fork server exited ({self.proc.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, cmd: list[str], cwd=None, env=None, timeout: float | None = None,
            nproc: int | None = None) -> subprocess.CompletedProcess:
        cmd = [str(c) for c in cmd]
        flag = cmd[1] if len(cmd) > 1 and cmd[1].startswith("-") else None
        if cmd[0] != sys.executable or len(cmd) < 2 or flag not in (None, "-m", "-c") or (flag and len(cmd) < 3):
            raise ValueError(f"fork_server.run: not a `{sys.executable} [-m MODULE | -c CODE | SCRIPT] ...` command: "
                             f"{cmd}")
        env = dict(os.environ if env is None else env)
        if self.after is None:
            first = self._reply(600)  # waits for the server's imports
            self.after, self.path = first["env"], first["path"]
        # a value the imports saw, or the one they set themselves, imports the same as a new process would; so does
        # a PYTHONPATH whose folders the server's sys.path already holds (or the repository, which the editable
        # install already imports the product from)
        changed = [k for k in IMPORT_TIME_ENV if env.get(k) not in (self.before[k], self.after[k])
                   and not (k == "PYTHONPATH" and all(os.path.abspath(p) in self.path
                                                      for p in env[k].split(os.pathsep) if p))]
        if changed:
            raise ValueError(f"fork_server.run: {changed} differ from the server's and are read at import: launch "
                             "this with subprocess")
        module = cmd[2] if cmd[1] == "-m" else None
        code = cmd[2] if cmd[1] == "-c" else None
        script = None if cmd[1] in ("-m", "-c") else cmd[1]
        args = cmd[2:] if script else cmd[3:]
        store = None
        with tempfile.TemporaryDirectory(prefix="fork_server") as tmp:
            files = [(Path(tmp) / f"stdout{r}", Path(tmp) / f"stderr{r}") for r in range(nproc or 1)]
            for out, err in files:
                out.touch()
                err.touch()
            request = {"module": module, "code": code, "script": script, "args": args,
                       "cwd": str(cwd or os.getcwd()), "env": env, "stdout": str(files[0][0]),
                       "stderr": str(files[0][1])}
            if nproc is not None:  # each rank's own variables and files replace the request's
                store, ranks = _group(env, nproc, Path(tmp))
                request["ranks"] = [{"env": rank_env, "stdout": str(out), "stderr": str(err)}
                                    for rank_env, (out, err) in zip(ranks, files)]
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                pids = self._reply(60)["pids"]
                reply = self._reply(timeout)
                if reply is None:
                    _signal_group(pids, signal.SIGKILL)  # a rank's session; a single child alone
                    self._reply(None)
            finally:
                del store  # the group's rendezvous store (torchrun's agent store) closes with its launch
            out = "".join(o.read_text(errors="replace") for o, _ in files)
            err = "".join(e.read_text(errors="replace") for _, e in files)
            if reply is None:
                raise subprocess.TimeoutExpired(cmd, timeout, out, err)
            codes, first = reply["returncodes"], reply["first_failed"]
            proc = subprocess.CompletedProcess(cmd, 0 if first is None else codes[first], out, err)
            proc.returncodes = codes
            return proc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)


def _group(env: dict, nproc: int, tmp: Path):
    """The rendezvous store and each rank's environment for a group of ``nproc`` ranks on this host, as torchrun's
    agent provides them (torch/distributed/elastic/agent/server/local_elastic_agent.py): the agent's TCPStore, bound
    here to a port the OS picks (so no probe-then-pass race), that every rank joins as a client
    (``TORCHELASTIC_USE_AGENT_STORE``); the same variables with the same values, the run id and each rank's error
    file aside; ``OMP_NUM_THREADS=1`` unless set (torch.distributed.run's default for more than one rank)."""
    import uuid

    from torch.distributed import TCPStore

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    common = {"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "WORLD_SIZE": str(nproc),
              "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "localhost",
              "MASTER_PORT": str(store.port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": str(uuid.uuid4()), "TORCHELASTIC_USE_AGENT_STORE": "True",
              "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
              "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}
    if nproc > 1:
        common["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return store, [{**env, **common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r),
                    "TORCHELASTIC_ERROR_FILE": str(tmp / f"attempt_0/{r}/error.json")} for r in range(nproc)]


_server: ForkServer | None = None


def _get_server() -> ForkServer:
    """This test process's server, started on first use (and again if it died)."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
        import atexit
        atexit.register(_server.close)
    return _server


def run(cmd: list[str], cwd=None, env=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)`` for a
    ``[sys.executable, "-m", MODULE, ...]``, ``[sys.executable, "-c", CODE, ...]`` or ``[sys.executable, SCRIPT, ...]``
    command, forked from this test process's server (started on first use)."""
    return _get_server().run(cmd, cwd=cwd, env=env, timeout=timeout)


def run_ranks(cmd: list[str], nproc: int, cwd=None, env=None, timeout: float | None = None
              ) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node NPROC`` for a ``run`` command, without the agent process and the
    per-rank interpreter start-up: ``nproc`` forks, each in its own session with the variables torchrun gives its
    ranks, joining a rendezvous store this process hosts (as the agent hosts it). When one rank exits non-zero the
    others get SIGTERM, then SIGKILL after ``GROUP_GRACE_S``, as torchrun stops them. The result's stdout and stderr
    are the ranks' outputs one after the other in rank order (torchrun interleaves them); its returncode is the exit
    status of the first rank to fail, or 0 (torchrun exits 1 and names that rank), and ``returncodes`` holds each
    rank's.

    What it cannot see: the agent itself (its signal forwarding, restarts, rendezvous over the network, its own exit
    status and messages) and each rank's interpreter start-up. Tests about those launch torchrun."""
    return _get_server().run(cmd, cwd=cwd, env=env, timeout=timeout, nproc=nproc)


def _run_child(request: dict) -> None:
    """``_child``, with an uncaught exception reported as the interpreter would report it for the launched code: its
    traceback without this file's and runpy's frames, exit status 1."""
    try:
        _child(request)
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001  (the interpreter's own handling, below)
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (_THIS_FILE, "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(err), err.with_traceback(tb), tb)  # the hook prints the exception's own traceback
        sys.exit(1)


if __name__ == "__main__":
    child_request = _serve(sys.argv[1:])
    if child_request is not None:
        _run_child(child_request)
