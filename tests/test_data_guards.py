"""Guards of the data path against wrong results and hangs at cluster scale (issue 21 item 10): a failed index build
on the builder rank stops the waiting ranks with its error, cache keys follow the code that lays the files out,
seeds and epochs are bounded before anything starts."""
from __future__ import annotations

import os
from pathlib import Path
import time

import numpy as np
import pytest

from test_samples import en_prepared, en_tokenizer, write_shards  # noqa: F401
from trainer.data.cache_file import CachePolicy
from trainer.data.corpus import IndexedCorpus
from trainer.data.sample_index import load_or_build


def _rank_opens(prefix, cache, rank, launch, queue):
    """One rank of a job: open the corpus and its segment-pair index as the dataset does (rank 0 builds)."""
    os.environ.update(RANK=str(rank), TORCHELASTIC_RUN_ID=launch)
    start = time.monotonic()
    try:
        policy = CachePolicy(cache, builder=rank == 0, timeout=30)
        load_or_build(IndexedCorpus(prefix, policy), "segment-pair", 32, 0.0, 1, False, policy)
        queue.put((rank, "ok", time.monotonic() - start))
    except Exception as err:  # noqa: BLE001 - reported to the test
        queue.put((rank, f"{type(err).__name__}: {err}", time.monotonic() - start))


