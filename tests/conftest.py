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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where torch sees a CUDA GPU and are skipped elsewhere.

    Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``) each module's tests stay on one worker, so a
    module-scoped fixture (a prepared corpus, reference runs) is built once, not once per worker; the Slurm modules
    share one group because they share the one test cluster (tests/slurm_cluster.py)."""
    import torch

    for item in items:
        group = "slurm" if item.get_closest_marker("slurm") is not None else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
