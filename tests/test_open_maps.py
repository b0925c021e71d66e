"""A process keeps a bounded number of shards mapped (trainer/data/open_maps.py): a corpus of more shards than the
open-file limit allows is read whole, in random order, as the loader workers read it."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_ernie_sidecars import _annotate, _docs
from test_samples import write_shards

ROOT = Path(__file__).resolve().parents[1]

READER = r"""
import json, os, resource, sys
import numpy as np
from trainer.data.cache_file import CachePolicy
from trainer.data.corpus import IndexedCorpus

prefix, cache, soft = sys.argv[1], sys.argv[2], int(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
corpus = IndexedCorpus(prefix, CachePolicy(cache))
order = np.random.default_rng(0).permutation(corpus.num_sentences)
def mapped_files():
    n = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{f}").endswith((".bin", ".idx"))
        except FileNotFoundError:  # listdir's own descriptor, closed by now
            pass
    return n

out, most = {}, 0
for s in np.concatenate([order, order[::-1]]).tolist():
    out[s] = corpus.read(s, s + 1).tolist()
    most = max(most, mapped_files())
print(json.dumps({"tokens": [out[s] for s in range(corpus.num_sentences)], "most": most}))
"""


def test_a_corpus_of_more_shards_than_the_open_file_limit_is_read_whole(tmp_path):
    """300 shards of 2 files each under a 200-file limit, every sentence read in random order, twice: before, each
    shard's .idx and .bin stayed mapped (one descriptor each) and the reader stopped with 'Too many open files' after
    ~90 shards. Now at most a quarter of the limit is held open for shards."""
    docs = [[[10 + d, 11 + d, 12 + d]] for d in range(300)]  # document d: one sentence naming it
    prefix = write_shards(docs, tmp_path / "many" / "many", vocab_size=1000, docs_per_shard=1)
    env = {k: v for k, v in os.environ.items() if k != "BERTFAMILY_MAX_OPEN_SHARDS"}
    proc = subprocess.run([sys.executable, "-c", READER, str(prefix), str(tmp_path / "cache"), "200"], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tokens"] == [sent for doc in docs for sent in doc]
    assert 0 < got["most"] <= 2 * (200 // 8)  # 25 shards of 2 files: a quarter of the limit


def test_side_car_readers_are_bounded_and_read_the_same_spans(tmp_path, monkeypatch):
    """ERNIE's side-cars (two mapped arrays per shard) under a 1-shard bound give the same spans as an unbounded
    reader, reading across every shard boundary, in a loader worker too."""
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.sidecars import CorpusSpans

    docs = _docs(0)
    prefix = write_shards(docs, tmp_path / "c" / "c", vocab_size=100, docs_per_shard=4)
    from data_prep.manifest import read_manifest
    _annotate(prefix.parent, read_manifest(prefix)["shards"], docs, 4)
    free = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))
    n = int(free.starts[-1])
    want = [free.range(a, min(a + 3, n)).tolist() for a in range(n)]
    monkeypatch.setenv("BERTFAMILY_MAX_OPEN_SHARDS", "1")
    bounded = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache", builder=False, timeout=0)))
    worker = pickle.loads(pickle.dumps(bounded))
    for spans in (bounded, worker):
        assert [spans.range(a, min(a + 3, n)).tolist() for a in range(n)] == want
        assert sum(r is not None for r in spans._readers) == 1 and len(spans._open) == 1


def test_the_bound_follows_the_limit_and_the_variable_is_checked(monkeypatch):
    import resource

    from trainer.data.open_maps import CEILING, max_open_shards

    monkeypatch.delenv("BERTFAMILY_MAX_OPEN_SHARDS", raising=False)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CEILING if soft == resource.RLIM_INFINITY else max(16, min(CEILING, soft // 8))
    assert max_open_shards(2) == want
    monkeypatch.setenv("BERTFAMILY_MAX_OPEN_SHARDS", "64")
    assert max_open_shards(2) == 64
    for bad in ("0", "many"):
        monkeypatch.setenv("BERTFAMILY_MAX_OPEN_SHARDS", bad)
        with pytest.raises(ValueError, match="BERTFAMILY_MAX_OPEN_SHARDS.*whole number"):
            max_open_shards(2)


def test_the_soft_open_file_limit_is_raised_to_the_hard_one():
    """trainer.pretrain raises it at start, so the bound above follows the hard limit; checked in a child whose soft
    limit was lowered to 256 (the hard one unchanged)."""
    code = ("import resource; from trainer.data.open_maps import raise_open_file_limit as r\n"
            "s, h = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, h))\n"
            "print(list(r()), list(resource.getrlimit(resource.RLIMIT_NOFILE)), h)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import resource
    (before, after), now, hard = json.loads("[" + proc.stdout.strip().replace("] ", "], ") + "]")
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    assert before == 256 and after == want and now == [want, hard]


def test_a_corpus_rebuilt_in_place_under_a_reader_stops_it_at_the_next_map(tmp_path, monkeypatch):
    """A reader that keeps one shard mapped remaps them as it goes (what a 2,000-shard corpus does under a 1,024 file
    limit, and what every first read does); the corpus is rebuilt under the same prefix with other text: the next map
    stops with CorpusChanged naming the corpus (before: the new shards were read through the old sample index, every
    later sample differed, nothing said; mixtures review). A manifest rewritten with the shards unchanged (what
    data_prep.annotate does when it records side-cars) is no change."""
    from data_prep.manifest import manifest_path, read_manifest, write_manifest
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import CorpusChanged, IndexedCorpus

    monkeypatch.setenv("BERTFAMILY_MAX_OPEN_SHARDS", "1")
    prefix = write_shards([[[5 + d % 7, 6, 7], [8, 9]] for d in range(12)], tmp_path / "c", 100, docs_per_shard=4)
    corpus = IndexedCorpus(prefix, CachePolicy(tmp_path / "cache"))
    first = [corpus.read(s, s + 1).tolist() for s in range(corpus.num_sentences)]  # maps shards 0, 1, 2 in turn
    before = manifest_path(prefix).stat().st_ino
    write_manifest(prefix, read_manifest(prefix))  # a new file (atomic rename), the same shards
    assert manifest_path(prefix).stat().st_ino != before
    assert [corpus.read(s, s + 1).tolist() for s in range(corpus.num_sentences)] == first
    write_shards([[[11 + d % 5, 12, 13], [14, 15]] for d in range(12)], tmp_path / "c", 100, docs_per_shard=4)
    with pytest.raises(CorpusChanged, match=r"rebuilt or replaced in place while this run reads it .* shard c_0000"):
        for s in range(corpus.num_sentences):
            corpus.read(s, s + 1)
    pickled = pickle.loads(pickle.dumps(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache2"))))
    assert pickled.read(0, 1).tolist() == [11, 12, 13]  # a reader opened after the rebuild reads it as it is
