"""Rank-aware printing. Every console line of the trainer goes through ``print0`` so that N ranks do not print N copies."""
import os
import sys


def global_rank() -> int:
    """This process's rank from the launcher's environment (torchrun, deepspeed, mpirun, srun); 0 if none."""
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def print0(*args, **kwargs) -> None:
    """print() on global rank 0 only, flushed (log files of batch jobs otherwise lag behind)."""
    if global_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def warn0(*args) -> None:
    if global_rank() == 0:
        print("warning:", *args, file=sys.stderr, flush=True)
