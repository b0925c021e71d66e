"""Shared fixtures: the corpora (in the repository or generated from it), the venv's bin on PATH for launched
processes."""
import os
import sys
from pathlib import Path

import pytest

# One Slurm cluster per session (tests/slurm_cluster.py); the modules take it through their `slurm_cluster` fixture.
from slurm_cluster import slurm_cluster_session  # noqa: F401,E402  (fixture)

REPO = Path(__file__).resolve().parents[1]
# Public-domain classical Chinese (tests/data/README.md says where it comes from and why it may be copied).
ZH_CORPUS = REPO / "tests" / "data" / "zh_classical.txt"

# Launched processes (torchrun, mpirun, deepspeed) must see the venv's tools first: mixing the system's and the
# venv's ninja makes DeepSpeed recompile its native ops (PLATFORM.md).
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per process unless the caller chose otherwise: `make test` runs three xdist workers on 2 cores,
# and beside them their launches (forked ranks, torchrun ranks, the Slurm jobs' one rank per node, which torchrun
# leaves at the default of one thread per core); with the default every process brought a second thread to the same
# two cores and the tiny models' ops gained nothing from it (whole suite, idle, same host: 471.6 s with the default,
# 422.2 s with one thread; the CPU bf16 matmuls of bench/gpu.sh --cpu-smoke 60.8 -> 34.4 s). Launched processes
# inherit it; tests/fork_server.py applies it to its forks.
if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def en_corpus() -> Path:
    """English: the standard library's docstrings, one sentence per line (data_prep/pydocs_text.py), written once
    per Python build and code version into a cache named after a hash of both, and read from there."""
    from data_prep.pydocs_text import cached_text

    return cached_text()


@pytest.fixture(scope="session")
def zh_corpus() -> Path:
    """Chinese: Tang poems, Song ci and other classical poems, the Analects, the Tao Te Ching and the Book of Songs."""
    return ZH_CORPUS


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where torch sees a CUDA GPU and are skipped elsewhere.

    Under pytest-xdist (``make test`` runs ``-n 3 --dist loadgroup``) each module's tests stay on one worker, so a
    module-scoped fixture (a prepared corpus, reference runs) is built once, not once per worker. The groups must be
    marked before pytest-xdist's worker hook turns them into node-id suffixes (``tryfirst``): marked after it, they
    were ignored, and a module's tests (and its module-scoped runs) were spread over the workers. (Each worker starts
    its own Slurm test cluster, tests/slurm_cluster.py, for the Slurm modules it gets.)

    The modules are reordered longest first (a weight from their markers: Slurm tests, then slow ones), since
    pytest-xdist hands the groups out in collection order: in alphabetical order the Slurm modules came last and
    ran alone on one worker for minutes while the other idled."""
    import torch

    weight: dict[str, int] = {}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        cost = 40 if item.get_closest_marker("slurm") else 20 if item.get_closest_marker("slow") else 1
        weight[item.module.__name__] = weight.get(item.module.__name__, 0) + cost
    items.sort(key=lambda item: -weight[item.module.__name__])  # stable: a module's own order is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


class _GroupCheck:
    """After pytest-xdist's worker hook: under ``--dist loadgroup`` every node id must carry its group suffix. pytest
    9.2 renamed the attribute pytest-xdist 3.8 writes it to, so the groups silently stopped working (setup.py pins
    pytest below 9.2); this stops the run instead of letting two workers share a module's runs or the Slurm
    cluster."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not config.getoption("loadgroup", False):
            return
        bare = [item.nodeid for item in items if "@" not in item.nodeid.rpartition("]")[2]]
        if bare:
            raise pytest.UsageError(f"pytest-xdist --dist loadgroup did not group {len(bare)} test(s) (first: "
                                    f"{bare[0]}): this pytest-xdist does not work with pytest {pytest.__version__}; "
                                    "install the versions setup.py's dev extra pins")


def pytest_configure(config):
    if "torch" in sys.modules:  # imported before this file set OMP_NUM_THREADS (a plugin): apply it now
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    config.pluginmanager.register(_GroupCheck(), "bertfamily-group-check")
