"""LAMB's cost against torch AdamW: optimizer step time, DeepSpeed train-step time at the same ZeRO stage, and the
communication and memory the ZeRO layout binding adds. Every figure is a ratio against AdamW measured in this run.

    python bench/lamb.py [--preset albert-base] [--steps 10] [--stages 0,2,3]

1. ``step``: ``optimizer.step()`` alone over the preset's parameters with random gradients (no DeepSpeed): our Lamb
   (per-tensor ratios) and Lamb on one flat tensor with a partition layout (the ZeRO path: ``index_add_`` sums, one
   gather of ratios), against ``torch.optim.AdamW(foreach=True)``.
2. ``engine``: one DeepSpeed process (gloo, fp32) at each ZeRO stage: forward + backward + ``engine.step()`` of an MLM
   batch through the preset, Lamb (bound with ``bind_zero_layout``) against torch AdamW; plus ``engine.step()`` alone.
3. ``comm``: bytes Lamb all-reduces per engine step (one ``[2, tensors + 1]`` fp32 tensor) against the bytes of the
   model's fp32 gradient all-reduce, for several presets (counted on the meta device, nothing allocated).

Best (minimum) of ``--steps`` timed steps after 2 warm-up steps, the figure least disturbed by other jobs on a shared
machine; Lamb and AdamW alternate step by step so that load drift hits both.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.optim.lamb import Lamb, PartitionLayout  # noqa: E402
from trainer.optim.param_groups import param_groups  # noqa: E402

BATCH, SEQ = 4, 32


def _model(preset: str) -> nn.Module:
    from trainer.models import PRESET_ROWS, PretrainingModel
    torch.manual_seed(0)
    row = PRESET_ROWS[preset]
    return PretrainingModel(row.config.replace(dropout=0.0, attention_dropout=0.0), {"mlm": row.heads["mlm"]})


class _MlmLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        logits = self.model(ids)["mlm"]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.roll(1, dims=1).reshape(-1))


def bench_step(preset: str, steps: int) -> dict[str, float]:
    model = _model(preset)
    params = [p for p in model.parameters()]
    gen = torch.Generator().manual_seed(1)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    adamw = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, foreach=True)
    lamb = Lamb(param_groups(model, 0.01, mark_trust_ratio=True), lr=1e-4, weight_decay=0.01)

    # The ZeRO path on one flat fp32 tensor (what ZeRO 1/2 hand the optimizer on one rank), decayed tensors only.
    decayed = param_groups(model, 0.01, mark_trust_ratio=True)[0]["params"]
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in decayed]))
    flat.grad = torch.cat([p.grad.reshape(-1) for p in decayed])
    starts = [0]
    for p in decayed[:-1]:
        starts.append(starts[-1] + p.numel())
    flat_lamb = Lamb([flat], lr=1e-4, weight_decay=0.01)
    names = [str(i) for i in range(len(decayed))]
    flat_lamb.partition_layout = PartitionLayout(num_slots=len(decayed), slot_names=names)
    flat_lamb.partition_layout.add(flat, [(start, p.numel(), i) for i, (start, p) in enumerate(zip(starts, decayed))])
    flat_adamw = torch.optim.AdamW([nn.Parameter(flat.detach().clone())], lr=1e-4, foreach=True)
    flat_adamw.param_groups[0]["params"][0].grad = flat.grad.clone()

    out = {"params": sum(p.numel() for p in params), "tensors": len(params), "decayed_elements": flat.numel()}
    pairs = [("adamw", adamw.step), ("lamb", lamb.step), ("flat_adamw", flat_adamw.step),
             ("flat_lamb_bound", flat_lamb.step)]
    for name, fn in pairs:  # state allocation happens in the first call: keep it out of the timing
        fn()
    times = {name: [] for name, _ in pairs}
    for _ in range(steps):  # alternate step by step so load drift hits every variant alike
        for name, fn in pairs:
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    out.update({name: min(t) for name, t in times.items()})
    return out


def _init_dist() -> None:
    import deepspeed
    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        deepspeed.init_distributed(dist_backend="gloo")


def _engine(preset: str, stage: int, optimizer: str):
    import deepspeed

    from trainer.optim.zero_lamb import bind_zero_layout
    model = _MlmLoss(_model(preset))
    if optimizer == "lamb":
        opt = Lamb(param_groups(model, 0.01, mark_trust_ratio=True), lr=1e-4, weight_decay=0.01)
    else:
        opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, foreach=True)
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    if optimizer == "lamb":
        bind_zero_layout(engine)
    return engine


def bench_engine(preset: str, stage: int, steps: int) -> dict[str, dict[str, float]]:
    """AdamW and Lamb engines at one ZeRO stage, stepped alternately on the same batches."""
    engines = {name: _engine(preset, stage, name) for name in ("adamw", "lamb")}
    vocab = engines["lamb"].module.model.cfg.vocab_size
    gen = torch.Generator().manual_seed(2)
    times = {name: {"train_step": [], "engine_step": []} for name in engines}
    for i in range(steps + 2):
        ids = torch.randint(0, vocab, (BATCH, SEQ), generator=gen)
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.backward(engine(ids))
            mid = time.perf_counter()
            engine.step()
            end = time.perf_counter()
            if i >= 2:
                times[name]["train_step"].append((end - start) * 1e3)
                times[name]["engine_step"].append((end - mid) * 1e3)
    return {name: {k: min(v) for k, v in t.items()} for name, t in times.items()}


def comm_table(presets: list[str]) -> list[dict]:
    from trainer.models.presets import counted_model
    rows = []
    for name in presets:
        model = counted_model(name)  # meta device: shapes only
        tensors = list(model.parameters())
        numel = sum(p.numel() for p in tensors)
        lamb_bytes = 2 * (len(tensors) + 1) * 4
        rows.append({"preset": name, "params": numel, "tensors": len(tensors), "lamb_allreduce_bytes": lamb_bytes,
                     "grad_allreduce_bytes": numel * 4, "ratio": lamb_bytes / (numel * 4)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="albert-base")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--stages", default="0,2,3")
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"# bench/lamb.py --preset {args.preset} --steps {args.steps}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)

    r = bench_step(args.preset, args.steps)
    print(f"\n## optimizer.step() alone, {args.preset}: {r['params'] / 1e6:.1f}M parameters in {r['tensors']} tensors "
          f"({r['decayed_elements'] / 1e6:.1f}M in the decayed group)")
    print("| optimizer | ms/step | vs AdamW |\n|---|---|---|")
    print(f"| torch AdamW (foreach), per tensor | {r['adamw']:.1f} | 1.00x |")
    print(f"| Lamb, per tensor | {r['lamb']:.1f} | {r['lamb'] / r['adamw']:.2f}x |")
    print(f"| torch AdamW, one flat tensor (decayed group) | {r['flat_adamw']:.1f} | 1.00x |")
    print(f"| Lamb, one flat tensor + partition layout (ZeRO path) | {r['flat_lamb_bound']:.1f} | "
          f"{r['flat_lamb_bound'] / r['flat_adamw']:.2f}x |", flush=True)

    if not args.skip_engine:
        _init_dist()
        print(f"\n## DeepSpeed, 1 process, fp32, {args.preset}, batch {BATCH} x {SEQ} (MLM over every token)")
        print("| ZeRO | AdamW train step ms | Lamb train step ms | ratio | AdamW engine.step ms | Lamb engine.step ms "
              "| ratio |\n|---|---|---|---|---|---|---|")
        for stage in [int(s) for s in args.stages.split(",") if s]:
            r = bench_engine(args.preset, stage, args.steps)
            a, b = r["adamw"], r["lamb"]
            train, step = b["train_step"] / a["train_step"], b["engine_step"] / a["engine_step"]
            print(f"| {stage} | {a['train_step']:.0f} | {b['train_step']:.0f} | {train:.2f}x "
                  f"| {a['engine_step']:.0f} | {b['engine_step']:.0f} | {step:.2f}x |", flush=True)

    print("\n## Communication Lamb adds per engine step (fp32 gradients)")
    print("| preset | parameters | tensors | Lamb all-reduce | gradient all-reduce | ratio |")
    print("|---|---|---|---|---|---|")
    for row in comm_table(["albert-base", "albert-xxlarge", "bert-base", "bert-large", "roberta-large"]):
        print(f"| {row['preset']} | {row['params'] / 1e6:.1f}M | {row['tensors']} | {row['lamb_allreduce_bytes']:,} B "
              f"| {row['grad_allreduce_bytes'] / 2 ** 20:,.0f} MiB | {row['ratio']:.1e} |")


if __name__ == "__main__":
    main()
