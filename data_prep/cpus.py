"""How many CPUs this process may run on: the default thread and worker counts of data prep and the trainer.

``os.cpu_count()`` is the node's CPUs, whatever Slurm's cgroup, ``taskset`` or ``numactl`` allow: a job given 8 CPUs
on a 128-core node would start 128 threads that share 8 cores. The affinity mask is what the scheduler lets this
process use (``sched_getaffinity``, Linux); elsewhere the node's count.
"""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
