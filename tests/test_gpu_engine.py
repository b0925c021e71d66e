"""trainer/engine.py's GPU decisions on the CPU, against a fake CUDA accelerator (issue 15): which device each rank
takes (torchrun, srun with one visible GPU per task, mpirun), that it takes it before the process group exists,
the optimizer when DeepSpeed's FusedAdam op is not prebuilt (never JIT-built at start-up), and fp16 loss-scaler
skips in the non-finite guard."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import trainer.engine as eng
from trainer.loop import Components, NonFiniteLossError, Trainer
from trainer.checkpoint import TrainState
from trainer.metrics import MetricsLogger
from trainer.optim import OptimConfig
from trainer.optim.build import GuardedAdamW

LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_LOCALID",
               "SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")


class FakeCuda:
    """The parts of DeepSpeed's CUDA accelerator that trainer/engine.py calls. The fake proves our side of the seam
    (which device index and backend the engine asks for, and in which order), not that a real CUDA device or NCCL
    accepts them (ordinals, exclusive-process mode, driver errors)."""

    _name = "cuda"

    def __init__(self, count: int):
        self.count = count
        self.calls: list = []

    def device_name(self, index=None):
        return "cuda" if index is None else f"cuda:{index}"

    def device_count(self):
        return self.count

    def set_device(self, index):
        self.calls.append(("set_device", index))

    def communication_backend_name(self):
        return "nccl"


@pytest.fixture
def fake_cuda(monkeypatch):
    """``make(count)``: FakeCuda with ``count`` devices, and deepspeed.init_distributed and torch.distributed's
    get_rank/get_world_size replaced by recorders reading RANK/WORLD_SIZE. The fake proves our side of the seam (the
    launch variables, device and backend init_distributed hands DeepSpeed, before the group), not DeepSpeed's real
    init_distributed (its MPI discovery, the device it binds the group to: test_plain_srun_one_gpu_per_task_through_
    deepspeeds_real_init_distributed covers that) nor a real process group's ranks."""
    for key in LAUNCH_KEYS:  # restored after the test, whatever init_distributed writes
        monkeypatch.setenv(key, "x")
        monkeypatch.delenv(key)

    def make(count: int) -> FakeCuda:
        acc = FakeCuda(count)
        monkeypatch.setattr(eng, "get_accelerator", lambda: acc)
        monkeypatch.setattr(eng.deepspeed, "init_distributed",
                            lambda dist_backend, **kw: acc.calls.append(("init_process_group", dist_backend)))
        monkeypatch.setattr(torch.distributed, "get_rank", lambda: int(os.environ["RANK"]))
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda: int(os.environ["WORLD_SIZE"]))
        return acc

    return make


# ---------------------------------------------------------------------------------------------- device per rank
def test_torchrun_rank_takes_its_local_gpu_before_the_process_group(fake_cuda, monkeypatch):
    acc = fake_cuda(8)
    monkeypatch.setenv("RANK", "13")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert eng.init_distributed(1) == (13, 16)
    assert acc.calls == [("set_device", 5), ("init_process_group", "nccl")]
    assert eng.device_name() == "cuda:5"


def test_plain_srun_with_one_visible_gpu_per_task_maps_to_device_0(fake_cuda, monkeypatch):
    acc = fake_cuda(1)  # Slurm bound one GPU to this task: CUDA_VISIBLE_DEVICES holds one
    monkeypatch.setenv("SLURM_PROCID", "13")
    monkeypatch.setenv("SLURM_LOCALID", "5")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "16")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert eng.init_distributed(1) == (13, 16)
    assert os.environ["LOCAL_RANK"] == "0"  # DeepSpeed reads it as the device index (the node's rank: SLURM_LOCALID)
    assert acc.calls == [("set_device", 0), ("init_process_group", "nccl")]
    assert eng.device_name() == "cuda:0"
    eng.restore_environment()
    assert "LOCAL_RANK" not in os.environ


