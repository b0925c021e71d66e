"""The data path at corpus scale: synthetic corpora of 1M to 1B sentences, today's builder against the previous one
and megatron-core's.

    python bench/scale.py [--sizes 1M,10M,100M,200M] [--workers N] [--format segment-pair] [--seq 128]
                          [--old-max 100M] [--megatron-max 200M] [--out bench/out/scale] [--parts open,megatron,old]

Corpora (written once under --out, reused): megatron-core ``.idx`` files written directly with numpy in its layout,
sparse ``.bin`` files (the tokens read are zeros: per-sample costs exclude disk reads), sentence lengths ~ 1 + Gamma
(2, 9.5) (mean ~20 tokens), documents ~ Geometric (mean 40 sentences), 1M-sentence shards, and a manifest. For each
size, each measurement in a fresh process:

- build: corpus arrays + sample index (trainer.data.build_index's work) with 1 and N workers: wall time, peak RSS of
  the builder and of its largest worker (VmHWM, ru_maxrss of children);
- open: a rank constructing ``PretrainingDataset`` on the prebuilt caches: time, its data path's private memory
  (/proc/self/smaps_rollup after minus before: Private_Clean + Private_Dirty, and Anonymous: a lone process's
  touched file pages count as Private_Clean although ranks of a node share them, so Anonymous is the private
  memory that 8 ranks would each hold) and RSS; time from process start to the first micro-batch (32 samples), with the caches prebuilt and with an empty
  cache (the process builds them: N workers); µs per sample at epoch 0 and at epoch 37; the epoch boundary (the
  first sample of a new epoch minus an ordinary one);
- old: the previous implementation (``git archive main`` of trainer/ and data_prep/ at the time of writing; pass
  --old-ref) on the same corpus: build time and peak RSS, open private memory, first epoch-boundary cost (its
  per-epoch permutation), up to --old-max sentences (it holds ~90 bytes per sentence while building);
- megatron: megatron-core's BERT builder (``helpers.build_mapping``, the C++ routine BERTMaskedWordPieceDataset runs
  on rank 0) and GPT's (``helpers.build_sample_idx`` + its document and shuffle indices) on the same corpus,
  including the whole-corpus arrays they need in memory.

Prints one table per size and the extrapolation to 2B sentences (linear in sentences from the largest size run),
and writes everything as JSON to --out/results.json. Ratios are against the baselines measured here, on this
machine, in the same run.

    python bench/scale.py --io ...    (the same as python bench/scale_io.py ...: real I/O, see there)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARD = 1_000_000
IDX_MAGIC = b"MMIDIDX\x00\x00"


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMBG")) * mult)


# -- synthetic corpora ---------------------------------------------------------------------------------------------------
def write_corpus(folder: Path, sentences: int, seed: int = 0, shard: int = SHARD, real: bool = False,
                 sidecars: bool = False, doc_mean: int = 40) -> Path:
    """PREFIX = folder/syn: shards of ``shard`` sentences in megatron-core's .idx layout (version 1, uint16 tokens).
    ``real``: every .bin byte written (random tokens), so reads hit the disk or the page cache; otherwise sparse.
    ``sidecars``: an ERNIE span side-car per shard (data_prep/sidecar.py's layout), one span per sentence of 4+
    tokens. ``doc_mean``: the mean document length in sentences (Geometric)."""
    prefix = folder / "syn"
    if (folder / "syn.manifest.json").exists():
        return prefix
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shards = []
    for k, lo in enumerate(range(0, sentences, shard)):
        n = min(shard, sentences - lo)
        lengths = (1 + rng.gamma(2.0, 9.5, n)).astype(np.int32)
        sizes = rng.geometric(1 / doc_mean, n // max(1, doc_mean // 4) + 10)
        ends = np.cumsum(sizes)
        ends = ends[ends < n]
        docs = np.concatenate([[0], ends, [n]]).astype(np.int64)
        pointers = np.zeros(n, np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
        name = f"syn_{k:05d}"
        with open(folder / f"{name}.idx", "wb") as f:
            f.write(IDX_MAGIC + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<QQ", n, len(docs)))
            f.write(lengths.tobytes())
            f.write(pointers.tobytes())
            f.write(docs.tobytes())
        tokens = int(lengths.sum(dtype=np.int64))
        with open(folder / f"{name}.bin", "wb") as f:
            if real:
                for at in range(0, tokens, 1 << 26):
                    rng.integers(5, 50000, min(1 << 26, tokens - at), dtype=np.uint16).tofile(f)
            else:
                f.truncate(2 * tokens)  # sparse: no disk blocks
        shards.append({"prefix": name, "documents": len(docs) - 1, "sentences": n, "tokens": tokens,
                       "bin_bytes": 2 * tokens, "bin_sha256": f"synthetic-{seed}-{k}", "idx_sha256": f"synthetic-{seed}-{k}",
                       "input": "synthetic", "input_range": [lo, lo + n]})
        if sidecars:  # recorded in the manifest, as data_prep/annotate.py records the side-cars it writes
            from data_prep.sidecar import header_record
            shards[-1]["sidecar"] = header_record(write_sidecar(folder / name, lengths))
    from data_prep.manifest import totals_of, write_manifest

    write_manifest(prefix, {"format": "bertfamily-indexed", "version": 1, "tool_version": "bench",
                            "tokenizer": {"path": str(folder / "no-tokenizer"), "fingerprint": "synthetic",
                                          "kind": "synthetic", "vocab_size": 50000},
                            "dtype": "uint16", "shards": shards, "totals": totals_of(shards, 0), "inputs": [],
                            "skipped": {}, "settings": {"synthetic": True, "seed": seed}})
    return prefix


def write_sidecar(shard_prefix: Path, lengths: np.ndarray) -> dict:
    """An ERNIE span side-car as data_prep/sidecar.py's SidecarWriter writes it: spans.npy rows (sequence, start,
    end, kind), mapped row pointers, and the header with the shard's lengths_sha256 (returned)."""
    import hashlib

    from data_prep.sidecar import FORMAT, KINDS, PTR_SUFFIX, VERSION, row_pointers

    seqs = np.flatnonzero(lengths >= 4).astype(np.int32)
    spans = np.stack([seqs, np.ones_like(seqs), np.full_like(seqs, 3), seqs % 2], axis=1).astype(np.int32)
    np.save(f"{shard_prefix}.spans.npy", spans)
    np.save(f"{shard_prefix}{PTR_SUFFIX}", row_pointers(spans, len(lengths)))
    header = {"format": FORMAT, "version": VERSION, "annotator": "synthetic", "sequences": len(lengths),
              "spans": len(spans), "kinds": list(KINDS), "row_pointers": shard_prefix.name + PTR_SUFFIX,
              "lengths_sha256": hashlib.sha256(lengths.astype("<i8").tobytes()).hexdigest(), "stats": {}}
    Path(f"{shard_prefix}.spans.json").write_text(json.dumps(header))
    return header


