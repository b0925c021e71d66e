"""The data path at scale, tested small: mapped arrays instead of private copies, the block-built index against a
one-shot reference, the keyed epoch permutation, cache files that survive crashes, races and corruption."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from test_samples import data_config, en_prepared, en_tokenizer, run_in_processes, write_shards  # noqa: F401
from trainer.data.cache_file import CachePolicy, is_mapped, read_header
from trainer.data.corpus import IndexedCorpus, idx_arrays
from trainer.data.dataset import PretrainingDataset
from trainer.data.loader import Collator
from trainer.data.order import EpochOrder, KeyedPermutation, PretrainingBatchSampler
from trainer.data.sample_index import (build_index, content_budget, index_path, index_settings, load_or_build,
                                       settings_hash)

FORMATS = [("full-sentences", False), ("doc-sentences", False), ("doc-sentences", True), ("segment-pair", False),
           ("sop-pair", False), ("sentence-pair", False)]


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """Several shards of documents with 1 to 9 sentences of 1 to 30 tokens (some single-sentence documents)."""
    rng = np.random.default_rng(0)
    docs = [[list(rng.integers(5, 90, int(rng.integers(1, 31)))) for _ in range(int(rng.integers(1, 10)))]
            for _ in range(60)]
    return write_shards(docs, tmp_path_factory.mktemp("ragged") / "rg", 100, docs_per_shard=13)


def sentence_targets(index_seed: int, sentences: np.ndarray, budget: int, short_seq_prob: float) -> np.ndarray:
    """sample_index.py's ``target(s)`` for many sentences at once, in numpy (the reference for the walk's scalar
    ``index_kernels.target1``): splitmix64 of (sentence, seed); short with probability ``short_seq_prob``, then
    uniform in [2, budget]."""
    from trainer.data.order import M64, mix64, mix64_many

    s = np.asarray(sentences, dtype=np.uint64)
    h = mix64_many(s * np.uint64(0x9E3779B97F4A7C15) + np.uint64(mix64(index_seed & M64)))
    u = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    target = np.full(len(s), budget, np.int64)
    short = u < short_seq_prob
    if short.any():
        h2 = mix64_many(h[short] ^ np.uint64(0x94D049BB133111EB))
        target[short] = 2 + (h2 % np.uint64(budget - 1)).astype(np.int64)
    return target


def reference_index(corpus: IndexedCorpus, fmt: str, T: int, short: float, seed: int, pack: bool):
    """sample_index.py's rules applied in one shot to whole-corpus arrays (the old build's shape), as an
    independent reference for the block-by-block, shard-parallel build."""
    budget = content_budget(fmt, T)
    lengths = corpus.sentence_lengths()
    n = len(lengths)
    s = np.arange(n)
    doc_end = np.asarray(corpus.doc_starts)[corpus.document_of(s) + 1]
    shard_end = np.zeros(n, np.int64)
    for _, first, count in corpus.shards:
        shard_end[first:first + count] = first + count
    cost = lengths.copy()
    if fmt == "full-sentences":
        cost[doc_end - 1] += 1
    cum = np.concatenate([[0], np.cumsum(cost)])
    target = sentence_targets(seed, s, budget, short)
    min_sent = 2 if fmt in ("segment-pair", "sop-pair") else 1
    if fmt == "sentence-pair":
        nxt = s + 2
    else:
        # in full-sentences a chunk ending on a document end needs no [SEP] of its own (the row's last closes it):
        # the end at e costs cum[e] - 1 when sentence e - 1 ends a document (non-decreasing in e: searchsorted)
        ends = np.concatenate([[0], cum[1:] - (fmt == "full-sentences") * (doc_end - 1 == s)])
        fit = np.searchsorted(ends, cum[:-1] + target, side="right") - 1
        nxt = np.minimum(np.maximum(fit, s + min_sent), s + budget)
    if fmt != "full-sentences":
        nxt = np.minimum(nxt, doc_end)
        tail = doc_end - nxt
        nxt = np.where((tail > 0) & (tail < max(min_sent, 2 if fmt == "sentence-pair" else 1)), doc_end, nxt)
    nxt = np.minimum(nxt, shard_end)
    rows, sizes = [], []
    for _, first, count in corpus.shards:
        chain, x = [], first
        while x < first + count:
            chain.append(x)
            x = int(nxt[x])
        shard_rows = []
        for a in chain:
            b = int(nxt[a])
            if cum[b] - cum[a] > 0 and (fmt not in ("segment-pair", "sop-pair", "sentence-pair") or b - a >= 2):
                shard_rows.append((a, b, int(target[a]), min(int(cum[b] - cum[a]), budget) + 2))
        if fmt == "doc-sentences" and pack:  # next-fit; long rows alone
            open_row, used = [], 0
            for r in shard_rows:
                if r[3] * 2 > T:
                    rows.append(r[:3])
                    sizes.append(1)
                    continue
                if used + r[3] > T:
                    rows += open_row
                    sizes.append(len(open_row))
                    open_row, used = [], 0
                open_row.append(r[:3])
                used += r[3]
            if open_row:
                rows += open_row
                sizes.append(len(open_row))
        else:
            rows += [r[:3] for r in shard_rows]
    return np.array(rows, np.int64).reshape(-1, 3), np.array(sizes, np.int64)


# -- the corpus and its mapped arrays ----------------------------------------------------------------------------------
def test_idx_arrays_are_megatron_core_indexed_dataset_arrays(ragged):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    corpus = IndexedCorpus(ragged, CachePolicy(ragged.parent / "c0"))
    for prefix, _, _ in corpus.shards:
        ds = IndexedDataset(prefix)
        mine = idx_arrays(prefix)
        for a, b in zip(mine, (ds.sequence_lengths, ds.index.sequence_pointers, ds.document_indices)):
            assert np.array_equal(a, b)
        assert all(is_mapped(a) for a in mine)
    opened = [(IndexedDataset(p), c) for p, _, c in corpus.shards]  # alive: its __del__ closes the map under views
    all_tokens = np.concatenate([np.array(ds[i]) for ds, c in opened for i in range(c)])
    assert np.array_equal(corpus.read(0, corpus.num_sentences), all_tokens)


@pytest.mark.parametrize("fmt,pack", FORMATS)
def test_block_built_index_equals_the_one_shot_reference(ragged, tmp_path, fmt, pack):
    corpus = IndexedCorpus(ragged, CachePolicy(tmp_path))
    assert len(corpus.shards) >= 4
    T, short, seed = 48, 0.3, 17
    chunks, sizes = reference_index(corpus, fmt, T, short, seed, pack)
    packed = fmt == "doc-sentences" and pack
    # sop-pair as ALBERT's SOP (swaps, pairs only: the reference's layout); without swaps it is ELECTRA's, whose
    # one-sentence documents are rows of their own (test_data_guards)
    nsp = 0.5 if fmt == "sop-pair" else 0.0
    # blocks smaller than a chunk, unaligned with shards, and one block per shard; the walk interpreted and compiled
    for block, compiled in ((1, False), (7, False), (1 << 20, False), (1, True), (7, True), (1 << 20, True)):
        got = build_index(corpus, fmt, T, short, seed, pack, block=block, compiled=compiled, nsp_prob=nsp)
        assert np.array_equal(got.chunks, chunks), (fmt, block, compiled)
        if packed:
            assert np.array_equal(np.diff(got.row_ptr), sizes)
    # the file the trainer maps: built by 3 worker processes, equal to the in-memory build
    mapped = load_or_build(corpus, fmt, T, short, seed, pack, CachePolicy(tmp_path, workers=3), nsp_prob=nsp)
    assert np.array_equal(mapped.chunks, chunks) and is_mapped(mapped.chunks)
    assert (mapped.row_ptr is not None) == packed
    if packed:
        assert np.array_equal(np.diff(mapped.row_ptr), sizes) and is_mapped(mapped.row_ptr)


def test_dataset_holds_mapped_arrays_and_pickles_paths_not_arrays(en_prepared, en_tokenizer, tmp_path):
    cfg = data_config(en_prepared, format="doc-sentences", pack_doc_sentences=True, max_seq_length=64,
                      cache_dir=str(tmp_path))
    ds = PretrainingDataset(cfg, en_tokenizer, seed=3)
    corpus, index = ds.corpora[0], ds.builders[0].index
    for p in (0, 5, 3 * len(ds) + 1):
        ds[p]  # opens the maps that reading needs
    shard_maps = [a for s in corpus._shards for a in (s.lengths, s.pointers, s.tokens) if a is not None]
    assert shard_maps  # the .idx and .bin maps that reading opened
    for arr in (corpus.doc_starts, index.chunks, index.row_ptr, *shard_maps):
        assert is_mapped(arr) and not arr.flags.owndata
    assert not any(isinstance(v, np.ndarray) and v.size > 100_000 for v in vars(ds).values())
    blob = pickle.dumps(ds)
    assert len(blob) < sum(a.nbytes for a in shard_maps) + index.chunks.nbytes  # paths travel, not the arrays
    assert len(blob) < 200_000
    again = pickle.loads(blob)
    assert is_mapped(again.corpora[0].doc_starts) and is_mapped(again.builders[0].index.chunks)
    assert all(s.lengths is None and s.tokens is None for s in again.corpora[0]._shards)  # re-mapped on first read
    for p in (0, 5, 3 * len(ds) + 1):
        a, b = ds[p], again[p]
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert all(is_mapped(s.lengths) for s in again.corpora[0]._shards if s.lengths is not None)


def test_loader_workers_under_spawn_give_the_same_batches(en_prepared, en_tokenizer, tmp_path):
    cfg = data_config(en_prepared, format="segment-pair", max_seq_length=64, cache_dir=str(tmp_path))
    ds = PretrainingDataset(cfg, en_tokenizer, seed=5)
    collate = Collator(en_tokenizer.pad_id, 64, cfg.masking.max_predictions_per_seq)

    def batches(**kw):
        sampler = PretrainingBatchSampler(8, 8, 4, 0, 1, total_samples=24)
        return list(torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate, **kw))

    plain = batches()
    spawned = batches(num_workers=2, multiprocessing_context="spawn")
    assert len(plain) == len(spawned) == 4
    for a, b in zip(plain, spawned):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if k != "packing")
        assert torch.equal(a["packing"].indices, b["packing"].indices)
        assert torch.equal(a["packing"].cu_seqlens, b["packing"].cu_seqlens)


def test_a_new_training_seed_reuses_the_index_and_index_seed_changes_it(en_prepared, en_tokenizer, tmp_path):
    cfg = data_config(en_prepared, format="full-sentences", max_seq_length=64, cache_dir=str(tmp_path))
    a = PretrainingDataset(cfg, en_tokenizer, seed=1)
    files = sorted(tmp_path.glob("index-*.bfc"))
    b = PretrainingDataset(cfg, en_tokenizer, seed=2)
    assert sorted(tmp_path.glob("index-*.bfc")) == files and a.builders[0].index.path == b.builders[0].index.path
    assert [a.locate(g) for g in range(50)] != [b.locate(g) for g in range(50)]  # the order follows the seed
    c = PretrainingDataset(cfg.model_copy(update={"index_seed": 99}), en_tokenizer, seed=1)
    assert len(list(tmp_path.glob("index-*.bfc"))) == 2 and c.builders[0].index.path != a.builders[0].index.path


# -- the keyed permutation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 64, 97, 128, 255, 256, 257, 1000, 1024, 4093, 65536,
                               65537])
def test_keyed_permutation_is_a_permutation(n):
    for key in (0, 1, 2**63 + 5):
        p = KeyedPermutation(n, key)
        out = p.many(np.arange(n))
        assert np.array_equal(np.sort(out), np.arange(n))
        sample = range(0, n, max(1, n // 50))
        assert [p(x) for x in sample] == out[list(sample)].tolist()  # the scalar and the vectorised agree


def test_keyed_permutation_looks_random():
    from scipy.stats import spearmanr

    n = 100_003
    p = KeyedPermutation(n, 12345).many(np.arange(n))
    assert abs(spearmanr(np.arange(n), p)[0]) < 0.02  # position says nothing about the sample id
    assert abs(spearmanr(p[:-1], p[1:])[0]) < 0.02  # neighbouring positions are unrelated
    assert np.mean(np.abs(np.diff(p)) < n // 100) < 0.05  # few neighbours are close in id (expected 2 %)
    q = KeyedPermutation(n, 12346).many(np.arange(n))
    assert np.mean(p == q) < 0.001 and abs(spearmanr(p, q)[0]) < 0.02  # another key: another order
    assert np.array_equal(KeyedPermutation(n, 12345).many(np.arange(n)), p)  # deterministic


def test_epoch_orders_differ_by_epoch_and_seed_and_resume_exactly():
    a, b = EpochOrder(10_000, seed=3), EpochOrder(10_000, seed=4)
    e0, e1 = a.batch(np.arange(10_000))[1], a.batch(np.arange(10_000, 20_000))[1]
    assert not np.array_equal(e0, e1) and not np.array_equal(e0, b.batch(np.arange(10_000))[1])
    deep = 37 * 10_000 + 123
    assert a(deep) == EpochOrder(10_000, seed=3)(deep) == (37, int(a.batch([deep])[1][0]))
    assert EpochOrder(10, seed=1, shuffle=False)(25) == (2, 5)


# -- cache files: crashes, races, corruption, waiting ---------------------------------------------------------------------
def test_a_killed_builder_leaves_no_final_file_and_a_rerun_completes(ragged, tmp_path):
    code = f"""
