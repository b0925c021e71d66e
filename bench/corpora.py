"""The corpora every benchmark reads: the same in-repository text the tests read (tests/conftest.py).

English: Python's standard-library docstrings as a sentence-per-line text (data_prep/pydocs_text.py, cached under a
hash of the Python build and the code that writes it). Chinese: the public-domain classical poems and prose in
tests/data/zh_classical.txt (tests/data/README.md says where they come from).
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ZH_CORPUS = REPO / "tests" / "data" / "zh_classical.txt"


def en_corpus() -> Path:
    """The English corpus file (written once per Python build and code version, then reused)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from data_prep.pydocs_text import cached_text

    return cached_text()


def zh_corpus() -> Path:
    return ZH_CORPUS
