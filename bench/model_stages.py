"""First-run GPU stages of ``bench/gpu.sh``: the bare model step on three row mixes, one profiled step, device idle
time at accumulation 4, and the other large presets; one JSON line per stage appended to ``--jsonl`` as measured.

- ``model_step``: BERT-large seq 512 bf16 (autocast, fused AdamW), rows ``full`` (every row 512 real tokens),
  ``short10`` (10 % of rows a random shorter length, the rest full: BERT's short_seq_prob) and ``packed`` (samples of
  random length packed into rows with ``pack_ids``). Every batch is fed as the trainer feeds it: the packing metadata
  is built on the host (``attach_packing``) and copied to the device, so packed rows take the varlen attention path.
  ms/step from CUDA events (perf_counter on the CPU), tokens = real (non-padding) tokens, MFU = the step's training
  FLOPs counted for the sequences as they run (``step_flops``: attention on each packed sample's own length, from
  ``trainer.flops``) / time / the datasheet bf16 peak, peak memory from ``torch.cuda.max_memory_allocated``.
- ``profile``: one step of the full-row mix under ``torch.profiler``: device time split GEMM / attention /
  elementwise (everything else), fractions of the total, and the attention kernel names that ran (CPU op names on
  the CPU).
- ``idle``: one optimizer step at accumulation 4 (4 forward/backward + AdamW) under the profiler: time inside the
  step's span during which no device kernel ran (CPU: no op on the main thread).
- ``model_step`` with ``compile: on``: the same on full and packed rows with each layer's feed-forward and
  attention-output blocks under ``torch.compile`` (``model.compile``, on by default on CUDA); ``warmup_s`` includes
  the compile. ``profile`` and ``idle`` run the compiled model on a GPU (what the trainer runs there).
- ``others``: RoBERTa-large packed, ALBERT-xxlarge and ELECTRA-large (generator + discriminator) model steps.

Each stage first checks ``--deadline`` (Unix seconds; gpu.sh sets start + 8 minutes): past it, the stage writes
``{"stage": ..., "skipped": "time budget"}`` and does not run.

    python bench/model_stages.py --jsonl out.jsonl                  # on a GPU
    python bench/model_stages.py --smoke --jsonl out.jsonl          # CPU, tiny presets: checks the script only
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

GEMM_KEYS = ("gemm", "cutlass", "cublas", "xmma", "nvjet", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
             "aten::_addmm_activation")
ATTENTION_KEYS = ("flash", "fmha", "attention", "sdpa", "scaled_dot_product", "attn")
SMOKE_PRESETS = {"bert-large": "tiny", "roberta-large": "tiny-roberta", "albert-xxlarge": "tiny-albert",
                 "electra-large": "tiny-electra"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("core", "profile", "others", "all"), default="all",
                   help="core: BERT-large model_step on three row mixes, eager and compiled; profile: profile and "
                        "idle; others: RoBERTa/ALBERT/ELECTRA (gpu.sh runs the trainer step between core and profile)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=10, help="timed steps after 2 warm-up steps")
    p.add_argument("--deadline", type=float, default=None, help="Unix time after which stages are skipped")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny presets, seq 64: checks the script only")
    p.add_argument("--jsonl", default=None)
    return p


def kernel_class(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ATTENTION_KEYS):
        return "attention"
    if any(k in low for k in GEMM_KEYS):
        return "gemm"
    return "elementwise"


def make_batch(mix: str, batch: int, seq: int, vocab: int, gen: torch.Generator) -> dict:
    """A collated CPU batch of ``mix`` rows, with ``packing`` attached on the host (what the loop does)."""
    from trainer.models.kernels import attach_packing

    lengths = [seq] * batch
    pack_ids = None
    if mix == "short10":
        for r in torch.randperm(batch, generator=gen)[:max(1, round(0.1 * batch))].tolist():
            lengths[r] = int(torch.randint(8, seq - 1, (1,), generator=gen))
    mask = torch.zeros(batch, seq, dtype=torch.long)
    if mix == "packed":
        pack_ids = torch.zeros(batch, seq, dtype=torch.long)
        for r in range(batch):
            used, k = 0, 0
            while seq - used >= 8:
                n = min(int(torch.randint(8, seq // 2 + 1, (1,), generator=gen)), seq - used)
                k += 1
                pack_ids[r, used:used + n] = k
                used += n
            lengths[r] = used
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    ids = torch.randint(5, vocab, (batch, seq), generator=gen) * mask
    preds = max(1, round(0.15 * seq))
    pos = torch.stack([torch.randperm(n - 1, generator=gen)[:preds] + 1 if n - 1 >= preds else
                       torch.arange(1, preds + 1) % n for n in lengths])
    flat = (pos + torch.arange(batch)[:, None] * seq).flatten()
    out = {"input_ids": ids, "attention_mask": mask, "mlm_positions": flat,
           "mlm_labels": torch.randint(5, vocab, flat.shape, generator=gen),
           "seq_labels": torch.randint(0, 2, (batch,), generator=gen), "row_tokens": lengths}
    if pack_ids is not None:
        out["pack_ids"] = pack_ids
    return attach_packing(out)


def build_model(preset: str, dev, compile: str = "off"):
    """``preset``'s pretraining model on ``dev``; ``compile`` is ``model.compile`` (off: eager, on: torch.compile of
    each layer's feed-forward and attention-output blocks)."""
    from trainer.models.electra import ElectraPretrainingModel
    from trainer.models.presets import PRESET_ROWS

    row = PRESET_ROWS[preset]
    # unpad as every GPU recipe sets it (model.unpad: true): short and packed rows take the varlen path there; the
    # presets' default (False) would measure the dense masked path, which no recipe runs
    cfg = row.config.replace(compile=compile, unpad=True)
    torch.manual_seed(0)
    if "electra" in preset:
        return ElectraPretrainingModel(cfg).to(dev).train()
    from trainer.models.heads import PretrainingModel
    return PretrainingModel(cfg, row.heads).to(dev).train()


