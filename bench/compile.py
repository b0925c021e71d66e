"""``model.compile`` on the CPU: the training step of our encoder + MLM + NSP heads with the layers compiled
(inductor's C++ backend) against the same model eager, in one process, on the same batches.

Forward + backward + torch AdamW (fused) per step, fp32, the same weights on both sides; steps of the two models
alternate so machine noise hits both alike; the figure is the median over the timed steps. The first compiled step
(the compile itself, also the recompile for a second shape) is reported apart. Rows: full (no padding) or, with
``--padding``, that fraction of each row padding, and ``--unpad`` (the packed path: linear layers on real tokens
only, the token count then changes per batch, which the dynamic graphs must absorb without recompiling).

    python bench/compile.py                       # H=512 L=4 A=8, batch 8 x 128
    python bench/compile.py --padding 0.3 --unpad # the varlen/packed path
On CUDA (``model.compile: auto`` turns it on there) bench/model_stages.py measures the same for BERT-large in bf16.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--padding", type=float, default=0.0, help="fraction of each row that is padding")
    p.add_argument("--unpad", action="store_true", help="ModelConfig.unpad (varlen path)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per model (after the warm-up steps)")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    from trainer.models import MLM, NSP, HeadSpec, PretrainingModel, flat_positions, get_preset

    heads = {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}
    cfg = get_preset("bert-base", hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                     intermediate_size=4 * args.hidden, unpad=args.unpad)
    torch.manual_seed(0)
    models = {"eager": PretrainingModel(cfg.replace(compile="off"), heads).train()}
    models["compiled"] = PretrainingModel(cfg.replace(compile="on"), heads).train()
    models["compiled"].load_state_dict(models["eager"].state_dict())
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True) for k, m in models.items()}
    gen = torch.Generator().manual_seed(0)
    real = int(args.seq * (1 - args.padding))
    preds = max(1, round(0.15 * real))

    def batch(jitter: int):
        ids = torch.randint(5, cfg.vocab_size, (args.batch, args.seq), generator=gen)
        mask = torch.zeros_like(ids)
        for r in range(args.batch):  # real lengths differ by row and batch when there is padding
            n = args.seq if not args.padding else max(preds + 2, real - (r * 7 + jitter) % max(1, real // 4))
            mask[r, :n] = 1
        ids[mask == 0] = 0
        pos = torch.stack([torch.randperm(int(mask[r].sum()) - 1, generator=gen)[:preds] + 1
                           for r in range(args.batch)])
        flat, labels = flat_positions(pos, torch.randint(5, cfg.vocab_size, pos.shape, generator=gen), args.seq)
        return ids, (mask if args.padding else None), flat, labels, torch.randint(0, 2, (args.batch,), generator=gen)

    batches = [batch(j) for j in range(4)]

    def step(name, b):
        ids, mask, flat, labels, nsp = b
        out = models[name](ids, mask, mlm_positions=flat)
        loss = F.cross_entropy(out[MLM], labels) + F.cross_entropy(out[NSP], nsp)
        loss.backward()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        return float(loss)

    first = {}
    for name in models:
        for i in range(2):  # two shapes (with padding): the second shows whether a new token count recompiles
            start = time.perf_counter()
            step(name, batches[i])
            first[f"{name} warm-up step {i + 1}"] = time.perf_counter() - start
    times = {k: [] for k in models}
    losses = {k: [] for k in models}
    for i in range(args.steps):
        for name in models:
            start = time.perf_counter()
            losses[name].append(step(name, batches[i % len(batches)]))
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"H={args.hidden} L={args.layers} A={args.heads} batch {args.batch} x {args.seq}, padding "
          f"{args.padding:.0%}, unpad={args.unpad}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for k, v in first.items():
        print(f"  {k}: {v:.2f} s")
    for k in models:
        print(f"  {k:>8}: {med[k] * 1e3:8.1f} ms/step (median of {args.steps})  last loss {losses[k][-1]:.4f}")
    print(f"  eager / compiled time per step: {med['eager'] / med['compiled']:.2f}x")


if __name__ == "__main__":
    main()
