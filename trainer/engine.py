"""The one product module that imports deepspeed: process group, optimizers, engine, checkpoint I/O, universal
conversion.

The training loop talks to ``Engine`` (forward / backward / step / save / load) and never reaches into ZeRO. The
DeepSpeed JSON named by a recipe holds only engine settings (ZeRO stage, buckets, offload, precision blocks); the
values the trainer computes (batch sizes, gradient clipping, precision, universal loading) are filled in by
``build_ds_config``, once per run, and a JSON that sets them by hand is rejected so they are never duplicated.
``build_optimizer`` picks the optimizer: DeepSpeed's where one applies (FusedAdam on GPU when prebuilt,
DeepSpeedCPUAdam under ZeRO-Offload), else ``trainer.optim.build``'s; every one carries the non-finite guard.

torch's default process-group timeout is set to the run's before DeepSpeed creates its own groups
(trainer/launch_env.py says why); ``Engine`` checks after ``deepspeed.initialize`` that every group got it.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from data_prep.known_noise import choose_cpu_accelerator

# DeepSpeed picks its accelerator when imported: with a CPU-only torch, say "cpu" first instead of letting it warn
# that it found no GPU (data_prep/known_noise.py says when this applies; a GPU build of torch is left alone)
choose_cpu_accelerator()
import deepspeed  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from trainer.launch_env import (  # noqa: E402, F401 (re-exported: trainer.engine.restore_environment, ...)
    _default_group_timeout, _free_port, _set_env, group_timeouts, restore_environment)


def _import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon module with its ``torch.compile`` decorators left eager.

    ``deepspeed.initialize`` imports that module in every rank (its ZeRO support check and ZeRO's gradient averaging
    ask whether the optimizer is Muon), and the module wraps three functions in ``torch.compile`` when imported,
    which imports torch._inductor: 1.5-2.5 s of CPU per rank (py-spy, 2026-12-05), each start and restart of every
    rank. The trainer never builds Muon (its optimizers are AdamW and LAMB), so those functions never run; the module
    and its classes are DeepSpeed's own, imported for real, so DeepSpeed's ``isinstance`` checks are unchanged."""
    name = "deepspeed.runtime.zero.muon.muon_optimizer"
    if name in sys.modules or not hasattr(torch, "compile"):
        return
    real = torch.compile

    def eager(model=None, **_kwargs):
        return model if model is not None else (lambda fn: fn)

    torch.compile = eager
    try:
        __import__(name)
    except ImportError:  # a DeepSpeed without Muon: nothing to import
        pass
    finally:
        torch.compile = real


_import_muon_uncompiled()
from trainer import safe_load
from trainer.ds_json import ds_config_path, offloads_optimizer, precision, read_ds_json
from trainer.ds_ops import clear_stale_op_locks
from trainer.log import print0, warn0
from trainer.optim import OptimConfig, zero_lamb
from trainer.optim.after_load import place_step_tensors, restore_group_settings, untie_state_tensors
from trainer.optim.build import GuardedAdamW, NonFiniteGuard, build_optimizer as build_torch_optimizer
from trainer.optim.lamb import Lamb
from trainer.optim.param_groups import param_groups

# Keys the trainer owns; a ds_config that sets them would silently disagree with the recipe.
TRAINER_OWNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                      "optimizer", "scheduler", "gradient_clipping")


