"""The data path at real I/O (issue 25), the ``--io`` mode of bench/scale.py, kept in its own module:

    python bench/scale_io.py [--sizes 2M,20M] [--shards 1000] [--out bench/out/scale_io]
                             [--io-parts build,formats] [--formats segment-pair,...] [--cold-repeats N]

Shards whose ``.bin`` holds random tokens (every byte written), an ERNIE span side-car
per shard, and a sparse twin of the same corpus as the baseline. Before each cold measurement every corpus and cache
file gets ``posix_fadvise(DONTNEED)`` (the resident fraction after it, from fincore, is printed). Measured: the
builder at 1, 2 and 16 workers (wall, CPU, peak RSS) against megatron-core's ``build_mapping``; per format (BERT's
segment-pair, RoBERTa's full-sentences, ALBERT's sop-pair, ERNIE 1.0 with side-cars) two rank processes started
together (RANK 0 and 1) with 2 forked loader workers each: start to first micro-batch, cold and warm, and every file
under the corpus folder each rank and worker opens (an audit hook); the cold start ``--cold-repeats`` times in all,
for its spread; rank 0's open alone on a cold cache (no other process reading beside it); µs per sample at real I/O
against the sparse twin. Each stage's caches are deleted once it is measured (at 500M sentences they are 2-3 GB each).

The corpora, the builder and megatron-core's children and the child-process runner are bench/scale.py's (each
measurement runs in a fresh process through its ``--_child`` entry point).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import REPO, Tok, cpu_seconds, gb, parse_size, peak_rss, run_child, write_corpus  # noqa: E402


def sparse_twin(folder: Path) -> Path:
    """folder/sparse: the same corpus (hard-linked .idx, side-cars and manifest) with sparse .bin files: the
    baseline whose reads never touch the disk, on the same structure."""
    twin = folder / "sparse"
    if not (twin / "syn.manifest.json").exists():
        twin.mkdir(exist_ok=True)
        for path in folder.iterdir():
            if path.is_file() and not (twin / path.name).exists():
                if path.suffix == ".bin":
                    with open(twin / path.name, "wb") as f:
                        f.truncate(path.stat().st_size)
                else:
                    os.link(path, twin / path.name)
    return twin / "syn"


def drop_page_cache(folders: list[Path]) -> float:
    """posix_fadvise(DONTNEED) on every file under ``folders`` after a sync (dirty pages cannot be dropped);
    returns the fraction of their bytes still resident after it (fincore), or -1 without fincore."""
    os.sync()
    files = [p for f in folders for p in Path(f).rglob("*") if p.is_file()]
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        resident = total = 0
        for chunk in range(0, len(files), 200):
            out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE",
                                  *map(str, files[chunk:chunk + 200])], capture_output=True, text=True, check=True)
            for line in out.stdout.split("\n"):
                if line.strip():
                    res, size = map(int, line.split())
                    resident, total = resident + res, total + size
        return resident / max(total, 1)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return -1.0


# -- measurements (each in its own process) --------------------------------------------------------------------------------

IO_FORMATS = ("segment-pair", "full-sentences", "sop-pair", "ernie")  # BERT, RoBERTa/ELECTRA, ALBERT, ERNIE 1.0
IO_GLOBAL, IO_MICRO = 64, 16  # per step: 2 ranks x 2 micro-batches of 16


def _io_dataset(a):
    """(dataset, collator) of format ``a["fmt"]`` as the trainer builds them (ERNIE: tiny_ernie's dataset with the
    corpus's side-cars and no DLM file), loader workers ``a["workers"]``."""
    if a["fmt"] != "ernie":
        from trainer.data.config import DataConfig
        from trainer.data.dataset import PretrainingDataset
        from trainer.data.loader import Collator

        cfg = DataConfig(corpora=[{"prefix": a["prefix"]}], format=a["fmt"], max_seq_length=a["seq"],
                         cache_dir=a["cache"], num_workers=a["workers"])
        return (PretrainingDataset(cfg, Tok(), seed=7), Collator(Tok.pad_id, a["seq"], 20), cfg.prefetch_factor)
    from trainer.config import load_config
    from trainer.ernie.components import build_dataset
    from trainer.ernie.data import ErnieCollator
    from trainer.objectives import get_objective

    cfg = load_config("tiny_ernie", [f"data.corpora=[{{prefix: {a['prefix']}}}]", "model.vocab_size=50000",
                                     f"model.pad_token_id={Tok.pad_id}", "objective.options.dlm=null",
                                     f"data.cache_dir={a['cache']}", f"data.num_workers={a['workers']}",
                                     f"data.max_seq_length={a['seq']}", f"train.global_batch_size={IO_GLOBAL}",
                                     f"train.micro_batch_size={IO_MICRO}"])
    objective = get_objective(cfg.objective)
    tok = Tok()
    tok.word_start = np.ones(Tok.vocab_size, bool)  # knowledge masking's word starts (Chinese: every token)
    ds, _ = build_dataset(cfg, tok, objective)
    return ds, ErnieCollator(Tok.pad_id, objective.options.knowledge_masking.max_predictions_per_seq), \
        cfg.data.prefetch_factor


def child_prebuild(a) -> dict:
    """What `python -m trainer.data.build_index` leaves for the job: the format's caches (ERNIE: with the side-car
    check), built once here; time and peak RSS."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    ds, _, _ = _io_dataset({**a, "workers": 0})
    return {"build_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0, "samples": len(ds), "peak": peak_rss()}


def child_open_alone(a) -> dict:
    """Rank 0's open of the dataset on the prebuilt caches, alone (no other rank, no loader workers): its check of
    every shard against the manifest and the cache maps. RANK 0 of 2, as torchrun would set it."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")
    import torch  # noqa: F401  (imported before the data, as in a rank)

    t0 = time.perf_counter()
    _io_dataset({**a, "workers": 0})
    return {"open_s": time.perf_counter() - t0}