import os, signal
import trainer.data.cache_file as cf
from trainer.data.cache_file import CachePolicy
from trainer.data.corpus import IndexedCorpus
from trainer.data.sample_index import load_or_build
corpus = IndexedCorpus({str(ragged)!r}, CachePolicy({str(tmp_path)!r}))
real = cf.os.replace
def die(src, dst):
    if "index-" in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)  # killed after writing everything, just before the rename
    real(src, dst)
cf.os.replace = die
load_or_build(corpus, "segment-pair", 48, 0.1, 1, False, CachePolicy({str(tmp_path)!r}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9, proc.stderr
    assert not list(tmp_path.glob("index-*.bfc")) and list(tmp_path.glob(".index-*.tmp-*"))
    corpus = IndexedCorpus(ragged, CachePolicy(tmp_path))
    index = load_or_build(corpus, "segment-pair", 48, 0.1, 1, False, CachePolicy(tmp_path))
    assert np.array_equal(index.chunks, build_index(corpus, "segment-pair", 48, 0.1, 1, False).chunks)
    assert not list(tmp_path.glob(".index-*.tmp-*"))  # the dead builder's temporary was removed


def _race(prefix, cache, queue):
    corpus = IndexedCorpus(prefix, CachePolicy(cache))
    index = load_or_build(corpus, "doc-sentences", 48, 0.1, 1, True, CachePolicy(cache, workers=2))
    queue.put(np.asarray(index.chunks).tobytes())


def test_two_concurrent_builders_end_with_one_valid_index(ragged, tmp_path):
    results = run_in_processes(_race, (ragged, tmp_path), 2, "spawn", 300)
    finals = list(tmp_path.glob("index-*.bfc"))
    assert len(finals) == 1 and results[0] == results[1] and not list(tmp_path.glob(".*tmp*"))
    assert read_header(finals[0])["kind"] == "sample-index"


def test_truncated_or_foreign_files_are_rebuilt_with_a_warning(ragged, tmp_path):
    corpus = IndexedCorpus(ragged, CachePolicy(tmp_path))
    good = load_or_build(corpus, "full-sentences", 48, 0.1, 1, False, tmp_path).chunks.copy()
    (path,) = tmp_path.glob("index-*.bfc")
    for damage in (lambda b: b[:len(b) - 10], lambda b: b"not a cache file at all" + b[23:],
                   lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:]):
        path.write_bytes(damage(path.read_bytes()))
        with pytest.warns(UserWarning, match=f"{path.name}.*rebuilding"):
            again = load_or_build(corpus, "full-sentences", 48, 0.1, 1, False, tmp_path)
        assert np.array_equal(again.chunks, good)
    other = tmp_path / "elsewhere"
    other.mkdir()
    key = settings_hash(index_settings(corpus, "full-sentences", 48, 0.1, 2, False))
    os.link(path, index_path(corpus, "full-sentences", key, other))  # a valid file under another key's name
    with pytest.warns(UserWarning, match="foreign"):
        load_or_build(corpus, "full-sentences", 48, 0.1, 2, False, other)


def test_waiting_ranks_time_out_naming_the_file_and_prebuilt_only_prints_the_command(ragged, tmp_path):
    corpus = IndexedCorpus(ragged, CachePolicy(tmp_path))
    waiter = CachePolicy(tmp_path, builder=False, timeout=0.5)
    with pytest.raises(TimeoutError, match=r"waited.*index-rg-sop-pair-.*\.bfc, which rank 0 builds"):
        load_or_build(corpus, "sop-pair", 48, 0.1, 1, False, waiter)
    strict = CachePolicy(tmp_path, prebuilt_only=True, hint="python -m trainer.data.build_index --config X")
    with pytest.raises(FileNotFoundError, match="(?s)index-rg-sop-pair.*missing.*build_index --config X"):
        load_or_build(corpus, "sop-pair", 48, 0.1, 1, False, strict)
    load_or_build(corpus, "sop-pair", 48, 0.1, 1, False, tmp_path)  # built: now both open it at once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_or_build(corpus, "sop-pair", 48, 0.1, 1, False, waiter))
        assert len(load_or_build(corpus, "sop-pair", 48, 0.1, 1, False, strict))


def test_a_waiting_rank_opens_the_file_once_rank_0_has_renamed_it(ragged, tmp_path):
    import threading

    corpus = IndexedCorpus(ragged, CachePolicy(tmp_path))
    done = threading.Event()
    threading.Timer(1.0, lambda: (load_or_build(corpus, "segment-pair", 48, 0.1, 1, False, tmp_path),
                                  done.set())).start()
    index = load_or_build(corpus, "segment-pair", 48, 0.1, 1, False, CachePolicy(tmp_path, builder=False, timeout=120))
    assert done.wait(60) and is_mapped(index.chunks)


def test_the_evaluation_dataset_is_built_once_per_run(en_prepared, en_tokenizer, tmp_path, monkeypatch):
    import data_prep.manifest
    import trainer.data.dataset as D
    from trainer.config import load_config
    from trainer.pretrain import build_components

    monkeypatch.setattr(data_prep.manifest, "tokenizer_dir", lambda prefix: en_tokenizer.path)  # fixture: no record
    cfg = load_config("tiny_roberta", [f"data.corpora=[{{prefix: {en_prepared}}}]",
                                       f"data.valid_corpora=[{{prefix: {en_prepared}}}]", f"data.cache_dir={tmp_path}",
                                       "train.eval_batches=2", "train.eval_every=1", f"run_dir={tmp_path / 'run'}",
                                       f"model.vocab_size={en_tokenizer.vocab_size}",
                                       f"model.pad_token_id={en_tokenizer.pad_id}"])
    splits = []
    real = D.PretrainingDataset.__init__

    def counting(self, cfg, tokenizer, seed, split="train"):
        splits.append(split)
        real(self, cfg, tokenizer, seed, split)

    monkeypatch.setattr(D.PretrainingDataset, "__init__", counting)
    comps = build_components(cfg, 0, 1, "cpu")
    evaluations = [[b["input_ids"] for b in comps.eval_batches()] for _ in range(3)]
    # train.eval_batches x global_batch_size samples: 2 x 16 in micro-batches of 4 at one rank
    assert splits.count("valid") == 1 and len(evaluations[0]) == 2 * 16 // 4
    assert all(torch.equal(a, b) for a, b in zip(evaluations[0], evaluations[2]))  # the same held-out batches


def test_offline_builder_then_ranks_that_require_a_prebuilt_index(en_prepared, en_tokenizer, tmp_path, capsys):
    from trainer.data.build_index import main

    sets = ["--set", f"data.corpora=[{{prefix: {en_prepared}}}]", "--set", f"data.cache_dir={tmp_path}",
            "--set", "model.vocab_size=2000", "--set", "model.pad_token_id=0", "--set", "data.format=segment-pair",
            "--set", "data.short_seq_prob=0.1"]  # data_config's below (RoBERTa's recipes inject no short rows)
    assert main(["--config", "tiny_roberta", *sets, "--workers", "2", "--memory-gb", "0.5", "--resume", "auto"]) == 0
    (index,) = tmp_path.glob("index-*-segment-pair-*.bfc")
    mtime = index.stat().st_mtime_ns
    assert main(["--config", "tiny_roberta", *sets]) == 0 and index.stat().st_mtime_ns == mtime  # found, not rebuilt
    assert "segment-pair' samples" in capsys.readouterr().out
    cfg = data_config(en_prepared, format="segment-pair", max_seq_length=64, cache_dir=str(tmp_path),
                      require_prebuilt_index=True)
    ds = PretrainingDataset(cfg, en_tokenizer, seed=9)
    assert ds.builders[0].index.path == index and index.stat().st_mtime_ns == mtime
    with pytest.raises(FileNotFoundError, match="(?s)require_prebuilt_index.*python -m trainer.data.build_index"):
        PretrainingDataset(cfg.model_copy(update={"max_seq_length": 96}), en_tokenizer, seed=9)
    assert main(["--config", "tiny_roberta", "--set", "data.format=nonsense"]) == 2
    assert main(["--config", "tiny_roberta", *sets, "--memory-gb", "0"]) == 2
    assert "--memory-gb 0.0: must be positive" in capsys.readouterr().err


def test_sidecar_row_pointers_are_written_at_annotation_and_old_sidecars_still_read(tmp_path):
    from data_prep.sidecar import PTR_SUFFIX, SidecarReader, SidecarWriter

    rng = np.random.default_rng(1)
    per_sequence = [np.array([[a, a + 2, int(rng.integers(0, 2))] for a in range(0, 2 * int(rng.integers(0, 4)), 2)])
                    for _ in range(300)]
    writer = SidecarWriter(tmp_path / "s_00000", spec="external")
    writer.add_document_spans(per_sequence)
    assert writer.finalize()["row_pointers"] == "s_00000" + PTR_SUFFIX
    reader = SidecarReader(tmp_path / "s_00000", expect_sequences=300)
    assert is_mapped(reader._ptr) and is_mapped(reader.spans)
    expected = [reader[i].tolist() for i in range(300)]
    assert expected == [np.asarray(p).reshape(-1, 3).tolist() for p in per_sequence]
    again = pickle.loads(pickle.dumps(reader))
    assert len(pickle.dumps(reader)) < 1000 and is_mapped(again._ptr) and again[7].tolist() == expected[7]
    (tmp_path / ("s_00000" + PTR_SUFFIX)).unlink()  # a side-car written before the pointers existed
    old = SidecarReader(tmp_path / "s_00000", expect_sequences=300)
    assert [old[i].tolist() for i in range(300)] == expected and (tmp_path / ("s_00000" + PTR_SUFFIX)).exists()


def test_scalar_and_vectorised_targets_agree():
    from trainer.data.index_kernels import kernels
    from trainer.data.order import mix64
    from trainer.data.sample_index import Layout

    lay = Layout("segment-pair", 128, 0.3, 77, False)
    s = np.arange(10**9, 10**9 + 5000)
    t = sentence_targets(77, s, lay.budget, 0.3)
    seed_mix = np.uint64(mix64(77))
    for compiled in (False, True):
        target1 = kernels(0, compiled).target1
        assert [target1(int(x), seed_mix, lay.budget, 0.3) for x in s] == t.tolist()
    assert 0.25 < np.mean(t < lay.budget) < 0.35 and t.min() >= 2 and t.max() == lay.budget


def test_a_corpus_of_many_shards_fits_the_cache_header(tmp_path):
    """The header has a fixed size: what it holds must not grow with the number of shards (the settings, with the
    corpus fingerprint, go to a description file beside the cache file)."""
    prefix = write_shards([[[5 + i % 50, 6], [7, 8 + i % 30]] for i in range(400)], tmp_path / "many", 100,
                          docs_per_shard=1)
    corpus = IndexedCorpus(prefix, CachePolicy(tmp_path / "c"))
    assert len(corpus.shards) == 400
    index = load_or_build(corpus, "segment-pair", 32, 0.1, 1, False, CachePolicy(tmp_path / "c", workers=2))
    assert len(index) == 400 and read_header(index.path)["meta"]["samples"] == 400
    assert index.path.with_name(index.path.name + ".json").exists()


@pytest.mark.parametrize("sentences", [2, 3000])
def test_a_shard_whose_sentences_are_not_back_to_back_is_refused(tmp_path, sentences):
    """``read`` slices a sentence range as one piece of the .bin: pointers that do not follow the lengths (a shard
    not written by megatron-core's builder) are refused when the corpus cache is built, naming the shard."""
    rng = np.random.default_rng(3)
    docs = [[list(rng.integers(5, 90, int(rng.integers(1, 9)))) for _ in range(sentences // 2)] for _ in range(2)]
    prefix = write_shards(docs, tmp_path / "bb", 100)
    IndexedCorpus(prefix, CachePolicy(tmp_path / "ok"))  # as written: accepted
    shard = f"{prefix}_00000"
    lengths, pointers, _ = idx_arrays(shard)
    n, at = len(lengths), 1 + 1024 * ((len(lengths) - 2) // 1024)  # a checked sentence (1, 1025, ... or the last)
    with open(shard + ".idx", "r+b") as f:
        f.seek(34 + 4 * n + 8 * at)  # its pointer, as if an earlier sentence had been written twice
        f.write(np.int64(int(pointers[at]) + 2 * int(lengths[0])).tobytes())
    with pytest.raises(ValueError, match="bb_00000.bin does not hold its sentences back to back"):
        IndexedCorpus(prefix, CachePolicy(tmp_path / "bad"))


def test_a_corpus_of_many_small_shards_is_walked_compiled(tmp_path, monkeypatch):
    """The walk is compiled or interpreted for the whole corpus, by its total size: chosen per shard, a corpus of
    1,000 shards of 2,000 sentences was walked all interpreted (7.3 s, 47x megatron-core's build_mapping; 1.0-1.3 s
    compiled, bench/scale.py --io). Here COMPILE_FROM is lowered below the corpus (30 sentences in 3 shards of 10):
    every shard is walked compiled, and the index equals the interpreted one."""
    from trainer.data import index_kernels, sample_index
    from trainer.data.cache_file import CachePolicy, open_cache
    from trainer.data.corpus import IndexedCorpus

    rng = np.random.default_rng(0)
    docs = [[list(rng.integers(5, 90, rng.integers(3, 9))) for _ in range(5)] for _ in range(6)]
    prefix = write_shards(docs, tmp_path / "c" / "c", vocab_size=100, docs_per_shard=2)
    corpus = IndexedCorpus(prefix, CachePolicy(tmp_path / "cache"))
    assert len(corpus.shards) == 3 and all(n == 10 for _, _, n in corpus.shards)
    reference = sample_index.build_index(corpus, "segment-pair", 16, 0.1, 1234, pack=False, compiled=False)
    seen, real = [], index_kernels.kernels
    monkeypatch.setattr(index_kernels, "kernels", lambda n, compiled=None: seen.append(compiled) or real(n, compiled))
    monkeypatch.setattr(index_kernels, "COMPILE_FROM", 25)  # above every shard, below the corpus
    index = sample_index.load_or_build(corpus, "segment-pair", 16, 0.1, 1234, False, CachePolicy(tmp_path / "cache"))
    assert seen and all(c is True for c in seen), seen
    assert np.array_equal(np.asarray(index.chunks), np.asarray(reference.chunks))