def smaps() -> dict:
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0]) * 1024
    out["private"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (less sensitive than wall time to a shared machine)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def peak_rss() -> dict:
    hwm = [line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM")]
    return {"self": int(hwm[0].split()[1]) * 1024,
            "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}


class Tok:
    """A tokenizer stand-in: the synthetic tokens are zeros, a normal token here."""
    pad_id, unk_id, cls_id, sep_id, mask_id = 1, 5, 2, 3, 4
    vocab_size = 50000
    special_ids = [1, 2, 3, 4, 5]
    word_start = None


def data_cfg(prefix, cache, fmt, seq, workers, old=False):
    from trainer.data.config import DataConfig

    extra = {} if old else {"index_workers": workers}
    return DataConfig(corpora=[{"prefix": str(prefix)}], format=fmt, max_seq_length=seq, cache_dir=str(cache),
                      num_workers=0, **extra)


def child_build(a) -> dict:
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.data.sample_index import load_or_build

    policy = CachePolicy(Path(a["cache"]), workers=a["workers"])
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    corpus = IndexedCorpus(a["prefix"], policy)
    t1 = time.perf_counter()
    index = load_or_build(corpus, a["fmt"], a["seq"], 0.1, 1234, False, policy)
    t2 = time.perf_counter()
    return {"corpus_s": t1 - t0, "index_s": t2 - t1, "total_s": t2 - t0, "samples": len(index),
            "cpu_s": cpu_seconds() - c0, "peak": peak_rss(), "bytes_on_disk": sum(p.stat().st_size for p in Path(a["cache"]).glob("*.bfc"))}


def _sample_costs(ds, n=2000) -> dict:
    N = len(ds)
    rng = np.random.default_rng(0)
    out = {}
    for name, epoch in (("epoch0", 0), ("epoch37", 37)):
        positions = (epoch * N + rng.integers(0, N, n)).tolist()
        ds[positions[0]]  # the epoch's first touch is the boundary cost, measured below
        t = time.perf_counter()
        for p in positions:
            ds[p]
        out[f"us_per_sample_{name}"] = (time.perf_counter() - t) / n * 1e6
    ordinary = []
    for p in rng.integers(0, N, 20).tolist():
        t = time.perf_counter()
        ds[50 * N + p]
        ordinary.append(time.perf_counter() - t)
    boundary = []
    for e in (60, 61, 62):
        t = time.perf_counter()
        ds[e * N]  # the first position of an epoch not touched before
        boundary.append(time.perf_counter() - t)
    out["epoch_boundary_ms"] = (float(np.median(boundary)) - float(np.median(ordinary))) * 1e3
    return out


def child_open(a) -> dict:
    import torch  # noqa: F401  (a rank has it imported: counted in the baseline, not in the data path)

    from trainer.data.dataset import PretrainingDataset
    from trainer.data.loader import Collator, build_dataloader

    before = smaps()
    t0 = time.perf_counter()
    ds = PretrainingDataset(data_cfg(a["prefix"], a["cache"], a["fmt"], a["seq"], a["workers"], a.get("old")), Tok(),
                            seed=7)
    t1 = time.perf_counter()
    opened = smaps()
    loader = build_dataloader(ds, Collator(Tok.pad_id, a["seq"], 20), 0, 32, 32, 0, 1, None, 0)
    next(iter(loader))
    first = time.time()
    t2 = time.perf_counter()
    after = smaps()
    out = {"open_s": t1 - t0, "first_batch_after_open_s": t2 - t0, "first_batch_wall": first,
           "private_open": opened["private"] - before["private"], "rss_open": opened["Rss"] - before["Rss"],
           "private_first_batch": after["private"] - before["private"],
           "anon_open": opened.get("Anonymous", 0) - before.get("Anonymous", 0),
           "anon_first_batch": after.get("Anonymous", 0) - before.get("Anonymous", 0),
           "rss_first_batch": after["Rss"] - before["Rss"], "samples": len(ds)}
    if a.get("costs"):
        out.update(_sample_costs(ds))
    out["peak"] = peak_rss()
    return out


def child_megatron(a) -> dict:
    from megatron.core.datasets import helpers_cpp as helpers

    from trainer.data.corpus import IndexedCorpus, idx_arrays
    from trainer.data.cache_file import CachePolicy

    corpus = IndexedCorpus(a["prefix"], CachePolicy(Path(a["cache"])))
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    # BERTMaskedWordPieceDataset's inputs: one IndexedDataset's arrays; a sharded corpus concatenated into one
    sizes = np.concatenate([idx_arrays(p)[0] for p, _, _ in corpus.shards]).astype(np.int32)
    docs = np.asarray(corpus.doc_starts, np.int64).copy()
    t1 = time.perf_counter()
    mapping = helpers.build_mapping(docs, sizes, 1, np.iinfo(np.int64).max - 1, a["seq"] - 3, 0.1, 1234, False, 2)
    t2 = time.perf_counter()
    bert_cpu = cpu_seconds() - c0
    del mapping
    bert_peak = peak_rss()["self"]
    # GPTDataset's: every .idx sequence is a document; shuffled document index, sample index, shuffle index
    rng = np.random.RandomState(1234)
    t3 = time.perf_counter()
    document_index = np.arange(len(sizes), dtype=np.int32)
    rng.shuffle(document_index)
    tokens = int(sizes.sum(dtype=np.int64))
    sample_index = helpers.build_sample_idx_int32(sizes, document_index, a["seq"], 1, tokens, True, True)
    shuffle = np.arange(len(sample_index) - 1, dtype=np.int64)
    rng.shuffle(shuffle)
    t4 = time.perf_counter()
    return {"bert_arrays_s": t1 - t0, "bert_build_mapping_s": t2 - t1, "bert_total_s": t2 - t0,
            "bert_cpu_s": bert_cpu, "bert_peak": bert_peak, "gpt_total_s": t4 - t3 + (t1 - t0), "gpt_samples": len(shuffle),
            "peak": peak_rss()}


def child_old_build(a) -> dict:
    from trainer.data.corpus import IndexedCorpus
    from trainer.data.sample_index import load_or_build

    from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: F401  (its import is not the build)

    c0 = cpu_seconds()
    t0 = time.perf_counter()
    corpus = IndexedCorpus(a["prefix"])
    t1 = time.perf_counter()
    index = load_or_build(corpus, a["fmt"], a["seq"], 0.1, 7, False, a["cache"])
    t2 = time.perf_counter()
    return {"corpus_s": t1 - t0, "index_s": t2 - t1, "total_s": t2 - t0, "samples": len(index),
            "cpu_s": cpu_seconds() - c0, "peak": peak_rss()}


# -- real I/O: 2 ranks x 2 loader workers per format, cold page cache (issue 25) -------------------------------------------
CHILDREN = {"build": child_build, "open": child_open, "megatron": child_megatron, "old-build": child_old_build}


def run_child(kind: str, args: dict, pythonpath: Path = REPO, timeout: float = 3600) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONWARNINGS": "ignore"}
    start = time.time()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_child", kind, json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=str(pythonpath))
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}",
                "stderr_tail": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.time() - start
    if "first_batch_wall" in out:
        out["start_to_first_batch_s"] = out.pop("first_batch_wall") - start
    return out


def old_tree(ref: str, out: Path) -> Path:
    """The previous implementation, trainer/ and data_prep/ of ``ref``, unpacked beside the results."""
    tree = out / f"old-{ref.replace('/', '_')}"
    if not (tree / "trainer").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "trainer", "data_prep"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


# -- the driver ------------------------------------------------------------------------------------------------------------
def gb(x) -> str:
    return f"{x / 2**30:.2f} GB" if isinstance(x, (int, float)) else "-"


def measure(size: int, a, out: Path, old: Path | None) -> dict:
    folder = out / f"corpus-{size}"
    t = time.perf_counter()
    prefix = write_corpus(folder, size)
    res = {"sentences": size, "corpus_write_s": time.perf_counter() - t}
    common = {"prefix": str(prefix), "fmt": a.format, "seq": a.seq}
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        tmp = Path(tmp)
        parts = set(a.parts.split(","))
        res["build_1"] = run_child("build", {**common, "cache": str(tmp / "c1"), "workers": 1})
        res["build_n"] = run_child("build", {**common, "cache": str(tmp / "cn"), "workers": a.workers})
        if "open" in parts:
            res["open"] = run_child("open", {**common, "cache": str(tmp / "cn"), "workers": a.workers, "costs": True})
            res["cold_open"] = run_child("open", {**common, "cache": str(tmp / "cold"), "workers": a.workers})
        if size <= a.megatron_max and "megatron" in parts:
            res["megatron"] = run_child("megatron", {**common, "cache": str(tmp / "cn")})
        if old is not None and size <= a.old_max and "old" in parts:
            res["old_build"] = run_child("old-build", {**common, "cache": str(tmp / "old")}, old)
            res["old_open"] = run_child("open", {**common, "cache": str(tmp / "old"), "workers": 1, "old": True,
                                                 "costs": size <= 10_000_000}, old)
    return res


def report(r: dict, workers: int) -> str:
    def g(d, *keys, fmt="{:.2f}"):
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return "-"
            d = d[k]
        return fmt.format(d) if isinstance(d, (int, float)) else str(d)

    lines = [f"== {r['sentences']:,} sentences =="]
    b1, bn, op, co = r["build_1"], r["build_n"], r.get("open", {}), r.get("cold_open", {})
    lines.append(f"new build (corpus arrays + index): 1 worker {g(b1, 'total_s')} s (index {g(b1, 'index_s')} s, "
                 f"CPU {g(b1, 'cpu_s')} s), "
                 f"{workers} workers {g(bn, 'total_s')} s; peak RSS builder {gb(b1.get('peak', {}).get('self'))}, "
                 f"with {workers} workers {gb(bn.get('peak', {}).get('self'))} + largest worker "
                 f"{gb(bn.get('peak', {}).get('children'))}; {g(b1, 'samples', fmt='{:,}')} samples, "
                 f"{gb(b1.get('bytes_on_disk'))} on disk")
    lines.append(f"new rank: open {g(op, 'open_s')} s, private {gb(op.get('private_open'))} (anonymous "
                 f"{gb(op.get('anon_open'))}, RSS {gb(op.get('rss_open'))}), after first batch private "
                 f"{gb(op.get('private_first_batch'))} (anonymous {gb(op.get('anon_first_batch'))}); "
                 f"start->first batch {g(op, 'start_to_first_batch_s')} s prebuilt, "
                 f"{g(co, 'start_to_first_batch_s')} s with an empty cache; µs/sample epoch 0 "
                 f"{g(op, 'us_per_sample_epoch0', fmt='{:.0f}')}, epoch 37 {g(op, 'us_per_sample_epoch37', fmt='{:.0f}')}"
                 f"; epoch boundary {g(op, 'epoch_boundary_ms', fmt='{:.3f}')} ms")
    if "megatron" in r:
        m = r["megatron"]
        lines.append(f"megatron-core BERT build_mapping: {g(m, 'bert_total_s')} s (arrays {g(m, 'bert_arrays_s')} s, "
                     f"CPU {g(m, 'bert_cpu_s')} s),"
                     f" peak RSS {gb(m.get('bert_peak'))}; GPT sample+shuffle index {g(m, 'gpt_total_s')} s, peak "
                     f"{gb(m.get('peak', {}).get('self'))}")
    if "old_build" in r:
        ob, oo = r["old_build"], r["old_open"]
        lines.append(f"previous build: {g(ob, 'total_s')} s (corpus {g(ob, 'corpus_s')} s, index {g(ob, 'index_s')}"
                     f" s, CPU {g(ob, 'cpu_s')} s), peak RSS {gb(ob.get('peak', {}).get('self'))}; rank private {gb(oo.get('private_open'))} "
                     f"(anonymous {gb(oo.get('anon_open'))}), after first batch {gb(oo.get('private_first_batch'))};"
                     f" start->first batch {g(oo, 'start_to_first_batch_s')} s prebuilt; epoch boundary "
                     f"{g(oo, 'epoch_boundary_ms', fmt='{:.0f}')} ms; µs/sample epoch 0 "
                     f"{g(oo, 'us_per_sample_epoch0', fmt='{:.0f}')}")
        if "total_s" in ob and "total_s" in bn:
            lines.append(f"speed-up of the build vs previous: {ob['total_s'] / bn['total_s']:.1f}x ({workers} "
                         f"workers), {ob['total_s'] / b1['total_s']:.1f}x (1 worker)")
    errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
    if errors:
        lines.append(f"errors: {errors}")
    return "\n".join(lines)


def extrapolate(r: dict, workers: int, target: int = 2_000_000_000) -> str:
    f = target / r["sentences"]
    bn, b1, op = r["build_n"], r["build_1"], r.get("open", {})
    parts = [f"== extrapolated to {target / 1e9:.0f}B sentences (x{f:.0f} from {r['sentences']:,}) =="]
    if "total_s" in bn:
        parts.append(f"build: {b1['total_s'] * f / 60:.1f} min with 1 worker, {bn['total_s'] * f / 60:.1f} min with "
                     f"{workers} (divide by workers/{workers} on a node with more CPUs); builder peak RSS flat "
                     f"({gb(b1['peak']['self'])}); cache on disk {gb(b1['bytes_on_disk'] * f)}")
    if "private_open" in op:
        parts.append(f"rank private memory after open: {gb(op['private_open'])} (no per-sentence term: the arrays are "
                     f"mapped)")
    if "old_build" in r and "total_s" in r["old_build"]:
        ob = r["old_build"]
        parts.append(f"previous: build {ob['total_s'] * f / 60:.1f} min, peak RSS {gb(ob['peak']['self'] * f)}")
    return "\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1M,10M,100M,200M")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--format", default="segment-pair")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--old-ref", default="d15298b", help="git ref of the previous implementation, the one issue 14 measured "
                   "(d15298b: main before issue 14; 'none' to skip)")
    p.add_argument("--old-max", default="100M", help="largest size to run the previous implementation on")
    p.add_argument("--megatron-max", default="200M")
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "scale"))
    p.add_argument("--parts", default="open,megatron,old",
                   help="measurements besides the builds (a comma list of open, megatron, old)")
    p.add_argument("--io", action="store_true",
                   help="real I/O instead: non-sparse .bin, --shards shards, ERNIE side-cars, cold page cache, 2 ranks "
                        "x 2 loader workers per format, the builder at 1/2/16 workers (--sizes: 2M,20M by default)")
    p.add_argument("--shards", type=int, default=1000, help="--io: shards per corpus")
    p.add_argument("--io-parts", default="build,formats",
                   help="--io: build (our builder at 1/2/16 workers and megatron-core's), formats (per format: the "
                        "ranks' start, rank 0's open alone, reads), or both")
    p.add_argument("--formats", default="segment-pair,full-sentences,sop-pair,ernie", help="--io: the formats measured")
    p.add_argument("--cold-repeats", type=int, default=1,
                   help="--io: cold starts of the 2 ranks per format (each after a page-cache drop), for their spread")
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._child:
        children = CHILDREN
        if a._child[0] not in children:  # bench/scale_io.py's own (its measurements run through this entry point)
            import scale_io
            children = scale_io.CHILDREN
        print(json.dumps(children[a._child[0]](json.loads(a._child[1]))))
        return 0
    if a.io:
        import scale_io
        return scale_io.run(a, p)
    a.old_max, a.megatron_max = parse_size(a.old_max), parse_size(a.megatron_max)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    old = None if a.old_ref == "none" else old_tree(a.old_ref, out)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    last = None
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        r = measure(size, a, out, old)
        r.update({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "workers": a.workers,
                  "format": a.format, "seq": a.seq, "cpus": os.cpu_count()})
        results[str(size)] = r
        results_path.write_text(json.dumps(results, indent=1))
        print(report(r, a.workers), flush=True)
        last = r
    if last is not None:
        print(extrapolate(last, a.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