def test_a_failed_build_on_rank_0_stops_the_waiting_rank_with_rank_0s_error(tmp_path, monkeypatch):
    """Rank 0's build raises (one-sentence documents give no segment pairs); rank 1, waiting with a 30 s
    data.index_wait_timeout, stops with rank 0's error instead of waiting it out (before: TimeoutError after 30 s,
    with a 1 h default). Two processes as a launcher starts them (RANK and one launch id each)."""
    import multiprocessing as mp

    prefix = write_shards([[[5 + i % 7, 6, 7]] for i in range(40)], tmp_path / "titles", 100)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_opens, args=(prefix, tmp_path / "cache", r, "job-1", queue)) for r in (1, 0)]
    for p in procs:
        p.start()
    results = dict((r, (msg, secs)) for r, msg, secs in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
    assert results[0][0].startswith("ValueError") and "no 'segment-pair' sample can be built" in results[0][0]
    message = results[1][0]
    assert message.startswith("BuildFailed: rank 0") and "no 'segment-pair' sample can be built" in message, message
    assert "index-titles-segment-pair" in message
    # a later launch's waiter does not take the earlier launch's note for its own builder's failure: it opens the
    # file once that builder (here: a thread of this process, another launch) has written it
    import threading

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-2")
    good = write_shards([[[5, 6], [7, 8, 9], [10]] for _ in range(20)], tmp_path / "docs", 100)
    cache = tmp_path / "cache2"
    corpus = IndexedCorpus(good, CachePolicy(cache))
    from trainer.data.cache_file import failure_note_path, settings_hash
    from trainer.data.sample_index import index_path, index_settings

    key = settings_hash(index_settings(corpus, "segment-pair", 32, 0.0, 1, False))
    note = failure_note_path(index_path(corpus, "segment-pair", key, cache))
    note.write_text('{"key": "%s", "launch": "torchrun:job-1:0", "rank": 0, "error": "old"}' % key)
    builder = threading.Timer(1.0, lambda: load_or_build(corpus, "segment-pair", 32, 0.0, 1, False, cache))
    builder.start()
    index = load_or_build(corpus, "segment-pair", 32, 0.0, 1, False, CachePolicy(cache, builder=False, timeout=60))
    builder.join(timeout=120)  # done before monkeypatch puts the environment back
    assert len(index) > 0 and not note.exists()  # the builder removed the old note before building


def test_cache_keys_follow_the_code_that_lays_the_files_out(tmp_path, monkeypatch):
    """A shared cache_dir used by two checkouts: the one whose index code differs (here: a copy of index_kernels.py
    with one line changed, standing in for another checkout's) gets its own index and corpus files instead of the
    other's. The hand-bumped versions key them too. Before: the keys held the version constants only."""
    import shutil

    import trainer.data.corpus as C
    import trainer.data.sample_index as S
    from trainer.data.sample_index import index_settings, settings_hash

    prefix = write_shards([[[5, 6], [7, 8, 9], [10]] for _ in range(20)], tmp_path / "docs", 100)
    cache = tmp_path / "cache"

    def keys():
        corpus = IndexedCorpus(prefix, CachePolicy(cache))
        index = load_or_build(corpus, "doc-sentences", 32, 0.0, 1, False, cache)
        assert index.key == settings_hash(index_settings(corpus, "doc-sentences", 32, 0.0, 1, False))
        return corpus.cache_key(), index.key

    first = keys()
    assert keys() == first  # the same code: the same files
    other = tmp_path / "other_checkout"
    other.mkdir()
    copies = [Path(shutil.copy(p, other)) for p in S.LAYOUT_SOURCES]
    monkeypatch.setattr(S, "LAYOUT_SOURCES", tuple(copies))
    assert keys()[1] == first[1]  # identical sources, another place: still the same index
    copies[1].write_text(copies[1].read_text() + "\nBLOCK_EXTRA = 1\n")
    changed = keys()
    assert changed[0] == first[0] and changed[1] != first[1]
    monkeypatch.setattr(S, "INDEX_VERSION", S.INDEX_VERSION + 1)
    assert keys()[1] not in (first[1], changed[1])
    corpus_copy = Path(shutil.copy(C.LAYOUT_SOURCES[0], other))
    corpus_copy.write_text(corpus_copy.read_text() + "\n# another layout\n")
    monkeypatch.setattr(C, "LAYOUT_SOURCES", (corpus_copy,))
    assert keys()[0] != first[0]
    assert len(list(cache.glob("corpus-docs-*.bfc"))) == 2 and len(list(cache.glob("index-docs-*.bfc"))) == 3


@pytest.mark.parametrize("setting, key", [("seed=-1", "seed"), (f"seed={2**32}", "seed"),
                                          ("data.masking.dupe_factor=16777216", "data.masking.dupe_factor")])
def test_seeds_and_epochs_out_of_range_are_refused_at_validation(setting, key):
    """``--set seed=-1`` passed validation and raised OverflowError in a loader worker (sample_key); 2**32 and up
    overflowed numpy's legacy seeding (np.random.seed) at start-up."""
    from trainer.config import ConfigError, apply_override, config_from_dict

    raw = {"run_dir": "/tmp/x", "model": {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 2},
           "data": {"corpora": [{"prefix": "unused"}]}, "objective": {"name": "mlm"},
           "train": {"steps": 10, "global_batch_size": 16, "micro_batch_size": 2}, "optim": {"lr": 1e-3},
           "deepspeed": {"config": "ds_configs/zero2.json"}}
    assert config_from_dict(raw).seed == 1234
    apply_override(raw, setting)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict(raw)


def test_finetune_seed_is_bounded():
    from pydantic import ValidationError

    from trainer.finetune.config import FinetuneConfig

    assert FinetuneConfig(seed=0).seed == 0
    for bad in (-1, 2**32):
        with pytest.raises(ValidationError, match="seed"):
            FinetuneConfig(seed=bad)


def test_a_run_past_the_epochs_a_sample_key_numbers_is_refused_when_the_loader_is_built(tmp_path):
    """train.steps x global batch over a tiny corpus past 2**24 epochs: refused when the loader is built (before any
    step), naming the settings. Before: the loader was built and the first batch past the limit raised
    OverflowError in a worker, after hours of training."""
    from types import SimpleNamespace

    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset
    from trainer.data.loader import Collator, build_dataloader

    MAX_EPOCHS = 1 << 24  # the epochs sample_key numbers (24 bits)
    prefix = write_shards([[[5, 6, 7], [8, 9]] for _ in range(6)], tmp_path / "tiny", 100)
    cfg = DataConfig(corpora=[{"prefix": str(prefix)}], format="doc-sentences", max_seq_length=16,
                     cache_dir=str(tmp_path / "cache"), num_workers=0)
    tok = SimpleNamespace(pad_id=0, cls_id=1, sep_id=2, mask_id=3, vocab_size=100, special_ids=[0, 1, 2, 3])
    dataset = PretrainingDataset(cfg, tok, seed=1)
    collator = Collator(0, 16, 20)
    n = len(dataset)
    build_dataloader(dataset, collator, 0, n, n, 0, 1, total_samples=MAX_EPOCHS * n, num_workers=0)  # the limit
    with pytest.raises(ValueError, match=r"train\.steps x train\.global_batch_size .* lower train\.steps"):
        build_dataloader(dataset, collator, 0, n, n, 0, 1, total_samples=(MAX_EPOCHS + 1) * n, num_workers=0)


@pytest.mark.parametrize("fmt", ["segment-pair", "sentence-pair"])
def test_nsp_negatives_put_their_unused_sentences_back_so_an_epoch_reads_every_token(tmp_path, fmt):
    """One epoch of NSP samples (every sample id once) holds every token of every document, in A or in a
    positive's B, as BERT's create_instances does (``i -= num_unused_segments``; a one-sentence document is a
    one-segment chunk, a negative). Each token id occurs once in the corpus, so a sample's tokens name their
    positions. Documents are short enough that nothing is truncated. Before: a negative dropped its chunk's B
    sentences (about a quarter of the tokens); until 2026-12-06 one-sentence documents were never read (4.2 % of
    the tokens of a corpus of short texts, measured by review)."""
    from types import SimpleNamespace

    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset

    rng = np.random.default_rng(5)
    docs, next_id = [], 10
    for _ in range(300):
        doc = []
        for _ in range(int(rng.integers(1, 7))):
            n = int(rng.integers(1, 6))
            doc.append(list(range(next_id, next_id + n)))
            next_id += n
        docs.append(doc)
    prefix = write_shards(docs, tmp_path / "unique", 8000, docs_per_shard=70)
    cfg = DataConfig(corpora=[{"prefix": str(prefix)}], format=fmt, max_seq_length=128, short_seq_prob=0.0,
                     nsp_negative_prob=0.5, cache_dir=str(tmp_path / "cache"), num_workers=0)
    tok = SimpleNamespace(pad_id=0, cls_id=2, sep_id=3, mask_id=4, vocab_size=8000, special_ids=[0, 1, 2, 3, 4])
    dataset = PretrainingDataset(cfg, tok, seed=1)
    own_doc = {t: d for d, doc in enumerate(docs) for s in doc for t in s}
    one_sentence_docs = {tuple(doc[0]) for doc in docs if len(doc) == 1}
    seen, negatives, forced = set(), 0, 0
    for sample_id in range(len(dataset)):
        sample, _ = dataset.unmasked(0, 0, sample_id)
        toks, types = sample["tokens"], sample["token_types"]
        a = [int(t) for t in toks[types == 0] if t >= 10]
        b = [int(t) for t in toks[types == 1] if t >= 10]
        assert len(toks) < 128  # nothing truncated
        seen.update(a)
        if tuple(a) in one_sentence_docs:  # a one-segment chunk: always a negative, as in BERT
            assert sample["sentence_label"] == 1
            forced += 1
        if sample["sentence_label"]:
            negatives += 1
            assert {own_doc[t] for t in b}.isdisjoint({own_doc[a[0]]})
        else:
            seen.update(b)
    every = {t for doc in docs for s in doc for t in s}
    assert sum(len(doc) == 1 for doc in docs) > 30  # one-sentence documents are among them
    assert every - seen == set(), f"{len(every - seen)} of {len(every)} tokens never read in an epoch"
    assert forced == len(one_sentence_docs)
    assert 0.35 < (negatives - forced) / (len(dataset) - forced) < 0.65
    # the compiled walk (corpora of 200k+ sentences per shard) lays out the same negatives and put-backs
    from trainer.data.sample_index import build_index

    corpus = dataset.corpora[0]
    compiled = build_index(corpus, fmt, 128, 0.0, cfg.index_seed, False, compiled=True, nsp_prob=0.5)
    assert np.array_equal(compiled.chunks, dataset.builders[0].index.chunks)


def test_the_walk_within_documents_stops_at_the_document_end(tmp_path, monkeypatch):
    """Issue 25 item 3: one-sentence documents (titles, queries) in doc-sentences: the walk looks at each sentence
    about twice (its cost, then the chunk's tokens) instead of scanning up to ``budget`` sentences past the document
    end and clamping afterwards (before: ~budget looks per sentence, 60x slower builds). Counted, not timed: the
    interpreted walk calls the module's ``cost1`` per look. The chunks are the same (test_scale's reference)."""
    import trainer.data.index_kernels as K
    from trainer.data.sample_index import build_index

    docs = [[[5 + i % 50, 6]] for i in range(2000)]
    corpus = IndexedCorpus(write_shards(docs, tmp_path / "titles", 100), CachePolicy(tmp_path / "cache"))
    looks = []
    cost1 = K.cost1
    monkeypatch.setattr(K, "cost1", lambda *a: (looks.append(1), cost1(*a))[1])
    index = build_index(corpus, "doc-sentences", 128, 0.0, 1, False, compiled=False)
    assert len(index) == 2000 and np.array_equal(index.chunks[:, 1] - index.chunks[:, 0], np.ones(2000))
    assert len(looks) <= 3 * 2000, f"{len(looks) / 2000:.0f} looks per sentence"


def test_a_blend_weight_with_no_slot_is_refused():
    """Issue 25 item 7 (this and the next two): refused with the setting to change. Before: the corpus was never
    read."""
    from trainer.data.order import Blend

    assert Blend([1.0, 0.001, 0.001], period=1000).per_period.tolist() == [998, 1, 1]
    with pytest.raises(ValueError, match=r"corpus 2 .* data\.blend_period=1,000"):
        Blend([1.0, 1e-4, 1e-4], period=1000)  # megatron's blending gives one of the two the only small slot


def test_a_shard_whose_last_document_pointer_is_off_is_refused_at_open(tmp_path):
    """Before: opened, and patched quietly where the index is built."""
    import struct

    prefix = write_shards([[[5, 6], [7]], [[8, 9]]], tmp_path / "off", 100)
    IndexedCorpus(prefix, CachePolicy(tmp_path / "cache"))
    idx = tmp_path / "off_00000.idx"
    raw = bytearray(idx.read_bytes())
    raw[-8:] = struct.pack("<q", 2)  # the last document ends at sentence 2 of 3
    idx.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"off_00000: .*last document ends at sentence 2, not at its 3 sentences"):
        IndexedCorpus(prefix, CachePolicy(tmp_path / "cache2"))


