"""ERNIE side-cars are checked against their shards once, when the corpus's side-car cache entry is built (issue 25
item 1): before, every ``SidecarReader`` read and hashed all of its shard's sequence lengths, in every rank and again
in every loader worker (~23 CPU-s and 8 GB of .idx reads per process at 2B sentences)."""
import pickle
from pathlib import Path

import numpy as np
import pytest

from test_samples import write_shards


def _docs(seed: int, n_docs: int = 12):
    rng = np.random.default_rng(seed)
    return [[rng.integers(5, 90, int(rng.integers(3, 9))).tolist() for _ in range(int(rng.integers(1, 5)))]
            for _ in range(n_docs)]


def _annotate(root, manifest_shards, docs, docs_per_shard, shift=0):
    """One side-car per shard: a span on the first two tokens of every sequence; ``shift`` records other lengths."""
    from data_prep.sidecar import SidecarWriter

    for k, spec in enumerate(manifest_shards):
        part = docs[k * docs_per_shard:(k + 1) * docs_per_shard]
        w = SidecarWriter(root / spec["prefix"], spec="external")
        for doc in part:
            w.add_document_spans([np.array([[0, 2, k % 2]]) for _ in doc], [len(s) + shift for s in doc])
        w.finalize()


@pytest.fixture
def annotated(tmp_path):
    from data_prep.manifest import read_manifest

    docs = _docs(0)
    prefix = write_shards(docs, tmp_path / "c" / "c", vocab_size=100, docs_per_shard=4)
    shards = read_manifest(prefix)["shards"]
    assert len(shards) == 3
    _annotate(prefix.parent, shards, docs, 4)
    return prefix, shards, docs


def _count_length_reads(monkeypatch) -> list:
    """Calls of the function that reads a shard's whole lengths array for the side-car hash."""
    import data_prep.sidecar as sidecar

    calls, real = [], sidecar.shard_sequence_lengths

    def counting(prefix):
        calls.append(str(prefix))
        return real(prefix)

    monkeypatch.setattr(sidecar, "shard_sequence_lengths", counting)
    return calls


def test_side_cars_are_hashed_once_per_cache_entry_not_per_open(annotated, tmp_path, monkeypatch):
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.data import CorpusSpans

    prefix, shards, _ = annotated
    calls = _count_length_reads(monkeypatch)
    policy = CachePolicy(tmp_path / "cache")
    first = CorpusSpans(IndexedCorpus(prefix, policy))
    assert len(calls) == 3  # the entry's build checks every shard's side-car
    del calls[:]
    again = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache", builder=False, timeout=0)))
    assert calls == []  # another rank: nothing per sentence read (main: 3, one per shard)
    worker = pickle.loads(pickle.dumps(again))
    assert calls == []  # a loader worker (main: 3 again)
    n = int(first.starts[-1])
    assert n == sum(s["sentences"] for s in shards)
    for a, b in [(0, n), (2, 9), (n - 3, n)]:
        assert first.range(a, b).tolist() == again.range(a, b).tolist() == worker.range(a, b).tolist()


def test_a_process_opens_only_the_side_cars_it_reads(annotated, tmp_path, monkeypatch):
    """Issue 25, item 5: a rank or loader worker maps a shard's side-car on its first read there, not every shard's
    at start-up (3 files per shard: 3,000 opens per process on a 1,000-shard corpus, measured by bench/scale.py
    --io before this). Shard 1's sentences read -> shard 1's side-car opened, in the rank and in a worker."""
    import trainer.ernie.sidecars as sidecars
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus

    prefix, shards, _ = annotated
    CorpusSpans = sidecars.CorpusSpans
    reference = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))  # builds the checked entry
    lo, last = int(reference.starts[1]), int(reference.starts[-1])
    want_mid, want_end = reference.range(lo, lo + 2).tolist(), reference.range(last - 2, last).tolist()
    opened = []

    class Counting(sidecars.SidecarReader):
        def __init__(self, shard_prefix, *args, **kwargs):
            opened.append(Path(shard_prefix).name)
            super().__init__(shard_prefix, *args, **kwargs)

    monkeypatch.setattr(sidecars, "SidecarReader", Counting)
    rank = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache", builder=False, timeout=0)))
    assert opened == []
    assert rank.range(lo, lo + 2).tolist() == want_mid and want_mid
    assert opened == [shards[1]["prefix"]]
    rank.range(lo + 1, lo + 3)
    assert opened == [shards[1]["prefix"]]  # once per process
    worker = pickle.loads(pickle.dumps(rank))
    assert opened == [shards[1]["prefix"]]  # unpickled in a loader worker: nothing opened yet
    assert worker.range(last - 2, last).tolist() == want_end
    assert opened == [shards[1]["prefix"], shards[-1]["prefix"]]


