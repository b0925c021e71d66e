"""The file names a corpus name becomes (the NAME of ``--output-prefix OUT/NAME``), and whether they all fit.

A file name may hold at most ``NAME_MAX`` (255) bytes on Linux filesystems. NAME goes into build_indexed's own files
(``NAME_00000.spans.ptr.npy.tmpPID`` is the longest: NAME + 31 bytes) and into the trainer's cache files, of which
the sample index's description ``index-NAME-full-sentences-heldout-KEY.bfc.json`` is the longest (NAME + 55). So
NAME may be 200 bytes (66 CJK characters: 3 bytes each in UTF-8). A longer one built, and the trainer then stopped
with a raw ENAMETOOLONG (found by review); build_indexed now refuses it before it reads anything. The cache files'
temporaries and failure notes add the host name and more, but are cut to fit (trainer/data/cache_file.fit_name),
so they set no limit.

The trainer's names are taken from the trainer's own functions (``index_path``, the formats of ``data.format``), so a
longer format name added there moves the limit here.
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import get_args

SHARD_DIGITS = 5
"""``NAME_00000``: data_prep/manifest.shard_name (100k shards before a sixth digit)."""
PID_DIGITS = 7
"""Linux's largest pid_max is 4194304: the ``.tmpPID`` of build_indexed's atomic writes (data_prep/sidecar.py)."""


def longest_names(name: str) -> list[tuple[str, str]]:
    """(what, file name) for the longest names derived from ``name``, build_indexed's and the trainer's."""
    from trainer.data.cache_file import settings_hash
    from trainer.data.config import DataConfig
    from trainer.data.sample_index import index_path

    key = settings_hash({})  # every key has this length
    corpus = SimpleNamespace(prefix=name)
    indexes = [index_path(corpus, fmt, key, ".", role="heldout").name
               for fmt in get_args(DataConfig.model_fields["format"].annotation)]
    index = max(indexes, key=lambda n: len(os.fsencode(n)))
    shard = f"{name}_{0:0{SHARD_DIGITS}d}"
    return [("the trainer's sample-index description", index + ".json"),
            ("build_indexed's side-car temporary", f"{shard}.spans.ptr.npy.tmp{'9' * PID_DIGITS}")]


def too_long(prefix: str) -> str | None:
    """Why the NAME of ``prefix`` is too long for the files made from it (naming the limit), or None if all fit."""
    from trainer.data.cache_file import NAME_MAX

    name = os.path.basename(prefix)
    what, longest = max(longest_names(name), key=lambda item: len(os.fsencode(item[1])))
    over = len(os.fsencode(longest)) - NAME_MAX
    if over <= 0:
        return None
    size = len(os.fsencode(name))
    return (f"--output-prefix {prefix}: its name is {size} bytes, {over} too many: the files made from it must fit "
            f"the filesystem's limit of {NAME_MAX} bytes per file name (NAME_MAX), and {what} would be "
            f"{NAME_MAX + over} bytes ({longest[:24]}...). Give a name of at most {size - over} bytes (UTF-8: a CJK "
            "character takes 3)")