def test_build_index_refuses_a_mistyped_option_and_accepts_the_trainers(capsys):
    """Before: any unknown option was ignored (--wokers 4 built with the default workers)."""
    from trainer.data import build_index

    with pytest.raises(SystemExit) as exit_:
        build_index.parse_args(["--config", "tiny_bert", "--wokers", "4"])
    assert exit_.value.code == 2 and "unrecognized arguments: --wokers 4" in capsys.readouterr().err
    args = build_index.parse_args(["--config", "tiny_bert", "--resume", "none", "--workers", "3"])  # trainer's
    assert args.workers == 3


def test_a_full_sentences_chunk_may_end_on_a_document_end_at_the_full_budget(tmp_path):
    """Issue 25 item 7: sentences of 4 and 6 tokens ending a document fill a budget of 10 exactly ([CLS] 4 6 [SEP]:
    the row's final [SEP] closes the document); the walk counted that document's [SEP] too and planned the chunk one
    token short (4 + 7 > 10: a 4-token chunk, then a 6-token one)."""
    from trainer.data.sample_index import build_index

    prefix = write_shards([[[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]], [[15, 16, 17]]], tmp_path / "fs", 100)
    corpus = IndexedCorpus(prefix, CachePolicy(tmp_path / "cache"))
    for compiled in (False, True):
        index = build_index(corpus, "full-sentences", 12, 0.0, 1, False, compiled=compiled)  # budget 10
        assert index.chunks[:, :2].tolist() == [[0, 2], [2, 3]], compiled


