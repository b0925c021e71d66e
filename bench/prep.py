"""Data-prep throughput: build_indexed.py against Megatron-LM's own tools/preprocess_data.py, same corpus, one run.

    python bench/prep.py [--megatron-lm bench/out/megatron_lm] [--size-mb 20] [--workers 2] [--rounds 2]
    python bench/prep.py --encode-cost-only        # only part 2 (no Megatron-LM checkout needed)

``--megatron-lm`` is a checkout of Megatron-LM at the tag matching the installed megatron-core (core_v0.16.1):

    git clone --depth 1 --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM bench/out/megatron_lm

(``make bench`` does this; bench/out/ is ignored: no Megatron-LM code is part of this repository.) It needs
``tools/preprocess_data.py`` and the ``megatron/training`` and ``megatron/legacy`` folders, plus ``six``
(``pip install -e .[bench]``). ``megatron/training/__init__.py`` imports the pretraining loop (initialize.py needs
triton, training.py ``megatron.rl``), which preprocess_data.py never calls; the ``--run-megatron`` runner below
registers ``megatron.training`` as a bare package carrying the ``get_*`` accessors of its ``global_vars`` (what its
``utils`` imports from the package) and then runs the script unmodified.

1. Both tools read the same ``.jsonl`` (the tests' English corpus, one document per line, repeated to --size-mb),
   use the same WordPiece folder (trained here by data_prep/train_tokenizer.py) and ``--workers N``:
   - Megatron-LM: ``--tokenizer-type HuggingFaceTokenizer --tokenizer-hf-use-fast``, no ``--split-sentences``: one
     tokenizer call and one sequence per *document* (its ``_text_document`` layout: GPT-style, what
     ``--split-sentences`` would change into one sequence per punkt sentence, which needs NLTK's punkt data);
   - ours: ``build_indexed.py --tokenizer-threads 1``: one sequence per *line* of a document (the sentence layout
     BERT's segment pairs and SOP need), ``end_document`` per document.
   Both are checked to hold the same documents and the same token stream (WordPiece splits on the newline, so a
   document's ids are its lines' ids one after the other); only the sequence boundaries differ. Wall and CPU time
   (user + system of the whole process tree) and peak RSS (summed over the tree, sampled every 50 ms) of each whole
   command, start-up included; the two tools alternate for --rounds rounds; best and median are reported.
2. Encoding cost per line against per document with the same tokenizer, in this process, one Rust thread, best of
   --rounds: what build_indexed does (``encode_batch_fast`` over the lines), the floor of per-document encoding
   (``encode_batch_fast`` over whole documents), and per-document encoding split back into lines by the tokenizer's
   character offsets (``encode_batch`` + a searchsorted per document), with a count of the lines whose ids differ
   from encoding the line alone, for each tokenizer kind.

The machine is shared with other jobs, so the ratios are what to read, not the absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpora import en_corpus  # noqa: E402  (the tests' English text: Python's docstrings, generated once)

MEGATRON_TAG = "core_v0.16.1"
ENV = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


# ---------------------------------------------------------------------------------------------------- Megatron-LM


def check_megatron_lm(root: Path) -> None:
    need = [root / "tools" / "preprocess_data.py", root / "megatron" / "training" / "tokenizer",
            root / "megatron" / "legacy"]
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        raise SystemExit(f"error: {root} is not a Megatron-LM checkout (missing {', '.join(missing)}); get one with\n"
                         f"  git clone --depth 1 --branch {MEGATRON_TAG} https://github.com/NVIDIA/Megatron-LM {root}")


def run_megatron(root: Path, argv: list[str]) -> None:
    """Run Megatron-LM's tools/preprocess_data.py unmodified, without importing its pretraining loop."""
    import importlib
    import runpy
    import types

    sys.path.insert(0, str(root))
    import megatron  # noqa: F401  (megatron-core's namespace package; with root on sys.path it spans root/megatron)

    pkg = types.ModuleType("megatron.training")
    pkg.__path__ = [str(root / "megatron" / "training")]
    sys.modules["megatron.training"] = pkg
    global_vars = importlib.import_module("megatron.training.global_vars")
    for name in dir(global_vars):
        if name.startswith("get_"):
            setattr(pkg, name, getattr(global_vars, name))
    script = str(root / "tools" / "preprocess_data.py")
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


# ---------------------------------------------------------------------------------------------------- harness


def measure(cmd: list[str]) -> dict:
    """Wall seconds, CPU seconds (user + system of the whole tree: every descendant is waited for, so it lands in
    RUSAGE_CHILDREN) and peak RSS (MiB, summed over the process tree) of a command."""
    import resource

    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = 0
            for p in [root, *root.children(recursive=True)]:
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
    return {"seconds": wall, "cpu_seconds": cpu, "peak_rss_mib": peak / 2**20}


