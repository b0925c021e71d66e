"""jieba annotation with its HMM on (``--annotate jieba``, the baseline) and off (``jieba:hmm=off``) on real Chinese.

    python bench/annotate.py [--corpus tests/data/zh_classical.txt] [--simplified-kb 300] [--traditional-kb 3]

The corpus's documents are split by data_prep.annotators.count_traditional into simplified ones (under 1% of their CJK
characters traditional-only forms) and traditional ones (over 5%: in zh_fortunes the Book of Songs and other classical
texts). Each line is annotated as one sequence with both specs, in the same process, alternating, after a warm-up
(jieba's dictionary loaded). Reported per text: MB/s of UTF-8 text for each spec, the ratio, spans of each kind, and how
many of the baseline's spans the hmm=off run reproduces exactly (same characters, same kind). The traditional sample
is small because the baseline is slow on it (that is the finding). The machine is shared: read the ratios.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_prep.annotators import count_traditional, make_annotator  # noqa: E402


def split(corpus: Path) -> tuple[list[str], list[str]]:
    simp, trad = [], []
    for doc in corpus.read_text(encoding="utf-8").split("\n\n"):
        t, c = count_traditional(doc)
        if c >= 10:
            (simp if t < 0.01 * c else trad if t > 0.05 * c else []).extend(x for x in doc.splitlines() if x.strip())
    return simp, trad


def take(lines: list[str], kb: float) -> list[str]:
    out, n = [], 0
    for line in lines:
        if n >= kb * 1000:
            break
        out.append(line)
        n += len(line.encode())
    return out


def run(spec: str, lines: list[str]) -> tuple[float, list]:
    ann = make_annotator(spec)
    ann("热身")  # loads the dictionary outside the timing
    t = time.perf_counter()
    spans = [ann(line) for line in lines]
    return time.perf_counter() - t, spans


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", type=Path, default=REPO / "tests" / "data" / "zh_classical.txt")  # in the repo
    p.add_argument("--simplified-kb", type=float, default=300)
    p.add_argument("--traditional-kb", type=float, default=3)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    simp, trad = split(args.corpus)
    print(f"{args.corpus}: {len(simp):,} simplified lines, {len(trad):,} traditional lines")
    for name, lines in (("simplified", take(simp, args.simplified_kb)), ("traditional", take(trad, args.traditional_kb))):
        mb = sum(len(x.encode()) for x in lines) / 1e6
        best = {}
        for _ in range(args.rounds):
            for spec in ("jieba", "jieba:hmm=off"):
                secs, spans = run(spec, lines)
                if spec not in best or secs < best[spec][0]:
                    best[spec] = (secs, spans)
        (t_on, on), (t_off, off) = best["jieba"], best["jieba:hmm=off"]
        a = {(i, s) for i, ss in enumerate(on) for s in ss}
        b = {(i, s) for i, ss in enumerate(off) for s in ss}
        kinds = lambda x, k: sum(1 for _, s in x if s[2] == k)  # noqa: E731
        print(f"{name}: {len(lines):,} lines, {mb:.3f} MB; best of {args.rounds}")
        print(f"  jieba          {t_on:8.2f} s  {mb / t_on:7.3f} MB/s  {kinds(a, 0):,} entities {kinds(a, 1):,} phrases")
        print(f"  jieba:hmm=off  {t_off:8.2f} s  {mb / t_off:7.3f} MB/s  {kinds(b, 0):,} entities {kinds(b, 1):,} phrases")
        print(f"  speed hmm=off / jieba: {t_on / t_off:.2f}x; baseline spans reproduced by hmm=off: {len(a & b):,} of "
              f"{len(a):,} ({len(a & b) / max(1, len(a)):.1%}), entities {kinds(a & b, 0):,} of {kinds(a, 0):,}; "
              f"hmm=off spans not in the baseline: {len(b - a):,}")


if __name__ == "__main__":
    main()
