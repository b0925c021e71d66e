"""The trainer's step against the bare model step: what DeepSpeed and ``trainer.loop`` add on top of the model.

Same model (BERT: our encoder + MLM head + NSP), same collated batches (``trainer.data.loader.Collator``), same
useful FLOPs: (a) the bare model step (autocast bf16 on a GPU, torch AdamW fused), (b) ``Trainer.train_step`` through
``trainer.engine.Engine`` at ZeRO-1 (``ds_configs/zero1_bf16*.json``, the GPU recipes' default) and ZeRO-2, gradient
accumulation 1 and 4, AdamW and LAMB, with host syncs per step from ``torch.cuda.set_sync_debug_mode`` on a GPU.
Ratios (b)/(a) per micro-batch are printed; the goal on an H100/H200 is the trainer within 10 % of the model at
accumulation 4. ``--jsonl PATH`` appends one JSON line per configuration as it is measured, in the first run's
priority order (ZeRO-1 before ZeRO-2, accumulation 4 before 1); past ``--deadline`` (gpu.sh passes its stage's) each
configuration not yet measured writes a ``skipped`` line instead.
MFU is against ``trainer.metrics.peak_flops`` (the datasheet bf16 peak for a listed GPU).

    python bench/trainer_step.py                      # bert-large, seq 512, 8192 tokens per step, 10 steps
    python bench/trainer_step.py --smoke              # CPU, tiny shapes: checks the script, measures nothing
``bash bench/gpu.sh`` runs it when deepspeed is importable.
"""
from __future__ import annotations

import argparse
import json
import gc
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="bert-large")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch-tokens", type=int, default=8192, help="tokens per micro-batch (batch = this / seq)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after 3 warm-up steps)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, 2 steps: checks the script only")
    p.add_argument("--jsonl", default=None, help="append one JSON line per measured configuration here")
    p.add_argument("--deadline", type=float, default=None,
                   help="Unix time after which the configurations not yet measured write a skipped line each")
    return p


def make_batches(cfg, batch: int, seq: int, n: int, seed: int = 0) -> list[dict]:
    """Full rows (no padding), 15 % of the tokens predicted, NSP labels: collated like the trainer's batches."""
    from trainer.data.loader import Collator

    rng = np.random.default_rng(seed)
    preds = max(1, round(0.15 * seq))
    collate = Collator(cfg.pad_token_id, seq, preds)
    out = []
    for _ in range(n):
        samples = []
        for _ in range(batch):
            ids = rng.integers(5, cfg.vocab_size, seq).astype(np.int32)
            pos = np.sort(rng.choice(np.arange(1, seq), size=preds, replace=False)).astype(np.int32)
            types = np.zeros(seq, np.int8)
            types[seq // 2:] = 1
            samples.append({"input_ids": ids, "token_type_ids": types, "mlm_positions": pos,
                            "mlm_labels": ids[pos].copy(), "sentence_label": int(rng.integers(0, 2))})
        out.append(collate(samples))
    return out


def useful_flops(cfg, batch: dict) -> float:
    """Training FLOPs of one micro-batch, as bench/gpu.sh counts them: dense layers and attention over real tokens,
    the vocabulary decoder at the predicted positions only."""
    tokens = int(batch["attention_mask"].sum())
    real = batch["attention_mask"].shape[1]
    preds = int((batch["mlm_labels"] != -100).sum())
    h, L = cfg.hidden_size, cfg.num_layers
    return (6 * tokens * L * (4 * h * h + 2 * h * cfg.ffn_size) + 12 * L * h * real * tokens
            + 6 * preds * h * cfg.vocab_size)


# (ZeRO stage, optimizer) -> the DeepSpeed JSON the recipes name for it (ZeRO-1 is the GPU recipes' default)
CONFIGS = {(1, "adamw"): "zero1_bf16.json", (1, "lamb"): "zero1_bf16_lamb.json",
           (2, "adamw"): "zero2_bf16.json", (2, "lamb"): "zero2_bf16_lamb.json"}


def ds_config(micro: int, accum: int = 1, stage: int = 1, optimizer: str = "adamw") -> dict:
    ds = json.loads((REPO / "ds_configs" / CONFIGS[stage, optimizer]).read_text())
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum, train_batch_size=micro * accum,
              gradient_clipping=1.0, zero_allow_untested_optimizer=True, steps_per_print=2**31 - 1)
    return ds