def make_corpus(path: Path, size_mb: float) -> int:
    """The English corpus as .jsonl documents, repeated until ``size_mb``; returns the byte size."""
    sys.path.insert(0, str(REPO))
    from data_prep.sources import iter_documents

    lines = [json.dumps({"text": "\n".join(d.lines)}, ensure_ascii=False) + "\n"
             for d in iter_documents(str(en_corpus()))]
    return write_repeated(path, "".join(lines).encode("utf-8"), size_mb)


def write_repeated(path: Path, block: bytes, size_mb: float) -> int:
    """``block`` written to ``path`` again and again until ``size_mb``; returns the byte size."""
    with open(path, "wb") as fh:
        written = 0
        while written < size_mb * 2**20:
            fh.write(block)
            written += len(block)
    return path.stat().st_size


def megatron_output(prefix: str):
    """(documents, sequences, tokens, token stream) of Megatron's ``{prefix}_text_document``."""
    import warnings

    import numpy as np
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(prefix + "_text_document")
    stream = np.fromfile(prefix + "_text_document.bin", dtype=ds.index.dtype)
    return len(ds.document_indices) - 1, len(ds), int(ds.sequence_lengths.sum()), stream


def our_output(prefix: str):
    import numpy as np
    sys.path.insert(0, str(REPO))
    from data_prep.manifest import read_manifest

    m = read_manifest(prefix)
    root = Path(prefix).parent
    stream = np.concatenate([np.fromfile(root / (s["prefix"] + ".bin"), dtype=m["dtype"]) for s in m["shards"]])
    t = m["totals"]
    return t["documents"], t["sentences"], t["tokens"], stream


def compare_tools(args, work: Path, tok: Path) -> None:
    import numpy as np

    root = Path(args.megatron_lm).resolve()
    check_megatron_lm(root)
    corpus = work / f"corpus_{args.size_mb:g}mb.jsonl"
    mib = make_corpus(corpus, args.size_mb) / 2**20
    py = sys.executable
    chunk = args.chunk_size_mb or max(1.0, round(mib / (2 * args.workers), 1))
    meg_prefix, our_prefix = str(work / "megatron" / "c"), str(work / "ours" / "c")
    (work / "megatron").mkdir(exist_ok=True)
    meg_cmd = [py, str(Path(__file__).resolve()), "--run-megatron", str(root), "--input", str(corpus),
               "--output-prefix", meg_prefix, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
               str(tok), "--tokenizer-hf-use-fast", "--json-keys", "text", "--workers", str(args.workers),
               "--log-interval", "1000000"]
    our_cmd = [py, "data_prep/build_indexed.py", "--input", str(corpus), "--tokenizer", str(tok), "--output-prefix",
               our_prefix, "--workers", str(args.workers), "--tokenizer-threads", "1", "--chunk-size-mb", str(chunk),
               "--overwrite"]
    print(f"corpus {corpus.name}: {mib:.1f} MiB; --workers {args.workers}; ours --chunk-size-mb {chunk}", flush=True)
    runs = {"megatron": [], "ours": []}
    for r in range(args.rounds):
        for name, cmd in (("megatron", meg_cmd), ("ours", our_cmd)) if r % 2 == 0 else (("ours", our_cmd),
                                                                                        ("megatron", meg_cmd)):
            if name == "ours":
                Path(our_prefix + ".manifest.json").unlink(missing_ok=True)
            runs[name].append(measure(cmd))
            m = runs[name][-1]
            print(f"round {r + 1} {name:>8}: {m['seconds']:6.1f} s wall, {m['cpu_seconds']:6.1f} s CPU, "
                  f"peak RSS {m['peak_rss_mib']:5.0f} MiB", flush=True)
    md, ms, mt, mstream = megatron_output(meg_prefix)
    od, os_, ot, ostream = our_output(our_prefix)
    if md != od or mt != ot or not np.array_equal(mstream.astype(np.int64), ostream.astype(np.int64)):
        raise SystemExit(f"outputs differ: Megatron-LM {md} documents, {mt} tokens; ours {od} documents, {ot} tokens")
    print(f"same {od:,} documents and the same {ot:,}-token stream; sequences: Megatron-LM {ms:,} (one per "
          f"document), ours {os_:,} (one per line)")
    print(f"\n{'':>10} {'best wall s':>11} {'median wall s':>13} {'median CPU s':>12} {'MiB/s/worker':>12} "
          f"{'peak RSS MiB':>12}")
    for name, ms_ in runs.items():
        best = min(m["seconds"] for m in ms_)
        print(f"{name:>10} {best:>11.1f} {statistics.median(m['seconds'] for m in ms_):>13.1f} "
              f"{statistics.median(m['cpu_seconds'] for m in ms_):>12.1f} {mib / best / args.workers:>12.3f} "
              f"{max(m['peak_rss_mib'] for m in ms_):>12.0f}")
    b = {k: min(m["seconds"] for m in v) for k, v in runs.items()}
    med = {k: statistics.median(m["seconds"] for m in v) for k, v in runs.items()}
    cpu = {k: statistics.median(m["cpu_seconds"] for m in v) for k, v in runs.items()}
    print(f"Megatron-LM / ours: wall best {b['megatron'] / b['ours']:.2f}x, wall median "
          f"{med['megatron'] / med['ours']:.2f}x, CPU median {cpu['megatron'] / cpu['ours']:.2f}x", flush=True)
    corpus.unlink()


