"""Masked samples per second on one core: our dataset vs megatron-core's BERT dataset vs Hugging Face's collator.

    python bench/loader.py [--samples 3000] [--vocab-size 30522] [--out DIR]

All three read the same single-shard indexed corpus (the tests' English corpus, WordPiece tokenizer trained by
data_prep/train_tokenizer.py), in one process with one torch thread, in the same run:

- ours: ``PretrainingDataset`` (segment-pair with NSP negatives, dynamic whole-word masking, sample construction
  from the shard included) plus collation into padded int64 batches of 32;
- megatron-core: ``BERTMaskedWordPieceDataset`` (segment pair with NSP, whole-word masking, max n-gram 1), one
  ``__getitem__`` per sample (its samples come out padded, so that is its collation). This is its fastest path:
  megatron-core 0.16.1 has no batched or compiled path for BERT samples (its C++ helpers build the sample index,
  before timing); the options that choose work are set to the cheapest that still does whole-word masking with
  NSP (n-grams of 1, no permutation, no geometric spans), and the .bin is memory-mapped (``mmap_bin_files`` default).
  A profile (300 samples, seq 128) puts ~85 % of ``__getitem__`` in ``_create_masked_lm_predictions``: a Python
  loop over the tokens as numpy scalars (``inv_vocab[token].startswith("##")``) and one ``RandomState.choice(p=...)``
  per masking candidate. Megatron spreads that over DataLoader workers; per core it is what is timed here;
- Hugging Face: ``DataCollatorForLanguageModeling`` (token-level 15 % masking) on ready-made sequences of the same
  length cut from the same shard (no sample construction: it does less work), given what a Hugging Face pipeline
  gives it: the tokenizer's output with ``special_tokens_mask`` (``run_mlm.py`` tokenizes with
  ``return_special_tokens_mask=True``), as tensors. Without the mask the collator calls
  ``get_special_tokens_mask`` per row, token by token in Python. Three forms are timed (see ``hf_examples``):
  tensors with the mask, lists with the mask (what ``run_mlm.py``'s dataset gives by default), bare ``input_ids``
  lists (what this benchmark gave it at first).

Reported: samples/s for each at seq 128 and 512 (median of ``--repeats`` interleaved rounds) and our ratio to each.
Index building (ours and megatron's), the Hugging Face examples and the first touch of the shard happen before
timing.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from corpora import en_corpus  # noqa: E402  (the tests' English text: Python's docstrings, generated once)

REPO = Path(__file__).resolve().parents[1]


def prepare(out: Path, vocab_size: int):
    """Tokenizer folder and a one-shard corpus of the English fortunes (one sentence = one line)."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from data_prep.manifest import sha256_file, totals_of, write_manifest
    from data_prep.tokenizer import load_tokenizer
    from data_prep.train_tokenizer import main as train_tokenizer

    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(["--kind", "wordpiece", "--input", str(en_corpus()), "--output", str(tok_dir), "--vocab-size",
                         str(vocab_size), "--quiet"])
    tok = load_tokenizer(tok_dir)
    prefix = out / "en"
    if not Path(str(prefix) + ".manifest.json").exists():
        docs, cur = [], []
        for line in en_corpus().read_text(encoding="utf-8").splitlines():
            if line.strip():
                cur.append(line.strip())
            elif cur:
                docs.append(cur)
                cur = []
        ids = tok.encode_batch([s for d in docs for s in d])
        base = str(out / "en_00000")
        dtype = np.uint16 if tok.vocab_size < 65500 else np.int32
        builder = IndexedDatasetBuilder(base + ".bin", dtype=dtype)
        i = n_sent = n_tok = 0
        for d in docs:
            for s in ids[i:i + len(d)]:
                if s:
                    builder.add_item(torch.tensor(s))
                    n_sent += 1
                    n_tok += len(s)
            i += len(d)
            builder.end_document()
        builder.finalize(base + ".idx")
        shard = {"prefix": "en_00000", "documents": len(docs), "sentences": n_sent, "tokens": n_tok,
                 "bin_bytes": os.path.getsize(base + ".bin"), "bin_sha256": sha256_file(base + ".bin"),
                 "idx_sha256": sha256_file(base + ".idx"), "input": str(en_corpus()), "input_range": [0, None]}
        write_manifest(prefix, {"format": "bertfamily-indexed", "version": 1, "tool_version": "bench",
                                "tokenizer": {"path": str(tok_dir), "fingerprint": tok.fingerprint, "kind": tok.kind,
                                              "vocab_size": tok.vocab_size},
                                "dtype": np.dtype(dtype).name, "shards": [shard], "totals": totals_of([shard], 0),
                                "inputs": [], "skipped": {}, "settings": {}})
    return tok, prefix


def bench_ours(tok, prefix, seq: int, n: int, cache: Path) -> float:
    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset
    from trainer.data.loader import Collator

    max_pred = round(seq * 0.15)
    cfg = DataConfig(corpora=[{"prefix": str(prefix)}], format="segment-pair", max_seq_length=seq,
                     cache_dir=str(cache), masking={"strategy": "whole-word", "dynamic": True,
                                                    "max_predictions_per_seq": max_pred})
    ds = PretrainingDataset(cfg, tok, seed=1)
    collate = Collator(tok.pad_id, seq, max_pred, pad_to="max")
    collate(ds.__getitems__(list(range(32))))  # warm: permutation, shard map
    t = time.perf_counter()
    for b in range(0, n, 32):
        collate(ds.__getitems__(list(range(b, b + 32))))  # what the DataLoader calls
    return n / (time.perf_counter() - t)


