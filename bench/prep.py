"""Data-prep throughput and memory: build_indexed.py against Megatron's preprocess_data.py loop, same data, one run.

    python bench/prep.py [--sizes-mb 20 200] [--workers 1] [--work /tmp/bench_prep]

The corpus is the tests' English corpus (bench/corpora.py: Python's docstrings) as JSON lines, one document per line, replicated
to each size. Both tools read the same .jsonl, use the same Hugging Face fast tokenizer (a WordPiece trained here
by data_prep/train_tokenizer.py) and write megatron-core indexed files with the same content: one sequence per line
of a document (the sentence-per-sequence layout BERT's samples need), checked equal in counts and tokens.

The baseline is Megatron-LM's ``tools/preprocess_data.py`` loop rebuilt here (that script is not in the
megatron-core wheel): ``multiprocessing.Pool(workers, initializer)``, ``pool.imap(encoder.encode, fin, 32)`` with one
JSON line per task, ``json.loads`` and the tokenizer called once per text in the worker (Megatron's
``_HuggingFaceTokenizer.tokenize`` is ``tokenizer(text).input_ids`` on a transformers fast tokenizer), the ids sent
back to the main process, which calls ``builder.add_document`` for every document and ``finalize`` once at the end.
For one sequence per sentence Megatron runs its splitter first (``--split-sentences``: an NLTK punkt pass that
writes lists of sentences) and then tokenizes each sentence with its own call; here the "splitter" is
``text.split("\n")`` done inside encode, which costs the baseline less than punkt would.

Each run is a separate process tree; its peak RSS is the largest sum of RSS over the tree, sampled every 50 ms
with psutil. MB/s counts input bytes over the wall time of the whole command (start-up included), divided by the
number of worker processes for "per worker". The machine is shared with other jobs, so the two tools run
alternately at each size and the ratio is what to read, not the absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from corpora import en_corpus  # the tests' English text: Python's docstrings, generated once

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------- baseline


class _Encoder:
    """Megatron's preprocess_data.Encoder with a Hugging Face tokenizer and the identity splitter."""

    def __init__(self, tokenizer_dir: str, json_key: str):
        self.tokenizer_dir, self.json_key = tokenizer_dir, json_key

    def initializer(self):
        from transformers import AutoTokenizer

        _Encoder.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def encode(self, json_line: str):
        data = json.loads(json_line)
        text = data[self.json_key]
        # Megatron's encode takes the splitter pass's list of sentences; the lines of the text stand in for it.
        sentences = text if isinstance(text, list) else [s for s in (x.strip() for x in text.split("\n")) if s]
        doc_ids, sentence_lens = [], []
        for sentence in sentences:
            sentence_ids = _Encoder.tokenizer(sentence, add_special_tokens=False).input_ids
            if len(sentence_ids) > 0:
                doc_ids.extend(sentence_ids)
                sentence_lens.append(len(sentence_ids))
        return doc_ids, sentence_lens, len(json_line)


def run_baseline(input_path: str, tokenizer_dir: str, output_prefix: str, workers: int) -> None:
    import multiprocessing

    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    encoder = _Encoder(tokenizer_dir, "text")
    encoder.initializer()
    vocab = len(_Encoder.tokenizer)
    with open(input_path, encoding="utf-8") as fin:
        pool = multiprocessing.Pool(workers, initializer=encoder.initializer)
        encoded = pool.imap(encoder.encode, fin, 32)
        builder = IndexedDatasetBuilder(output_prefix + ".bin", dtype=DType.optimal_dtype(vocab))
        docs = 0
        for doc, lens, _ in encoded:
            builder.add_document(np.array(doc, dtype=np.int64), lens)
            docs += 1
        builder.finalize(output_prefix + ".idx")
        pool.close()
        pool.join()
    print(json.dumps({"documents": docs}))


