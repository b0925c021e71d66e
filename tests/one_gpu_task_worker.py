"""One task of a plain ``srun`` that bound one GPU to it, on a CPU machine (issue 21, item 8); run by
tests/test_gpu_engine.py in a child process (DeepSpeed's communication backend is process-global state).

The environment is what srun gives task 13 of 16, local id 5, with ``CUDA_VISIBLE_DEVICES`` holding one GPU. DeepSpeed
gets a fake CUDA accelerator (``deepspeed.accelerator.set_accelerator``) that sees one device and fails, as CUDA does,
on any other ordinal. ``trainer.engine.init_distributed`` then runs DeepSpeed's real ``init_distributed``
(deepspeed/comm/comm.py and ``TorchBackend.init_process_group``, which binds the group to
``device(LOCAL_RANK)``) down to ``torch.distributed.init_process_group``; that one call is wrapped: it checks the
``device_id`` DeepSpeed passes against the fake device list, then creates a real one-rank gloo group without it.

What it cannot see: NCCL itself (its communicator bound to the device, the 15 peers), and CUDA calls that bypass
DeepSpeed's accelerator (e.g. ``torch.cuda`` directly).

Prints one JSON line: the device calls in order, LOCAL_RANK after init, or the error.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch
    import torch.distributed as dist

    import trainer.engine as eng  # imports deepspeed (CPU accelerator on this machine)
    from deepspeed.accelerator import set_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    calls: list = []

    def check(index) -> int:
        index = int(index)
        if index != 0:
            raise RuntimeError(f"CUDA error: invalid device ordinal (device {index}; 1 device visible)")
        return index

    class OneVisibleGpu(CPU_Accelerator):
        """DeepSpeed's accelerator interface as a task bound to one GPU sees CUDA: device 0 only. The communication
        backend is gloo (there is no NCCL here); the device binding DeepSpeed asks for is checked all the same."""

        def __init__(self):
            super().__init__()
            self._name = "cuda"
            self._communication_backend_name = "gloo"

        def device_name(self, device_index=None):
            return "cuda" if device_index is None else f"cuda:{check(device_index)}"

        def device(self, device_index=None):
            return torch.device("cuda", check(0 if device_index is None else device_index))

        def device_count(self):
            return 1

        def set_device(self, device_index):
            calls.append(["set_device", check(device_index)])

        def current_device(self):
            return 0

    real_init = dist.init_process_group

    @functools.wraps(real_init)  # DeepSpeed passes device_id only if the signature has it (inspect follows wraps)
    def init_process_group(backend=None, **kwargs):
        device = kwargs.pop("device_id", None)
        if device is not None:
            check(device.index)  # what NCCL's eager init on that device would hit first
        calls.append(["init_process_group", backend, None if device is None else str(device)])
        kwargs.update(rank=0, world_size=1)  # the other 15 tasks do not exist here
        return real_init(backend, **kwargs)

    set_accelerator(OneVisibleGpu())
    dist.init_process_group = init_process_group
    try:
        eng.init_distributed(1)
        out = {"calls": calls, "LOCAL_RANK": os.environ.get("LOCAL_RANK"), "device_name": eng.device_name()}
    except Exception as err:  # noqa: BLE001
        out = {"calls": calls, "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(out), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
