"""What a run reports, on rank 0 only: console lines, a tqdm bar, TensorBoard scalars and ``RUN_DIR/metrics.jsonl``.

``metrics.jsonl`` holds one JSON object per logged step (``step``, ``loss``, ``lr``, ``tokens_per_s`` always; plus
``samples_per_s``, ``grad_norm``, ``loss_scale``, ``mfu``, ``skipped`` and each objective's own metrics), and one per
evaluation with ``"split": "eval"``; every line is strict JSON (a NaN/Inf value is written as ``null``,
``json_safe``). ``python -m trainer.plot RUN_DIR`` reads it back.

Time fields (host clocks: no device sync). Every record: ``time``, unix seconds when it was written. Train records
(since 2026-12-06), over the logging window (the steps since the previous train record): ``step_s``, mean seconds of
rank 0's optimizer steps (what ``tokens_per_s`` divides by: saves and evaluations excluded); ``data_wait_s``, mean
seconds per step rank 0 waited for its batches; ``window_s``, wall seconds since the previous train record of this
launch (or its training start), saves and evaluations included; ``save_s`` and ``eval_s``, seconds of checkpoint
saves and evaluations in the window; across ranks (every rank's window rides the step's one all-reduce):
``max_step_s`` / ``max_step_rank``, the rank whose steps took longest and its mean (the collectives keep every rank
near the same figure), and ``max_data_wait_s`` / ``max_data_wait_rank``, the rank that waited longest for its
batches and its mean per step: a loader stall on one node shows there, and makes every rank's ``step_s`` grow.

The tqdm bar (``logging.progress_bar``): ``"auto"`` shows it only when stderr is a terminal (a Slurm log would get
a ``\r`` frame a second, tens of MB over a long run), ``true`` always, ``false`` never.

MFU is model FLOPs per second over the peak: the FLOPs per token are counted for the layers as applied
(``trainer/flops.py``: ALBERT's shared layer once per application, ELECTRA's generator and discriminator, every head
the forward computes), attention for the rows as computed: each packed sample's or padded row's real length squared,
not ``max_seq_length`` for every token, and padding never counted (before 2026-12-06 the attention part was counted
at full rows: up to ~8 % high for 512-token BERT-large on short rows). The peak is ``logging.peak_tflops`` per
rank, else the vendor's dense peak for this GPU model at the training's matmul dtype (``PEAK_TFLOPS``; fp32 counts
as tf32 when torch allows TF32 matmuls), else a large matmul at the training dtype measured once at start-up
(synchronised; it lands below the datasheet, so MFU reads high by that margin: the table is preferred).
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path

import torch

from trainer.log import print0

NOT_CURVES = ("step", "split", "time")


# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s per GPU, by matmul dtype. Matched in order
# against torch.cuda.get_device_name() (e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"),
# so the specific names (NVL, PCIe) come before the generic ones. A GPU not listed is measured instead.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H200|GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 (HBM3)
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"V100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2; no bf16 on Volta
]


def matmul_dtype_name(dtype: torch.dtype) -> str:
    """'bf16', 'fp16', or for fp32 'tf32' when torch lets matmuls use TF32 tensor cores, else 'fp32'."""
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def table_peak_flops(gpu_name: str, dtype: torch.dtype) -> float | None:
    """The datasheet peak (FLOP/s) of ``gpu_name`` at ``dtype`` from PEAK_TFLOPS, or None when not listed."""
    kind = matmul_dtype_name(dtype)
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, gpu_name):
            return peaks[kind] * 1e12 if kind in peaks else None
    return None


def peak_flops(device: str, dtype: torch.dtype) -> tuple[float, str]:
    """(peak FLOP/s per rank, where it came from): the table for a known GPU, else a measurement at ``dtype``."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        peak = table_peak_flops(name, dtype)
        if peak is not None:
            return peak, f"{name} datasheet, {matmul_dtype_name(dtype)} dense"
        return measure_peak_flops(device, dtype), f"{name} not in PEAK_TFLOPS: measured {dtype} matmul"
    return measure_peak_flops(device, dtype), f"measured {dtype} matmul on {device}"