def child_rank(a) -> dict:
    """One rank of ``a["world"]``: its dataset on the prebuilt caches and a DataLoader with ``a["workers"]`` workers
    (forked, as the trainer's), up to its first micro-batch. Every file under the corpus folder that this process or
    its workers open is logged through an audit hook (numpy's and megatron-core's maps open through Python)."""
    log = os.open(a["opens_log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    root = a["root"]

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(root):
                os.write(log, f"{os.getpid()}\t{path}\n".encode())  # os.write raises no audit event

    sys.addaudithook(hook)
    import torch  # noqa: F401  (a rank has it imported before its data; counted in the start)

    from trainer.data.loader import build_dataloader

    t0 = time.time()
    ds, collate, prefetch = _io_dataset(a)
    t1 = time.time()
    loader = build_dataloader(ds, collate, 0, IO_GLOBAL, IO_MICRO, a["rank"], a["world"], None, a["workers"],
                              prefetch)
    it = iter(loader)
    batch = next(it)
    t2 = time.time()
    rows = int(batch["input_ids"].shape[0])
    for _ in range(7):  # the next micro-batches (the loader's workers take turns)
        next(it)
    t3 = time.time()
    del it, loader
    return {"first_batch_at": t2, "open_s": t1 - t0, "first_batch_after_open_s": t2 - t1,
            "next_7_batches_s": t3 - t2, "rows": rows, "pid": os.getpid(), "peak": peak_rss()}


def child_reads(a) -> dict:
    """µs per sample of 2,000 random positions in one process (no workers), twice: the first pass reads through
    the page cache as it finds it, the second warm."""
    ds, _, _ = _io_dataset({**a, "workers": 0})
    positions = np.random.default_rng(1).integers(0, len(ds), 2000).tolist()
    out = {}
    for name in ("first_pass", "warm"):
        t = time.perf_counter()
        for p in positions:
            ds[p]
        out[f"us_per_sample_{name}"] = (time.perf_counter() - t) / len(positions) * 1e6
    return out


def run_ranks(common: dict, world: int, opens_log: Path) -> dict:
    """``world`` rank processes started together; each one's start -> first micro-batch, and the corpus files each
    process (rank or loader worker) opened."""
    opens_log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    start = time.time()
    # RANK as torchrun sets it: rank 0 is the caches' builder, which checks every shard's files at each open (a cut
    # .bin stops the run there); the other ranks and every loader worker open only what they read
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_child", "rank",
                               json.dumps({**common, "rank": r, "world": world, "opens_log": str(opens_log)})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world)},
                              cwd=str(REPO))
             for r in range(world)]
    ranks = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}",
                        "stderr_tail": err[-2000:]}
            r = json.loads(out.strip().splitlines()[-1])
            r["start_to_first_batch_s"] = r.pop("first_batch_at") - start
            ranks.append(r)
    finally:
        for proc in procs:  # a failed or timed-out rank must not leave its peer (and its workers) running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    opened: dict[int, set] = {}
    for line in opens_log.read_text().splitlines() if opens_log.exists() else []:
        pid, path = line.split("\t", 1)
        opened.setdefault(int(pid), set()).add(path)
    rank_pids = {r["pid"] for r in ranks}
    for r in ranks:
        own = opened.get(r["pid"], set())
        r["files_opened"] = len(own)
        r["corpus_files_opened"] = sum(not p.endswith(".bfc") for p in own)
    workers = [paths for pid, paths in opened.items() if pid not in rank_pids]
    return {"ranks": ranks, "worker_processes": len(workers),
            "worker_files_opened_max": max((len(p) for p in workers), default=0),
            "start_to_first_batch_max_s": max(r["start_to_first_batch_s"] for r in ranks)}