def test_plain_srun_one_gpu_per_task_through_deepspeeds_real_init_distributed():
    """Issue 21 item 8: task 13 of 16, local id 5, one visible GPU, through DeepSpeed's real init_distributed (not
    mocked) against a fake accelerator that fails on any ordinal but 0 (tests/one_gpu_task_worker.py says what it
    cannot see). Old code: DeepSpeed bound the process group to cuda:5, "invalid device ordinal"."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_KEYS}
    env.update(SLURM_PROCID="13", SLURM_LOCALID="5", SLURM_STEP_NUM_TASKS="16", SLURM_JOB_ID="42",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(eng._free_port()), CUDA_VISIBLE_DEVICES="3",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "one_gpu_task_worker.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert out["calls"] == [["set_device", 0], ["init_process_group", "gloo", "cuda:0"]]
    assert out["LOCAL_RANK"] == "0" and out["device_name"] == "cuda:0"


def test_mpirun_rank_that_sees_fewer_gpus_than_its_local_rank_is_refused_with_what_to_do(fake_cuda, monkeypatch):
    fake_cuda(1)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(RuntimeError, match="mpirun: local rank 3 sees 1 device.*launch with torchrun or srun"):
        eng.init_distributed(1)


def test_srun_with_all_gpus_visible_and_mpirun_use_the_local_rank(fake_cuda, monkeypatch):
    acc = fake_cuda(4)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    monkeypatch.setenv("RANK", "7")  # DeepSpeed's MPI discovery sets these; the fake does not
    monkeypatch.setenv("WORLD_SIZE", "8")
    eng.init_distributed(1)
    assert acc.calls[0] == ("set_device", 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    acc.count = 0
    with pytest.raises(RuntimeError, match="no cuda device is visible to rank 3.*CUDA_VISIBLE_DEVICES"):
        eng.local_device_index()


def test_engine_tells_deepspeed_the_selected_device(fake_cuda, monkeypatch):
    """deepspeed.initialize is replaced by a recorder of the args it gets. The fake proves our side of the seam (the
    device_rank Engine passes), not that DeepSpeed's real initialize then uses that device rather than LOCAL_RANK."""
    fake_cuda(1)
    monkeypatch.setenv("LOCAL_RANK", "6")
    seen = {}

    def initialize(args=None, **kwargs):
        seen["device_rank"] = args.device_rank
        return SimpleNamespace(), kwargs["optimizer"], None, kwargs["lr_scheduler"]

    monkeypatch.setattr(eng.deepspeed, "initialize", initialize)
    model = torch.nn.Linear(2, 2)
    eng.Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), None, {})
    assert seen["device_rank"] == 0  # not DeepSpeed's set_device(LOCAL_RANK=6): out of range with one GPU


# ---------------------------------------------------------------------------------------- optimizer fallback
@pytest.fixture
def cuda_optimizer(fake_cuda, monkeypatch, tmp_path):
    """build_optimizer for 'cuda:0' with the fused_adam op prebuilt or not, and nvcc present or not: DeepSpeed's
    installed_ops, CUDA_HOME and FusedAdam (FakeFusedAdam, torch's AdamW, optionally failing to load) are replaced.
    The fake proves our side of the seam (which optimizer build_optimizer picks from what DeepSpeed reports, and the
    reason it gives), not that a real prebuilt fused_adam op loads or steps on a GPU."""
    import deepspeed.git_version_info as info
    import deepspeed.ops.adam
    from torch.utils import cpp_extension

    fake_cuda(1)
    monkeypatch.setattr(info, "accelerator_name", "cuda")
    built = []

    class FakeFusedAdam(torch.optim.AdamW):
        def __init__(self, params, adam_w_mode=True, **kwargs):
            if fail:
                raise RuntimeError(fail)
            built.append(adam_w_mode)
            super().__init__(params, **kwargs)

    monkeypatch.setattr(deepspeed.ops.adam, "FusedAdam", FakeFusedAdam)
    fail = None

    def build(prebuilt: bool, nvcc: bool, build_error: str | None = None):
        nonlocal fail
        fail = build_error
        monkeypatch.setattr(info, "installed_ops", {"fused_adam": prebuilt})
        home = tmp_path / "cuda"
        if nvcc:
            (home / "bin").mkdir(parents=True, exist_ok=True)
            (home / "bin" / "nvcc").write_text("")
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home) if nvcc else None)
        monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
        return eng.build_optimizer(OptimConfig(lr=1e-3), model, "cuda:0", {}), built

    return build


def test_fused_adam_is_used_only_when_prebuilt(cuda_optimizer):
    opt, built = cuda_optimizer(prebuilt=True, nvcc=False)
    assert type(opt).__name__ == "GuardedFusedAdam" and built == [True]
    opt, built = cuda_optimizer(prebuilt=False, nvcc=True)  # buildable is not enough: no JIT build at start-up
    assert isinstance(opt, GuardedAdamW) and opt.defaults["fused"] is True and built == [True]  # not a 2nd FusedAdam


def test_without_a_prebuilt_op_the_optimizer_is_torch_fused_adamw(cuda_optimizer, capsys):
    opt, built = cuda_optimizer(prebuilt=False, nvcc=False)
    assert isinstance(opt, GuardedAdamW) and opt.defaults["fused"] is True and built == []
    assert [len(g["params"]) for g in opt.param_groups] == [1, 3]  # still no decay for biases and norms
    err = capsys.readouterr().err
    assert "not prebuilt" in err and "DS_BUILD_FUSED_ADAM=1" in err


