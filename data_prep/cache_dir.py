"""Where derived files that outlive one run are cached, and how their names are keyed.

``$BERTFAMILY_CACHE``, else ``$XDG_CACHE_HOME/bertfamily``, else ``~/.cache/bertfamily``. Every file there is named
after a hash of everything its content depends on (``key``), so a stale or foreign copy is never read: a change of
any input makes a new name. Writers write a temporary file in the same folder and rename it into place, so a reader
never sees a partial file and concurrent writers of one key (same bytes) do no harm.

Cached here: the English test corpus (data_prep/pydocs_text.py) and jieba's prefix dictionary
(data_prep/annotators.py; jieba's own default, ``/tmp/jieba.cache``, is shared by every jieba user on the machine and
trusted whatever wrote it).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache folder (or a sub-folder of it), created if missing."""
    if os.environ.get("BERTFAMILY_CACHE"):
        root = Path(os.environ["BERTFAMILY_CACHE"])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertfamily"
    folder = root.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def key(*inputs: str | bytes) -> str:
    """A short hash of ``inputs`` (20 hex digits: collisions need ~10^12 keys)."""
    h = hashlib.sha256()
    for item in inputs:
        data = item.encode() if isinstance(item, str) else item
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:20]
