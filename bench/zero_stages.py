"""Trainer throughput and ZeRO-3 memory on CPU, each against a baseline measured in the same run.

1. Steps/s and tokens/s of our DeepSpeed engine (``trainer.engine.Engine``) at ZeRO 0, 2 and 3 (one process, fp32,
   torch AdamW), for the ``tiny`` preset and ``bert-base`` (110M) with an MLM head, on the same synthetic batch
   (random ids, 15 % predicted positions), against a plain PyTorch loop (same model, torch AdamW, no DeepSpeed):
   the ratio is the engine's overhead. One process because the 2 cores here cannot run 2 ranks for throughput.
2. Per-rank memory of model states at ZeRO-3 on 2 ranks (and ZeRO-0 on 2 ranks for contrast) against the
   16 * P / N bytes theory (fp32 params 4 + grads 4 + Adam m, v 8 bytes per parameter, split over N ranks). Measured
   as a census of every live tensor in the rank's process after a step (unique storages, so views and aliases count
   once), i.e. everything tensor-shaped the rank holds, not only what ZeRO says it holds.

    python bench/zero_stages.py                 # everything (~10 min on 2 shared cores)
    python bench/zero_stages.py --presets tiny  # quick
    python bench/zero_stages.py --parts memory  # only the memory table

It prints the two tables of BENCHMARKS.md ("Trainer") as they appear there, memory in MiB (2**20 bytes).
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MICRO = {"tiny": (16, 128), "bert-base": (8, 128)}  # (micro batch, sequence length) per preset


def _batch(vocab: int, batch: int, seq: int, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    n = max(1, int(0.15 * seq))
    pos = torch.stack([torch.randperm(seq, generator=g)[:n] for _ in range(batch)])
    flat = (pos + torch.arange(batch)[:, None] * seq).flatten()
    labels = ids.flatten()[flat].clone()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "positions": flat, "labels": labels}


def _model(preset: str):
    from trainer.models import MLM, HeadSpec, PretrainingModel, get_preset
    cfg = get_preset(preset, dropout=0.0, attention_dropout=0.0)
    return PretrainingModel(cfg, {MLM: HeadSpec("mlm")}), cfg


def _loss(model, b):
    import torch.nn.functional as F
    out = model(b["input_ids"], attention_mask=b["attention_mask"], mlm_positions=b["positions"])
    return F.cross_entropy(out["mlm"], b["labels"])


def _tensor_census() -> int:
    """Bytes of all live tensors' unique storages in this process."""
    import torch
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and not obj.is_meta:
                st = obj.untyped_storage()
                key = st.data_ptr()
                if key and key not in seen:
                    seen.add(key)
                    total += st.nbytes()
        except Exception:  # noqa: BLE001  (some objects raise on isinstance/attribute access)
            continue
    return total


def worker(args) -> dict:
    import torch
    # One thread everywhere: on 2 shared cores, 2 OpenMP threads per process stall at every barrier when a neighbour
    # holds a core (a tiny step measured 0.25-5 s with 2 threads, 0.24-0.35 s with 1), which would decide the ratios.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, cfg = _model(args.preset)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    micro, seq = MICRO[args.preset]
    batch = _batch(cfg.vocab_size, micro, seq)
    from trainer.optim import OptimConfig
    from trainer.optim.build import build_optimizer
    opt = build_optimizer(OptimConfig(lr=1e-4), model)
    if args.stage < 0:  # the plain PyTorch baseline
        def backward():
            _loss(model, batch).backward()

        def update():
            opt.step()
            opt.zero_grad()
        world = 1
    else:
        from trainer import engine
        from trainer.config import config_from_dict
        _, world = engine.init_distributed(10)
        scratch = Path(tempfile.mkdtemp(prefix="bench_zero_"))  # this rank's own files, whatever else runs
        atexit.register(shutil.rmtree, scratch, True)
        ds_json = REPO / "ds_configs" / f"zero{args.stage}.json"
        if args.small_buckets:  # memory runs: 1M-element buckets, so communication buffers do not hide the states
            conf = json.loads(ds_json.read_text())
            for key in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size"):
                if key in conf["zero_optimization"]:
                    conf["zero_optimization"][key] = 1_000_000
            ds_json = scratch / f"zero{args.stage}.json"
            ds_json.write_text(json.dumps(conf))
        run_cfg = config_from_dict({  # model, data and objective sections are not read here, but the schema wants them
            "run_dir": str(scratch / "run"), "model": cfg.model_dump(), "data": {"corpora": [{"prefix": "unused"}]},
            "objective": {"name": "mlm"},
            "train": {"steps": 10, "global_batch_size": micro * world, "micro_batch_size": micro},
            "optim": {"lr": 1e-4}, "deepspeed": {"config": str(ds_json)}})
        eng = engine.Engine(model, opt, None, engine.build_ds_config(run_cfg, world, 1))

        def backward():
            eng.backward(eng(_loss, batch))

        def update():
            eng.step()
    for _ in range(args.warmup):
        backward()
        update()
    start = time.perf_counter()
    for _ in range(args.steps):
        backward()
        update()
    seconds = time.perf_counter() - start
    backward()  # one more step, with the census taken where the states peak: gradients present, before the update
    census = _tensor_census()
    update()
    return {"preset": args.preset, "stage": args.stage, "world": world, "params": params,
            "steps_per_s": args.steps / seconds, "tokens_per_s": args.steps * micro * seq * world / seconds,
            "census_bytes": census, "rank": int(os.environ.get("RANK", 0))}