def test_a_prebuilt_op_that_fails_to_load_falls_back_with_the_reason(cuda_optimizer, capsys):
    opt, built = cuda_optimizer(prebuilt=True, nvcc=False, build_error="fused_adam was built with torch 2.1")
    assert isinstance(opt, GuardedAdamW) and opt.defaults["fused"] is True
    err = capsys.readouterr().err
    assert "loading the prebuilt op failed (RuntimeError: fused_adam was built with torch 2.1)" in err
    assert "DS_BUILD_FUSED_ADAM=1" in err


def test_with_nvcc_and_ninja_but_no_prebuilt_op_nothing_is_compiled(fake_cuda, monkeypatch, tmp_path):
    """Issue 21 item 9: the real FusedAdam class and DeepSpeed's real OpBuilder.load; only the compile steps
    (OpBuilder.jit_load, torch's cpp_extension.load) are replaced by recorders. What it cannot see: the build on a
    real GPU node (the accelerator here is the fake one; DeepSpeed's own is the CPU one)."""
    import deepspeed.git_version_info as info
    from deepspeed.ops.op_builder.builder import OpBuilder
    from torch.utils import cpp_extension

    fake_cuda(1)
    monkeypatch.setattr(info, "accelerator_name", "cuda")
    monkeypatch.setattr(info, "installed_ops", dict(info.installed_ops, fused_adam=False))
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "cuda" / "bin" / "nvcc").write_text("")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    compiled = []

    def recorder(name):
        def record(*args, **kwargs):
            compiled.append(name)
            raise RuntimeError(f"{name} called: a JIT build would start here")
        return record

    monkeypatch.setattr(OpBuilder, "jit_load", recorder("OpBuilder.jit_load"))
    monkeypatch.setattr(cpp_extension, "load", recorder("cpp_extension.load"))
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    opt = eng.build_optimizer(OptimConfig(lr=1e-3), model, "cuda:0", {})
    assert compiled == []
    assert isinstance(opt, GuardedAdamW) and opt.defaults["fused"] is True


# ----------------------------------------------------------------------------------- fp16 loss-scaler skips
class FakeDeepSpeedFp16:
    """A DeepSpeed engine in fp16 as trainer.engine.Engine sees it; ``script`` gives, per optimizer step,
    (step applied, loss scale after the step, loss). The fake proves our side of the seam (how Engine and the loop
    read was_step_applied and cur_scale), not when DeepSpeed's real fp16 loss scaler skips a step or changes its
    scale."""

    device = torch.device("cpu")

    def __init__(self, script):
        self.script = list(script)
        self.i = -1
        self.optimizer = SimpleNamespace(cur_scale=2.0**16)

    def step(self):
        self.i += 1
        self.optimizer.cur_scale = self.script[self.i][1]

    def was_step_applied(self):
        return self.script[self.i][0]

    def backward(self, loss):
        pass

    def get_lr(self):
        return [1e-4]

    def get_global_grad_norm(self):
        return 1.0

    def zero_optimization_stage(self):
        return 2  # ds_configs/zero2_fp16.json

    def train(self, mode=True):
        pass


def run_fake(tmp_path, script, fp16=True, min_loss_scale=1):
    fake = FakeDeepSpeedFp16(script)
    engine = eng.Engine.__new__(eng.Engine)
    engine.engine = fake
    engine.ds_config = {"fp16": {"enabled": fp16, "loss_scale": 0, "min_loss_scale": min_loss_scale},
                        "bf16": {"enabled": not fp16}}
    cfg = SimpleNamespace(run_dir=str(tmp_path),
                          train=SimpleNamespace(steps=len(script), global_batch_size=2, eval_every=0,
                                                stop_at_step=None, max_nonfinite_in_a_row=5),
                          logging=SimpleNamespace(every_steps=1, tensorboard=False, progress_bar=False),
                          checkpoint=SimpleNamespace(every_steps=0, save_at_end=False))

    def batches(consumed, end):
        while True:
            yield {"input_ids": torch.ones(2, 4, dtype=torch.long)}

    def loss(model, batch):
        return torch.tensor(fake.script[fake.i + 1][2]), {}

    trainer = Trainer(cfg=cfg, engine=engine, comps=Components(model=None, loss=loss, train_batches=batches),
                      state=TrainState(), rank=1, world_size=2, grad_accum=1,  # rank 1 of 2: writes no status or metrics
                      metrics=MetricsLogger(tmp_path, cfg.logging, 1, len(script), 0),
                      preempt=SimpleNamespace(requested=False))
    return trainer


def test_fp16_overflow_skips_with_a_falling_loss_scale_do_not_stop_the_run(tmp_path):
    # 2^16 -> 2^9: seven skips in a row at the start of an fp16 run, then the scale fits and steps apply
    script = [(False, 2.0 ** (15 - k), 7.0) for k in range(7)] + [(True, 2.0**9, 6.9)] * 3
    trainer = run_fake(tmp_path, script)
    assert trainer.train() == 0
    assert trainer.state.step == 10 and trainer.state.skipped_steps == 0


