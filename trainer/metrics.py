"""What a run reports, on rank 0 only: console lines, a tqdm bar, TensorBoard scalars and ``RUN_DIR/metrics.jsonl``.

``metrics.jsonl`` holds one JSON object per logged step (``step``, ``loss``, ``lr``, ``tokens_per_s`` always; plus
``samples_per_s``, ``grad_norm``, ``loss_scale``, ``mfu``, ``skipped`` and each objective's own metrics), and one per
evaluation with ``"split": "eval"``. ``python -m trainer.plot RUN_DIR`` reads it back.

MFU is model FLOPs per second over the peak: training costs ~6 FLOPs per parameter per token (forward 2, backward 4)
for the dense weights, plus the attention score/value products, 12 * layers * hidden * seq per token
(PaLM paper, appendix B). Embedding lookups are not matmuls and are left out. The peak is ``logging.peak_tflops`` per
rank, or a fp32 (bf16 on GPU when training in bf16) matmul measured once at start-up.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from trainer.log import print0


def model_flops_per_token(model: torch.nn.Module, seq_len: int, num_layers: int = 0, hidden: int = 0) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + the attention products (12 L H T)."""
    embedding = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return 6.0 * (total - embedding) + 12.0 * num_layers * hidden * seq_len


def measure_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024) -> float:
    """FLOP/s of a square matmul on this device (~0.3 s on CPU); the denominator of MFU when none is configured.
    Its operands come from a private generator: the trainer measures after restoring a checkpoint's RNG state, and a
    draw from the global stream would shift dropout and ELECTRA's sampling in a resumed run."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    a @ b  # warm-up
    reps, start = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - start < 0.2:
        a @ b
        reps += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2.0 * n**3 * reps / (time.perf_counter() - start)


class MetricsLogger:
    """Rank 0 writes; the other ranks' calls are no-ops, so the loop can call it unconditionally."""

    def __init__(self, run_dir: str | Path, cfg, rank: int, total_steps: int, start_step: int):
        self.enabled = rank == 0
        self.cfg = cfg
        self.writer = None
        self.bar = None
        self.jsonl = None
        if not self.enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run continues the same file (plot() keeps the last record of a repeated step).
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)
        if cfg.progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                            mininterval=1.0)

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print0(line)

    def advance(self, steps: int = 1, loss: float | None = None) -> None:
        if self.bar is not None:
            self.bar.update(steps)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def log(self, step: int, record: dict, split: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": step, **({"split": split} if split != "train" else {}), **record}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.writer is not None:
            for key, value in record.items():
                if key not in ("step", "split") and isinstance(value, (int, float)) and value is not None:
                    self.writer.add_scalar(f"{split}/{key}", value, step)
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in record.items() if k not in ("step", "split"))
        self._print(f"{split} step {step}: {shown}")

    def message(self, text: str) -> None:
        if self.enabled:
            self._print(text)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        self.jsonl.close()


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