def test_a_side_car_for_other_tokens_is_still_refused(annotated, tmp_path, monkeypatch):
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.data import CorpusSpans

    prefix, shards, docs = annotated
    CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))  # the entry exists and is valid
    _annotate(prefix.parent, shards, docs, 4, shift=1)  # side-cars made for other token counts
    calls = _count_length_reads(monkeypatch)
    with pytest.raises(ValueError, match=r"c_00000\.spans\.json was made for other tokens"):
        CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))
    assert calls  # their headers make another key: checked again, not taken from the old entry


def test_build_index_prebuilds_the_side_car_check(annotated, tmp_path, monkeypatch):
    from trainer.data.build_index import _check_sidecars
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.data import CorpusSpans

    prefix, _, _ = annotated
    assert _check_sidecars(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))  # what build_index runs
    calls = _count_length_reads(monkeypatch)
    prebuilt = CachePolicy(tmp_path / "cache", builder=False, timeout=0, prebuilt_only=True)
    assert len(CorpusSpans(IndexedCorpus(prefix, prebuilt)).starts) == 4 and calls == []
    IndexedCorpus(prefix, CachePolicy(tmp_path / "other"))  # the corpus arrays only, not the side-car check
    with pytest.raises(FileNotFoundError, match="side-car check"):  # data.require_prebuilt_index without it
        CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "other", builder=False, prebuilt_only=True)))


def _record(prefix, shards) -> None:
    """What data_prep/annotate.py does after writing the side-cars: their headers into the manifest."""
    import json

    from data_prep.annotate import record_sidecars

    record_sidecars(prefix, [json.loads((prefix.parent / (spec["prefix"] + ".spans.json")).read_text())
                             for spec in shards])


def _count_opens(monkeypatch) -> list:
    """Names of the ``.spans.json`` files opened from now on."""
    import builtins

    opened, real = [], builtins.open

    def counting(file, *args, **kwargs):
        if str(file).endswith(".spans.json"):
            opened.append(Path(file).name)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    return opened


@pytest.mark.parametrize("in_manifest", [True, False])
def test_a_rank_reads_no_side_car_header_at_start_up_when_the_manifest_records_them(annotated, tmp_path, monkeypatch,
                                                                                    in_manifest):
    """Issue 25: the side-car check's key came from every shard's ``.spans.json``, read by every rank at start-up
    (1,000 small reads per rank for 1,000 shards). With the headers recorded in the manifest (``data_prep/annotate.py``
    records them), a rank opens a header only when it first reads that shard's spans. A corpus annotated before
    (``in_manifest=False``) still works and reads every header at start-up, as before: the control."""
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.data import CorpusSpans

    prefix, shards, _ = annotated
    if in_manifest:
        _record(prefix, shards)
    reference = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))  # rank 0 builds the check
    lo = int(reference.starts[1])
    want = reference.range(lo, lo + 2).tolist()
    opened = _count_opens(monkeypatch)
    rank = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache", builder=False, timeout=0)))
    start_up = list(opened)
    assert rank.range(lo, lo + 2).tolist() == want
    if in_manifest:
        assert start_up == [] and opened == [shards[1]["prefix"] + ".spans.json"]
    else:
        assert sorted(start_up) == sorted(spec["prefix"] + ".spans.json" for spec in shards)


def test_a_side_car_rewritten_after_the_manifest_recorded_it_is_refused(annotated, tmp_path):
    """The manifest's record makes the check's key, so a side-car rewritten behind it (without annotate.py's
    recording) is caught where it is read: on a rank's first read of that shard (here: spans for other token
    counts), and by a check entry built for it (here: another annotator, same tokens); the message names the file
    and says to annotate again."""
    import json

    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.data import CorpusSpans

    prefix, shards, docs = annotated
    _record(prefix, shards)
    CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))  # checked and valid
    _annotate(prefix.parent, shards, docs, 4, shift=1)
    rank = CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache", builder=False, timeout=0)))
    with pytest.raises(ValueError, match=r"c_00000\.spans\.json .* is not the side-car .*manifest.json recorded.*"
                                         r"python -m data_prep\.annotate"):
        rank.range(0, 2)
    _annotate(prefix.parent, shards, docs, 4)  # the recorded tokens again, but another annotator's spans
    header = prefix.parent / "c_00002.spans.json"
    header.write_text(json.dumps({**json.loads(header.read_text()), "annotator": "another"}))
    with pytest.raises(ValueError, match=r"c_00002\.spans\.json .* is not the side-car .*manifest.json recorded"):
        CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "fresh")))  # a new check entry compares them all
    _annotate(prefix.parent, shards, docs, 4, shift=1)
    _record(prefix, shards)  # annotated again (recorded): another key, so checked again, refused for its tokens
    with pytest.raises(ValueError, match=r"c_00000\.spans\.json was made for other tokens"):
        CorpusSpans(IndexedCorpus(prefix, CachePolicy(tmp_path / "cache")))
