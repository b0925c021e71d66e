"""Training-step throughput of our encoder + MLM head (+ NSP) against Hugging Face BertForPreTraining.

Same configuration, batch, sequence length and masked positions; forward + backward + AdamW step, CPU fp32, one
process. Hugging Face computes vocabulary logits at every position (its labels are -100 where nothing is predicted);
ours only at the masked positions. Steps of the two models alternate, so machine noise hits both alike.

MFU is against a fp32 matmul measured in the same run. Model FLOPs per step are the *useful* ones, identical for both
sides: 6 x (non-embedding encoder + head weights) per token, 12 L H T per token for attention, and the vocabulary
decoder 6 E V only at the masked positions (Hugging Face does ~6.7x more decoder work than this counts at 15 %).

    python bench/step.py                       # H=512 L=4 A=8, batch 8 x 128, 15 % masked (20 per row)
    python bench/step.py --padding 0.5 --unpad # half of every row padding; ours drops it (unpad=True)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20, help="masked positions per row (BERT: 20 at seq 128)")
    p.add_argument("--padding", type=float, default=0.0, help="fraction of each row that is padding")
    p.add_argument("--unpad", action="store_true", help="ours drops padding tokens (ModelConfig.unpad)")
    p.add_argument("--steps", type=int, default=6, help="timed steps per model (after 2 warm-up steps)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--optimizer", choices=["fused", "foreach", "loop"], default="fused",
                   help="torch AdamW implementation, the same for both models (fused: one kernel per tensor)")
    return p


def make_batch(args, gen):
    real = max(args.predictions + 2, int(round(args.seq * (1 - args.padding))))
    ids = torch.randint(5, args.vocab, (args.batch, args.seq), generator=gen)
    mask = torch.zeros(args.batch, args.seq, dtype=torch.long)
    mask[:, :real] = 1
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, real // 2:real] = 1
    pos = torch.stack([torch.randperm(real - 1, generator=gen)[:args.predictions] + 1 for _ in range(args.batch)])
    labels = torch.randint(5, args.vocab, pos.shape, generator=gen)
    nsp = torch.randint(0, 2, (args.batch,), generator=gen)
    return ids, mask, types, pos, labels, nsp


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    from trainer.metrics import measure_peak_flops
    from trainer.models import MLM, NSP, HeadSpec, PretrainingModel, flat_positions, get_preset

    torch.manual_seed(0)
    cfg = get_preset("bert-base", vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                     num_heads=args.heads, unpad=args.unpad)
    ours = PretrainingModel(cfg, {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}).train()
    hf_cfg = transformers.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                     num_attention_heads=args.heads, intermediate_size=4 * args.hidden)
    theirs = transformers.BertForPreTraining(hf_cfg).train()
    ids, mask, types, pos, labels, nsp = make_batch(args, torch.Generator().manual_seed(1))
    flat, flat_labels = flat_positions(pos, labels, args.seq)
    hf_labels = torch.full_like(ids, -100).scatter_(1, pos, labels)

    def our_step(opt):
        out = ours(ids, mask, types, mlm_positions=flat)
        loss = F.cross_entropy(out[MLM], flat_labels) + F.cross_entropy(out[NSP], nsp)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def hf_step(opt):
        out = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=hf_labels,
                     next_sentence_label=nsp)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[args.optimizer]
    steps = {"ours": (our_step, torch.optim.AdamW(ours.parameters(), lr=1e-5, **impl)),
             "hf": (hf_step, torch.optim.AdamW(theirs.parameters(), lr=1e-5, **impl))}
    times = {name: [] for name in steps}
    for i in range(args.steps + 2):
        for name, (fn, opt) in steps.items():
            start = time.perf_counter()
            fn(opt)
            if i >= 2:
                times[name].append(time.perf_counter() - start)
    peak = measure_peak_flops("cpu", torch.float32, n=2048)

    tokens = int(mask.sum())  # real tokens per step (padding excluded for both)
    h, layers, t, e, v = args.hidden, args.layers, int(mask.sum(1).float().mean()), cfg.emb_size, args.vocab
    encoder_weights = layers * (4 * h * h + 2 * h * cfg.ffn_size)
    head_weights = h * e + h * h + h * 2  # MLM transform, pooler, NSP classifier
    flops = 6 * tokens * encoder_weights + 12 * layers * h * t * tokens + 6 * flat.numel() * e * v \
        + 6 * args.batch * head_weights
    print(f"config: H={h} L={layers} A={args.heads} V={v} batch {args.batch} x seq {args.seq}, "
          f"{args.padding:.0%} padding, {args.predictions} predictions/row, unpad={args.unpad}, "
          f"AdamW {args.optimizer}, torch threads {torch.get_num_threads()}, HF attention {theirs.config._attn_implementation}")
    print(f"measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    result = {}
    for name in steps:
        med = statistics.median(times[name])
        result[name] = tokens / med
        print(f"{name:>5}: {med * 1e3:8.1f} ms/step (median of {len(times[name])}), {tokens / med:9.1f} tokens/s, "
              f"MFU {flops / med / peak:6.1%}")
    print(f"ratio ours/hf tokens/s: {result['ours'] / result['hf']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