def test_index_build_threads_are_capped_by_a_memory_budget(tmp_path, monkeypatch):
    """Issue 25 item 4 (part): ``--workers $SLURM_CPUS_ON_NODE`` (128-224) started that many threads with 2 shards
    each in flight, ~56 bytes per sentence of the largest shard apiece (~25 GB at 224 threads and 1M-sentence
    shards). The threads are now capped by a memory budget; the index is the same. Observed through the thread
    pool the build starts (a recording subclass of concurrent.futures.ThreadPoolExecutor)."""
    import concurrent.futures

    import trainer.data.sample_index as S

    sizes = []

    class Recording(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers=None, *a, **k):
            if k.get("thread_name_prefix") == "index":  # the index builder's pool (not other libraries')
                sizes.append(max_workers)
            super().__init__(max_workers, *a, **k)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Recording)
    docs = [[[5 + (i + j) % 40, 6, 7] for j in range(1 + i % 5)] for i in range(400)]
    corpus = IndexedCorpus(write_shards(docs, tmp_path / "many", 100, docs_per_shard=20), CachePolicy(tmp_path / "c"))
    reference = S.build_index(corpus, "doc-sentences", 32, 0.1, 1, False)
    largest = max(count for _, _, count in corpus.shards)
    # room for 3 threads (56 bytes per sentence: sample_index.SHARD_BYTES_PER_SENTENCE)
    monkeypatch.setattr(S, "BUILD_MEMORY", 2 * 56 * largest * 3, raising=False)
    built = S.load_or_build(corpus, "doc-sentences", 32, 0.1, 1, False, CachePolicy(tmp_path / "c", workers=16))
    assert sizes == [3] and np.array_equal(built.chunks, reference.chunks)
    assert S.threads_for(224, 1_000_000, 1000, budget=2 << 30) == 19  # the default budget, 1M-sentence shards
    assert S.threads_for(224, 10**10, 5, budget=2 << 30) == 1


