"""Encode throughput of ``data_prep.tokenizer.Tokenizer.encode_batch`` against the baseline Megatron's
preprocess_data.py uses: a transformers fast tokenizer called once per sentence. Same tokenizer folder, same lines,
one thread (a build_indexed worker's share of the machine), measured in one run.

    python bench/tokenizer_encode.py [--corpus FILE (default: the tests' English corpus)] [--repeat 3] [--batch 1000]

Prints MB/s for each path and the ratios; the figures go to BENCHMARKS.md ("## Tokenizers").
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _best_of(fn, repeat: int) -> float:
    """Fastest of ``repeat`` runs in seconds: on a shared machine the minimum is the least disturbed figure."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, help="default: the tests' English corpus (bench/corpora.py)")
    p.add_argument("--kinds", nargs="+", default=["bbpe", "wordpiece", "unigram"])
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch", type=int, default=1000, help="lines per encode_batch call")
    args = p.parse_args(argv)
    # One thread per process, before tokenizers starts its pool: the per-worker figure build_indexed multiplies.
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    sys.path.insert(0, str(REPO))
    from transformers import AutoTokenizer

    from corpora import en_corpus

    from data_prep import train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    args.corpus = args.corpus or en_corpus()
    lines = [line for line in args.corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    mb = sum(len(line.encode("utf-8")) for line in lines) / 1e6
    print(f"corpus {args.corpus.name}: {len(lines):,} lines, {mb:.2f} MB; best of {args.repeat}; 1 thread")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            folder = Path(tmp) / kind
            train_tokenizer.main(["--kind", kind, "--input", str(args.corpus), "--output", str(folder),
                                  "--vocab-size", str(args.vocab_size), "--quiet"])
            ours, hf = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            batches = [lines[i:i + args.batch] for i in range(0, len(lines), args.batch)]
            check = [hf(line, add_special_tokens=False)["input_ids"] for line in lines[:2000]]
            assert ours.encode_batch(lines[:2000]) == check, f"{kind}: ids differ from AutoTokenizer"
            t_base = _best_of(lambda: [hf(line, add_special_tokens=False)["input_ids"] for line in lines], args.repeat)
            t_line = _best_of(lambda: [ours.encode(line) for line in lines], args.repeat)
            t_batch = _best_of(lambda: [ours.encode_batch(b) for b in batches], args.repeat)
            print(f"{kind:9s} baseline AutoTokenizer per line {mb / t_base:6.2f} MB/s | ours encode per line "
                  f"{mb / t_line:6.2f} MB/s ({t_base / t_line:.2f}x) | ours encode_batch({args.batch}) "
                  f"{mb / t_batch:6.2f} MB/s ({t_base / t_batch:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