class CudaSyncCount:
    """Host-device syncs while ``on``, as CUDA reports them: ``torch.cuda.set_sync_debug_mode("warn")`` makes every
    synchronizing call (``.item()``, a pageable copy, ``nonzero``) emit a UserWarning; counted here. None on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda, self.count = cuda, 0

    def run(self, fn):
        if not self.cuda:
            fn()
            return None
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)


def emit(jsonl: str | None, record: dict) -> None:
    """One JSON line, appended as soon as it is measured (a cut run still reports what it did)."""
    print(json.dumps(record), flush=True)
    if jsonl:
        with open(jsonl, "a") as f:
            f.write(json.dumps(record) + "\n")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from trainer import engine as ds_engine
    from trainer.checkpoint import TrainState
    from trainer.loop import Components, Trainer
    from trainer.metrics import peak_flops
    from trainer.models import get_preset
    from trainer.objectives import get_objective
    from trainer.optim import OptimConfig

    if args.smoke and not torch.cuda.is_available():
        # DeepSpeed's CPU accelerator JIT-builds its shared-memory allreduce op inside init_distributed, once per
        # DeepSpeed install (~30 s of a 63 s smoke run): a one-rank run never communicates, and on a GPU the op is
        # never built. Marked unavailable, DeepSpeed's backend uses torch.distributed (deepspeed/comm/torch.py,
        # build_shm_op).
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    ds_engine.init_distributed(10)
    device = ds_engine.device_name()
    cuda = device.startswith("cuda")
    if not cuda and not args.smoke:
        raise SystemExit("bench/trainer_step.py needs a GPU; --smoke runs it on the CPU")
    preset, seq, steps, warmup = (("tiny", 32, 2, 1) if args.smoke else (args.preset, args.seq, args.steps, 3))
    cfg = get_preset(preset)
    batch_rows = max(1, (256 if args.smoke else args.batch_tokens) // seq)
    objective = get_objective({"name": "mlm+nsp"})
    batches = make_batches(cfg, batch_rows, seq, warmup + steps)
    flops = useful_flops(cfg, batches[0])
    peak, source = peak_flops(device, torch.bfloat16)
    print(f"trainer step bench: {preset} seq {seq} batch {batch_rows} on {device}; peak {peak / 1e12:.1f} TFLOP/s "
          f"({source})", flush=True)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(step_fn) -> float:
        for i in range(warmup):
            step_fn(batches[i])
        sync()
        start = time.perf_counter()
        for i in range(warmup, warmup + steps):
            step_fn(batches[i])
        sync()
        return (time.perf_counter() - start) / steps

    # (a) the bare model step: fp32 weights, autocast bf16, torch AdamW (fused on a GPU)
    torch.manual_seed(0)
    model = objective.build_model(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)

    last = {}

    def model_step(batch):
        from trainer.loop import _to_device
        b = _to_device(batch, device)
        with torch.autocast("cuda" if cuda else "cpu", torch.bfloat16, enabled=cuda):
            loss, _ = objective.loss(model, b)
        last["loss"] = loss.detach()  # read once after timing (a .item() here would be a host sync per step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    reference = timed(model_step)
    print(f"  model step (autocast bf16, AdamW fused): {reference * 1e3:8.1f} ms/step  "
          f"MFU {flops / reference / peak:6.1%}  loss {last['loss'].item():.3f}", flush=True)
    del model, opt
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()  # each configuration's peak is its own, the first one's included

    # (b) the trainer's step: DeepSpeed engine + Trainer.train_step at ZeRO-1 (the recipes' default) and ZeRO-2,
    # accumulation 1 and 4 (time per micro-batch compared with the model step's), AdamW and LAMB
    emit(args.jsonl, {"stage": "model_step", "preset": preset, "seq": seq, "batch": batch_rows,
                      "ms_per_step": reference * 1e3, "mfu": flops / reference / peak, "peak_flops": peak,
                      "loss": last["loss"].item()})
    # The order is the first run's priority (a cut run keeps the ones that matter most): ZeRO-1, the GPU recipes'
    # default, before ZeRO-2; accumulation 4 (the goal: within 10 % of the model step) before 1
    configs = [(stage, accum, name) for stage in (1, 2) for accum in (4, 1) for name in ("adamw", "lamb")]
    for stage, accum, name in configs:
        if args.deadline is not None and time.time() >= args.deadline:
            emit(args.jsonl, {"stage": "trainer_step", "zero": stage, "accum": accum, "optimizer": name,
                              "skipped": "time budget (--deadline) spent"})
            continue
        torch.manual_seed(0)
        model = objective.build_model(cfg)
        ds = ds_config(batch_rows, accum, stage, name)
        optimizer = ds_engine.build_optimizer(OptimConfig(name=name, lr=1e-4), model, device, ds)
        engine = ds_engine.Engine(model, optimizer, None, ds)
        trainer = Trainer(cfg=None, engine=engine,
                          comps=Components(model=model, loss=objective.loss, train_batches=lambda consumed: iter(())),
                          state=TrainState(), rank=0, world_size=1, grad_accum=accum, metrics=None,
                          preempt=SimpleNamespace(requested=False))
        result = {}

        def trainer_step(batch):
            result["r"] = trainer.train_step(iter([batch] * accum))

        dt = timed(trainer_step) / accum  # per micro-batch, comparable with the model step
        syncs = CudaSyncCount(cuda).run(lambda: trainer_step(batches[0]))
        mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
        print(f"  trainer step ({name}, ZeRO-{stage} bf16, accum {accum}, {type(optimizer).__name__}): "
              f"{dt * 1e3:8.1f} ms/micro-batch  MFU {flops / dt / peak:6.1%}  trainer/model "
              f"{dt / reference:.2f}x  loss {result['r'].loss:.3f}  syncs/step {syncs}  peak mem {mem:.1f} GiB",
              flush=True)
        emit(args.jsonl, {"stage": "trainer_step", "zero": stage, "accum": accum, "optimizer": name,
                          "ms_per_micro_batch": dt * 1e3, "mfu": flops / dt / peak,
                          "trainer_over_model": dt / reference, "syncs_per_step": syncs,
                          "loss": result["r"].loss, "peak_mem_gib": None if not cuda else mem})
        engine.close()  # DeepSpeed's ZeRO engines are a reference cycle that del alone never frees (Engine.close)
        del engine, trainer, model, optimizer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    ds_engine.shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