def run_peak_flops(run_dir: str | Path, device: str, dtype: torch.dtype, rank: int) -> tuple[float, str]:
    """``peak_flops``, with a measured peak kept for the run: the first launch that measures writes it to
    ``RUN_DIR/mfu_peak.json`` (device name, dtype), and later launches on the same kind of device reuse it. Before, a
    GPU missing from ``PEAK_TFLOPS`` (or the CPU) was measured at every launch, so a run's MFU jumped between
    relaunches with whatever the node and its neighbours did during those 0.2 s (found by review)."""
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else device
    if device.startswith("cuda") and table_peak_flops(name, dtype) is not None:
        return peak_flops(device, dtype)
    path = Path(run_dir) / "mfu_peak.json"
    want = {"device": name, "dtype": str(dtype)}
    try:
        kept = json.loads(path.read_text())
        if {k: kept.get(k) for k in want} == want and float(kept["flops"]) > 0:
            return float(kept["flops"]), f"measured {dtype} matmul on {name} at the run's first launch ({path})"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    peak, source = peak_flops(device, dtype)
    if rank == 0:
        try:
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps({**want, "flops": peak, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime())}))
            os.replace(tmp, path)
        except OSError as err:  # the MFU of later launches is measured again; said, not raised
            print0(f"warning: could not keep the measured MFU denominator in {path}: {err}")
    return peak, source + f", kept in {path} for later launches"


def measure_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int | None = None) -> float:
    """FLOP/s of a square n x n matmul at ``dtype`` on this device: n 8192 on a GPU (smaller ones stay far below
    an H100's peak), 1024 on the CPU (256 below fp32: bf16 is ~250x slower there); ~0.2 s plus a synchronised
    warm-up. Its operands come from a private generator: the trainer measures after restoring a checkpoint's RNG
    state, and a draw from the global stream would shift dropout and ELECTRA's sampling in a resumed run."""
    cuda = device.startswith("cuda")
    if n is None:
        n = 8192 if cuda else (1024 if dtype == torch.float32 else 256)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    for _ in range(2):  # warm-up: cuBLAS picks its kernel, clocks ramp up
        a @ b
    sync()
    reps, start = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - start < 0.2:
        a @ b
        reps += 1
        if cuda and reps % 10 == 0:
            sync()  # the clock must see finished work, not queued launches
    sync()
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
        # Append: a resumed run continues the same file (plot() keeps the last record of a repeated step). Each
        # record is one O_APPEND write of unbuffered bytes (as the downstream runner's), so a failed write (a full
        # disk) leaves nothing queued for close() to retry; a line an earlier run left cut is dropped first.
        self.path = run_dir / "metrics.jsonl"
        cut = drop_cut_last_line(self.path)
        moved, aside = set_aside_after(self.path, start_step)
        self.jsonl = open(self.path, "ab", buffering=0)
        if cut:
            print0(f"metrics: {self.path} ended in a cut line (an earlier run stopped while writing it: a full disk, "
                   f"a kill); dropped its {len(cut)} bytes ({cut[:60]!r}...) so every line stays one JSON record")
        if moved:
            print0(f"metrics: this launch starts at step {start_step}; the {moved} record(s) of later steps in "
                   f"{self.path} (logged after that checkpoint by an earlier launch, or by a run this one rolled "
                   f"back) were moved to the end of {aside}, so the file holds each step of this run once, as "
                   "TensorBoard does")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)
        if show_progress_bar(cfg.progress_bar):
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

    # in metrics.jsonl, not TensorBoard curves: unix time as a float32 scalar is ~128 s coarse, and rank numbers are
    # labels (the console line leaves out the time too)
    def log(self, step: int, record: dict, split: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": step, **({"split": split} if split != "train" else {}), "time": round(time.time(), 3),
                  **record}
        data = (json.dumps(json_safe(record), allow_nan=False) + "\n").encode("utf-8")
        try:
            while data:
                data = data[self.jsonl.write(data):]
        except OSError as err:
            raise _named(err, self.path) from err
        if self.writer is not None:
            try:
                for key, value in record.items():
                    if key not in NOT_CURVES and not key.endswith("_rank") and isinstance(value, (int, float)):
                        self.writer.add_scalar(f"{split}/{key}", value, step)
            except OSError as err:  # raised by TensorBoard's writer thread, without the file's name
                raise _named(err, Path(self.writer.log_dir)) from err
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in record.items() if k not in NOT_CURVES)
        self._print(f"{split} step {step}: {shown}")

    def message(self, text: str) -> None:
        if self.enabled:
            self._print(text)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        try:
            if self.writer is not None:
                self.writer.close()  # flushes: on a full disk this raises again, after the file below is closed
        finally:
            self.jsonl.close()


def show_progress_bar(setting, stream=None) -> bool:
    """``logging.progress_bar``: True / "true" / "on" force the bar, False / "false" / "off" hide it, "auto" (or
    None) shows it when ``stream`` (stderr, where tqdm draws) is a terminal."""
    if isinstance(setting, str):
        setting = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}.get(
            setting.strip().lower(), None)
    if setting is None:
        stream = sys.stderr if stream is None else stream
        try:
            return bool(stream.isatty())
        except (AttributeError, ValueError):  # a replaced or closed stream
            return False
    return bool(setting)