def _mib(nbytes: float) -> str:
    """Bytes as the memory table shows them: MiB (2**20 bytes), two decimals under 10 MiB."""
    mib = nbytes / 2**20
    return f"{mib:,.2f} MiB" if mib < 10 else f"{mib:,.1f} MiB"


def _rate(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _launch(preset: str, stage: int, nproc: int, steps: int, warmup: int, small_buckets: bool = False) -> list[dict]:
    me = [str(Path(__file__).resolve()), "--worker", "--preset", preset, "--stage", str(stage), "--steps", str(steps),
          "--warmup", str(warmup)] + (["--small-buckets"] if small_buckets else [])
    if nproc == 1:
        cmd = [sys.executable, *me]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(port), *me]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not rows:
        raise RuntimeError(f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--stage", type=int, default=-1)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--small-buckets", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=2, help="throughput: best of this many interleaved rounds")
    p.add_argument("--presets", default="tiny,bert-base")
    p.add_argument("--parts", default="throughput,memory", help="comma-separated: throughput, memory")
    p.add_argument("--out", default=None, help="also write every measurement as JSON to this file")
    args = p.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0
    parts = set(args.parts.split(","))
    results, throughput_rows, memory_rows = [], [], []
    for preset in args.presets.split(","):
        micro, seq = MICRO[preset]
        if "throughput" in parts:
            steps = 20 if preset == "tiny" else 3
            # Interleaved rounds, best of each: the machine is shared, and a neighbour's burst should not decide a
            # ratio.
            best: dict[int, dict] = {}
            for _ in range(args.rounds):
                for stage in (-1, 0, 2, 3):
                    r = _launch(preset, stage, 1, steps, 2)[0]
                    if stage not in best or r["tokens_per_s"] > best[stage]["tokens_per_s"]:
                        best[stage] = r
            base = best[-1]
            results.append(base)
            cells = [f"{_rate(base['steps_per_s'])} steps/s, {base['tokens_per_s']:,.0f} tok/s"]
            for stage in (0, 2, 3):
                r = best[stage]
                r["ratio_vs_torch"] = r["tokens_per_s"] / base["tokens_per_s"]
                results.append(r)
                cells.append(f"{_rate(r['steps_per_s'])} steps/s, {r['tokens_per_s']:,.0f} tok/s "
                             f"(x{r['ratio_vs_torch']:.2f})")
            throughput_rows.append(f"| `{preset}` ({base['params'] / 1e6:.2f} M) | {micro} x {seq} | "
                                   + " | ".join(cells) + " |")
            print(throughput_rows[-1], flush=True)
        if "memory" in parts:
            cells, ratios = [], []
            for stage in (0, 3):
                rows = _launch(preset, stage, 2, 1, 2, small_buckets=True)
                theory = 16 * rows[0]["params"] / (2 if stage == 3 else 1)
                for r in rows:
                    r["memory"] = True
                    r["theory_bytes"] = theory
                    results.append(r)
                # The larger rank: what a rank must have room for (the two differ by a bucket at most).
                worst = max(r["census_bytes"] for r in rows)
                cells += [_mib(worst), _mib(theory)]
                ratios.append(f"x{worst / theory:.2f}")
            memory_rows.append(f"| `{preset}` ({rows[0]['params']:,} params) | " + " | ".join(cells) + " | "
                               + " / ".join(ratios) + " |")
            print(memory_rows[-1], flush=True)
    if throughput_rows:
        print("\nThroughput, one process, best of %d interleaved rounds:\n" % args.rounds)
        print("| model (params) | micro batch x seq | plain torch | ZeRO-0 | ZeRO-2 | ZeRO-3 |")
        print("|---|---|---|---|---|---|")
        print("\n".join(throughput_rows))
    if memory_rows:
        print("\nPer-rank memory of model states, 2 ranks (the larger rank's tensor census; MiB = 2**20 bytes):\n")
        print("| model | ZeRO-0, per rank | 16·P | ZeRO-3, per rank | 16·P/N | measured / theory |")
        print("|---|---|---|---|---|---|")
        print("\n".join(memory_rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
