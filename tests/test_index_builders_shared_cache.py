"""Two builders of one sample index on a shared cache volume whose processes have the same pid (two Kubernetes pods or
containers, each builder PID 1 in its own PID namespace, on one cache_dir): each keeps its temporaries to itself.

Reviewer exp7 (/tmp/rev_scale/exp7_same_pid_builders.py): write_index named the packed rows' temporary
``.NAME.rows-PID``, so the second builder truncated the first one's and removed it when done, and the first failed
with FileNotFoundError; ``.NAME.json.tmpPID`` (the description beside the file) had the same flaw. Here the two
builders run in one process (one pid, by construction) under two host names, the second one started and finished
while the first is between two shards: deterministic, no timing."""
from __future__ import annotations

import socket

import numpy as np
import pytest

from test_samples import write_shards
from trainer.data import sample_index as S
from trainer.data.cache_file import CachePolicy
from trainer.data.corpus import IndexedCorpus


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Four shards of documents with 1 to 6 sentences of 1 to 20 tokens."""
    rng = np.random.default_rng(3)
    docs = [[list(rng.integers(5, 90, int(rng.integers(1, 21)))) for _ in range(int(rng.integers(1, 7)))]
            for _ in range(40)]
    return write_shards(docs, tmp_path_factory.mktemp("pods") / "pd", 100, docs_per_shard=10)


@pytest.mark.parametrize("fmt,pack", [("doc-sentences", True), ("segment-pair", False)])
def test_two_builders_with_one_pid_on_two_hosts_both_finish(sharded, tmp_path, monkeypatch, fmt, pack):
    host = {"name": "pod-a"}
    monkeypatch.setattr(socket, "gethostname", lambda: host["name"])
    cache = tmp_path / "cache"
    corpus = IndexedCorpus(sharded, CachePolicy(cache))
    assert len(corpus.shards) == 4
    real_run = S._run
    other = {}

    def interleaved(tasks, *args, **kwargs):
        for k, item in enumerate(real_run(tasks, *args, **kwargs)):
            yield item
            if k == 0 and not other:  # builder A is between two shards: builder B (pod-b, same pid) runs whole
                other["started"] = True
                host["name"] = "pod-b"
                other["index"] = S.load_or_build(IndexedCorpus(sharded, CachePolicy(cache)), fmt, 48, 0.2, 5, pack,
                                                 CachePolicy(cache))
                host["name"] = "pod-a"

    monkeypatch.setattr(S, "_run", interleaved)
    mine = S.load_or_build(corpus, fmt, 48, 0.2, 5, pack, CachePolicy(cache))  # failed: FileNotFoundError
    assert "index" in other  # B did run inside A's build
    want = S.build_index(corpus, fmt, 48, 0.2, 5, pack)
    for got in (mine, other["index"], S.load_or_build(corpus, fmt, 48, 0.2, 5, pack, CachePolicy(cache))):
        assert np.array_equal(got.chunks, want.chunks)
        if pack:
            assert np.array_equal(got.row_ptr, want.row_ptr)
    assert [p.name for p in cache.glob(".*")] == []  # neither builder left a temporary
    assert len(list(cache.glob("index-*.bfc.json"))) == 1


def test_the_description_temporaries_of_two_same_pid_builders_differ(tmp_path, monkeypatch):
    """B writes and renames its description while A's is written but not yet renamed (old name: one
    `.NAME.json.tmpPID` for both, and A's rename failed with FileNotFoundError)."""
    import os

    host = {"name": "pod-a"}
    monkeypatch.setattr(socket, "gethostname", lambda: host["name"])
    path = tmp_path / "index-x.bfc"
    real_replace = os.replace
    nested = []

    def replace(src, dst):
        if not nested:
            nested.append(src)
            host["name"] = "pod-b"
            S._write_description(path, {"who": "b"})
            host["name"] = "pod-a"
        real_replace(src, dst)

    monkeypatch.setattr(S.os, "replace", replace)
    S._write_description(path, {"who": "a"})
    assert nested and (tmp_path / "index-x.bfc.json").read_text().count('"a"') == 1
    assert [p.name for p in tmp_path.glob(".*")] == []
