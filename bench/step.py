"""Training-step throughput of our encoder + MLM head (+ NSP) against Hugging Face BertForPreTraining.

Same configuration, batch, sequence length and masked positions; forward + backward + AdamW step, CPU fp32, one
process. Hugging Face computes vocabulary logits at every position (its labels are -100 where nothing is predicted);
ours only at the masked positions. Steps of the two models alternate, so machine noise hits both alike.

MFU is against a fp32 matmul measured in the same run, reported twice:

- useful: the FLOPs of the work both models must do, identical for both sides: 6 x (non-embedding encoder weights)
  per real token, 12 L H T per real token for attention (T = real tokens in the row), the MLM transform (H x E) and
  the vocabulary decoder (E x V) only at the masked positions, pooler and NSP classifier once per row;
- executed: the FLOPs each model really runs. Hugging Face runs the encoder on every position, padding included,
  attention over the padded length, and the transform and the full-vocabulary decoder at *every* position (its
  labels are -100 where nothing is predicted); ours runs the encoder on every position too (padding included) unless
  --unpad drops it, and the transform and decoder only at the masked positions. At 15 % masking Hugging Face's
  decoder does ~6.7x the useful decoder work, so its useful MFU understates how efficiently it runs what it runs.

``--flops-only`` prints the FLOP counts of a shape without timing anything (to derive the executed MFU of a past
measurement from its useful MFU: executed = useful x executed FLOPs / useful FLOPs).

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
    p.add_argument("--flops-only", action="store_true", help="print the FLOP counts per step and exit (no timing)")
    return p


def step_flops(args, cfg, real_per_row: list[int], n_pred: int) -> dict:
    """FLOPs of one training step (forward + backward = 6 x multiply-adds per weight per token; attention's two
    T x T matmuls 12 L H T per token): the useful ones (the same for both) and what each model executes."""
    h, layers, e, v, b, seq = args.hidden, args.layers, cfg.emb_size, args.vocab, args.batch, args.seq
    encoder_weights = layers * (4 * h * h + 2 * h * cfg.ffn_size)
    transform, decoder = h * e, e * v  # MLM head: dense H -> E (+ LayerNorm), decoder E -> V tied to the embeddings
    rows = 6 * b * (h * h + h * 2)  # pooler and NSP classifier on [CLS], once per row

    def encoder(lengths: list[int], attended: list[int]) -> int:
        return sum(6 * n * encoder_weights + 12 * layers * h * t * n for n, t in zip(lengths, attended))

    real = sum(real_per_row)
    useful = encoder(real_per_row, real_per_row) + 6 * n_pred * (transform + decoder) + rows
    padded = encoder([seq] * b, [seq] * b)  # every position through every layer, attention over the padded length
    ours = (encoder(real_per_row, real_per_row) if args.unpad else padded) + 6 * n_pred * (transform + decoder) + rows
    hf = padded + 6 * b * seq * (transform + decoder) + rows
    return {"useful": useful, "ours": ours, "hf": hf, "real_tokens": real}


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
    flops = step_flops(args, cfg, mask.sum(1).tolist(), flat.numel())
    print(f"FLOPs per step: useful {flops['useful'] / 1e9:.2f} G; executed: ours {flops['ours'] / 1e9:.2f} G "
          f"(x{flops['ours'] / flops['useful']:.3f} of useful), HF {flops['hf'] / 1e9:.2f} G "
          f"(x{flops['hf'] / flops['useful']:.3f})", flush=True)
    if args.flops_only:
        return 0

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
    print(f"config: H={args.hidden} L={args.layers} A={args.heads} V={args.vocab} batch {args.batch} x seq {args.seq}, "
          f"{args.padding:.0%} padding, {args.predictions} predictions/row, unpad={args.unpad}, "
          f"AdamW {args.optimizer}, torch threads {torch.get_num_threads()}, HF attention {theirs.config._attn_implementation}")
    print(f"measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    result = {}
    for name in steps:
        med = statistics.median(times[name])
        result[name] = tokens / med
        print(f"{name:>5}: {med * 1e3:8.1f} ms/step (median of {len(times[name])}), {tokens / med:9.1f} tokens/s, "
              f"MFU useful {flops['useful'] / med / peak:6.1%}, executed {flops[name] / med / peak:6.1%}")
    print(f"ratio ours/hf tokens/s: {result['ours'] / result['hf']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
