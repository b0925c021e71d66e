"""Shared fixtures: where the real corpora live, a scratch directory, the venv's bin on PATH for launched processes."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CORPORA = SHARED / "corpora"

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
    path = CORPORA / "en_fortunes.txt"
    if not path.exists():
        pytest.fail(f"shared English corpus missing at {path}: clone next to ../shared")
    return path


@pytest.fixture(scope="session")
def zh_corpus() -> Path:
    path = CORPORA / "zh_fortunes.txt"
    if not path.exists():
        pytest.fail(f"shared Chinese corpus missing at {path}: clone next to ../shared")
    return path