class _MegatronTokenizer:
    """The attributes megatron-core's BERT dataset reads (PLATFORM.md)."""

    def __init__(self, tok):
        self.inv_vocab = {i: t for i, t in enumerate(tok.tokens)}
        self.cls, self.sep, self.mask, self.pad = tok.cls_id, tok.sep_id, tok.mask_id, tok.pad_id
        self.unique_identifiers = {"class": "bench", "fingerprint": tok.fingerprint}


def bench_megatron(tok, prefix, seq: int, n: int, cache: Path) -> float:
    import torch.distributed as dist
    from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    if not dist.is_initialized():  # megatron-core's builders ask for the rank; a file store needs no port
        cache.mkdir(parents=True, exist_ok=True)
        dist.init_process_group("gloo", init_method=f"file://{(cache / 'pg_store').resolve()}", rank=0, world_size=1)
    shard = str(prefix.parent / "en_00000")
    indexed = IndexedDataset(shard)
    cfg = BERTMaskedWordPieceDatasetConfig(
        random_seed=1, sequence_length=seq, split="100,0,0", path_to_cache=str(cache), tokenizer=_MegatronTokenizer(tok),
        masking_probability=0.15, short_sequence_probability=0.1, masking_max_ngram=1, masking_do_full_word=True,
        masking_do_permutation=False, masking_use_longer_ngrams=False, masking_use_geometric_distribution=False,
        classification_head=True)
    docs = np.arange(len(indexed.document_indices) - 1, dtype=np.int32)
    ds = BERTMaskedWordPieceDataset(indexed, shard, docs, n + 64, Split.train, cfg)
    for i in range(32):
        ds[i]
    t = time.perf_counter()
    for i in range(n):
        ds[i % len(ds)]
    return n / (time.perf_counter() - t)


def hf_examples(tok, prefix, seq: int, n: int, form: str = "tensors") -> list[dict]:
    """Ready-made rows of ``seq`` tokens ([CLS] body [SEP]) cut from the shard, in one of the forms a Hugging Face
    pipeline hands its collator:

    - "tensors": the tokenizer's output with ``special_tokens_mask`` (``return_special_tokens_mask=True``, what
      ``run_mlm.py`` asks for), as tensors (a dataset with ``set_format("torch")``);
    - "lists": the same as Python lists (what ``run_mlm.py``'s dataset gives the Trainer's DataLoader by default);
    - "bare": ``input_ids`` lists without the mask (what this benchmark gave it at first), which makes the collator
      build the mask row by row in Python (``get_special_tokens_mask``)."""
    import torch

    from trainer.data.corpus import IndexedCorpus

    corpus = IndexedCorpus(prefix)
    flat = corpus.read(0, corpus.num_sentences).astype(np.int64)
    body = seq - 2
    rows = [[tok.cls_id] + flat[i * body:(i + 1) * body].tolist() + [tok.sep_id]
            for i in range(min(n, len(flat) // body))]
    if form == "bare":
        made = [{"input_ids": r} for r in rows]
    else:
        hf_tok = _hf_tokenizer(tok)
        # The mask the tokenizer itself gives for these ids (1 at [CLS]/[SEP]), computed once per row, untimed.
        made = [{"input_ids": r,
                 "special_tokens_mask": hf_tok.get_special_tokens_mask(r, already_has_special_tokens=True)}
                for r in rows]
        if form == "tensors":
            made = [{k: torch.tensor(v) for k, v in m.items()} for m in made]
    return [made[i % len(made)] for i in range(n)]


def _hf_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok.backend, cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]", pad_token="[PAD]", unk_token="[UNK]")


def bench_hf(tok, examples: list[dict]) -> float:
    from transformers import DataCollatorForLanguageModeling

    n = len(examples)
    collate = DataCollatorForLanguageModeling(_hf_tokenizer(tok), mlm=True, mlm_probability=0.15, return_tensors="pt")
    collate(examples[:32])
    t = time.perf_counter()
    for b in range(0, n, 32):
        collate(examples[b:b + 32])
    return n / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=3000, help="samples timed per loader and length")
    p.add_argument("--repeats", type=int, default=3, help="rounds; each loader's median is reported")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # samples per second *per core*
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        tok, prefix = prepare(out, args.vocab_size)
        print(f"corpus: {en_corpus().name}, tokenizer wordpiece {tok.vocab_size}, {args.samples} samples per measurement")
        forms = ("tensors", "lists", "bare")
        print(f"{'seq':>5} {'ours/s':>9} {'megatron/s':>11} " + " ".join(f"{'hf ' + f + '/s':>14}" for f in forms)
              + f" {'ours/megatron':>14} " + " ".join(f"{'ours/hf ' + f:>15}" for f in forms))
        for seq in (128, 512):
            examples = [hf_examples(tok, prefix, seq, args.samples, form) for form in forms]
            rounds = []
            for _ in range(args.repeats):  # interleaved, so load drifting on a shared machine hits all alike
                rounds.append((bench_ours(tok, prefix, seq, args.samples, out / "cache_ours"),
                               bench_megatron(tok, prefix, seq, args.samples, out / "cache_megatron"),
                               *(bench_hf(tok, ex) for ex in examples)))
            ours, meg, *hf = np.median(np.array(rounds), axis=0)
            print(f"{seq:>5} {ours:>9.0f} {meg:>11.0f} " + " ".join(f"{x:>14.0f}" for x in hf)
                  + f" {ours / meg:>14.2f} " + " ".join(f"{ours / x:>15.2f}" for x in hf), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
