"""The held-out split (data.valid_split, trainer/data/heldout.py): which documents train, which evaluate, and the
evaluation set at any world size."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from test_samples import write_shards  # noqa: F401  (helper)
from trainer.data.config import DataConfig
from trainer.data.corpus import IndexedCorpus
from trainer.data.dataset import PretrainingDataset
from trainer.data.heldout import DocumentSplit, held_out_mask, held_out_one, shard_key
from trainer.data.sample_index import build_index

DOCS = 240
TOKEN0 = 10  # every token of document d is TOKEN0 + d: a sample's tokens name the documents it read


def _docs(seed: int = 0) -> list:
    """240 documents of 1-6 sentences of 1-9 tokens, document d's tokens all TOKEN0 + d."""
    rng = np.random.default_rng(seed)
    return [[[TOKEN0 + d] * int(rng.integers(1, 10)) for _ in range(int(rng.integers(1, 7)))] for d in range(DOCS)]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(corpus prefix, documents) in 3 shards."""
    docs = _docs()
    return write_shards(docs, tmp_path_factory.mktemp("heldout") / "toy", 1000, docs_per_shard=90), docs


def _held(corpus, fraction) -> np.ndarray:
    split = DocumentSplit(corpus, fraction)
    return np.array([split.held_out(d) for d in range(corpus.num_documents)])


def test_valid_split_is_checked_with_the_key_named(toy):
    prefix, _ = toy
    for bad in (0.5, 0.9, -0.01):
        with pytest.raises(ValidationError, match=r"data.valid_split=.*below 0.5"):
            DataConfig(corpora=[{"prefix": str(prefix)}], valid_split=bad)
    with pytest.raises(ValidationError, match="set one of them"):
        DataConfig(corpora=[{"prefix": str(prefix)}], valid_corpora=[{"prefix": str(prefix)}], valid_split=0.1)
    assert DataConfig(corpora=[{"prefix": str(prefix)}]).valid_split == 0.0


def test_the_split_is_a_keyed_hash_of_shard_name_and_document(toy):
    prefix, _ = toy
    corpus = IndexedCorpus(prefix)
    key = shard_key(corpus.shards[1][0])
    mask = held_out_mask(key, 90, 0.3)
    assert mask.tolist() == [held_out_one(key, j, 0.3) for j in range(90)]  # the scalar twin agrees
    held = _held(corpus, 0.3)
    assert held[90:180].tolist() == mask.tolist()  # global documents 90..179 are shard 1's
    assert 0.15 < held.mean() < 0.45  # ~30 % of 240
    assert shard_key("/a/toy_00001") == shard_key("/b/toy_00001") != shard_key("/a/toy_00002")  # the name, not folder
    assert not _held(corpus, 0.0).any()


@pytest.mark.parametrize("fmt", ["full-sentences", "doc-sentences", "segment-pair", "sentence-pair", "sop-pair"])
def test_training_never_reads_a_held_out_document_and_reads_every_kept_one(toy, fmt):
    prefix, docs = toy
    corpus = IndexedCorpus(prefix)
    held = _held(corpus, 0.2)
    assert 20 < held.sum() < 80

    def sentences_read(index):
        out = np.zeros(corpus.num_sentences, np.int64)
        for s, e, _ in index.chunks.tolist():
            out[s:e] += 1
        return out

    train = sentences_read(build_index(corpus, fmt, 24, 0.1, seed=3, nsp_prob=0.5, valid_split=0.2))
    heldout = sentences_read(build_index(corpus, fmt, 24, 0.1, seed=3, nsp_prob=0.5, valid_split=0.2,
                                         role="heldout"))
    full = sentences_read(build_index(corpus, fmt, 24, 0.1, seed=3, nsp_prob=0.5))
    doc_of = corpus.document_of(np.arange(corpus.num_sentences))
    in_held = held[doc_of]
    assert not train[in_held].any()  # no sentence of a held-out document trains
    assert not heldout[~in_held].any()  # the held-out index reads only held-out documents
    # token accounting: the kept documents' sentences are read exactly as often as without a split, where the walk
    # stays within documents (every format but full-sentences); full-sentences reads every kept sentence once
    if fmt == "full-sentences":
        assert (train[~in_held] == 1).all() and (heldout[in_held] == 1).all()
    else:
        assert np.array_equal(train[~in_held], full[~in_held]) and np.array_equal(heldout[in_held], full[in_held])
    tokens = corpus.sentence_lengths()
    assert (train * tokens).sum() + (heldout * tokens).sum() == (full * tokens).sum() or fmt == "full-sentences"


def _tokenizer():
    return SimpleNamespace(pad_id=0, cls_id=1, sep_id=2, mask_id=3, special_ids=[0, 1, 2, 3], vocab_size=1000,
                           word_start=None)


@pytest.mark.parametrize("fmt", ["segment-pair", "full-sentences"])
def test_no_training_sample_holds_a_held_out_token_nsp_negatives_included(toy, tmp_path, fmt):
    prefix, _ = toy
    cfg = DataConfig(corpora=[{"prefix": str(prefix)}], format=fmt, max_seq_length=24, valid_split=0.2,
                     cache_dir=str(tmp_path), num_workers=0)
    train = PretrainingDataset(cfg, _tokenizer(), seed=5)
    corpus = train.corpora[0]
    held = _held(corpus, 0.2)
    seen, negatives = set(), 0
    for sample_id in range(len(train.builders[0].index)):  # a whole epoch, before masking
        sample, _ = train.unmasked(0, 0, sample_id)
        seen.update((sample["tokens"][sample["tokens"] >= TOKEN0] - TOKEN0).tolist())
        negatives += int(sample.get("sentence_label", 0))
    assert not seen & set(np.flatnonzero(held).tolist())
    kept_with_a_sample = set(np.flatnonzero(~held).tolist())
    if fmt == "full-sentences":
        assert seen == kept_with_a_sample  # every kept document trains
    else:
        assert negatives > 20  # the B sides of these were redrawn off held-out documents
    valid = PretrainingDataset(cfg, _tokenizer(), seed=5, split="valid")
    own = set()
    for sample_id in range(len(valid.builders[0].index)):
        s = valid.builders[0].index.chunks[sample_id]
        own.update(corpus.document_of(np.arange(s[0], s[1])).tolist())
    assert own and own <= set(np.flatnonzero(held).tolist())


@pytest.mark.parametrize("source", ["valid_split", "valid_corpora"])
def test_the_evaluation_set_is_the_same_at_one_and_two_ranks_and_after_a_resume(toy, tmp_path, monkeypatch, source):
    import data_prep.manifest
    from trainer.config import batch_plan, load_config
    from trainer.pretrain import build_components

    prefix, _ = toy
    tok = SimpleNamespace(**vars(_tokenizer()), path=None)
    monkeypatch.setattr(data_prep.manifest, "tokenizer_dir", lambda prefix: None)
    monkeypatch.setattr("data_prep.tokenizer.load_tokenizer", lambda path: tok)

    def rows(world_size: int) -> list:
        held_out = ("data.valid_split=0.2" if source == "valid_split" else f"data.valid_corpora=[{{prefix: {prefix}}}]")
        cfg = load_config("tiny_roberta", [f"data.corpora=[{{prefix: {prefix}}}]", held_out,
                                           f"data.cache_dir={tmp_path}", "data.num_workers=0",
                                           "data.format=full-sentences", "data.max_seq_length=24",
                                           "train.eval_batches=2", "train.eval_every=1", f"run_dir={tmp_path / 'run'}",
                                           "model.vocab_size=1000", "model.pad_token_id=0"])
        cfg.train.micro_batch_size = batch_plan(cfg.train, world_size)[0]  # as pretrain.run sets it
        out = []
        for rank in range(world_size):
            comps = build_components(cfg, rank, world_size, "cpu")
            for batch in comps.eval_batches():
                ids = batch["input_ids"].clone()
                for r, (pos, lab) in enumerate(zip(batch["mlm_positions"], batch["mlm_labels"])):
                    ids[r, pos[lab >= 0]] = lab[lab >= 0]  # undo the masking: the text each row was built from
                for row, mask in zip(ids, batch["attention_mask"]):
                    out.append(tuple(row[mask.bool()].tolist()))
        return out

    one, two, again = rows(1), rows(2), rows(1)
    assert len(one) == 2 * 16  # train.eval_batches x global_batch_size, whatever the world size
    assert sorted(one) == sorted(two) and one == again
    tokens = {t - TOKEN0 for row in one for t in row if t >= TOKEN0}
    held = set(np.flatnonzero(_held(IndexedCorpus(prefix), 0.2)).tolist())
    assert len(tokens) > 5 and (tokens <= held or source == "valid_corpora")  # held-out documents only
    assert max(tokens) > 90  # shuffled: not only the first shard's documents (0..89)


def test_the_compiled_walk_takes_the_same_documents(toy):
    prefix, _ = toy
    corpus = IndexedCorpus(prefix)
    for fmt in ("full-sentences", "doc-sentences", "segment-pair"):
        for role in ("train", "heldout"):
            a, b = (build_index(corpus, fmt, 24, 0.1, seed=3, pack=True, nsp_prob=0.5, valid_split=0.2, role=role,
                                compiled=compiled) for compiled in (False, True))
            assert np.array_equal(a.chunks, b.chunks) and (a.row_ptr is None or np.array_equal(a.row_ptr, b.row_ptr))


def _walk_each_run_alone(prefix: str, first: int, layout, compiled: bool) -> np.ndarray:
    """The reference: every run of chosen documents cut out of the shard (its own lengths and document array,
    numbered from 0) and walked alone, one ``walk`` call per run, as main did before the loop moved into the
    compiled code (2026-12-06)."""
    from trainer.data import index_kernels as K
    from trainer.data.corpus import idx_arrays
    from trainer.data.order import M64, mix64

    lengths, _, docs = idx_arrays(prefix)
    docs = np.asarray(docs, np.int64)
    chosen = held_out_mask(shard_key(prefix), len(docs) - 1, layout.valid_split)
    chosen = ~chosen if layout.role == "train" else chosen
    mode = {"full-sentences": K.FULL_SENTENCES, "sentence-pair": K.SENTENCE_PAIR}.get(layout.fmt, K.WITHIN_DOCUMENT)
    keep_min = 2 if layout.fmt in ("segment-pair", "sop-pair", "sentence-pair") else 1
    run = K.kernels(len(lengths), compiled)
    out, rows, got = np.empty((len(lengths) + 1, 3), np.int64), np.empty(len(lengths) + 1, np.int64), []
    d = 0
    while d < len(chosen):
        if not chosen[d]:
            d += 1
            continue
        hi = d
        while hi < len(chosen) and chosen[hi]:
            hi += 1
        s0, m = int(docs[d]), int(docs[hi] - docs[d])
        k, s, _ = run.walk(lengths[s0:s0 + m], docs[d:hi + 1] - s0, first + s0, 0, 0, m, mode, layout.budget,
                           layout.min_sent, layout.min_tail, keep_min, np.uint64(mix64(layout.index_seed & M64)),
                           float(layout.short_seq_prob), float(layout.nsp_prob), out, rows)
        assert s >= m  # the buffer holds the whole run
        got.append(out[:k].copy())
        d = hi
    return np.concatenate(got) if got else np.zeros((0, 3), np.int64)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_walk_over_runs_equals_each_run_walked_alone(toy, compiled):
    """The held-out split's runs of documents are walked inside one kernel call (walk_runs) and resumed across
    full buffers (a block of 2 rows here): the chunks must be those of each run walked alone, for every format,
    both roles and splits from 0.005 to 0.45."""
    from trainer.data.sample_index import Layout, _walk

    prefix, _ = toy
    corpus = IndexedCorpus(prefix)
    checked = 0
    for fmt, nsp in (("full-sentences", 0.0), ("doc-sentences", 0.0), ("segment-pair", 0.5), ("sop-pair", 0.0),
                     ("sentence-pair", 0.5)):
        for split in (0.005, 0.2, 0.45):
            for role in ("train", "heldout"):
                layout = Layout(fmt, 24, 0.1, 3, False, nsp_prob=nsp, valid_split=split, role=role)
                for shard, first, _ in corpus.shards:
                    want = _walk_each_run_alone(shard, first, layout, compiled)
                    parts = [c for c, _ in _walk((shard, first, layout, 2, compiled))]
                    have = np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)
                    assert np.array_equal(have, want), (fmt, split, role, shard)
                    checked += len(want)
    assert checked > 1000


def test_the_index_cache_key_holds_the_split_and_the_role(toy, tmp_path):
    from trainer.data.sample_index import load_or_build

    prefix, _ = toy
    corpus = IndexedCorpus(prefix)
    paths = {load_or_build(corpus, "doc-sentences", 24, 0.1, 3, False, tmp_path, 0.5, split, role).path
             for split, role in ((0.0, "train"), (0.2, "train"), (0.3, "train"), (0.2, "heldout"))}
    assert len(paths) == 4 and sum("heldout" in p.name for p in paths) == 1
    with pytest.raises(ValueError, match="held-out index needs data.valid_split > 0"):
        load_or_build(corpus, "doc-sentences", 24, 0.1, 3, False, tmp_path, 0.5, 0.0, "heldout")


def test_ernie_refuses_the_split_at_config_time(toy):
    from trainer.config import ConfigError, load_config

    prefix, _ = toy
    with pytest.raises(ConfigError, match="valid_split=0.1: the held-out split is not supported by the 'ernie'"):
        load_config("tiny_ernie", [f"data.corpora=[{{prefix: {prefix}}}]", "data.valid_split=0.1", "run_dir=/tmp/x",
                                   "model.vocab_size=1000", "model.pad_token_id=0"])


def test_a_split_that_holds_out_nothing_stops_at_start(toy, tmp_path, monkeypatch):
    """The held-out index is built when the components are (before step 1), not at the first evaluation: a
    data.valid_split too small to hold out a usable document stops the run before it trains, naming the key."""
    import data_prep.manifest
    from trainer.config import load_config
    from trainer.pretrain import build_components

    prefix, _ = toy
    assert not _held(IndexedCorpus(prefix), 0.0005).any()
    tok = SimpleNamespace(**vars(_tokenizer()), path=None)
    monkeypatch.setattr(data_prep.manifest, "tokenizer_dir", lambda prefix: None)
    monkeypatch.setattr("data_prep.tokenizer.load_tokenizer", lambda path: tok)
    cfg = load_config("tiny_roberta", [f"data.corpora=[{{prefix: {prefix}}}]", "data.valid_split=0.0005",
                                       "train.eval_every=2",
                                       f"data.cache_dir={tmp_path}", "data.num_workers=0",
                                       "data.format=full-sentences", "data.max_seq_length=24",
                                       f"run_dir={tmp_path / 'run'}", "model.vocab_size=1000", "model.pad_token_id=0"])
    with pytest.raises(ValueError, match=r"data.valid_split=0.0005 holds out no document"):
        build_components(cfg, 0, 1, "cpu")
    # a run that never evaluates (train.eval_every 0) does not build or read the held-out set: it is not stopped
    quiet = cfg.model_copy(update={"train": cfg.train.model_copy(update={"eval_every": 0})})
    assert build_components(quiet, 0, 1, "cpu").eval_batches is None


def test_an_evaluation_larger_than_the_held_out_data_says_it_rereads_it(toy, tmp_path, monkeypatch, capsys):
    """The evaluation takes train.eval_batches x the global batch positions of the held-out order, cycling a smaller
    held-out set (roberta_base with a 2 % split of a small corpus: 12 samples read 22 times each) without a word."""
    import data_prep.manifest
    from trainer.config import load_config
    from trainer.pretrain import build_components

    prefix, _ = toy
    tok = SimpleNamespace(**vars(_tokenizer()), path=None)
    monkeypatch.setattr(data_prep.manifest, "tokenizer_dir", lambda prefix: None)
    monkeypatch.setattr("data_prep.tokenizer.load_tokenizer", lambda path: tok)
    sets = [f"data.corpora=[{{prefix: {prefix}}}]", "data.valid_split=0.05", "train.eval_every=2",
            f"data.cache_dir={tmp_path}", "data.num_workers=0", "data.format=full-sentences",
            "data.max_seq_length=24", f"run_dir={tmp_path / 'run'}", "model.vocab_size=1000", "model.pad_token_id=0"]
    held = len(PretrainingDataset(load_config("tiny_roberta", sets).data, tok, 0, split="valid"))
    big = load_config("tiny_roberta", [*sets, "train.global_batch_size=16", f"train.eval_batches={held}"])
    build_components(big, 0, 1, "cpu")
    said = capsys.readouterr().out
    assert f"each evaluation reads {16 * held} samples" in said and f"the held-out data holds {held}: it reads them " \
        f"~16.0 times over" in said, said
    small = load_config("tiny_roberta", [*sets, "train.global_batch_size=1", f"train.eval_batches={held}"])
    build_components(small, 0, 1, "cpu")
    assert "each evaluation reads" not in capsys.readouterr().out
