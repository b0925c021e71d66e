"""Share of computed tokens that are padding, per recipe format, as the trainer's loaders deliver batches today.

    python bench/padding.py [--batches 40] [--out DIR]

Corpora are prepared here with the project's own commands (``data_prep.train_tokenizer``, ``data_prep.build_indexed``,
``data_prep.annotate`` for ERNIE): the benchmarks' English text (Python's docstrings, a blank line ends a document)
and the tests' Chinese text. For each recipe its ``data`` section (format, max_seq_length, short_seq_prob,
pack_doc_sentences, masking width) and micro batch are read from ``trainer/recipes`` and the real loader is built:
``PretrainingDataset`` + ``Collator`` (ERNIE: ``KnowledgeMaskedDataset`` + ``ErnieCollator``) through
``build_dataloader`` (order, sampler and collation as in training; 0 workers, which changes who builds a sample,
never what it is). Over the first ``--batches`` micro-batches it counts, per encoder layer:

- ``padded``: the trainer's dense path, B x T with T the batch's longest row (``pad_to: batch``, every recipe);
- ``max``: ``pad_to: max`` (B x max_seq_length, fixed shapes);
- ``unpadded``: the rows of ``Packing.indices`` that ``attach_packing`` (what the loop calls before the copy to the
  device) gives the varlen path (``model.unpad`` or packed rows on CUDA): the layers run on these rows only;
- ``fill``: real tokens / (B x max_seq_length), how full the rows are: short rows (short_seq_prob, sentence
  boundaries, document ends) lower the tokens per step even where no padding is computed.

Padding share = 1 - real / computed. The embeddings (one gather) and heads are left out: the layers are the cost.
The English text has short documents (docstrings): doc-sentences rows end at document ends far more often than on
Wikipedia/books, so its figures are an upper bound of what a real corpus gives.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from corpora import ZH_CORPUS, en_corpus  # noqa: E402

# (label, recipe, data overrides): every pretraining format the recipes use, plus sentence-pair (no recipe uses it)
# and RoBERTa's documented doc-sentences alternative with packing.
CASES = [
    ("segment-pair (bert_base_phase1)", "bert_base_phase1", {}),
    ("segment-pair (bert_base)", "bert_base", {}),
    ("sentence-pair (bert_base + format)", "bert_base", {"format": "sentence-pair"}),
    ("sop-pair (albert_base)", "albert_base", {}),
    ("sop-pair, no swaps (electra_small)", "electra_small", {}),
    ("full-sentences (roberta_base)", "roberta_base", {}),
    ("doc-sentences (roberta_base + format)", "roberta_base", {"format": "doc-sentences"}),
    ("doc-sentences packed (roberta_base + pack)", "roberta_base",
     {"format": "doc-sentences", "pack_doc_sentences": True}),
    ("doc-sentences ERNIE (ernie_base)", "ernie_base", {}),
]


def prepare(out: Path) -> dict[str, tuple[Path, Path]]:
    """{"en"|"zh": (corpus prefix, tokenizer folder)}, built once in ``out``."""
    from data_prep import annotate, build_indexed, train_tokenizer

    made = {}
    for kind, text, vocab, annot in (("en", en_corpus(), 8000, None), ("zh", ZH_CORPUS, 3000, "jieba")):
        tok, prefix = out / f"{kind}_tok", out / "corpus" / kind
        if not Path(str(prefix) + ".manifest.json").exists():
            train_tokenizer.main(["--kind", "wordpiece" if kind == "en" else "zh", "--input", str(text), "--output",
                                  str(tok), "--vocab-size", str(vocab), "--quiet"])
            assert build_indexed.main(["--input", str(text), "--tokenizer", str(tok), "--output-prefix",
                                       str(prefix)]) == 0
            if annot:
                annotate.annotate_corpus(prefix, annot, progress=False)
        made[kind] = (prefix, tok)
    return made


def loader_for(recipe: str, overrides: dict, corpora: dict, cache: Path):
    """(DataLoader, micro batch, max_seq_length) of the recipe's data section on the prepared corpus."""
    from data_prep.tokenizer import load_tokenizer
    from trainer.config import _read_yaml, resolve_recipe
    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset
    from trainer.data.loader import Collator, build_dataloader

    raw = _read_yaml(resolve_recipe(recipe))
    ernie = raw.get("objective", {}).get("name") == "ernie"
    prefix, tok_dir = corpora["zh" if ernie else "en"]
    tok = load_tokenizer(tok_dir)
    data = {**raw["data"], **overrides, "corpora": [{"prefix": str(prefix)}], "cache_dir": str(cache),
            "num_workers": 0, "valid_corpora": []}
    cfg = DataConfig.model_validate(data)
    micro = raw["train"]["micro_batch_size"]
    if ernie:
        from trainer.ernie.config import KnowledgeMaskingConfig
        from trainer.ernie.data import ErnieCollator, KnowledgeMaskedDataset

        km = KnowledgeMaskingConfig.model_validate(raw["objective"]["options"]["knowledge_masking"])
        dataset = KnowledgeMaskedDataset(cfg, tok, 1234, "train", km, micro, None, 0)
        collate = ErnieCollator(tok.pad_id, km.max_predictions_per_seq)
    else:
        dataset = PretrainingDataset(cfg, tok, 1234, "train")
        collate = Collator(tok.pad_id, cfg.max_seq_length, cfg.masking.max_predictions_per_seq, cfg.pad_to)
    return build_dataloader(dataset, collate, 0, micro, micro, 0, 1, None, 0), micro, cfg.max_seq_length


def measure(loader, max_seq: int, batches: int) -> dict:
    from trainer.models.kernels import attach_packing

    real = padded = unpadded = full = n = 0
    for batch in loader:
        batch = attach_packing(batch)
        mask = batch["pack_ids"] != 0 if "pack_ids" in batch else batch["attention_mask"].bool()
        B, T = mask.shape
        real += int(mask.sum())
        padded += B * T
        full += B * max_seq
        unpadded += batch["packing"].indices.numel()
        n += 1
        if n == batches:
            break
    return {"batches": n, "real_tokens": real, "pad_share_padded": 1 - real / padded,
            "pad_share_max": 1 - real / full, "pad_share_unpadded": 1 - real / unpadded, "fill": real / full}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=40, help="micro-batches measured per case")
    ap.add_argument("--out", type=Path, default=None, help="where corpora are prepared (default: a temp folder)")
    ap.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per case")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        t0 = time.perf_counter()
        corpora = prepare(out)
        print(f"corpora prepared in {time.perf_counter() - t0:.0f} s ({out})")
        print(f"{'case':44s} {'B':>3s} {'T':>4s} {'padded':>8s} {'max':>7s} {'unpadded':>9s} {'fill':>6s}")
        for label, recipe, over in CASES:
            loader, micro, seq = loader_for(recipe, over, corpora, out / "cache")
            r = measure(loader, seq, args.batches)
            print(f"{label:44s} {micro:3d} {seq:4d} {r['pad_share_padded']:8.1%} {r['pad_share_max']:7.1%} "
                  f"{r['pad_share_unpadded']:9.1%} {r['fill']:6.1%}")
            if args.jsonl:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps({"case": label, "recipe": recipe, "overrides": over, "micro_batch": micro,
                                        "max_seq_length": seq, **r}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
