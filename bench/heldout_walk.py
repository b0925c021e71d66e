"""The sample index's walk with a held-out split (``data.valid_split``): one compiled call per block of rows
(``walk_runs``, today) against one Python-level ``walk`` call per run of chosen documents (main before 2026-12-06),
on the same synthetic shard, in this process.

    python bench/heldout_walk.py [--sentences 4M] [--doc-mean 5] [--splits 0,0.005,0.2] [--out bench/out/heldout]

The shard is bench/scale.py's synthetic corpus (megatron-core ``.idx`` layout, sentence lengths ~ 1 + Gamma(2, 9.5))
with documents of ``--doc-mean`` sentences (Geometric): short documents are where runs are many (at split ``p``,
about ``p * (1 - p)`` runs per document). Both walks are compiled (numba, compiled once before timing) and must give
the same chunks (checked). Reports seconds per shard and per million documents for each split, role and format,
and the ratio baseline / today (best of ``--repeat`` alternated runs of each).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def per_run_baseline(prefix: str, layout) -> np.ndarray:
    """main before 2026-12-06: a Python loop over the runs, each cut out and walked by one compiled ``walk`` call."""
    from trainer.data import index_kernels as K
    from trainer.data.corpus import idx_arrays
    from trainer.data.order import M64, mix64
    from trainer.data.sample_index import _document_runs

    lengths, _, docs = idx_arrays(prefix)
    docs = np.asarray(docs, np.int64)
    run = K.kernels(len(lengths), True)
    mode = {"full-sentences": K.FULL_SENTENCES, "sentence-pair": K.SENTENCE_PAIR}.get(layout.fmt, K.WITHIN_DOCUMENT)
    keep_min = 2 if layout.fmt in ("segment-pair", "sop-pair", "sentence-pair") else 1
    seed_mix = np.uint64(mix64(layout.index_seed & M64))
    out, rows, parts = np.empty((len(lengths), 3), np.int64), np.empty(len(lengths), np.int64), []
    for lo, hi in _document_runs(prefix, len(docs) - 1, layout).tolist():
        s0, m = int(docs[lo]), int(docs[hi] - docs[lo])
        s, d = 0, 0
        while s < m:
            k, s, d = run.walk(lengths[s0:s0 + m], docs[lo:hi + 1] - s0, s0, s, d, m, mode, layout.budget,
                               layout.min_sent, layout.min_tail, keep_min, seed_mix, float(layout.short_seq_prob),
                               float(layout.nsp_prob), out, rows)
            if k:
                parts.append(out[:k].copy())
    return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)


def today(prefix: str, layout, block: int) -> np.ndarray:
    from trainer.data.sample_index import _walk

    parts = [c for c, _ in _walk((prefix, 0, layout, block, True))]
    return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)


def main() -> None:
    from scale import parse_size, write_corpus

    from trainer.data.corpus import idx_header
    from trainer.data.sample_index import Layout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", default="4M")
    ap.add_argument("--doc-mean", type=int, default=5)
    ap.add_argument("--splits", default="0,0.005,0.2")
    ap.add_argument("--formats", default="full-sentences,segment-pair")
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "heldout"))
    args = ap.parse_args()
    n = parse_size(args.sentences)
    folder = Path(args.out) / f"s{n}_d{args.doc_mean}"
    prefix = str(write_corpus(folder, n, shard=n, doc_mean=args.doc_mean)) + "_00000"
    documents = idx_header(prefix).documents - 1
    print(f"shard: {n:,} sentences, {documents:,} documents (mean {n / documents:.1f} sentences)", flush=True)
    # compile both kernels once (numba's cache makes later processes cheap; this one pays it before timing)
    warm = Layout("full-sentences", 128, 0.1, 1, False, valid_split=0.2)
    today(prefix, warm, args.block), per_run_baseline(prefix, warm)
    results = []
    for fmt in args.formats.split(","):
        nsp = 0.5 if fmt == "segment-pair" else 0.0
        for split in (float(x) for x in args.splits.split(",")):
            for role in (("train", "heldout") if split > 0 else ("train",)):
                layout = Layout(fmt, 128, 0.1, 1, False, nsp_prob=nsp, valid_split=split, role=role)
                times = {"base": [], "new": []}
                for _ in range(args.repeat):  # alternated, best of --repeat each (a shared machine's noise)
                    t0 = time.perf_counter()
                    base = per_run_baseline(prefix, layout)
                    t1 = time.perf_counter()
                    new = today(prefix, layout, args.block)
                    t2 = time.perf_counter()
                    times["base"].append(t1 - t0)
                    times["new"].append(t2 - t1)
                    assert np.array_equal(base, new), (fmt, split, role)
                t0, t1, t2 = 0.0, min(times["base"]), min(times["base"]) + min(times["new"])
                row = {"format": fmt, "valid_split": split, "role": role, "chunks": len(new),
                       "baseline_s": round(t1 - t0, 3), "today_s": round(t2 - t1, 3),
                       "baseline_s_per_M_docs": round((t1 - t0) / documents * 1e6, 3),
                       "today_s_per_M_docs": round((t2 - t1) / documents * 1e6, 3),
                       "ratio": round((t1 - t0) / max(t2 - t1, 1e-9), 2)}
                results.append(row)
                print(json.dumps(row), flush=True)
    (Path(args.out) / "results.json").write_text(json.dumps({"sentences": n, "documents": documents,
                                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