# ---------------------------------------------------------------------------------------------------- encode cost


def split_by_offsets(encoding, line_starts):
    """Token ids of one document's encoding, split into its lines by each token's first character."""
    import numpy as np

    ids = np.asarray(encoding.ids)
    starts = np.fromiter((o[0] for o in encoding.offsets), dtype=np.int64, count=len(ids))
    line_of = np.searchsorted(line_starts, starts, side="right") - 1  # non-decreasing: offsets follow the text
    cuts = np.searchsorted(line_of, np.arange(1, len(line_starts)))
    return np.split(ids, cuts)


def encode_cost(work: Path, rounds: int) -> None:
    """Part 2: per-line vs per-document encoding, CPU seconds in this process, one Rust thread."""
    import numpy as np
    sys.path.insert(0, str(REPO))
    from data_prep.sources import iter_documents
    from data_prep.tokenizer import load_tokenizer

    docs = [d.lines for d in iter_documents(str(en_corpus()))]
    lines = [x for d in docs for x in d]
    texts = ["\n".join(d) for d in docs]
    starts = [np.cumsum([0] + [len(x) + 1 for x in d[:-1]]) for d in docs]
    mib = sum(len(t.encode()) for t in texts) / 2**20
    print(f"\nencode cost: {len(docs):,} documents, {len(lines):,} lines, {mib:.2f} MiB; CPU s, best of {rounds}")
    print(f"{'kind':>10} {'per line':>9} {'per doc':>9} {'doc+split':>10} {'line/doc':>9} {'line/doc+split':>15} "
          f"{'lines differing':>16}")
    for kind in ("wordpiece", "bbpe", "unigram"):
        tok_dir = work / kind
        if not (tok_dir / "tokenizer.json").exists():
            subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", kind, "--input", str(en_corpus()),
                            "--output", str(tok_dir), "--vocab-size", "8000", "--quiet"], cwd=REPO, check=True,
                           env={**os.environ, **ENV})
        backend = load_tokenizer(tok_dir).backend

        def per_line():
            return [e.ids for e in backend.encode_batch_fast(lines, add_special_tokens=False)]

        def per_doc():
            return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]

        def doc_split():
            encs = backend.encode_batch(texts, add_special_tokens=False)
            return [part for e, s in zip(encs, starts) for part in split_by_offsets(e, s)]

        best = {}
        for _ in range(rounds):  # interleaved
            for name, fn in (("line", per_line), ("doc", per_doc), ("split", doc_split)):
                t0 = time.process_time()
                fn()
                best[name] = min(best.get(name, float("inf")), time.process_time() - t0)
        differ = sum(list(a) != list(b) for a, b in zip(per_line(), doc_split()))
        print(f"{kind:>10} {best['line']:>9.2f} {best['doc']:>9.2f} {best['split']:>10.2f} "
              f"{best['line'] / best['doc']:>8.2f}x {best['line'] / best['split']:>14.2f}x "
              f"{differ:>9,} of {len(lines):,}", flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-megatron"]:  # before argparse: Megatron's own options (--workers ...) are passed through
        run_megatron(Path(argv[1]), argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatron-lm", default=str(REPO / "bench" / "out" / "megatron_lm"),
                    help=f"Megatron-LM checkout at {MEGATRON_TAG}")
    ap.add_argument("--size-mb", type=float, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk-size-mb", type=float, default=0,
                    help="ours: piece size (default: input / (2 x workers), so that every worker has pieces)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--encode-cost-only", action="store_true")
    args = ap.parse_args(argv)
    os.environ.update(ENV)  # one Rust thread here too, before tokenizers builds its pool
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if not args.encode_cost_only:
            tok = work / "wordpiece"
            if not (tok / "tokenizer.json").exists():
                subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", "wordpiece", "--input",
                                str(en_corpus()), "--output", str(tok), "--vocab-size", "8000", "--quiet"], cwd=REPO,
                               check=True, env={**os.environ, **ENV})
            compare_tools(args, work, tok)
        encode_cost(work, max(args.rounds, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
