"""build_indexed.py on a corpus of many small files: small inputs grouped into pieces against one piece per file.

    python bench/small_files.py [--files 5000] [--workers 2] [--rounds 1]

Writes --files inputs of one to three documents each (~350 bytes on average: the tests' English text, every line cut to
200 characters; one news article per file, THUCNews-like) and builds them twice per round, alternating, with the
same command: as build_indexed plans them now (consecutive small inputs grouped into pieces of up to the piece size,
prep_work.plan_pieces) and as it planned them before (``plan_pieces(group=False)``: at least one piece, so one
shard, per input; the baseline, run by the same code in the same script on the same files). Reported for each: wall
time of the whole command (start-up included), shards and output files written, manifest bytes, and the time to open
every shard with megatron-core's IndexedDataset (mmap), what each trainer rank does at start-up. Both outputs are
checked to hold the same token stream.

The machine is shared with other jobs, so the ratios are what to read, not the absolute numbers.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpora import en_corpus  # noqa: E402

import numpy as np  # noqa: E402

ENV = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
# the baseline: the same build_indexed with the pre-grouping plan (one piece per input)
PER_FILE = ("import sys; from data_prep import build_indexed, prep_work; "
            "build_indexed.plan_pieces = lambda i, s: prep_work.plan_pieces(i, s, group=False); "
            "sys.exit(build_indexed.main(sys.argv[1:]))")
GROUPED = "import sys; from data_prep import build_indexed; sys.exit(build_indexed.main(sys.argv[1:]))"


def write_inputs(root: Path, n: int) -> int:
    from data_prep import sources

    docs = [[line[:200] for line in d.lines[:3]] for d in sources.iter_documents(str(en_corpus()))]
    root.mkdir(parents=True)
    k = total = 0
    for i in range(n):
        mine = [docs[(k + j) % len(docs)] for j in range(1 + i % 3)]
        k += len(mine)
        text = "".join("\n".join(d) + "\n\n" for d in mine).encode()
        (root / f"{i // 1000:03d}").mkdir(exist_ok=True)
        (root / f"{i // 1000:03d}" / f"{i:07d}.txt").write_bytes(text)
        total += len(text)
    return total


def build(code: str, src: Path, tok: Path, prefix: Path, workers: int) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, "--input", str(src), "--tokenizer", str(tok),
                           "--output-prefix", str(prefix), "--workers", str(workers), "--overwrite"], cwd=REPO,
                          env={**os.environ, **ENV}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"build_indexed failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - t0


def measure(prefix: Path) -> dict:
    from data_prep import inspect_indexed
    from data_prep import manifest as mf

    m = mf.read_manifest(prefix)
    t0 = time.perf_counter()
    opened = [inspect_indexed.open_shard(str(prefix.parent / s["prefix"])) for s in m["shards"]]
    open_s = time.perf_counter() - t0
    # the token stream, the sequence lengths and the documents' sequence counts, each in corpus order (not per shard:
    # the two layouts cut shards in different places)
    tokens, lengths, docs = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    for ds in opened:
        lengths.update(np.asarray(ds.sequence_lengths, dtype=np.int64).tobytes())
        docs.update(np.diff(ds.document_indices).astype(np.int64).tobytes())
        for i in range(len(ds)):
            tokens.update(np.asarray(ds[i], dtype=np.int64).tobytes())
    stream = (tokens.hexdigest(), lengths.hexdigest(), docs.hexdigest())
    files = [p for p in prefix.parent.iterdir() if p.name.startswith(prefix.name)]
    return {"shards": len(m["shards"]), "files": len(files), "manifest": mf.manifest_path(prefix).stat().st_size,
            "open_s": open_s, "tokens": m["totals"]["tokens"], "documents": m["totals"]["documents"],
            "stream": hash(stream)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_small_files_") as tmp:
        work = Path(tmp)
        total = write_inputs(work / "src", args.files)
        tok = work / "tok"
        subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", "wordpiece", "--input",
                        str(en_corpus()), "--output", str(tok), "--vocab-size", "8000", "--quiet"], cwd=REPO,
                       check=True, env={**os.environ, **ENV})
        print(f"{args.files:,} input files, {total / 2**20:.1f} MiB, --workers {args.workers}")
        results = {"per-file": [], "grouped": []}
        for _ in range(args.rounds):
            for name, code in (("per-file", PER_FILE), ("grouped", GROUPED)):
                prefix = work / name / "c"
                wall = build(code, work / "src", tok, prefix, args.workers)
                results[name].append({"wall": wall, **measure(prefix)})
        a, b = results["per-file"][-1], results["grouped"][-1]
        assert (a["tokens"], a["documents"], a["stream"]) == (b["tokens"], b["documents"], b["stream"]), \
            "the two outputs differ"
        print(f"{'':10s} {'build s (best)':>15s} {'shards':>8s} {'files':>8s} {'manifest B':>12s} "
              f"{'open all shards s':>18s}")
        for name, rs in results.items():
            r = rs[-1]
            print(f"{name:10s} {min(x['wall'] for x in rs):15.1f} {r['shards']:8,d} {r['files']:8,d} "
                  f"{r['manifest']:12,d} {min(x['open_s'] for x in rs):18.3f}")
        best = {k: min(x["wall"] for x in v) for k, v in results.items()}
        print(f"grouped / per-file: build time {best['grouped'] / best['per-file']:.3f}x, shards "
              f"{b['shards'] / a['shards']:.4f}x, manifest {b['manifest'] / a['manifest']:.4f}x; same token stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
