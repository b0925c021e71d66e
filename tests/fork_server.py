"""Launch ``python -m MODULE ARGS`` / ``python SCRIPT ARGS`` / ``python -c CODE ARGS`` as a fork of a process that has already imported torch,
torch._dynamo, DeepSpeed and the trainer, instead of a new interpreter: ``run(cmd, ...)`` is a drop-in for
``subprocess.run(cmd, capture_output=True, text=True, ...)`` for the single-process launches of the suite.

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
``torch.set_num_threads`` (OpenMP read it when the server loaded torch).

What it cannot see, so launches that depend on these use ``subprocess`` (``run`` refuses the ones it can detect):
import-time behaviour (what importing torch, DeepSpeed or the trainer prints or costs, environment variables read
at import such as ``PYTHONPATH`` or ``DS_ACCELERATOR``), interpreter start-up options, and launches that signal,
kill or wait on a process group (the child shares the server's group).

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
# Read at import (by the server, for every child): a request that changes them would not take effect.
IMPORT_TIME_ENV = ("PYTHONPATH", "DS_ACCELERATOR", "PYTHONWARNINGS", "TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE",
                   "PYTHONHASHSEED")


# ----------------------------------------------------------------------------------------------------------- server
def _serve(preload: list[str]) -> dict | None:
    """Import ``preload``, then fork once per request line on stdin. Returns the request in a child (which then runs
    it); returns None in the server when stdin closes."""
    import importlib

    sys.path.insert(0, str(REPO / "tests"))
    for name in preload:
        importlib.import_module(name)
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
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
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            return request
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()
    return None


def _child(request: dict) -> None:
    """Become the launched process: cwd, environment, fds, argv, random states; then run the target as __main__
    (SystemExit and uncaught exceptions propagate to the interpreter, which exits as a launched one would)."""
    import random
    import runpy

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
    if request["env"].get("OMP_NUM_THREADS"):
        import torch
        torch.set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))
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

    def run(self, cmd: list[str], cwd=None, env=None, timeout: float | None = None) -> subprocess.CompletedProcess:
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
        with tempfile.TemporaryDirectory(prefix="fork_server") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            out.touch()
            err.touch()
            request = {"module": module, "code": code, "script": script, "args": args,
                       "cwd": str(cwd or os.getcwd()), "env": env, "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = self._reply(60)["pid"]
            reply = self._reply(timeout)
            if reply is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(errors="replace"),
                                                err.read_text(errors="replace"))
            return subprocess.CompletedProcess(cmd, reply["returncode"], out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)


_server: ForkServer | None = None


def run(cmd: list[str], cwd=None, env=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)`` for a
    ``[sys.executable, "-m", MODULE, ...]``, ``[sys.executable, "-c", CODE, ...]`` or ``[sys.executable, SCRIPT, ...]``
    command, forked from this test
    process's server (started on first use)."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
        import atexit
        atexit.register(_server.close)
    return _server.run(cmd, cwd=cwd, env=env, timeout=timeout)


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
