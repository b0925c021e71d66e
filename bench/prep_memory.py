"""build_indexed's peak memory against corpus size and against the largest document, one script run.

    python bench/prep_memory.py [--sizes-mb 20,100] [--doc-mb 1,8] [--workers 2] [--work DIR]

1. Corpus size: bench/prep.py's ``.jsonl`` corpus (the tests' English corpus, one document per line, repeated) at
   each of ``--sizes-mb``, built with ``--split-sentences --workers N``; peak RSS summed over the process tree (main,
   pool workers), sampled every 50 ms (bench/prep.py ``measure``). The claim under test: memory does not grow with
   the corpus (shards are bounded, pieces are streamed).
2. Document size: one ``.txt`` of a single document of ``--doc-mb`` megabytes (the same text, no blank line), same
   command: what one huge document (a book dumped as one record, a whole site) costs a worker.

Ratios are within this run; the machine is shared, read the ratios (and the MiB) rather than the seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prep import ENV, REPO, en_corpus, make_corpus, measure, write_repeated  # noqa: E402


def one_document(path: Path, size_mb: float) -> int:
    """A .txt holding one document of ``size_mb`` MB: the English corpus's lines without blank lines, repeated."""
    lines = [line for line in en_corpus().read_text(encoding="utf-8").splitlines() if line.strip()]
    return write_repeated(path, ("\n".join(lines) + "\n").encode("utf-8"), size_mb)


def build(corpus: Path, tok: Path, prefix: Path, workers: int) -> dict:
    cmd = [sys.executable, "data_prep/build_indexed.py", "--input", str(corpus), "--tokenizer", str(tok),
           "--output-prefix", str(prefix), "--split-sentences", "--workers", str(workers), "--overwrite"]
    return measure(cmd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="20,100")
    ap.add_argument("--doc-mb", default="1,8")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    os.environ.update(ENV)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        tok = work / "wordpiece"
        if not (tok / "tokenizer.json").exists():
            subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", "wordpiece", "--input",
                            str(en_corpus()), "--output", str(tok), "--vocab-size", "8000", "--quiet"], cwd=REPO,
                           check=True, env={**os.environ, **ENV})
        rows = []
        for size in (float(x) for x in args.sizes_mb.split(",")):
            corpus = work / f"corpus_{size:g}mb.jsonl"
            mib = make_corpus(corpus, size) / 2**20
            m = build(corpus, tok, work / "out" / f"c{size:g}", args.workers)
            rows.append({"case": "corpus", "input_mib": round(mib, 1), **{k: round(v, 1) for k, v in m.items()}})
            print(json.dumps(rows[-1]), flush=True)
            corpus.unlink()
        for size in (float(x) for x in args.doc_mb.split(",")):
            corpus = work / f"doc_{size:g}mb.txt"
            mib = one_document(corpus, size) / 2**20
            m = build(corpus, tok, work / "out" / f"d{size:g}", args.workers)
            rows.append({"case": "one document", "input_mib": round(mib, 1),
                         **{k: round(v, 1) for k, v in m.items()}})
            print(json.dumps(rows[-1]), flush=True)
            corpus.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
