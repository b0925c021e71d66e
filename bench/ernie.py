"""ERNIE data-side costs, each a ratio against a baseline measured in this run on the same data.

    python bench/ernie.py [--rows 4000] [--seq 128] [--repeats 3]

1. ``masking``: samples/s of knowledge masking (``trainer.ernie.knowledge_masking``) per sample, at the basic and the
   entity level (jieba spans from the side-car format), and 64 rows per call with a generator per row
   (``knowledge_mask_rows``, what the ERNIE datasets' ``__getitems__`` does), against the trainer's
   whole-word ``trainer.data.masking.Masker`` per sample (BERT's whole-word masking: the same work without spans).
2. ``annotate``: characters/s of our jieba annotator (POS-tagged cut + entity/phrase spans) against a bare
   ``jieba.posseg`` cut of the same text, and of the offline path (text rebuilt from token ids + annotate + align).

Rows are the test Chinese corpus's lines, tokenized with a `zh` tokenizer trained here and packed to ``--seq``
tokens ([CLS] sentences [SEP]). Best of ``--repeats``; baseline and ours alternate so load drift hits both.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_prep import annotate  # noqa: E402
from trainer.data.config import MaskingConfig  # noqa: E402
from trainer.data.masking import Masker  # noqa: E402
from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig, knowledge_mask, knowledge_mask_rows  # noqa: E402,E501

from corpora import ZH_CORPUS as CORPUS  # noqa: E402  (the tests' Chinese text, tests/data/)


def build_rows(tok, lines: list[str], seq: int, tok_dir) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pack tokenized lines into rows of <= seq tokens; spans (jieba) placed in row coordinates."""
    doc = annotate.DocumentAnnotator(annotate.make_annotator("jieba"), tok_dir)
    ids = tok.encode_batch(lines)
    spans = doc(lines, ids)
    rows, row_spans = [], []
    cur, cur_spans, pos = [tok.cls_id], [], 1
    for x, s in zip(ids, spans):
        if not x:
            continue
        if pos + len(x) + 1 > seq:
            rows.append(np.asarray(cur + [tok.sep_id], np.int64))
            row_spans.append(np.concatenate(cur_spans) if cur_spans else np.zeros((0, 3), np.int64))
            cur, cur_spans, pos = [tok.cls_id], [], 1
        x = x[:seq - 2]
        cur_spans.append(annotate.place_spans([s], [pos], [len(x)]).astype(np.int64))
        cur.extend(x)
        pos += len(x)
    return rows, row_spans


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    from data_prep import train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench_ernie_"))
    train_tokenizer.main(["--kind", "zh", "--input", str(CORPUS), "--output", str(tmp / "tok"), "--quiet"])
    tok = load_tokenizer(tmp / "tok")
    lines = [l for l in CORPUS.read_text(encoding="utf-8").splitlines() if l.strip()]
    # ~20 tokens per line: enough lines for --rows rows, not the whole corpus through jieba
    rows, spans = build_rows(tok, lines[:args.rows * (args.seq // 12)], args.seq, tmp / "tok")
    rows, spans = rows[:args.rows], spans[:args.rows]
    n = len(rows)
    print(f"{n} rows of <= {args.seq} tokens, {sum(len(s) for s in spans)} spans "
          f"({sum(int((s[:, 2] == 0).sum()) for s in spans)} entities)")

    ws = np.asarray(tok.word_start, bool)
    special = np.asarray(tok.special_ids)
    random_ids = np.setdiff1d(np.arange(tok.vocab_size), special)
    is_special = np.zeros(tok.vocab_size, bool)
    is_special[special] = True
    masker = Masker(MaskingConfig(strategy="whole-word", max_predictions_per_seq=20), tok.vocab_size, tok.mask_id,
                    tok.special_ids, tok.word_start)
    km = KnowledgeMaskingConfig(max_predictions_per_seq=20)

    def baseline():
        rng = np.random.default_rng(0)
        for r in rows:
            masker(r, rng)

    def ours(level):
        def run():
            rng = np.random.default_rng(0)
            for r, s in zip(rows, spans):  # as trainer/ernie/data.py does per sample
                ids = r[None]
                sp = np.concatenate([np.zeros((len(s), 1), np.int64), s], axis=1)
                knowledge_mask(ids, ~is_special[ids], ws[ids], sp, level, km, tok.mask_id, random_ids, rng)
        return run

    def ours_batched():  # the datasets' DataLoader path: 64 rows per call, each with its own generator
        for b0 in range(0, n, 64):
            chunk = list(range(b0, min(n, b0 + 64)))
            knowledge_mask_rows([rows[i] for i in chunk], [spans[i] for i in chunk], "entity", km, tok.mask_id,
                                random_ids, [np.random.default_rng(i) for i in chunk], is_special, ws)

    def baseline_batched():  # the trainer's own batch path: Masker.mask_batch, a generator per row
        for b0 in range(0, n, 64):
            chunk = list(range(b0, min(n, b0 + 64)))
            masker.mask_batch([rows[i] for i in chunk], [np.random.default_rng(i) for i in chunk])

    base_t, base_b_t, basic_t, entity_t, batched_t = [], [], [], [], []
    for _ in range(args.repeats):  # alternate: load drift hits every variant alike
        base_t.append(timed(baseline, 1))
        base_b_t.append(timed(baseline_batched, 1))
        basic_t.append(timed(ours("basic"), 1))
        entity_t.append(timed(ours("entity"), 1))
        batched_t.append(timed(ours_batched, 1))
    base = n / min(base_t)
    print("\n## masking (samples/s, best of %d)" % args.repeats)
    print(f"whole-word Masker per sample (baseline): {base:,.0f}")
    for name, t in (("whole-word Masker.mask_batch, 64 rows per call (own generators)", base_b_t),
                    ("knowledge basic, per sample", basic_t), ("knowledge entity, per sample", entity_t),
                    ("knowledge entity, 64 rows per call (own generators)", batched_t)):
        rate = n / min(t)
        print(f"{name}: {rate:,.0f} ({rate / base:.2f}x)")

    import jieba
    import jieba.posseg

    text_lines = lines[:3000]
    chars = sum(len(l) for l in text_lines)
    pos_tok = jieba.posseg.POSTokenizer(jieba.Tokenizer())
    ann = annotate.JiebaAnnotator()
    ann._tok = pos_tok  # the same loaded dictionary for both
    list(pos_tok.cut("预热"))
    to_text = annotate.SequenceText(tok)
    line_ids = tok.encode_batch(text_lines)
    bare_t, ann_t, off_t = [], [], []
    for _ in range(args.repeats):
        bare_t.append(timed(lambda: [list(pos_tok.cut(l)) for l in text_lines], 1))
        ann_t.append(timed(lambda: [ann(l) for l in text_lines], 1))
        off_t.append(timed(lambda: [annotate.align_spans(ann(t), o) for t, o in map(to_text, line_ids)], 1))
    bare = chars / min(bare_t)
    print("\n## annotate (characters/s, best of %d, %d lines, %d chars)" % (args.repeats, len(text_lines), chars))
    print(f"bare jieba.posseg cut (baseline): {bare:,.0f}")
    print(f"JiebaAnnotator (cut + spans): {chars / min(ann_t):,.0f} ({chars / min(ann_t) / bare:.2f}x)")
    print(f"offline: text from ids + annotate + align: {chars / min(off_t):,.0f} ({chars / min(off_t) / bare:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
