"""What the Slurm templates cost on top of a plain launch: time to the first training step and to the end of a tiny
run, `sbatch slurm/roberta_large.sh` on the local two-node cluster against `torchrun --nproc-per-node 2` of the same
config on the same machine (the baseline), measured in one run, alternating, so machine load hits both alike.

    python bench/slurm_launch.py [--repeats 2] [--steps 20]

The template adds: sbatch scheduling, the config check on the batch host (`pretrain.py --check`, one Python start-up
with the trainer's imports), srun starting one torchrun per node, and the static rendezvous across the two nodes.
Needs slurm-wlm and munge (tests/slurm_cluster.py starts the cluster).
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def first_step_and_end(proc_done, metrics: Path, timeout: float = 900) -> tuple[float, float]:
    """Seconds until metrics.jsonl has its first record, and until ``proc_done()`` is true."""
    start = time.monotonic()
    first = None
    while time.monotonic() - start < timeout:
        if first is None and metrics.exists() and metrics.read_text().strip():
            first = time.monotonic() - start
        if proc_done():
            return (first if first is not None else float("nan")), time.monotonic() - start
        time.sleep(0.1)
    raise TimeoutError(f"no end after {timeout} s ({metrics})")


def prepare(tmp: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from data_prep import build_indexed, train_tokenizer

    from corpora import en_corpus

    corpus = en_corpus()
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:6000]
    while lines and lines[-1].strip():
        lines.pop()
    text = tmp / "en.txt"
    text.write_text("".join(lines), encoding="utf-8")
    train_tokenizer.main(["--kind", "bbpe", "--input", str(text), "--output", str(tmp / "tok"), "--vocab-size",
                          "1024", "--quiet"])
    prefix = tmp / "corpus" / "en"
    build_indexed.main(["--input", str(text), "--tokenizer", str(tmp / "tok"), "--output-prefix", str(prefix)])
    return prefix


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from slurm_cluster import SlurmCluster

    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    prefix = prepare(tmp)
    sets = [f"train.steps={args.steps}", "checkpoint.every_steps=0", "logging.every_steps=1",
            "data.format=full-sentences", f"data.corpora=[{{prefix: {prefix}}}]"]
    results = {"torchrun": [], "slurm": []}
    with SlurmCluster(tmp / "cluster") as cluster:
        for i in range(args.repeats):
            run = tmp / f"torchrun{i}"
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
                   "trainer/pretrain.py", "--config", "tiny_roberta", "--set", f"run_dir={run}",
                   *(x for kv in sets for x in ("--set", kv))]
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            first, end = first_step_and_end(lambda: proc.poll() is not None, run / "metrics.jsonl")
            assert proc.returncode == 0, f"torchrun run failed ({proc.returncode})"
            results["torchrun"].append((first, end))

            run = tmp / f"slurm{i}"
            env = {"CONFIG": "tiny_roberta", "RUN_DIR": str(run), "DATA_PREFIX": str(prefix),
                   "EXTRA_SETS": " ".join(s for s in sets if not s.startswith("data.corpora"))}
            job = cluster.sbatch(REPO / "slurm" / "roberta_large.sh", "--nodes=2", "--gpus-per-node=0",
                                 f"--output={tmp}/slurm{i}.out", cwd=REPO, env=env)
            first, end = first_step_and_end(
                lambda: cluster.job(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
                run / "metrics.jsonl")
            assert cluster.job(job)["JobState"] == "COMPLETED", cluster.job_output(job)
            results["slurm"].append((first, end))
            print(f"repeat {i}: torchrun first step {results['torchrun'][-1][0]:.1f} s, end "
                  f"{results['torchrun'][-1][1]:.1f} s; slurm first step {first:.1f} s, end {end:.1f} s", flush=True)

    med = {k: (statistics.median(f for f, _ in v), statistics.median(e for _, e in v)) for k, v in results.items()}
    print(json.dumps({"steps": args.steps, "repeats": args.repeats,
                      "torchrun_first_step_s": round(med["torchrun"][0], 1), "torchrun_end_s": round(med["torchrun"][1], 1),
                      "slurm_first_step_s": round(med["slurm"][0], 1), "slurm_end_s": round(med["slurm"][1], 1),
                      "ratio_first_step": round(med["slurm"][0] / med["torchrun"][0], 2),
                      "ratio_end": round(med["slurm"][1] / med["torchrun"][1], 2)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