@pytest.mark.parametrize("fmt,packed", [("doc-sentences", False), ("full-sentences", False), ("doc-sentences", True)])
def test_a_shard_larger_than_the_memory_budget_is_walked_in_pieces(tmp_path, fmt, packed):
    """Issue 25 item 4: a shard whose walk would hold more than half the build's memory budget (a single-file corpus
    of 2B sentences: ~100 GB) is walked in the writer's thread after the shards before it and handed over one block
    at a time, while the small shards still go through the threads; the index is the one the in-memory build gives.
    Packed doc-sentences need the whole shard's row sizes, so that shard comes whole."""
    import trainer.data.sample_index as S

    docs = [[[5 + (i + j) % 40, 6, 7] for j in range(30 if 40 <= i < 60 else 1 + i % 5)] for i in range(200)]
    corpus = IndexedCorpus(write_shards(docs, tmp_path / "c", 100, docs_per_shard=20), CachePolicy(tmp_path / "x"))
    sizes = [n for _, _, n in corpus.shards]
    assert sizes[2] == 600 and max(sizes[:2] + sizes[3:]) <= 100
    budget = 2 * S.SHARD_BYTES_PER_SENTENCE * 100 * 3  # 3 threads' worth of small shards; shard 2 is over half
    assert S.threads_for(16, 100, 9, budget) == 3
    reference = S.build_index(corpus, fmt, 16, 0.1, 1, packed)
    layout = S.Layout(fmt, 16, 0.1, 1, packed, S.nsp_share(fmt, 0.0), 0.0, "train")
    pieces = list(S._run([(p, first, layout, 8, None) for p, first, _ in corpus.shards], 16, sizes, budget))
    assert np.array_equal(np.concatenate([c for c, _ in pieces]), reference.chunks)
    first = [f for _, f, _ in corpus.shards]
    in_big = (reference.chunks[:, 0] >= first[2]) & (reference.chunks[:, 0] < first[3])
    big = int(in_big.sum())
    if packed:  # every shard one piece
        assert len(pieces) == len(sizes)
    else:  # the small shards whole, the large one in blocks of at most 8 chunks
        assert big > 40 and len(pieces) >= len(sizes) - 1 + -(-big // 8)
        assert all(len(c) <= 8 for c, _ in pieces[2:len(pieces) - (len(sizes) - 3)])
    built = S.load_or_build(corpus, fmt, 16, 0.1, 1, packed, CachePolicy(tmp_path / "x", workers=16, memory=budget))
    assert np.array_equal(built.chunks, reference.chunks)
    if packed:
        assert np.array_equal(built.row_ptr, reference.row_ptr)


def test_only_the_builder_touches_shard_files_at_open_and_the_others_read_lazily(tmp_path):
    """Issue 25 item 5: at 128 ranks x 1,000 shards every rank stat-ed and opened every shard at start (~400,000
    metadata operations in a burst on a Lustre server). Now the builder rank checks the shards; any other rank
    takes the counts from the manifest and the token dtypes from the corpus cache, and opens a shard only when it
    reads it. Shown with the shard files moved away: a non-builder opens the corpus without them, the builder
    refuses, and reads work again once they are back."""
    import shutil

    from trainer.data.corpus import ShardMismatch

    docs = [[[5 + (i + j) % 40, 6, 7] for j in range(1 + i % 3)] for i in range(60)]
    prefix = write_shards(docs, tmp_path / "c", 100, docs_per_shard=20)
    built = IndexedCorpus(prefix, CachePolicy(tmp_path / "cache"))
    expected = [built.read(s, s + 1).tolist() for s in range(built.num_sentences)]
    away = tmp_path / "away"
    away.mkdir()
    files = sorted(tmp_path.glob("c_0000*.bin")) + sorted(tmp_path.glob("c_0000*.idx"))
    assert len(files) == 6
    for f in files:
        shutil.move(f, away / f.name)
    other = IndexedCorpus(prefix, CachePolicy(tmp_path / "cache", builder=False, timeout=1.0))
    assert (other.num_sentences, other.num_documents) == (built.num_sentences, built.num_documents)
    assert [s.dtype for s in other._shards] == [np.dtype(np.uint16)] * 3
    with pytest.raises(FileNotFoundError):
        other.read(0, 1)
    with pytest.raises(ShardMismatch, match="c_00000.bin is missing"):
        IndexedCorpus(prefix, CachePolicy(tmp_path / "cache"))
    for f in files:
        shutil.move(away / f.name, f)
    assert [other.read(s, s + 1).tolist() for s in range(other.num_sentences)] == expected


def test_corpora_of_different_tokenizers_with_one_vocab_size_are_refused(tmp_path):
    """Reviewer bug 4: a blend (data.corpora) or an evaluation set (data.valid_corpora) prepared with another
    tokenizer of the same vocabulary size was mixed in silently (only vocab_size was compared). Now the dataset
    refuses it before building anything, naming both prefixes and both manifests' tokenizer fingerprints."""
    import json
    from types import SimpleNamespace

    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset

    docs = [[[5, 6, 7], [8, 9]] for _ in range(6)]
    a = write_shards(docs, tmp_path / "a", 100)
    same = write_shards(docs, tmp_path / "same", 100)
    other = write_shards(docs, tmp_path / "other", 100)
    manifest = Path(f"{other}.manifest.json")
    m = json.loads(manifest.read_text())
    m["tokenizer"]["fingerprint"] = "f" * 64  # what another tokenizer of 100 ids writes
    manifest.write_text(json.dumps(m))
    tok = SimpleNamespace(pad_id=0, cls_id=1, sep_id=2, mask_id=3, vocab_size=100, special_ids=[0, 1, 2, 3])
    common = dict(format="doc-sentences", max_seq_length=16, cache_dir=str(tmp_path / "cache"), num_workers=0)
    PretrainingDataset(DataConfig(corpora=[{"prefix": str(a)}, {"prefix": str(same)}], **common), tok, seed=1)
    blend = DataConfig(corpora=[{"prefix": str(a)}, {"prefix": str(other)}], **common)
    valid = DataConfig(corpora=[{"prefix": str(a)}], valid_corpora=[{"prefix": str(other)}], **common)
    for cfg, split in ((blend, "train"), (valid, "train"), (valid, "valid")):
        with pytest.raises(ValueError, match="different tokenizers") as err:
            PretrainingDataset(cfg, tok, seed=1, split=split)
        assert str(a) in str(err.value) and str(other) in str(err.value)
        assert "test" in str(err.value) and "f" * 64 in str(err.value)


@pytest.mark.parametrize("option,value", [("--workers", "-1"), ("--workers", "0"), ("--memory-gb", "nan"),
                                          ("--memory-gb", "-2.5"), ("--memory-gb", "inf")])
def test_build_index_refuses_invalid_numbers(option, value, capsys):
    """Reviewer (smaller items): `build_index --workers -1` and `--memory-gb nan` were accepted."""
    from trainer.data import build_index

    assert build_index.main(["--config", "tiny_bert", option, value]) == 2
    assert f"error: {option} {value}: must be" in capsys.readouterr().err


def test_sop_pair_without_swaps_reads_one_sentence_documents_as_one_segment_rows(tmp_path):
    """ELECTRA's recipes (sop-pair, nsp_negative_prob 0): its ExampleBuilder writes a row at every document end, a
    one-sentence document included, as [CLS] A [SEP]. sop-pair never read them (0 of 200 one-sentence documents on a
    corpus of short texts, diff review). ALBERT's SOP (swaps at 0.5) keeps pairs only."""
    from types import SimpleNamespace

    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset

    rng = np.random.default_rng(3)
    docs, next_id = [], 10
    for d in range(240):
        doc = []
        for _ in range(1 if d % 2 else int(rng.integers(2, 6))):
            n = int(rng.integers(1, 6))
            doc.append(list(range(next_id, next_id + n)))
            next_id += n
        docs.append(doc)
    prefix = write_shards(docs, tmp_path / "half_single", 4000, docs_per_shard=80)
    tok = SimpleNamespace(pad_id=0, cls_id=2, sep_id=3, mask_id=4, vocab_size=4000, special_ids=[0, 1, 2, 3, 4])
    singles = {tuple(doc[0]) for doc in docs if len(doc) == 1}
    for negative, want_singles in ((0.0, len(singles)), (0.5, 0)):
        cfg = DataConfig(corpora=[{"prefix": str(prefix)}], format="sop-pair", max_seq_length=128, short_seq_prob=0.0,
                         nsp_negative_prob=negative, cache_dir=str(tmp_path / f"cache{negative}"), num_workers=0)
        dataset = PretrainingDataset(cfg, tok, seed=1)
        seen, single_rows = set(), 0
        for sample_id in range(len(dataset)):
            sample, _ = dataset.unmasked(0, 0, sample_id)
            toks, types = sample["tokens"], sample["token_types"]
            content = [int(t) for t in toks if t >= 10]
            seen.update(content)
            if tuple(content) in singles:
                single_rows += 1
                assert toks[0] == 2 and toks[-1] == 3 and (toks == 3).sum() == 1 and not types.any()
                assert sample["sentence_label"] == 0
        assert single_rows == want_singles
        if negative == 0.0:
            assert {t for doc in docs for s in doc for t in s} <= seen  # every token of every document read