def measure_io(size: int, a, out: Path) -> dict:
    folder = out / f"io-{size}-{a.shards}"
    t = time.perf_counter()
    prefix = write_corpus(folder, size, shard=-(-size // a.shards), real=True, sidecars=True)
    sparse = sparse_twin(folder)
    bin_bytes = sum(p.stat().st_size for p in folder.glob("*.bin"))
    res = {"sentences": size, "shards": a.shards, "bin_bytes": bin_bytes, "corpus_write_s": time.perf_counter() - t}
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        tmp = Path(tmp)
        base = {"prefix": str(prefix), "seq": a.seq, "root": str(folder)}
        parts = set(a.io_parts.split(","))
        formats = [f for f in IO_FORMATS if f in a.formats.split(",")]
        # the builder (segment-pair) at 1, 2 and 16 workers, cold page cache each time
        for w in (1, 2, 16) if "build" in parts else ():
            res[f"resident_before_build_{w}"] = drop_page_cache([folder])
            res[f"build_{w}"] = run_child("build", {**base, "fmt": "segment-pair", "cache": str(tmp / f"b{w}"),
                                                    "workers": w})
        # megatron-core's builder cold too, then both warm (the files just read): the same cache state each side
        if "build" in parts:
            res["resident_before_megatron"] = drop_page_cache([folder])
            res["megatron"] = run_child("megatron", {**base, "fmt": "segment-pair", "cache": str(tmp / "b1")})
            res["megatron_warm"] = run_child("megatron", {**base, "fmt": "segment-pair", "cache": str(tmp / "b1")})
            res["build_1_warm"] = run_child("build", {**base, "fmt": "segment-pair", "cache": str(tmp / "b1w"),
                                                      "workers": 1})
            for name in ("b1", "b2", "b16", "b1w"):  # the builder's caches, measured: the disk may be short
                shutil.rmtree(tmp / name, ignore_errors=True)
        for fmt in formats if "formats" in parts else ():
            common = {**base, "fmt": fmt, "cache": str(tmp / f"c-{fmt}"), "workers": 2}
            r = res[fmt] = {"prebuild": run_child("prebuild", common)}
            r["resident_before_ranks"] = drop_page_cache([folder, tmp / f"c-{fmt}"])
            r["cold"] = run_ranks(common, 2, tmp / "opens.log")
            # the same cold start again (its spread), then rank 0's open alone on a cold cache: no other rank or
            # loader worker reading beside it
            r["cold_again"] = []
            for _ in range(a.cold_repeats - 1):
                drop_page_cache([folder, tmp / f"c-{fmt}"])
                r["cold_again"].append(run_ranks(common, 2, tmp / "opens.log"))
            r["resident_before_open_alone"] = drop_page_cache([folder, tmp / f"c-{fmt}"])
            r["open_alone"] = run_child("open_alone", common)
            r["warm"] = run_ranks(common, 2, tmp / "opens.log")
            sparse_common = {**common, "prefix": str(sparse), "cache": str(tmp / f"s-{fmt}")}
            run_child("prebuild", sparse_common)
            r["reads_real"] = run_child("reads", common)
            r["reads_sparse"] = run_child("reads", sparse_common)
            for cache in (tmp / f"c-{fmt}", tmp / f"s-{fmt}"):  # measured: room for the next format's
                shutil.rmtree(cache, ignore_errors=True)
    return res


def report_io(r: dict) -> str:
    def g(x, fmt="{:.2f}"):
        return fmt.format(x) if isinstance(x, (int, float)) else "-"

    lines = [f"== real I/O: {r['sentences']:,} sentences in {r['shards']} shards, {r['bin_bytes'] / 2**30:.2f} GB of "
             f"tokens written (not sparse) =="]
    for w in (1, 2, 16) if "build_1" in r else ():
        b = r[f"build_{w}"]
        lines.append(f"builder, {w:2d} workers (cold cache, resident before {g(r[f'resident_before_build_{w}'], '{:.1%}')}"
                     f"): {g(b.get('total_s'))} s wall, {g(b.get('cpu_s'))} CPU-s, peak RSS "
                     f"{gb(b.get('peak', {}).get('self'))}, {b.get('error', '')}")
    for ours, theirs, cache in (("build_1", "megatron", "cold"), ("build_1_warm", "megatron_warm", "warm")) \
            if "build_1" in r else ():
        m, b = r.get(theirs, {}), r.get(ours, {})
        lines.append(f"megatron-core build_mapping on the same corpus, {cache} cache: {g(m.get('bert_total_s'))} s "
                     f"wall, {g(m.get('bert_cpu_s'))} CPU-s, peak RSS {gb(m.get('bert_peak'))}; ours (1 worker, "
                     f"{cache}) {g(b.get('total_s'))} s: ours/megatron "
                     f"{g(b['total_s'] / m['bert_total_s'] if m.get('bert_total_s') and 'total_s' in b else None)}x")
    for fmt in [f for f in IO_FORMATS if f in r]:
        f = r[fmt]
        pre, cold, warm = f["prebuild"], f["cold"], f["warm"]
        if "error" in cold or "error" in warm or "error" in pre:
            lines.append(f"{fmt}: error {pre.get('error') or cold.get('error') or warm.get('error')}")
            continue
        rr, rs = f["reads_real"], f["reads_sparse"]
        ranks = cold["ranks"]
        lines.append(
            f"{fmt:14s}: prebuild {g(pre['build_s'])} s; 2 ranks x 2 workers, start -> first micro-batch cold "
            f"{g(cold['start_to_first_batch_max_s'])} s (resident before {g(f['resident_before_ranks'], '{:.1%}')}), "
            f"warm {g(warm['start_to_first_batch_max_s'])} s; open {g(max(x['open_s'] for x in ranks))} s; files "
            f"opened: rank 0 {ranks[0]['files_opened']}, rank 1 {ranks[1]['files_opened']}, a loader worker <= "
            f"{cold['worker_files_opened_max']} ({cold['worker_processes']} workers); µs/sample real "
            f"{g(rr.get('us_per_sample_first_pass'), '{:.0f}')} first / {g(rr.get('us_per_sample_warm'), '{:.0f}')} "
            f"warm, sparse {g(rs.get('us_per_sample_warm'), '{:.0f}')} warm: real/sparse warm "
            f"{g(rr['us_per_sample_warm'] / rs['us_per_sample_warm'] if rs.get('us_per_sample_warm') else None)}x")
        again = [x for x in f.get("cold_again", []) if "error" not in x]
        if again:
            lines.append(f"{'':14s}  the cold start again: " + ", ".join(
                f"{g(x['start_to_first_batch_max_s'])} s (rank 0's open {g(x['ranks'][0]['open_s'])} s)" for x in again))
        if "open_alone" in f:
            lines.append(f"{'':14s}  rank 0's open alone, cold (resident before "
                         f"{g(f['resident_before_open_alone'], '{:.1%}')}): {g(f['open_alone'].get('open_s'))} s "
                         f"{f['open_alone'].get('error', '')}")
    return "\n".join(lines)


CHILDREN = {"prebuild": child_prebuild, "open_alone": child_open_alone, "rank": child_rank, "reads": child_reads}


def run(a, p) -> int:
    """The --io measurement for bench/scale.py's parsed arguments ``a`` (its parser ``p``, for the defaults)."""
    out = Path(a.out if a.out != p.get_default("out") else REPO / "bench" / "out" / "scale_io")
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    sizes = "2M,20M" if a.sizes == p.get_default("sizes") else a.sizes
    for size in [parse_size(s) for s in sizes.split(",")]:
        r = measure_io(size, a, out)
        r.update({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seq": a.seq, "cpus": os.cpu_count()})
        # a run of some parts keeps the others' earlier figures for this size in the file (its report: this run's)
        results[f"{size}-{a.shards}"] = {**results.get(f"{size}-{a.shards}", {}), **r}
        results_path.write_text(json.dumps(results, indent=1))
        print(report_io(r), flush=True)
    return 0


if __name__ == "__main__":
    import scale
    sys.exit(scale.main(["--io", *sys.argv[1:]]))
