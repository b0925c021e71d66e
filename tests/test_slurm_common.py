"""slurm/common.sh's choice of torchrun options, which differ by torch release (no Slurm needed).

The templates used to pass ``--shutdown-timeout`` unconditionally: torch 2.11's torchrun (the lent GPU machines'
torch, and a common one on clusters) rejects it, so every launch failed at once ("unrecognized arguments"); five
Slurm tests failed that way in a torch 2.11 venv. The fake torchruns below print only a help text: they prove our
reading of it, not what torchrun does with the options; the Slurm tests run the real one."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def torchrun_options(tmp_path, help_text=None):
    """(exit status, stdout, stderr) of bf_torchrun_options with a torchrun printing ``help_text`` (None: the real
    one beside this interpreter), called twice (a multi-phase job launches several times), options one per line."""
    path = str(Path(sys.executable).parent)
    if help_text is not None:
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "torchrun").write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}\nEOF\n")
        (fake / "torchrun").chmod(0o755)
        path = str(fake)
    script = ('set -euo pipefail; source slurm/common.sh; bf_torchrun_options; bf_torchrun_options; '
              'printf "%s\\n" "${BF_TORCHRUN_OPTS[@]}"')
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PATH=os.pathsep.join([path, "/usr/bin", "/bin"]), SAVE_TIMEOUT="300"))
    return proc.returncode, proc.stdout, proc.stderr


def test_the_options_read_from_this_torchrun_launch_it(tmp_path):
    """The real torchrun beside this interpreter: torch 2.13's gets both options, 2.11's (no --shutdown-timeout) the
    signals alone and a warning; either way torchrun starts a one-rank run with them (an option it did not know
    would end it at once with "unrecognized arguments", as on torch 2.11 before)."""
    import torch

    code, out, err = torchrun_options(tmp_path)
    assert code == 0, err
    options = [line for line in out.splitlines() if not line.startswith("bertfamily")]
    assert options[0] == "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13):
        assert options[1:] == ["--shutdown-timeout=300"] and "warning" not in out, out
    else:
        assert options[1:] == [] and "no --shutdown-timeout" in out, out
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=1", "--no-python", *options, "true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_torchrun_without_shutdown_timeout_launches_and_the_log_says_saves_get_30_s(tmp_path):
    code, out, err = torchrun_options(tmp_path, "usage: torchrun [--signals-to-handle SIGNALS_TO_HANDLE]\n"
                                                "                [--virtual-local-rank]")
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("bertfamily")]
    assert [line for line in out.splitlines() if line not in warnings] == [
        "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]
    # once, although asked twice: the help is read once per job
    assert len(warnings) == 1 and "30 s" in warnings[0] and "SAVE_TIMEOUT=300" in warnings[0], out


def test_a_torchrun_that_cannot_pass_usr1_on_is_refused_naming_the_option(tmp_path):
    code, out, err = torchrun_options(tmp_path, "usage: torchrun [--nnodes NNODES] [--max-restarts MAX_RESTARTS]")
    assert code == 1 and out == ""
    assert "has no --signals-to-handle" in err and "USR1" in err, err


@pytest.mark.parametrize("option", ["--signals-to-handle", "--shutdown-timeout"])
def test_the_templates_launch_torchrun_with_the_options_read_from_it(option):
    """Neither option is written into the srun line itself any more (that is what broke on torch 2.11)."""
    launch = (REPO / "slurm" / "common.sh").read_text().split("srun --nodes=", 1)[1].split("BF_SRUN_PID=", 1)[0]
    assert option not in launch and '"${BF_TORCHRUN_OPTS[@]}"' in launch