# ---------------------------------------------------------------------------------------------------- harness


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Wall seconds, CPU seconds (user + system of the whole tree: every descendant is waited for, so it lands in
    RUSAGE_CHILDREN) and peak RSS (MiB, summed over the process tree) of a command."""
    import resource

    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            rss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return {"seconds": wall, "cpu_seconds": cpu, "peak_rss_mib": peak / 2**20, "stdout": out}


def tokenizer_floor(tokenizer_dir: str) -> float:
    """CPU seconds per MiB of the bare Rust tokenizer (encode_batch_fast, one thread) on the corpus's lines: the
    part of the work that neither tool can avoid with this tokenizer. Measured in this process."""
    sys.path.insert(0, str(REPO))
    from data_prep.sources import iter_documents
    from data_prep.tokenizer import load_tokenizer

    lines = [line for d in iter_documents(str(en_corpus())) for line in d.lines]
    backend = load_tokenizer(tokenizer_dir).backend
    t0 = time.process_time()
    backend.encode_batch_fast(lines, add_special_tokens=False)
    return (time.process_time() - t0) / (en_corpus().stat().st_size / 2**20)


def make_corpus(path: Path, size_mb: float) -> int:
    """The English corpus as .jsonl documents, repeated until ``size_mb``; returns the byte size."""
    sys.path.insert(0, str(REPO))
    from data_prep.sources import iter_documents

    lines = [json.dumps({"text": "\n".join(d.lines)}, ensure_ascii=False) + "\n" for d in iter_documents(str(en_corpus()))]
    block = "".join(lines).encode("utf-8")
    target = int(size_mb * 2**20)
    with open(path, "wb") as fh:
        written = 0
        while written < target:
            fh.write(block)
            written += len(block)
    return path.stat().st_size


def read_totals(prefix: str) -> dict:
    sys.path.insert(0, str(REPO))
    from data_prep.manifest import read_manifest

    return read_manifest(prefix)["totals"]


def baseline_totals(prefix: str) -> dict:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(prefix)
    return {"documents": len(ds.document_indices) - 1, "sentences": len(ds), "tokens": int(ds.sequence_lengths.sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[20, 200])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shard-sequences", type=int, default=250_000,
                    help="ours: sequences per shard (what bounds memory; see BENCHMARKS.md)")
    ap.add_argument("--work", default="/tmp/bench_prep")
    ap.add_argument("--run-baseline", nargs=3, metavar=("INPUT", "TOKENIZER", "PREFIX"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_baseline:
        run_baseline(*args.run_baseline, workers=args.workers)
        return 0

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = work / "wordpiece"
    py = sys.executable
    if not (tok / "tokenizer.json").exists():
        subprocess.run([py, "data_prep/train_tokenizer.py", "--kind", "wordpiece", "--input", str(en_corpus()),
                        "--output", str(tok), "--quiet"], cwd=REPO, check=True)
    # One Rust thread per worker for both (the baseline's per-call path is single-threaded anyway).
    env = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    rows = []
    for size in args.sizes_mb:
        corpus = work / f"corpus_{size:g}mb.jsonl"
        nbytes = make_corpus(corpus, size)
        mb = nbytes / 2**20
        base_prefix = str(work / f"baseline_{size:g}")
        ours_prefix = str(work / f"ours_{size:g}" / "c")
        for p in Path(work).glob(f"ours_{size:g}/*"):
            p.unlink()
        base = measure([py, "bench/prep.py", "--workers", str(args.workers), "--run-baseline", str(corpus), str(tok),
                        base_prefix], env)
        ours = measure([py, "data_prep/build_indexed.py", "--input", str(corpus), "--tokenizer", str(tok),
                        "--output-prefix", ours_prefix, "--workers", str(args.workers), "--tokenizer-threads", "1",
                        "--shard-sequences", str(args.shard_sequences)], env)
        bt, ot = baseline_totals(base_prefix), read_totals(ours_prefix)
        if any(bt[k] != ot[k] for k in ("documents", "sentences", "tokens")):
            raise SystemExit(f"outputs differ: baseline {bt}, ours {ot}")
        row = {
            "size_mb": round(mb, 1), "documents": ot["documents"],
            "baseline_tokens": bt["tokens"], "ours_tokens": ot["tokens"],
            "baseline_s": round(base["seconds"], 1), "ours_s": round(ours["seconds"], 1),
            "baseline_mb_s_per_worker": round(mb / base["seconds"] / args.workers, 3),
            "ours_mb_s_per_worker": round(mb / ours["seconds"] / args.workers, 3),
            "ratio": round(base["seconds"] / ours["seconds"], 2),
            "baseline_cpu_s": round(base["cpu_seconds"], 1), "ours_cpu_s": round(ours["cpu_seconds"], 1),
            "cpu_ratio": round(base["cpu_seconds"] / ours["cpu_seconds"], 2),
            "baseline_peak_rss_mib": round(base["peak_rss_mib"]), "ours_peak_rss_mib": round(ours["peak_rss_mib"]),
            "ours_shards": ot["shards"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        corpus.unlink()
    print(f"\n{'size MB':>8} {'docs':>9} {'base MB/s/w':>12} {'ours MB/s/w':>12} {'ratio':>6} {'base CPU s':>10} "
          f"{'ours CPU s':>10} {'CPU ratio':>9} {'base RSS MiB':>13} {'ours RSS MiB':>13}")
    for r in rows:
        print(f"{r['size_mb']:>8} {r['documents']:>9,} {r['baseline_mb_s_per_worker']:>12} "
              f"{r['ours_mb_s_per_worker']:>12} {r['ratio']:>6} {r['baseline_cpu_s']:>10} {r['ours_cpu_s']:>10} "
              f"{r['cpu_ratio']:>9} {r['baseline_peak_rss_mib']:>13} {r['ours_peak_rss_mib']:>13}")
    floor = tokenizer_floor(str(tok))
    print(f"bare tokenizer (encode_batch_fast, 1 thread): {floor:.2f} CPU s/MiB; at {rows[-1]['size_mb']} MB that is "
          f"{floor * rows[-1]['size_mb']:.0f} CPU s of the baseline's {rows[-1]['baseline_cpu_s']} and ours' "
          f"{rows[-1]['ours_cpu_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
