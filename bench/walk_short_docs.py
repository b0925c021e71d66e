"""The sample-index walk on one-sentence documents (titles, queries, chat lines): this checkout's compiled walk
against a baseline ref's (default ``main``), in one process, on the same in-memory ``.idx`` arrays.

    python bench/walk_short_docs.py [--sentences 5M] [--format doc-sentences] [--seq 128] [--baseline main]

The baseline's ``trainer/data/index_kernels.py`` is read with ``git show REF:...`` into a temporary module and
compiled by numba like ours; compilation and a warm-up walk are excluded from the timings (best of 3).
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def load_baseline(ref: str, folder: Path):
    src = subprocess.run(["git", "show", f"{ref}:trainer/data/index_kernels.py"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    path = folder / "baseline_index_kernels.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_index_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_walk(K, lengths, docs, mode, budget, min_sent, min_tail, keep_min, with_nsp: bool) -> float:
    run = K.kernels(0, compiled=True)
    n = len(lengths)
    out, rows = np.empty((1 << 20, 3), np.int64), np.empty(1 << 20, np.int64)
    extra = (0.0,) if with_nsp else ()
    best = float("inf")
    for _ in range(4):  # the first is a warm-up
        t0 = time.perf_counter()
        s, d = 0, 0
        while s < n:
            _, s, d = run.walk(lengths, docs, 0, s, d, n, mode, budget, min_sent, min_tail, keep_min, np.uint64(7),
                               0.1, *extra, out, rows)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", default="5M")
    p.add_argument("--format", default="doc-sentences")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--baseline", default="main")
    a = p.parse_args(argv)
    n = int(float(a.sentences.upper().rstrip("M")) * 10**6) if a.sentences.upper().endswith("M") else int(a.sentences)
    from trainer.data import index_kernels as ours
    from trainer.data.sample_index import Layout

    lay = Layout(a.format, a.seq, 0.1, 7, False)
    mode = {"full-sentences": ours.FULL_SENTENCES, "sentence-pair": ours.SENTENCE_PAIR}.get(a.format,
                                                                                          ours.WITHIN_DOCUMENT)
    rng = np.random.default_rng(0)
    lengths = (1 + rng.gamma(2.0, 9.5, n)).astype(np.int32)
    docs = np.arange(n + 1, dtype=np.int64)  # one sentence per document
    keep_min = 2 if a.format in ("segment-pair", "sop-pair", "sentence-pair") else 1
    args = (lengths, docs, mode, lay.budget, lay.min_sent, lay.min_tail, keep_min)
    with tempfile.TemporaryDirectory() as tmp:
        base = load_baseline(a.baseline, Path(tmp))
        t_base = time_walk(base, *args, with_nsp="nsp_prob" in base.walk.__code__.co_varnames)
        t_ours = time_walk(ours, *args, with_nsp=True)
    print(f"{n:,} one-sentence documents, {a.format}, T={a.seq}: baseline {a.baseline} {t_base:.2f} s "
          f"({t_base / n * 1e9:.0f} ns/sentence), this checkout {t_ours:.2f} s ({t_ours / n * 1e9:.0f} ns/sentence): "
          f"{t_base / t_ours:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
