"""A corpus name of 200 bytes (66 CJK characters) built, and the trainer then stopped with a raw ENAMETOOLONG: the
cache file's temporary adds ~60 bytes and the host name to a name that already holds the corpus's (found by review).
Now the temporaries and failure notes of a cache file are cut to fit NAME_MAX (255 bytes; trainer/data/cache_file.py),
and build_indexed refuses up front a name whose own files would not fit (data_prep/prefix_names.py)."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_prep import build_indexed
from trainer.data import cache_file

REPO = Path(__file__).resolve().parents[1]
NAME = "c" * 200  # the reviewer's corpus name
KEY = "0123456789abcdef"


def _build(path: Path) -> None:
    with cache_file.CacheWriter(path, "test", KEY, [("a", "int64", ())]) as w:
        w.append("a", np.arange(5))
        w.commit()


def _names(folder: Path) -> list[int]:
    return [len(os.fsencode(p.name)) for p in folder.iterdir()]


def test_cache_files_of_a_200_byte_corpus_name_are_built_and_their_temporaries_fit(tmp_path):
    cache = tmp_path / "index_cache"
    policy = cache_file.CachePolicy(cache)
    # the trainer's longest cache name for it: 250 bytes
    for name in (f"corpus-{NAME}-{KEY}.bfc", f"index-{NAME}-full-sentences-heldout-{KEY}.bfc"):
        arrays, _ = cache_file.ensure(cache / name, "test", KEY, _build, policy, "the test file")
        assert list(arrays["a"]) == [0, 1, 2, 3, 4]
    # a builder killed mid-write leaves its (cut) temporary; the next builder on this machine removes it
    path = cache / f"index-{NAME}-doc-sentences-{KEY}.bfc"
    subprocess.run([sys.executable, "-c", "import os\nfrom trainer.data import cache_file\n"
                    f"cache_file.CacheWriter({str(path)!r}, 'test', 'key', [('a', 'int64', ())])\nos._exit(0)"],
                   cwd=REPO, check=True)
    (dead,) = [p for p in cache.iterdir() if ".tmp-" in p.name]
    assert len(os.fsencode(dead.name)) <= 255
    cache_file.ensure(path, "test", KEY, _build, policy, "the test file")
    assert not dead.exists() and max(_names(cache)) <= 255


def test_a_failed_build_of_a_long_named_file_leaves_its_note_for_the_waiting_ranks(tmp_path):
    path = tmp_path / f"index-{NAME}-full-sentences-heldout-{KEY}.bfc"

    def fail(_path):
        raise RuntimeError("shard 3 is unreadable")

    with pytest.raises(RuntimeError, match="unreadable"):
        cache_file.ensure(path, "test", KEY, fail, cache_file.CachePolicy(tmp_path), "the test file")
    assert cache_file.failure_note_path(path).exists() and max(_names(tmp_path)) <= 255
    with pytest.raises(cache_file.BuildFailed, match="shard 3 is unreadable"):  # at once, not after the timeout
        cache_file.ensure(path, "test", KEY, fail, cache_file.CachePolicy(tmp_path, builder=False, timeout=30),
                          "the test file")


def test_a_cache_file_name_past_the_limit_is_refused_with_the_limit_named(tmp_path):
    """A corpus built before build_indexed refused such names: one line, not ENAMETOOLONG from deep inside."""
    with pytest.raises(OSError, match=r"its name is 256 bytes, more than filesystems allow \(255, NAME_MAX\)") as err:
        cache_file.CacheWriter(tmp_path / ("x" * 252 + ".bfc"), "test", KEY, [("a", "int64", ())])
    assert err.value.errno == errno.ENAMETOOLONG and not list(tmp_path.iterdir())


def test_build_indexed_refuses_a_name_its_files_would_not_fit_and_takes_200_bytes(tmp_path, capsys):
    args = ["--input", "in.txt", "--tokenizer", "tok", "--output-prefix"]
    assert build_indexed.parse_args(args + [str(tmp_path / NAME)]).output_prefix == str(tmp_path / NAME)
    assert build_indexed.parse_args(args + [str(tmp_path / ("中" * 66))])  # 198 bytes
    for name, size in (("c" * 201, 201), ("中" * 67, 201)):
        with pytest.raises(SystemExit) as stop:
            build_indexed.parse_args(args + [str(tmp_path / name)])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert (f"its name is {size} bytes, 1 too many: the files made from it must fit the filesystem's limit of 255 "
                "bytes per file name (NAME_MAX)") in err and "Give a name of at most 200 bytes" in err, err


def test_a_200_byte_corpus_trains_its_sample_index_is_built_with_its_description(tmp_path):
    """The sample index's description (``NAME.json`` beside it) had its own temporary name, which passed NAME_MAX for
    this corpus: the corpus cache and the index built, then ENAMETOOLONG (found after the fix above)."""
    from test_samples import write_shards
    from trainer.data.corpus import IndexedCorpus
    from trainer.data.sample_index import load_or_build

    docs = [[[10 + d, 11, 12], [13, 14]] for d in range(20)]
    prefix = write_shards(docs, tmp_path / NAME, vocab_size=100)
    policy = cache_file.CachePolicy(tmp_path / "cache")
    corpus = IndexedCorpus(prefix, policy)
    for fmt in ("doc-sentences", "full-sentences"):
        index = load_or_build(corpus, fmt, 64, 0.1, 1, False, policy)
        assert index.path.exists() and index.path.with_name(index.path.name + ".json").exists()
    assert max(_names(tmp_path / "cache")) <= 255