def init_distributed(timeout_minutes: float, should_stop=None) -> tuple[int, int]:
    """Join (or, without a launcher, create) the process group; returns (rank, world size).

    torchrun and the deepspeed launcher set RANK/WORLD_SIZE; under mpirun DeepSpeed discovers the MPI environment
    itself (mpi4py). With no launcher at all we make a one-rank group on a free local port, so
    ``python -m trainer.pretrain`` needs nothing else. The timeout bounds every collective: when a rank dies the
    others fail after it (gloo usually notices a closed socket at once) instead of hanging the job.

    On the CPU accelerator DeepSpeed loads its ``deepspeed_shm_comm`` op here, through torch's build lock: a stale
    lock is cleared first (``clear_stale_op_locks``); ``should_stop()`` true (a SIGTERM recorded by the caller) ends
    a wait on a live one with ``ext_lock.ExtensionLockWaitStopped``.
    """
    launched = any(k in os.environ for k in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"))
    if not launched and "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        # `srun python trainer/pretrain.py` (one task per rank, no torchrun): ranks from the srun step (the batch
        # script itself has no SLURM_STEP_NUM_TASKS, so a single process there stays a 1-rank run), the rendezvous
        # from MASTER_ADDR, which the job script sets to the first node's NodeAddr.
        if "MASTER_ADDR" not in os.environ:
            raise RuntimeError("srun without a launcher: set MASTER_ADDR to the first node's address (scontrol show "
                               "node $(scontrol show hostnames | head -1) | grep NodeAddr)")
        _set_env(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_STEP_NUM_TASKS"],
                 LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
        if "MASTER_PORT" not in os.environ:
            _set_env(MASTER_PORT=str(29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000))
        launched = True
    if not launched:
        _set_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if get_accelerator().device_name() != "cpu":
        # This rank's GPU, before the process group and before any CUDA allocation (the optimizer is built before
        # deepspeed.initialize): otherwise every rank opens a context on GPU 0 (~0.5 GB each; fatal when the GPUs
        # are in exclusive-process mode).
        index = local_device_index()
        _device_local_rank(index)
        get_accelerator().set_device(index)
    if get_accelerator().device_name() == "cpu":
        clear_stale_op_locks(["ShareMemCommBuilder"], should_stop)
    backend = "gloo" if get_accelerator().device_name() == "cpu" else get_accelerator().communication_backend_name()
    timeout = datetime.timedelta(minutes=timeout_minutes)
    _default_group_timeout(timeout)  # before DeepSpeed creates any group of its own (module docstring)
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout, auto_mpi_discovery=True, verbose=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _device_local_rank(index: int) -> None:
    """Make LOCAL_RANK this rank's device index when the two differ (plain ``srun`` binding one GPU per task:
    SLURM_LOCALID 5, one visible device, index 0).

    DeepSpeed reads LOCAL_RANK as "the GPU device ID" (``deepspeed.comm.get_local_rank``): ``init_distributed`` binds
    the process group to ``device(LOCAL_RANK)`` (deepspeed/comm/torch.py, ``device_id=``), and ZeRO-3 places
    tensors on ``device_name(LOCAL_RANK)`` (runtime/zero/utils.py); with one visible GPU anything but 0 is "invalid
    device ordinal". The node-local rank stays in SLURM_LOCALID; restore_environment puts LOCAL_RANK back.

    Under mpirun DeepSpeed sets LOCAL_RANK itself from Open MPI's local rank inside init_distributed and its engine
    requires the two to be equal, so a rank that sees fewer GPUs than its local rank cannot work there: refused here
    with what to do instead of a CUDA error."""
    rank = local_rank()
    if rank == index:
        return
    if "LOCAL_RANK" not in os.environ and "OMPI_COMM_WORLD_LOCAL_RANK" in os.environ:
        raise RuntimeError(
            f"mpirun: local rank {rank} sees {get_accelerator().device_count()} device(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); DeepSpeed uses the local rank as the "
            "device index under mpirun, so let every rank see all of its node's GPUs, or launch with torchrun or "
            "srun (one task per GPU works there)")
    _set_env(LOCAL_RANK=str(index))


def shutdown() -> None:
    """End of a successful run: every rank leaves together and the process group is torn down explicitly (left to
    interpreter exit, gloo's threads sometimes abort the process: "terminate called without an active exception")."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    restore_environment()


def local_rank() -> int:
    """This process's rank on its node: LOCAL_RANK (torchrun, the deepspeed launcher, our srun path), else Open MPI's
    or Slurm's own variable (mpirun: DeepSpeed sets LOCAL_RANK from it only inside init_distributed), else 0."""
    for key in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def local_device_index() -> int:
    """The visible device this rank uses: its local rank modulo the devices it can see. torchrun with all 8 GPUs
    visible: local rank 5 -> 5. Plain ``srun`` binding one GPU per task (CUDA_VISIBLE_DEVICES holds one):
    SLURM_LOCALID 5 -> 0, the only device that task sees (cuda:5 would be out of range)."""
    count = get_accelerator().device_count()
    if count < 1:
        raise RuntimeError(f"no {get_accelerator().device_name()} device is visible to rank {local_rank()} "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return local_rank() % count


def device_name() -> str:
    """'cpu' or e.g. 'cuda:0' for this rank (``local_device_index``)."""
    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return "cpu"
    return f"{acc.device_name()}:{local_device_index()}"


def build_ds_config(cfg, world_size: int, grad_accum: int, load_universal: bool = False) -> dict:
    """The DeepSpeed config dict of a run (built once, by ``trainer.pretrain.run``): the recipe's JSON plus everything
    the trainer computes. ``cfg`` has been validated (``trainer.config``), which also refused LAMB under offload."""
    ds_json = read_ds_json(cfg)
    owned = [k for k in TRAINER_OWNED_KEYS if k in ds_json]
    if owned:
        raise ValueError(f"{ds_config_path(cfg)}: sets {owned}, which the trainer fills in from the recipe (train.*, "
                         "optim.*); remove them from the JSON")
    ds_json["train_micro_batch_size_per_gpu"] = cfg.train.micro_batch_size
    ds_json["gradient_accumulation_steps"] = grad_accum
    ds_json["train_batch_size"] = cfg.train.micro_batch_size * grad_accum * world_size
    ds_json["gradient_clipping"] = cfg.optim.grad_clip
    ds_json.setdefault("zero_optimization", {})
    if cfg.deepspeed.zero_stage is not None:
        ds_json["zero_optimization"]["stage"] = cfg.deepspeed.zero_stage
    prec = precision(cfg, ds_json)
    ds_json["bf16"] = dict(ds_json.get("bf16", {}), enabled=prec == "bf16")
    fp16 = dict(ds_json.get("fp16", {}), enabled=prec == "fp16")
    if prec == "fp16":
        fp16.setdefault("loss_scale", 0)  # 0 = dynamic loss scaling
        fp16.setdefault("initial_scale_power", 16)
    ds_json["fp16"] = fp16
    # A client optimizer under ZeRO: torch AdamW is on DeepSpeed's list, our LAMB is not (it handles the partition
    # layout itself, see trainer/optim/zero_lamb.py), nor our guarded DeepSpeedCPUAdam (DeepSpeed checks exact types).
    ds_json["zero_allow_untested_optimizer"] = True
    ds_json["steps_per_print"] = 2**31 - 1  # our own logging reports progress
    ds_json["checkpoint"] = dict(ds_json.get("checkpoint", {}), load_universal=load_universal)
    return ds_json


def build_optimizer(cfg: OptimConfig, model: torch.nn.Module, device: str, ds_config: dict,
                    groups: list[dict] | None = None) -> torch.optim.Optimizer:
    """The optimizer the run steps, with the non-finite guard and our parameter groups (no weight decay for biases
    and norms):

    - ``adamw`` under ZeRO-Offload (``offload_optimizer``): DeepSpeed's ``DeepSpeedCPUAdam`` (AVX kernel; what
      DeepSpeed expects there: torch AdamW on CPU would be 5-7x slower, and FusedAdam cannot step CPU tensors).
      Same update rule as torch AdamW; the fp32 arithmetic differs in the last bits (tests/test_zero_offload.py).
      Compiles ``cpu_adam`` on first use (~75 s on 2 cores, then cached in TORCH_EXTENSIONS_DIR);
    - ``adamw`` on a GPU: DeepSpeed's FusedAdam (multi-tensor CUDA kernel) when its op is prebuilt
      (``fused_adam_op_usable``; never JIT-compiled here), else torch's ``AdamW(fused=True)`` (same update rule, one
      fused kernel too);
    - otherwise (``adamw`` on CPU, ``lamb`` anywhere): ``trainer.optim.build.build_optimizer``.

    ``groups`` replaces the default param groups (fine-tuning's per-layer learning rates).
    """
    adam_groups = groups or param_groups(model, cfg.weight_decay)
    if cfg.name == "adamw" and offloads_optimizer(ds_config):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        clear_stale_op_locks(["CPUAdamBuilder"])  # DeepSpeedCPUAdam loads cpu_adam through torch's build lock

        cls = type("GuardedCPUAdam", (NonFiniteGuard, DeepSpeedCPUAdam), {})
        return cls(adam_groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                   weight_decay=cfg.weight_decay, bias_correction=True, adamw_mode=True)
    if cfg.name == "adamw" and device.startswith("cuda"):
        usable, why = fused_adam_op_usable()
        if usable:
            try:
                from deepspeed.ops.adam import FusedAdam

                cls = type("GuardedFusedAdam", (NonFiniteGuard, FusedAdam), {})
                return cls(adam_groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                           adam_w_mode=True)
            except Exception as err:  # noqa: BLE001  (a prebuilt op built against another torch/CUDA, a bad .so)
                first = str(err).splitlines()[0] if str(err) else ""
                why = f"loading the prebuilt op failed ({type(err).__name__}: {first})"
        warn0(f"optimizer: DeepSpeed's FusedAdam is not usable ({why}); using torch's AdamW(fused=True) instead, "
              "the same update rule. To use DeepSpeed's, install it with its ops prebuilt: "
              "DS_BUILD_FUSED_ADAM=1 pip install deepspeed (README, 'GPU setup').")
        return GuardedAdamW(adam_groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                            fused=True)
    return build_torch_optimizer(cfg, model, groups)


def fused_adam_op_usable() -> tuple[bool, str]:
    """(whether DeepSpeed's fused_adam op is prebuilt for this accelerator, how / why not), without loading it.

    Only a prebuilt op counts (``DS_BUILD_FUSED_ADAM=1 pip install deepspeed``): this is the very test DeepSpeed's
    ``OpBuilder.load`` makes before importing the op instead of JIT-compiling it (``installed_ops`` and the
    accelerator it was built for, deepspeed/ops/op_builder/builder.py). A JIT build is never started, even where
    nvcc and ninja exist (most clusters): every rank of a fresh node would compile into the shared
    TORCH_EXTENSIONS_DIR at once inside ``build_optimizer``, before ``deepspeed.initialize``, while the ranks that
    finished wait in the first broadcast until the process group's timeout (10 min); a killed build leaves a lock
    the next run waits on forever. torch's ``AdamW(fused=True)`` applies the same update in one fused kernel too.
    """
    from deepspeed.git_version_info import accelerator_name, installed_ops

    if not installed_ops.get("fused_adam", False):
        return False, "its op is not prebuilt into this DeepSpeed install (no JIT build is attempted at start-up)"
    if accelerator_name != get_accelerator()._name:
        return False, (f"its op was prebuilt for the {accelerator_name!r} accelerator, not "
                       f"{get_accelerator()._name!r} (no JIT build is attempted at start-up)")
    return True, "prebuilt"


def _wrapper_skips_nonfinite_steps(wrapper) -> bool:
    """True when DeepSpeed's optimizer wrapper skips a step with a non-finite global gradient norm itself (setting
    ``.overflow``, which the engine reads): ``BF16_Optimizer`` always (``is_invalid_grad_norm``); ZeRO-1/2's
    ``DeepSpeedZeroOptimizer`` when it checks overflow or computes the norm outside bf16 (DeepSpeed 0.19.8,
    ``stage_1_and_2.step``). ZeRO-3 and stage 0 keep our guard."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if isinstance(wrapper, BF16_Optimizer):
        return True
    if isinstance(wrapper, DeepSpeedZeroOptimizer):
        return bool(wrapper.check_grad_overflow or (wrapper.compute_grad_norm and wrapper.dtype != torch.bfloat16))
    return False


class Engine:
    """A DeepSpeed engine as the loop sees it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, ds_config: dict):
        """``optimizer`` from ``build_optimizer`` and ``ds_config`` from ``build_ds_config`` (the same dict)."""
        self.ds_config = ds_config
        # device_rank: the device init_distributed selected. Without it DeepSpeed calls set_device(LOCAL_RANK),
        # out of range under srun with one visible GPU per task.
        args = None if get_accelerator().device_name() == "cpu" else SimpleNamespace(device_rank=local_device_index())
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            args=args, model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
        self._check_group_timeouts()
        if isinstance(optimizer, NonFiniteGuard) and _wrapper_skips_nonfinite_steps(self.engine.optimizer):
            optimizer.checked_by_wrapper = True  # the guard would only repeat DeepSpeed's check, once per group
        if isinstance(optimizer, Lamb) and self.zero_stage > 0:
            # A ZeRO-partitioned LAMB needs the partition layout to compute per-parameter trust ratios.
            zero_lamb.bind_zero_layout(self.engine)
        self.client_optimizer = optimizer
        # Each param group's settings as this run's config built them (betas, eps, weight_decay, LAMB's
        # exclude_from_trust_ratio, ...): ``load`` puts them back over the checkpoint's (see restore_group_settings).
        # (Not "step": FusedAdam counts its steps in the group, and that count is the checkpoint's.)
        self.group_settings = [{k: v for k, v in g.items() if k not in ("params", "step")}
                               for g in optimizer.param_groups]

    @staticmethod
    def _check_group_timeouts() -> None:
        """Say it when a process group DeepSpeed made does not time out with the world group's (the run's
        ``deepspeed.timeout_minutes``): a hung peer would then hold the run that group's timeout instead."""
        if not torch.distributed.is_initialized():
            return
        timeouts = group_timeouts()
        world = timeouts.get(torch.distributed.distributed_c10d._get_process_group_name(
            torch.distributed.group.WORLD))
        other = {name: t for name, t in timeouts.items() if t is not None and world is not None and t != world}
        if other:
            warn0(f"process group(s) {other} time out after other than deepspeed.timeout_minutes ({world}): a hung "
                  "rank may hold the others that long (trainer/engine.py _default_group_timeout)")

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

    def unhandled_nonfinite_step(self) -> bool:
        """True when the last optimizer step was skipped for non-finite gradients that nothing handled.

        In fp32/bf16 that is every skip (the non-finite guard's). In fp16 a skip is usually DeepSpeed's dynamic loss
        scaler at work: it halves the scale and skips the step, routinely several times at the start of training
        (initial scale 2^16, hysteresis 2), so it is not counted; only a skip at the minimum loss scale (or with a
        static scale) is, when the scaler can do nothing more. A non-finite *loss* is counted by the loop anyway.
        """
        if self.engine.was_step_applied():
            return False
        fp16 = self.ds_config.get("fp16") or {}
        if not fp16.get("enabled"):
            return True
        dynamic = fp16.get("loss_scale", 0) == 0
        return not dynamic or self.loss_scale() <= fp16.get("min_loss_scale", 1)

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
        ours atomically once all ranks are done).

        A failure while the checkpoint filesystem is (nearly) full is raised as ENOSPC naming the folder, whatever
        the writer said (torch's zip writer drops the errno, and its words change between versions), so that
        ``checkpoint.save`` stops the run as disk full (``trainer/disk_space.py``)."""
        try:
            self.engine.save_checkpoint(str(ckpt_root), tag=tag, client_state=client_state, save_latest=False)
        except Exception as err:
            from trainer.disk_space import as_disk_full, is_disk_full
            if not is_disk_full(err) and is_disk_full(err, Path(ckpt_root) / tag):
                raise as_disk_full(err, Path(ckpt_root) / tag) from err
            raise

    def load(self, ckpt_root: Path, tag: str) -> dict:
        """Every file DeepSpeed reads here is loaded weights-only (``trainer.safe_load``): a checkpoint that would
        run code raises ``UntrustedCheckpointError`` naming the file."""
        with safe_load.weights_only_loads([Path(ckpt_root) / tag], checkpoint_globals()):
            path, client_state = self.engine.load_checkpoint(str(ckpt_root), tag=tag, load_optimizer_states=True,
                                                             load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_root}/{tag}")
        changed = restore_group_settings(self.client_optimizer, self.group_settings)
        if changed:
            print0(f"resume: optimizer settings from this run's config, not the checkpoint's: {'; '.join(changed)}")
        untie_state_tensors(self.client_optimizer)
        place_step_tensors(self.client_optimizer)
        if isinstance(self.client_optimizer, Lamb) and self.zero_stage > 0:
            # bound again to what the load left: its exclusions are the restored ones (DeepSpeed 0.19.8 keeps the
            # fp32 partition tensors; a version that replaced them would otherwise stop at the first step)
            zero_lamb.bind_zero_layout(self.engine)
        return client_state or {}

    def close(self) -> None:
        """Free the engine's memory now. DeepSpeed's ZeRO optimizers hold their engine through gradient hooks, a
        reference cycle that ``del`` and even ``gc.collect()`` leave alive (measured on CPU for zero1.json, zero2.json
        and zero2_bf16.json); a fine-tuning sweep of 10 runs in one process kept every run's weights, gradients and
        optimizer state on the GPU. ``DeepSpeedEngine.destroy`` breaks the cycle."""
        self.engine.destroy()
        self.engine = self.optimizer = self.scheduler = self.client_optimizer = None


def convert_to_universal(tag_dir: Path, out_dir: Path) -> None:
    """DeepSpeed's universal checkpoint (per-parameter fp32 + optimizer state), loadable on any world size.

    Runs DeepSpeed's own converter as a subprocess; ``--inject_missing_state`` is required for checkpoints written
    by an engine with a client optimizer (without it the converter fails, see PLATFORM.md).
    """
    # through trainer.safe_run: the converter's own torch.load calls pass weights_only=False
    cmd = [sys.executable, "-m", "trainer.safe_run", "deepspeed.checkpoint.ds_to_universal",
           "--input_folder", str(tag_dir), "--output_folder", str(out_dir), "--inject_missing_state",
           "--num_extract_workers", "1", "--num_merge_workers", "1"]
    here = str(Path(__file__).resolve().parents[1])  # this checkout's trainer package, also when not installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0 and "weights-only unpickler" in proc.stderr:
        bad = safe_load.refused_files([tag_dir], checkpoint_globals())
        if bad:
            raise safe_load.UntrustedCheckpointError("\n".join(safe_load.refusal(f, g) for f, g in bad))
    if proc.returncode < 0:  # e.g. SIGTERM to the job's process group (a preemption), or the OOM killer
        raise RuntimeError(f"universal conversion of {tag_dir} was killed by signal {-proc.returncode}")
    if proc.returncode != 0:
        raise RuntimeError(f"universal conversion of {tag_dir} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def consolidated_fp32_state_dict(ckpt_root: Path, tag: str) -> dict[str, torch.Tensor]:
    """Full fp32 weights from a checkpoint of any ZeRO stage (DeepSpeed's zero_to_fp32 for stages 1-3), loaded
    weights-only: a file that would run code raises ``safe_load.UntrustedCheckpointError`` naming it."""
    tag_dir = Path(ckpt_root) / tag
    # every file of the folder, before any is loaded: also refuses a poisoned file that this consolidation would
    # not read (rng_rank*.pt), since a checkpoint holding one is not to be trusted as a whole
    safe_load.vet([tag_dir], checkpoint_globals() + safe_load.numpy_rng_globals())
    from trainer.bf16_checkpoint import bf16_zero1_state_dict, is_bf16_optimizer_checkpoint
    if is_bf16_optimizer_checkpoint(tag_dir, checkpoint_globals()):
        return bf16_zero1_state_dict(tag_dir, checkpoint_globals())
    if any(tag_dir.glob("*optim_states.pt")) and any(tag_dir.glob("*zero_pp_rank_*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        with safe_load.weights_only_loads([tag_dir], checkpoint_globals()):  # zero_to_fp32 passes weights_only=False
            return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root), tag=tag)
    states = sorted(tag_dir.glob("mp_rank_*_model_states.pt"))
    if not states:
        raise FileNotFoundError(f"{tag_dir}: no DeepSpeed model states (mp_rank_*_model_states.pt)")
    module = safe_load.load(states[0], checkpoint_globals())["module"]
    return {k: v.float() for k, v in module.items()}


def checkpoint_globals() -> list:
    """The classes DeepSpeed pickles into its checkpoints besides tensors and plain data, allowed in weights-only
    loads (``trainer.safe_load``). Found by saving real checkpoints (tests/test_untrusted_checkpoints.py saves at
    ZeRO 0-3 and fails if a file needs a class missing here): the ZeRO optimizer shards hold the loss scaler object
    (``LossScaler``; ``DynamicLossScaler`` with fp16's dynamic scaling, stage_1_and_2.py / stage3.py
    ``state_dict``), the ``ZeroStageEnum`` and, at stages 1-2, ``fragment_address`` records (param slice mappings).
    None of them runs code from the file: constructing them only stores fields."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]
