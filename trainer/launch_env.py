"""What ``trainer.engine.init_distributed`` writes into the process, and puts back (``restore_environment``): the
launch variables it sets itself when no launcher did, and torch's default process-group timeout.

One reach into torch (not DeepSpeed) internals, ``_default_group_timeout``: DeepSpeed creates its own process groups
with ``dist.new_group(ranks)`` and no timeout (the clone of the world group that ZeRO reduces gradients over,
deepspeed/utils/groups.py ``_clone_world_group``; ZeRO++, MoE and sequence-parallel groups likewise), and torch gives
such a group its built-in default (30 min gloo, 10 min NCCL), not ``deepspeed.timeout_minutes``: a stopped rank held
the others 30 min in the gradient reduction with the setting at 1 min. torch resolves every ``timeout=None`` of
``new_group`` / ``new_subgroups`` through one function reading two module globals (``_get_default_timeout``,
torch/distributed/distributed_c10d.py); setting them to the run's timeout covers every group DeepSpeed creates, now
or lazily later, with no DeepSpeed method patched. ``Engine`` checks after ``deepspeed.initialize`` that every group
got it (a torch that resolves defaults elsewhere is said, not silent).
"""
from __future__ import annotations

import datetime
import os
import socket

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Launch variables init_distributed wrote itself (no launcher, or srun without one), with their values before: put
# back by restore_environment, so that a process that ran training in-process (a test, a notebook, fine-tuning)
# does not hand RANK=0/WORLD_SIZE=1/MASTER_PORT to the launchers it starts later (torchrun overrides them, but
# mpirun, srun and deepspeed's launcher would read them as their own, and every later child inherits them).
_SAVED_ENV: dict[str, str | None] = {}


def _set_env(**values: str) -> None:
    for k, v in values.items():
        _SAVED_ENV.setdefault(k, os.environ.get(k))
        os.environ[k] = v


# torch's own default process-group timeouts before _default_group_timeout set them (put back by restore_environment)
_SAVED_TIMEOUTS: dict[str, object] = {}


def _default_group_timeout(timeout: datetime.timedelta) -> None:
    """Make ``timeout`` torch's default for every process group created without one (see the module docstring):
    DeepSpeed's world-group clone and ZeRO's groups then time out with the trainer's setting. Costs nothing per step."""
    from torch.distributed import distributed_c10d as c10d

    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if getattr(c10d, name, None) is not None:  # the NCCL one is None in a torch built without NCCL
            _SAVED_TIMEOUTS.setdefault(name, getattr(c10d, name))
            setattr(c10d, name, timeout)


def group_timeouts() -> dict[str, datetime.timedelta | None]:
    """{process group name: its timeout} for every group of this process (None where the backend does not say):
    what ``Engine`` checks and tests/test_hang_timeout.py reads."""
    from torch.distributed import distributed_c10d as c10d

    out = {}
    for pg in list(c10d._world.pg_map):
        timeout = None
        for device in ("cpu", "cuda"):
            try:
                timeout = pg._get_backend(torch.device(device)).options._timeout
                break
            except Exception:  # noqa: BLE001  (no backend for that device; a backend without options)
                continue
        out[c10d._get_process_group_name(pg)] = timeout
    return out


def restore_environment() -> None:
    """Undo what init_distributed wrote into os.environ (nothing when a launcher set the variables) and put torch's
    default process-group timeouts back."""
    from torch.distributed import distributed_c10d as c10d

    while _SAVED_TIMEOUTS:
        name, value = _SAVED_TIMEOUTS.popitem()
        setattr(c10d, name, value)
    while _SAVED_ENV:
        k, v = _SAVED_ENV.popitem()
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
