"""Sample formats over real indexed shards: NSP / SOP pairs, full- and doc-sentences, the sample index and its cache.

The top of this file also holds the corpus fixtures the other data/objective tests import: a WordPiece tokenizer
trained on the shared English corpus, and shards written in the layout of DESIGN.md "Shards and manifest" (megatron-core's builder plus data_prep's
manifest writer).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer.data.config import DataConfig
from trainer.data.corpus import IndexedCorpus
from trainer.data.dataset import PretrainingDataset
from trainer.data.formats import SampleBuilder
from trainer.data.sample_index import build_index, load_or_build



# ---------------------------------------------------------------------------------------------------------------------
# corpus fixtures (imported by test_masking, test_data_order, test_objectives)
# ---------------------------------------------------------------------------------------------------------------------
def read_documents(path: Path, limit: int | None = None) -> list[list[str]]:
    """Blank-line separated documents of one-sentence lines (the shared corpora's layout)."""
    docs, cur = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            cur.append(line.strip())
        elif cur:
            docs.append(cur)
            cur = []
        if limit and len(docs) >= limit:
            break
    if cur and (not limit or len(docs) < limit):
        docs.append(cur)
    return docs


def train_wordpiece(corpus: Path, out: Path, vocab_size: int = 2000):
    """A real tokenizer folder (data_prep/train_tokenizer.py) loaded the way the trainer loads it."""
    from data_prep.tokenizer import load_tokenizer
    from data_prep.train_tokenizer import main as train_tokenizer

    train_tokenizer(["--kind", "wordpiece", "--input", str(corpus), "--output", str(out), "--vocab-size",
                     str(vocab_size), "--quiet"])
    return load_tokenizer(out)


def write_shards(docs_ids: list[list[list[int]]], prefix: Path, vocab_size: int, docs_per_shard: int = 4000) -> Path:
    """Shards PREFIX_0000k.bin/.idx (one sequence per sentence, end_document per document) and their manifest,
    the layout build_indexed.py writes (DESIGN.md "Shards and manifest"); small hand-made corpora need exact
    control over sentence boundaries, which a text round trip through a tokenizer would not give."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from data_prep.manifest import sha256_file, totals_of, write_manifest

    prefix.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab_size < 65500 else np.int32
    shards = []
    for k in range(0, len(docs_ids), docs_per_shard):
        name = f"{prefix.name}_{k // docs_per_shard:05d}"
        base = str(prefix.parent / name)
        builder = IndexedDatasetBuilder(base + ".bin", dtype=dtype)
        part = docs_ids[k:k + docs_per_shard]
        for doc in part:
            for sent in doc:
                builder.add_item(torch.tensor(sent, dtype=torch.int64))
            builder.end_document()
        builder.finalize(base + ".idx")
        shards.append({"prefix": name, "documents": len(part), "sentences": sum(len(d) for d in part),
                       "tokens": sum(len(s) for d in part for s in d), "bin_bytes": Path(base + ".bin").stat().st_size,
                       "bin_sha256": sha256_file(base + ".bin"), "idx_sha256": sha256_file(base + ".idx"),
                       "input": "test", "input_range": [k, k + len(part)]})
    write_manifest(prefix, {
        "format": "bertfamily-indexed", "version": 1, "tool_version": "test",
        "tokenizer": {"path": "", "fingerprint": "test", "kind": "wordpiece", "vocab_size": vocab_size},
        "dtype": np.dtype(dtype).name, "shards": shards, "totals": totals_of(shards, 0), "inputs": [], "skipped": {},
        "settings": {}})
    return prefix


def encode_docs(tok, docs: list[list[str]]) -> list[list[list[int]]]:
    flat = tok.encode_batch([s for d in docs for s in d])
    out, i = [], 0
    for d in docs:
        sents = [s for s in flat[i:i + len(d)] if s]
        i += len(d)
        if sents:
            out.append(sents)
    return out


# Other test files import these fixtures, which makes each file's copy a fixture of its own; the cache below keeps
# the work to once per session (pytest imports this module once, as `test_samples`).
_SESSION_CACHE: dict = {}


def _once(key, make):
    if key not in _SESSION_CACHE:
        _SESSION_CACHE[key] = make()
    return _SESSION_CACHE[key]


@pytest.fixture(scope="session")
def en_tokenizer(en_corpus, tmp_path_factory):
    return _once("en_tokenizer", lambda: train_wordpiece(en_corpus, tmp_path_factory.mktemp("tok") / "wordpiece",
                                                         vocab_size=2000))


@pytest.fixture(scope="session")
def en_prepared(en_corpus, en_tokenizer, tmp_path_factory) -> Path:
    """The whole English corpus (~640 documents, one per standard-library module) as 4 shards; returns the prefix."""
    def make():
        docs = encode_docs(en_tokenizer, read_documents(en_corpus))
        return write_shards(docs, tmp_path_factory.mktemp("en") / "en", en_tokenizer.vocab_size,
                            docs_per_shard=-(-len(docs) // 4))
    return _once("en_prepared", make)


def data_config(prefix, **kw) -> DataConfig:
    return DataConfig(corpora=[{"prefix": str(prefix)}], **kw)


# ---------------------------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------------------------
def test_corpus_reads_back_what_was_written(tmp_path):
    docs = [[[5, 6, 7], [8]], [[9, 10]], [[11], [12, 13], [14]]]
    prefix = write_shards(docs, tmp_path / "toy", 100, docs_per_shard=2)
    corpus = IndexedCorpus(prefix)
    assert corpus.num_documents == 3 and corpus.num_sentences == 6
    assert corpus.doc_starts.tolist() == [0, 2, 3, 6]
    assert corpus.read(0, 6).tolist() == list(range(5, 15))  # crosses the shard boundary at sentence 3
    assert corpus.read(3, 5).tolist() == [11, 12, 13]
    assert corpus.document_of(np.array([0, 1, 2, 3, 5])).tolist() == [0, 0, 1, 2, 2]


def test_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="toy.manifest.json"):
        IndexedCorpus(tmp_path / "toy")
    (tmp_path / "bad.manifest.json").write_text(json.dumps({"format": "other", "shards": []}))
    with pytest.raises(ValueError, match="bad.manifest.json.*format"):
        IndexedCorpus(tmp_path / "bad")


def test_full_sentences_index_worked_example(tmp_path):
    # The example of sample_index.py's docstring: budget 10 = T - 2 with T = 12.
    docs = [[[1] * 4, [2] * 3, [3] * 5], [[4] * 6, [5] * 2]]
    corpus = IndexedCorpus(write_shards(docs, tmp_path / "ex", 100))
    index = build_index(corpus, "full-sentences", 12, 0.0, seed=1)
    assert index.chunks[:, :2].tolist() == [[0, 2], [2, 3], [3, 5]]
    doc = build_index(corpus, "doc-sentences", 12, 0.0, seed=1, pack=False)
    assert doc.chunks[:, :2].tolist() == [[0, 2], [2, 3], [3, 5]]


def _builder(prefix, fmt, T=128, short=0.1, seed=3, pack=True):
    corpus = IndexedCorpus(prefix)
    index = build_index(corpus, fmt, T, short, seed, pack, nsp_prob=0.5)  # NSP negatives are decided in the index
    return corpus, index, SampleBuilder(corpus, index, fmt, T, cls_id=2, sep_id=3)


def _segments(tokens, sep=3):
    seps = np.flatnonzero(tokens == sep)
    return tokens[1:seps[0]], tokens[seps[0] + 1:seps[1]]


def _locate(corpus, seg):
    """Global token offsets where ``seg`` occurs in the corpus (a brute-force reference)."""
    flat = corpus.read(0, corpus.num_sentences)
    n = len(seg)
    starts = np.flatnonzero(flat[:len(flat) - n + 1] == seg[0])
    return np.array([o for o in starts.tolist() if np.array_equal(flat[o:o + n], seg)], dtype=np.int64)


def test_nsp_negatives_come_from_other_documents_and_positives_are_contiguous(en_prepared):
    corpus, index, build = _builder(en_prepared, "segment-pair", short=0.0)
    cum = np.concatenate([[0], np.cumsum(corpus.sentence_lengths())])
    tok_doc = np.repeat(np.arange(corpus.num_documents), np.diff(cum[corpus.doc_starts]))
    labels, checked = [], 0
    for i in range(0, len(index), max(1, len(index) // 300)):
        s = build(i, np.random.default_rng(i))
        a, b = _segments(s["tokens"])
        assert len(s["tokens"]) <= 128 and len(a) and len(b)
        labels.append(s["sentence_label"])
        start, end, _ = index.chunks[i]
        own_doc = corpus.document_of(start)
        if s["sentence_label"] == 0:
            # B follows A inside the chunk's document (both possibly trimmed at their outer ends)
            chunk = corpus.read(start, end)
            ia = _locate_in(chunk, a)
            assert ia is not None and any(ib >= ia + len(a) for ib in _find(chunk, b))  # (b's text may repeat)
        else:
            # (B's text may repeat in many documents, its own among them: docstrings share boilerplate sentences)
            b_docs = {int(tok_doc[o]) for o in _locate(corpus, b)}
            assert b_docs - {own_doc}, f"sample {i}: negative B found in its own document only"
        checked += 1
    n = len(labels)
    rate = np.mean(labels)
    assert abs(rate - 0.5) < 4 * np.sqrt(0.25 / n), f"NSP negative rate {rate} over {n} samples"


def _locate_in(haystack, needle):
    if len(needle) == 0:
        return 0
    w = np.lib.stride_tricks.sliding_window_view(haystack, len(needle))
    hits = np.flatnonzero((w == needle).all(axis=1))
    return int(hits[0]) if len(hits) else None


def _find(hay: np.ndarray, seg: np.ndarray) -> list[int]:
    """Start offsets where ``seg`` occurs in ``hay`` (brute force: the reference)."""
    n = len(seg)
    return [o for o in range(len(hay) - n + 1) if np.array_equal(hay[o:o + n], seg)]


def test_sop_negatives_are_the_positive_swapped(en_prepared):
    corpus, index, build = _builder(en_prepared, "sop-pair", T=128, short=0.0)
    n = min(len(index), 400)
    n_neg = n_trimmed = 0
    for i in range(n):
        s = build(i, np.random.default_rng(1000 + i))
        start, end, _ = index.chunks[i]
        chunk = corpus.read(start, end)
        a, b = _segments(s["tokens"])
        assert (s["token_types"][:len(a) + 2] == 0).all() and (s["token_types"][len(a) + 2:] == 1).all()
        first, second = (b, a) if s["sentence_label"] else (a, b)  # the chunk's order
        if len(chunk) <= build.budget:
            joined = np.concatenate([first, second])
            assert joined.tolist() == chunk.tolist(), f"sample {i}: segments are not the chunk's two halves"
        else:
            # trimmed: the pair fills the budget; each side is one contiguous piece of the chunk, the first one
            # wholly before the second (trimming cuts only the ends of each side)
            n_trimmed += 1
            assert len(a) + len(b) == build.budget and len(a) > 0 and len(b) > 0
            assert any(pb >= pa + len(first) for pa in _find(chunk, first) for pb in _find(chunk, second)), \
                f"sample {i}: trimmed segments are not the chunk's first and second parts in this order"
        n_neg += s["sentence_label"]
    assert n_trimmed > 0  # the trimmed branch was exercised (7 of these 400 pairs)
    # negatives are drawn with probability 0.5: within 5 binomial standard deviations of n / 2
    assert abs(n_neg - n / 2) < 5 * (n * 0.25) ** 0.5, (n_neg, n)


def test_packed_rows_hold_more_samples_than_int8_counts(tmp_path):
    # 300 one-token documents at T = 512: every sample is [CLS] t [SEP] (3 tokens), so a packed row holds up to
    # 170 of them, past int8's 127
    docs = [[[10 + d % 50]] for d in range(300)]
    corpus = IndexedCorpus(write_shards(docs, tmp_path / "short", 100))
    index = build_index(corpus, "doc-sentences", 512, 0.0, seed=1, pack=True)
    build = SampleBuilder(corpus, index, "doc-sentences", 512, cls_id=2, sep_id=3)
    s = build(0, None)
    n = len(index.sample_chunks(0))
    assert n >= 128
    assert s["pack_ids"].tolist() == [k for k in range(1, n + 1) for _ in range(3)]
    assert s["tokens"][0::3].tolist() == [2] * n and s["tokens"][2::3].tolist() == [3] * n


def test_doc_sentences_never_cross_a_document_and_packing_fills_rows(en_corpus, en_tokenizer, tmp_path):
    docs = encode_docs(en_tokenizer, read_documents(en_corpus))
    # documents of 1 to 4 consecutive sentences of a module: a module's docstrings are one long document that fills
    # 128-token rows without packing; short documents (fortunes, tweets, Q&A) are where packing matters
    short_docs = []
    for doc in docs:
        i = 0
        while i < len(doc):
            n = 1 + len(short_docs) % 4
            short_docs.append(doc[i:i + n])
            i += n
    prefix = write_shards(short_docs, tmp_path / "short", en_tokenizer.vocab_size)
    corpus, index, build = _builder(prefix, "doc-sentences", T=128, short=0.0, pack=True)
    docs_of = corpus.document_of
    for i in range(len(index)):
        for start, end, _ in index.sample_chunks(i):
            assert docs_of(start) == docs_of(end - 1), f"sample {i} crosses a document"
    lengths = np.array([len(build(i, None)["tokens"]) for i in range(0, len(index), 7)])
    assert lengths.max() <= 128
    _, unpacked, build_u = _builder(prefix, "doc-sentences", T=128, short=0.0, pack=False)
    unpacked_len = np.array([len(build_u(i, None)["tokens"]) for i in range(0, len(unpacked), 7)])
    _, full, build_f = _builder(prefix, "full-sentences", T=128, short=0.0)
    full_len = np.array([len(build_f(i, None)["tokens"]) for i in range(0, len(full), 7)])
    # Fixed micro-batch shapes: tokens per row with packing are within 15 % of full-sentences; without, far below.
    assert lengths.mean() > 0.85 * full_len.mean(), (lengths.mean(), full_len.mean())
    assert unpacked_len.mean() < 0.7 * lengths.mean()
    s = build(int(np.argmax(np.diff(index.row_ptr))), None)
    packs = s["pack_ids"]
    assert packs.max() >= 2 and (np.diff(packs) >= 0).all()
    assert (s["tokens"][np.flatnonzero(np.diff(packs, prepend=0))] == 2).all()  # each packed sample opens with [CLS]


def test_full_sentences_put_a_separator_at_document_ends(tmp_path):
    docs = [[[10, 11], [12]], [[13, 14]], [[15] * 3]]
    corpus = IndexedCorpus(write_shards(docs, tmp_path / "fs", 100))
    index = build_index(corpus, "full-sentences", 64, 0.0, seed=1)
    s = SampleBuilder(corpus, index, "full-sentences", 64, cls_id=2, sep_id=3)(0, None)
    assert s["tokens"].tolist() == [2, 10, 11, 12, 3, 13, 14, 3, 15, 15, 15, 3]


def test_pairs_fit_and_short_seq_prob_makes_short_samples(en_prepared):
    p = 0.1
    corpus, index, build = _builder(en_prepared, "segment-pair", T=64, short=p)
    budget = 61  # T - 3
    n = len(index)
    # each chunk's own target is drawn short with probability p, uniform on [2, budget] (so = budget with 1/60);
    # where a chunk starts depends only on the targets before it, so the short chunks are Binomial(n, p x 59/60)
    q = p * (budget - 2) / (budget - 1)
    short = int((np.abs(index.chunks[:, 2]) < budget).sum())  # NSP negatives hold -target
    assert abs(short - n * q) < 5 * (n * q * (1 - q)) ** 0.5, (short, n, n * q)
    for i in range(0, len(index), 50):
        assert len(build(i, np.random.default_rng(i))["tokens"]) <= 64


def test_index_cache_is_reused_and_keyed_by_settings(en_prepared, tmp_path):
    corpus = IndexedCorpus(en_prepared)
    a = load_or_build(corpus, "full-sentences", 128, 0.1, 5, True, tmp_path)
    files = sorted(p.name for p in tmp_path.glob("index-*.bfc"))
    mtime = (tmp_path / files[0]).stat().st_mtime_ns
    b = load_or_build(corpus, "full-sentences", 128, 0.1, 5, True, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("index-*.bfc")) == files and np.array_equal(a.chunks, b.chunks)
    assert (tmp_path / files[0]).stat().st_mtime_ns == mtime  # mapped, not rebuilt
    load_or_build(corpus, "full-sentences", 256, 0.1, 5, True, tmp_path)
    assert len(list(tmp_path.glob("index-*.bfc"))) == 2


def test_dataset_sample_contract(en_prepared, en_tokenizer, tmp_path):
    cfg = data_config(en_prepared, format="segment-pair", max_seq_length=128, cache_dir=str(tmp_path))
    ds = PretrainingDataset(cfg, en_tokenizer, seed=1)
    s = ds[0]
    assert set(s) == {"input_ids", "token_type_ids", "mlm_positions", "mlm_labels", "sentence_label"}
    assert len(s["mlm_positions"]) <= cfg.masking.max_predictions_per_seq
    assert (np.diff(s["mlm_positions"]) > 0).all()


def test_sentence_pair_is_two_natural_sentences(en_prepared):
    corpus, index, build = _builder(en_prepared, "sentence-pair", T=128, short=0.0)
    for i in range(0, len(index), max(1, len(index) // 200)):
        s = build(i, np.random.default_rng(i))
        a, b = _segments(s["tokens"])
        start = int(index.chunks[i, 0])
        if len(s["tokens"]) < 128:  # untrimmed: A is exactly one sentence, and B the next one for positives
            assert a.tolist() == corpus.read(start, start + 1).tolist()
            if s["sentence_label"] == 0:
                assert b.tolist() == corpus.read(start + 1, start + 2).tolist()


def _build_in_process(prefix, cache, queue):
    corpus = IndexedCorpus(prefix)
    index = load_or_build(corpus, "segment-pair", 96, 0.1, 9, False, cache)
    queue.put(np.asarray(index.chunks).tobytes())


def run_in_processes(target, args: tuple, n: int, method: str, timeout: float) -> list:
    """Start ``n`` processes of ``target(*args, queue)`` at once (start method ``method``), return what each put on
    the queue, and check that every one exited cleanly: concurrent index builders, as the ranks of a job start."""
    import multiprocessing as mp

    ctx = mp.get_context(method)
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_concurrent_index_builds_agree(en_prepared, tmp_path):
    results = run_in_processes(_build_in_process, (en_prepared, tmp_path), 3, "fork", 120)
    assert len(set(results)) == 1
    assert len(list(tmp_path.glob("index-*.bfc"))) == 1 and not list(tmp_path.glob("*.tmp*"))
