"""The one product module that imports deepspeed: process group, engine, checkpoint I/O, universal conversion.

The training loop talks to ``Engine`` (forward / backward / step / save / load) and never reaches into ZeRO. The
DeepSpeed JSON named by a recipe holds only engine settings (ZeRO stage, buckets, offload, precision blocks); the
values the trainer computes (batch sizes, gradient clipping, precision, universal loading) are filled in by
``build_ds_config``, and a JSON that sets them by hand is rejected so they are never duplicated.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import torch

import deepspeed
from deepspeed.accelerator import get_accelerator

# Keys the trainer owns; a ds_config that sets them would silently disagree with the recipe.
TRAINER_OWNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                      "optimizer", "scheduler", "gradient_clipping")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_minutes: float) -> tuple[int, int]:
    """Join (or, without a launcher, create) the process group; returns (rank, world size).

    torchrun and the deepspeed launcher set RANK/WORLD_SIZE; under mpirun DeepSpeed discovers the MPI environment
    itself (mpi4py). With no launcher at all we make a one-rank group on a free local port, so
    ``python -m trainer.pretrain`` needs nothing else. The timeout bounds every collective: when a rank dies the
    others fail after it (gloo usually notices a closed socket at once) instead of hanging the job.
    """
    launched = any(k in os.environ for k in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"))
    if not launched and "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        # `srun python trainer/pretrain.py` (one task per rank, no torchrun): ranks from the srun step (the batch
        # script itself has no SLURM_STEP_NUM_TASKS, so a single process there stays a 1-rank run), the rendezvous
        # from MASTER_ADDR, which the job script sets to the first node's NodeAddr.
        if "MASTER_ADDR" not in os.environ:
            raise RuntimeError("srun without a launcher: set MASTER_ADDR to the first node's address (scontrol show "
                               "node $(scontrol show hostnames | head -1) | grep NodeAddr)")
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_STEP_NUM_TASKS"],
                          LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
        os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000))
        launched = True
    if not launched:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    backend = "gloo" if get_accelerator().device_name() == "cpu" else get_accelerator().communication_backend_name()
    deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(minutes=timeout_minutes),
                               auto_mpi_discovery=True, verbose=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def shutdown() -> None:
    """End of a successful run: every rank leaves together and the process group is torn down explicitly (left to
    interpreter exit, gloo's threads sometimes abort the process: "terminate called without an active exception")."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def device_name() -> str:
    """'cpu' or e.g. 'cuda:0' for this rank."""
    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return "cpu"
    return f"{acc.device_name()}:{int(os.environ.get('LOCAL_RANK', 0))}"


def fused_adam_class():
    """DeepSpeed's fused (multi-tensor CUDA) Adam; only for GPUs: on CPU it compiles a native op for ~75 s."""
    from deepspeed.ops.adam import FusedAdam
    return FusedAdam


def cpu_adam_class():
    """DeepSpeed's ``DeepSpeedCPUAdam`` (AVX kernel, ZeRO-Offload's optimizer); compiles ``cpu_adam`` on first use
    (~75 s on 2 cores, then cached in TORCH_EXTENSIONS_DIR)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    return DeepSpeedCPUAdam


def build_ds_config(cfg, world_size: int, grad_accum: int, load_universal: bool = False) -> dict:
    """The DeepSpeed config dict: the recipe's JSON plus everything the trainer computes."""
    from trainer.config import ConfigError, ds_config_path, precision, read_ds_json
    from trainer.optim import offload_problem
    path = ds_config_path(cfg)
    ds = read_ds_json(cfg)
    owned = [k for k in TRAINER_OWNED_KEYS if k in ds]
    if owned:
        raise ValueError(f"{path}: sets {owned}, which the trainer fills in from the recipe (train.*, optim.*); "
                         "remove them from the JSON")
    problem = offload_problem(cfg.optim, ds, str(path))
    if problem:
        raise ConfigError(problem)
    ds["train_micro_batch_size_per_gpu"] = cfg.train.micro_batch_size
    ds["gradient_accumulation_steps"] = grad_accum
    ds["train_batch_size"] = cfg.train.micro_batch_size * grad_accum * world_size
    ds["gradient_clipping"] = cfg.optim.grad_clip
    ds.setdefault("zero_optimization", {})
    if cfg.deepspeed.zero_stage is not None:
        ds["zero_optimization"]["stage"] = cfg.deepspeed.zero_stage
    prec = precision(cfg)
    ds["bf16"] = dict(ds.get("bf16", {}), enabled=prec == "bf16")
    fp16 = dict(ds.get("fp16", {}), enabled=prec == "fp16")
    if prec == "fp16":
        fp16.setdefault("loss_scale", 0)  # 0 = dynamic loss scaling
        fp16.setdefault("initial_scale_power", 16)
    ds["fp16"] = fp16
    # A client optimizer under ZeRO: torch AdamW is on DeepSpeed's list, our LAMB is not (it handles the partition
    # layout itself, see trainer/optim/zero_lamb.py), nor our guarded DeepSpeedCPUAdam (DeepSpeed checks exact types).
    ds["zero_allow_untested_optimizer"] = True
    ds["steps_per_print"] = 2**31 - 1  # our own logging reports progress
    ds["checkpoint"] = dict(ds.get("checkpoint", {}), load_universal=load_universal)
    return ds


def _cpu_adam_like(optimizer: torch.optim.Optimizer, scheduler) -> torch.optim.Optimizer:
    """ZeRO-Offload steps the optimizer on the CPU copies of the fp32 partitions, so our AdamW becomes DeepSpeed's
    ``DeepSpeedCPUAdam`` (what DeepSpeed expects there; torch AdamW on CPU would be 5-7x slower, and the GPU
    FusedAdam cannot step CPU tensors) with the same groups (weight decay off for biases and norms), lr, betas, eps
    and decoupled weight decay, and the same non-finite guard.

    The schedule was built on the optimizer we replace: it is pointed at the new one, so the engine's
    ``scheduler.step()`` and the trainer's ``scheduler.sync_lr()`` after a resume set the lr that is stepped with.
    Same update rule as torch AdamW; the fp32 arithmetic differs in the last bits (tests/test_zero_offload.py).
    """
    from trainer.optim import NonFiniteGuard
    cpu_adam = cpu_adam_class()
    if isinstance(optimizer, cpu_adam):
        return optimizer
    adamw = isinstance(optimizer, torch.optim.AdamW) or getattr(optimizer, "adam_w_mode", False)  # torch / FusedAdam
    if not adamw or any(g.get("amsgrad") or g.get("maximize") for g in optimizer.param_groups):
        raise TypeError(f"ZeRO offload_optimizer: cannot step {type(optimizer).__name__} as DeepSpeedCPUAdam "
                        "(only decoupled-weight-decay Adam without amsgrad/maximize)")
    keys = ("params", "lr", "initial_lr", "betas", "eps", "weight_decay", "bias_correction")
    groups = [{k: g[k] for k in keys if k in g} for g in optimizer.param_groups]
    d = optimizer.defaults
    cls = type("GuardedCPUAdam", (NonFiniteGuard, cpu_adam), {})
    new = cls(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
              bias_correction=True, adamw_mode=True)
    if scheduler is not None:
        scheduler.optimizer = new
        # torch's LRScheduler wrapped the replaced optimizer's step() to warn when the schedule steps first; the new
        # one is unwrapped, so its first scheduler.step() would warn "optimizer.step() has been overridden". DeepSpeed
        # steps the optimizer before the schedule, so that warning would be noise in every offload run.
        warnings.filterwarnings("ignore", message=r"Seems like `optimizer\.step\(\)` has been overridden",
                                category=UserWarning)
    return new


class Engine:
    """A DeepSpeed engine as the loop sees it."""

    def __init__(self, model: torch.nn.Module, optimizer, scheduler, ds_config: dict, lamb: bool = False):
        self.ds_config = ds_config
        from trainer.optim import offloads_optimizer
        if offloads_optimizer(ds_config):
            if lamb:
                raise ValueError("Lamb with ZeRO offload_optimizer is not supported (trainer.optim.offload_problem)")
            optimizer = _cpu_adam_like(optimizer, scheduler)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
        if lamb and self.zero_stage > 0:
            # A ZeRO-partitioned LAMB needs the partition layout to compute per-parameter trust ratios.
            from trainer.optim import zero_lamb
            zero_lamb.bind_zero_layout(self.engine)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    @property
    def zero_stage(self) -> int:
        return self.engine.zero_optimization_stage()

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def __call__(self, fn, *args, **kwargs):
        """Run ``fn(module, *args)`` (e.g. an objective's loss) under the engine's forward hooks (ZeRO-3 gathers)."""
        return fn(self.engine, *args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()

    def is_boundary(self) -> bool:
        return self.engine.is_gradient_accumulation_boundary()

    def step_applied(self) -> bool:
        """False when the last optimizer step was skipped (non-finite gradients or fp16 overflow)."""
        return self.engine.was_step_applied()

    @property
    def skipped_steps(self) -> int:
        return self.engine.skipped_steps

    def lr(self) -> float:
        return self.engine.get_lr()[0]

    def grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            return None
        return float(norm)

    def loss_scale(self) -> float:
        opt = self.engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None)
        return float(scale) if scale is not None else 1.0

    def train(self, mode: bool = True) -> None:
        self.engine.train(mode)

    def save(self, ckpt_root: Path, tag: str, client_state: dict) -> None:
        """Every rank writes its shards of ``ckpt_root/tag``; DeepSpeed's own ``latest`` is not touched (we move
        ours atomically once all ranks are done)."""
        self.engine.save_checkpoint(str(ckpt_root), tag=tag, client_state=client_state, save_latest=False)

    def load(self, ckpt_root: Path, tag: str) -> dict:
        path, client_state = self.engine.load_checkpoint(str(ckpt_root), tag=tag, load_optimizer_states=True,
                                                         load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_root}/{tag}")
        return client_state or {}


def convert_to_universal(tag_dir: Path, out_dir: Path) -> None:
    """DeepSpeed's universal checkpoint (per-parameter fp32 + optimizer state), loadable on any world size.

    Runs DeepSpeed's own converter as a subprocess; ``--inject_missing_state`` is required for checkpoints written
    by an engine with a client optimizer (without it the converter fails, see PLATFORM.md).
    """
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag_dir),
           "--output_folder", str(out_dir), "--inject_missing_state", "--num_extract_workers", "1",
           "--num_merge_workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"universal conversion of {tag_dir} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def consolidated_fp32_state_dict(ckpt_root: Path, tag: str) -> dict[str, torch.Tensor]:
    """Full fp32 weights from a checkpoint of any ZeRO stage (DeepSpeed's zero_to_fp32 for stages 1-3)."""
    tag_dir = Path(ckpt_root) / tag
    if any(tag_dir.glob("*optim_states.pt")) and any(tag_dir.glob("*zero_pp_rank_*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root), tag=tag)
    states = sorted(tag_dir.glob("mp_rank_*_model_states.pt"))
    if not states:
        raise FileNotFoundError(f"{tag_dir}: no DeepSpeed model states (mp_rank_*_model_states.pt)")
    module = torch.load(states[0], map_location="cpu", weights_only=False)["module"]
    return {k: v.float() for k, v in module.items()}
