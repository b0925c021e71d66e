"""What bounding the mapped shards costs (trainer/data/open_maps.py): random reads over a many-shard corpus with every
shard kept mapped (the baseline: the bound set to the shard count) against bounds of 128 (the default at a 1,024
open-file limit) and 16 (the floor).

    python bench/open_shards.py [--shards 2000] [--sentences-per-shard 2000] [--reads 40000] [--seq 128]
                                [--out bench/out/open_shards]

The corpus (bench/scale.py's synthetic layout, real token bytes so reads touch the page cache) is written once under
--out. Each bound runs in a fresh process, which raises its soft open-file limit to the hard one so that the baseline
can keep every shard open; each reads the same random sentence positions (``IndexedCorpus.read`` of up to --seq
tokens from a random sentence, as a sample's first read), after one untimed pass that warms the page cache. Prints
microseconds per read, the ratio to the baseline, and the most .bin/.idx descriptors the process held.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

CHILD = r"""
import json, os, resource, sys, time
import numpy as np
from trainer.data.cache_file import CachePolicy
from trainer.data.corpus import IndexedCorpus

prefix, cache, reads, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
corpus = IndexedCorpus(prefix, CachePolicy(cache))
starts = np.random.default_rng(0).integers(0, corpus.num_sentences - 1, reads).tolist()

def held():
    n = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{f}").endswith((".bin", ".idx"))
        except FileNotFoundError:
            pass
    return n

for s in starts:  # warm the page cache and the corpus arrays
    corpus.read(s, s + 1, seq)
t = time.perf_counter()
for s in starts:
    corpus.read(s, s + 1, seq)
seconds = time.perf_counter() - t
print(json.dumps({"us_per_read": 1e6 * seconds / reads, "held": held(), "open": len(corpus._open)}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", type=int, default=2000)
    p.add_argument("--sentences-per-shard", type=int, default=2000)
    p.add_argument("--reads", type=int, default=40000)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "open_shards"))
    a = p.parse_args(argv)
    from scale import write_corpus

    out = Path(a.out)
    prefix = write_corpus(out / f"c{a.shards}x{a.sentences_per_shard}", a.shards * a.sentences_per_shard,
                          shard=a.sentences_per_shard, real=True)
    results = {}
    for bound in (a.shards, 128, 16):
        env = dict(os.environ, PYTHONPATH=str(REPO), BERTFAMILY_MAX_OPEN_SHARDS=str(bound))
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(prefix), str(out / "cache"), str(a.reads),
                               str(a.seq)], env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"bound {bound}: {proc.stderr[-2000:]}")
        results[bound] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[bound]["wall_s"] = time.perf_counter() - t
    base = results[a.shards]["us_per_read"]
    print(f"{a.shards} shards x {a.sentences_per_shard} sentences, {a.reads} random reads of <= {a.seq} tokens")
    print(f"{'bound':>8} {'us/read':>9} {'ratio':>7} {'.bin/.idx fds held':>19}")
    for bound, r in results.items():
        print(f"{bound:>8} {r['us_per_read']:>9.1f} {r['us_per_read'] / base:>7.2f} {r['held']:>19}")
    (out / "results.json").write_text(json.dumps({"args": vars(a), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