def _named(err: OSError, path: Path) -> OSError:
    """``err`` with ``path`` as its file name when it has none (a write or flush error names no file)."""
    if err.filename:
        return err
    return OSError(err.errno, err.strerror or str(err), str(path))


_STEP = re.compile(rb'^\{"step": (-?\d+)')


def set_aside_after(path: Path, step: int) -> tuple[int, Path | None]:
    """Move the records of steps after ``step`` out of ``path`` (metrics.jsonl) to the end of
    ``metrics.set-aside.jsonl`` beside it, after one line ``{"set_aside": UTC time, "resumed_at_step": step, "records":
    n}`` (one file for every launch of the run: a preempted run relaunched 50 times would otherwise leave 50 small
    files); returns (how many, that file). A launch resumed at step s
    logs s+1... again: before, the records an earlier launch logged after its last checkpoint stayed (the same steps
    twice), and after a roll-back the abandoned run's later steps followed the new run's, nothing telling them apart
    (plots drew one curve; found by review). TensorBoard's ``purge_step`` drops the same steps from its view.
    Streamed line by line (a 1M-step log is hundreds of MB): only the leading ``{"step": N`` of each line, which
    ``MetricsLogger.log`` always writes first, is parsed; lines without it are kept.

    A downstream runner of an earlier launch (detached; it outlives its launch) may append a score record while the
    file is rewritten: its write goes to the old file. The old file stays open, and what was appended to it by the
    replace (checked twice, 50 ms apart) is copied to the new one; before, such a record was lost (found by review of
    the day's diff: 40 of 2,000 records racing a rewrite). A runner that opened the old file before the replace and
    writes after the last check still loses its record: the window is a runner's open-to-write, microseconds."""
    try:
        with open(path, "rb") as f:
            later = any((m := _STEP.match(line)) and int(m.group(1)) > step for line in f)
    except FileNotFoundError:
        return 0, None
    if not later:
        return 0, None
    aside = path.with_name("metrics.set-aside.jsonl")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    moved, later = 0, []

    def split(lines, keep) -> None:
        nonlocal moved
        for line in lines:
            m = _STEP.match(line)
            if m and int(m.group(1)) > step:
                later.append(line if line.endswith(b"\n") else line + b"\n")
                moved += 1
            else:
                keep.write(line)

    try:
        with open(path, "rb") as f:
            with open(tmp, "wb") as keep:
                split(f, keep)
                keep.flush()
                os.fsync(keep.fileno())
            head = {"set_aside": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "resumed_at_step": step,
                    "records": moved}
            with open(aside, "ab") as out:  # written before the records leave metrics.jsonl: a kill loses none
                out.write((json.dumps(head) + "\n").encode() + b"".join(later))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
            for wait in (0.0, 0.05):  # what a concurrent writer appended to the old file meanwhile
                time.sleep(wait)
                rest = f.read()
                if rest:
                    before = len(later)
                    with open(path, "ab") as new:
                        split(rest.splitlines(keepends=True), new)
                    if len(later) > before:
                        with open(aside, "ab") as out:
                            out.write(b"".join(later[before:]))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return moved, aside


def drop_cut_last_line(path: Path) -> bytes:
    """Truncate ``path`` after its last newline when it does not end in one (an earlier writer stopped mid-record);
    returns the bytes dropped (empty when the file is whole or absent). Appending after a cut line would glue the
    next record onto it: one line that is no JSON, and two records lost."""
    try:
        with open(path, "r+b") as f:
            size = f.seek(0, 2)
            if size == 0:
                return b""
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return b""
            pos, block = size, 1 << 16
            while pos > 0:  # back to the last newline
                start = max(0, pos - block)
                f.seek(start)
                chunk = f.read(pos - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    pos = start + nl + 1
                    break
                pos = start
            f.seek(pos)
            cut = f.read(size - pos)
            if os.fstat(f.fileno()).st_size != size:
                # another writer (a downstream runner of an earlier launch) appended meanwhile: cutting now would
                # take its record too; its line is glued to the cut one either way, and readers skip that line
                return b""
            f.truncate(pos)
            return cut
    except FileNotFoundError:
        return b""


def json_safe(value):
    """``value`` with every NaN/Inf float replaced by None: JSON has no NaN, and Python's ``NaN``/``Infinity``
    literals make the line unreadable to strict parsers (jq, JavaScript, pandas' default). A null loss is a
    non-finite one (the NaN guard's message names it); TensorBoard and the console still get the raw value."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