def step_flops(model, batches, seq: int, preds: int) -> float:
    """Training FLOPs of one step on each batch (mean over ``batches``), counted for the sequences as they run: the
    matmul FLOPs of one forward on ``n`` tokens with ``preds`` predictions is A n + B n^2 + K (B: attention scores
    and context, K: heads on a fixed number of positions), fitted from ``trainer.flops.forward_flops`` at three
    lengths for each ``PretrainingModel`` inside ``model``; a row of packed samples costs the sum of its samples'
    A n + B n^2 plus one K. Training = 3 x forward. On full rows this equals ``train_flops_per_token`` x tokens."""
    from trainer.flops import _pretraining_models, forward_flops

    total = 0.0
    for part in _pretraining_models(model):
        lengths = (seq, seq // 2, seq // 4)
        f = [forward_flops(part, n, preds) for n in lengths]
        # f(n) = A n + B n^2 + K: differences remove K; the second difference gives B
        (n1, n2, n3), (f1, f2, f3) = lengths, f
        b_coef = ((f1 - f2) / (n1 - n2) - (f2 - f3) / (n2 - n3)) / (n1 - n3)
        a_coef = (f1 - f2) / (n1 - n2) - b_coef * (n1 + n2)
        k_coef = f1 - a_coef * n1 - b_coef * n1 * n1
        for b in batches:
            lens = (b["packing"].cu_seqlens[1:] - b["packing"].cu_seqlens[:-1]).double().cpu()
            total += 3 * (a_coef * lens.sum().item() + b_coef * (lens * lens).sum().item()
                          + k_coef * len(b["row_tokens"])) / len(batches)
    return total


def loss_of(model, b) -> torch.Tensor:
    from trainer.models.electra import ElectraPretrainingModel

    kw = {"pack_ids": b.get("pack_ids"), "packing": b["packing"]}
    if isinstance(model, ElectraPretrainingModel):
        g = model(b["input_ids"], b["attention_mask"], positions=b["mlm_positions"], part="generator", **kw)
        d = model(b["input_ids"], b["attention_mask"], part="discriminator", **kw).float()
        return F.cross_entropy(g.float(), b["mlm_labels"]) + F.binary_cross_entropy_with_logits(
            d, torch.zeros_like(d))
    out = model(b["input_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"], **kw)
    loss = F.cross_entropy(out["mlm"].float(), b["mlm_labels"])
    for name, value in out.items():
        if name not in ("mlm", "hidden"):
            loss = loss + F.cross_entropy(value.float(), b["seq_labels"])
    return loss


class Stages:
    def __init__(self, args):
        from trainer.metrics import table_peak_flops

        self.args = args
        self.dev = torch.device("cpu" if args.smoke else "cuda")
        self.seq = 64 if args.smoke else args.seq
        self.batch = max(1, (256 if args.smoke else args.batch_tokens) // self.seq)
        self.steps = 2 if args.smoke else args.steps
        name = torch.cuda.get_device_name() if self.dev.type == "cuda" else "cpu"
        self.peak = table_peak_flops(name, torch.bfloat16) if self.dev.type == "cuda" else None
        self.gen = torch.Generator().manual_seed(0)

    def emit(self, record: dict) -> None:
        print(json.dumps(record), flush=True)
        if self.args.jsonl:
            with open(self.args.jsonl, "a") as f:
                f.write(json.dumps(record) + "\n")

    def out_of_time(self, stage: str, **what) -> bool:
        if self.args.deadline is not None and time.time() >= self.args.deadline:
            self.emit({"stage": stage, **what, "skipped": "time budget (--deadline) spent"})
            return True
        return False

    def preset(self, name):
        return SMOKE_PRESETS[name] if self.args.smoke else name

    def batches(self, model, mix, n=2):
        vocab = (model.cfg if hasattr(model, "cfg") else model.discriminator.cfg).vocab_size
        cpu = [make_batch(mix, self.batch, self.seq, vocab, self.gen) for _ in range(n)]
        return [{k: (v.to(self.dev, non_blocking=True) if hasattr(v, "to") else v) for k, v in b.items()}
                for b in cpu]

    def train_step(self, model, opt, batches):
        for b in batches:
            with torch.autocast(self.dev.type, torch.bfloat16):
                loss = loss_of(model, b) / len(batches)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def model_step(self, preset_name: str, mix: str, compile: str = "off") -> None:
        from trainer.flops import train_flops_per_token

        preset = self.preset(preset_name)
        if self.out_of_time("model_step", preset=preset, mix=mix, compile=compile):
            return
        model = build_model(preset, self.dev, compile)
        compile_start = time.perf_counter()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=self.dev.type == "cuda")
        batches = self.batches(model, mix)
        if self.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for i in range(2 if compile == "off" else 3):  # compiled: both batches' shapes seen before timing
            self.train_step(model, opt, batches[i % 2:i % 2 + 1])
        self.sync()
        warmup_s = time.perf_counter() - compile_start
        if self.dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for i in range(self.steps):
            loss = self.train_step(model, opt, batches[i % 2:i % 2 + 1])
        if self.dev.type == "cuda":
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end) / self.steps
        else:
            ms = (time.perf_counter() - t0) * 1e3 / self.steps
        rows = [b["row_tokens"] for b in batches]
        samples = [int(b["packing"].cu_seqlens.numel() - 1) for b in batches]
        tokens = sum(sum(r) for r in rows) / len(rows)  # real tokens per step (mean over the alternated batches)
        preds = max(1, round(0.15 * self.seq))
        per_token = train_flops_per_token(model, self.seq, preds)
        flops = step_flops(model, batches, self.seq, preds)
        rate = tokens / (ms / 1e3)
        self.emit({"stage": "model_step", "preset": preset, "mix": mix, "compile": compile,
                   "warmup_s": warmup_s, "seq": self.seq, "batch": self.batch,
                   "dtype": "bf16", "device": self.dev.type, "ms_per_step": ms, "tokens_per_step": tokens,
                   "row_tokens": rows, "samples": samples, "tokens_per_s": rate, "full_row_flops_per_token": per_token,
                   "flops_per_step": flops, "mfu": flops / (ms / 1e3) / self.peak if self.peak else None,
                   "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if self.dev.type == "cuda" else None,
                   "loss": float(loss.detach())})
        del model, opt
        gc.collect()  # a compiled model is a reference cycle (its layers hold their compiled forward): free it now
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()

    def _profiled(self, accum: int):
        from torch.profiler import ProfilerActivity, profile

        model = build_model(self.preset("bert-large"), self.dev, "off" if self.dev.type == "cpu" else "on")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=self.dev.type == "cuda")
        batches = self.batches(model, "full", n=accum)
        self.train_step(model, opt, batches)  # warm-up (kernel choice, allocator)
        self.sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            self.train_step(model, opt, batches)
            self.sync()
        del model, opt
        return prof

    def device_events(self, prof):
        """(name, start_us, end_us, self_us) of device kernels (GPU) or of CPU ops on the main thread (CPU)."""
        from torch.autograd import DeviceType

        events = prof.events()
        if self.dev.type == "cuda":
            ks = [e for e in events if e.device_type == DeviceType.CUDA]
            return [(e.name, e.time_range.start, e.time_range.end, e.time_range.elapsed_us()) for e in ks]
        main = max({e.thread for e in events}, key=lambda t: sum(e.thread == t for e in events))
        return [(e.name, e.time_range.start, e.time_range.end, e.self_cpu_time_total) for e in events
                if e.thread == main and e.device_type == DeviceType.CPU]

    def profile(self) -> None:
        if self.out_of_time("profile"):
            return
        events = self.device_events(self._profiled(accum=1))
        split = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0}
        attention = {}
        for name, _, _, us in events:
            cls = kernel_class(name)
            split[cls] += us
            if cls == "attention":
                attention[name] = attention.get(name, 0.0) + us
        total = sum(split.values())
        self.emit({"stage": "profile", "preset": self.preset("bert-large"), "mix": "full", "device": self.dev.type,
                   "kind": "kernels" if self.dev.type == "cuda" else "cpu ops (self time)",
                   "total_ms": total / 1e3, "fractions": {k: v / total for k, v in split.items()},
                   "attention_kernels": sorted(attention, key=attention.get, reverse=True)})

    def idle(self) -> None:
        if self.out_of_time("idle", accum=4):
            return
        spans = sorted((s, e) for _, s, e, _ in self.device_events(self._profiled(accum=4)))
        busy, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                busy += 0.0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        span = max(e for _, e in spans) - spans[0][0]
        self.emit({"stage": "idle", "preset": self.preset("bert-large"), "accum": 4, "device": self.dev.type,
                   "span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": (span - busy) / 1e3,
                   "idle_fraction": (span - busy) / span})

    def run(self):
        stages = []
        if self.args.part in ("core", "all"):
            stages += [(self.model_step, ("bert-large", mix)) for mix in ("full", "short10", "packed")]
            # model.compile: on (the CUDA default) against the eager steps above
            stages += [(self.model_step, ("bert-large", mix, "on")) for mix in ("full", "packed")]
        if self.args.part in ("profile", "all"):
            stages += [(self.profile, ()), (self.idle, ())]
        if self.args.part in ("others", "all"):
            stages += [(self.model_step, ("roberta-large", "packed")), (self.model_step, ("albert-xxlarge", "full")),
                       (self.model_step, ("electra-large", "full"))]
        failures = 0
        for fn, args in stages:
            try:
                fn(*args)
            except Exception as err:  # one broken stage must not cost the others on an unattended first run
                failures += 1
                self.emit({"stage": fn.__name__, "args": list(args), "failed": f"{type(err).__name__}: {err}"[:2000]})
                del err
                gc.collect()  # (the failed stage's model, e.g. after an out-of-memory error)
                if self.dev.type == "cuda":
                    torch.cuda.empty_cache()
        return failures


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench/model_stages.py needs a CUDA GPU; --smoke runs it on the CPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    if Stages(args).run():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