def test_fp16_skips_the_scaler_cannot_handle_still_stop_the_run(tmp_path):
    at_minimum = [(True, 1.0, 7.0)] + [(False, 1.0, 7.0)] * 6  # overflow at the minimum scale: nothing left to do
    trainer = run_fake(tmp_path, at_minimum)
    with pytest.raises(NonFiniteLossError, match="5 steps in a row"):
        trainer.train()
    nan_loss = [(False, 2.0 ** (15 - k), float("nan")) for k in range(7)]  # a NaN loss is no overflow
    with pytest.raises(NonFiniteLossError, match="5 steps in a row"):
        run_fake(tmp_path, nan_loss).train()
    bf16_guard = [(False, 1.0, 7.0)] * 7  # bf16: every skip is the non-finite guard's
    with pytest.raises(NonFiniteLossError, match="5 steps in a row"):
        run_fake(tmp_path, bf16_guard, fp16=False).train()


def test_what_a_single_process_init_writes_into_the_environment_is_put_back(fake_cuda, monkeypatch):
    """Issue 12: an in-process run (a test, a notebook, fine-tuning) left RANK=0, WORLD_SIZE=1, MASTER_PORT... in
    os.environ, inherited by every launcher the process started afterwards."""
    fake_cuda(1)
    monkeypatch.setenv("MASTER_ADDR", "10.9.8.7")  # the user's own value comes back, not just an absence
    assert eng.init_distributed(1) == (0, 1)
    assert os.environ["RANK"] == "0" and os.environ["MASTER_ADDR"] == "127.0.0.1" and "MASTER_PORT" in os.environ
    eng.restore_environment()
    assert os.environ["MASTER_ADDR"] == "10.9.8.7"
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"} & set(os.environ)


def test_a_universal_loads_cpu_step_count_moves_to_the_fused_optimizers_device():
    """DeepSpeed's universal load (a resume on another world size) assigns the converter's CPU ``step`` tensor to the
    state directly, bypassing torch's load_state_dict (which moves it for fused optimizers); AdamW(fused=True) then
    stops at the first step on a GPU ("Expected all tensors to be on the same device ... state_steps"). Parameters on
    the meta device stand in for the GPU here: this proves our move, not torch's fused kernel's device check."""
    gpu_param = torch.nn.Parameter(torch.empty(4, device="meta"))
    other = torch.nn.Parameter(torch.empty(4, device="meta"))
    opt = SimpleNamespace(param_groups=[{"params": [gpu_param], "fused": True},
                                        {"params": [other], "fused": None, "capturable": False}],
                          state={gpu_param: {"step": torch.tensor(12.0), "exp_avg": torch.empty(4, device="meta")},
                                 other: {"step": torch.tensor(12.0)}})
    assert eng.place_step_tensors(opt) == 1
    assert opt.state[gpu_param]["step"].device.type == "meta"
    assert opt.state[gpu_param]["step"].dtype == torch.float32
    assert opt.state[other]["step"].device.type == "cpu"  # a for-each AdamW keeps its step on the host


def test_close_frees_the_engine_a_fine_tuning_sweep_would_otherwise_keep():
    """DeepSpeed's ZeRO-2 optimizer holds its engine through gradient hooks: after ``del`` and gc.collect() the model
    was still alive (a 10-run fine-tuning sweep kept 10 models' weights, gradients and optimizer state on the GPU).
    A real 1-rank gloo engine in a forked process; the control without close() shows the leak the test guards."""
    code = """
import gc, json, weakref
import deepspeed.ops
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
from trainer import engine as E
from trainer.models import get_preset
from trainer.objectives import get_objective
from trainer.optim import OptimConfig
E.init_distributed(5)
alive = {}
for close in (False, True):
    model = get_objective({"name": "mlm"}).build_model(get_preset("tiny", vocab_size=64))
    ds = json.load(open("ds_configs/zero2.json"))
    ds.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1, train_batch_size=2,
              zero_allow_untested_optimizer=True, steps_per_print=2**31 - 1)
    engine = E.Engine(model, E.build_optimizer(OptimConfig(name="adamw", lr=1e-4), model, "cpu", ds), None, ds)
    ref = weakref.ref(model)
    if close:
        engine.close()
    del engine, model
    gc.collect()
    alive[close] = ref() is not None
print(json.dumps(alive))
E.shutdown()
"""
    import fork_server
    proc = fork_server.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alive = json.loads(proc.stdout.strip().splitlines()[-1])
    assert alive["true"] is False  # closed: freed
    # (without close() DeepSpeed 0.19.8 leaks it, alive["false"] is True: measured, not asserted, so a DeepSpeed that
    # breaks the cycle itself does not fail this test; the close=True case fails on a close() that frees nothing)
