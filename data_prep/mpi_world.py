"""Which MPI rank this process is, from the launcher's environment (mpirun, srun), and the one collective the data
tools need (an allgather of small statuses): shared by build_indexed.py and annotate.py, which both run one rank per
node under ``slurm/build_indexed.sh``. mpi4py is imported only for the collective: importing it initialises MPI,
which must come after the worker pools have forked."""
from __future__ import annotations

import os
import re

from data_prep.prep_work import World


def detect_world() -> World:
    """Rank and size from the launcher's environment, without importing mpi4py (which would initialise MPI)."""
    env = os.environ
    for rank_key, size_key, local_key in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"),
        ("PMIX_RANK", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE"),
        ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE"),
    ):
        if rank_key in env and size_key in env:
            local = re.match(r"\d+", env.get(local_key, "1"))
            return World(int(env[rank_key]), int(env[size_key]), int(local.group(0)) if local else 1)
    return World(0, 1, 1)


def mpi_allgather(world: World, status: tuple[str, int]) -> list[tuple[str, int]]:
    """Barrier plus every rank's (status, bytes processed). mpi4py is imported here, after the worker pool exited."""
    if not world.is_mpi:
        return [status]
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise SystemExit("error: launched with several ranks but mpi4py is missing: pip install mpi4py") from err
    comm = MPI.COMM_WORLD
    if comm.Get_size() != world.size:
        raise SystemExit(f"error: the environment says {world.size} ranks but MPI sees {comm.Get_size()}; under "
                         f"srun use --mpi=pmix so that the ranks form one MPI job")
    return comm.allgather(status)
