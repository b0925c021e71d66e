"""Counts the host<->device synchronisation points of real training steps on the CPU (tests/test_gpu_paths.py).

On a GPU each of these blocks the host until the device catches up: ``Tensor.item/tolist/cpu``, ``bool/int/float``
of a tensor, ``nonzero`` and boolean-mask indexing (a data-dependent shape), and ``torch.tensor/as_tensor`` of host
data with a ``device=`` (a synchronous copy from pageable memory). On the CPU they are free, but they are
the same calls, so counting them here tells how many a GPU step would make. The batches are collated before
counting starts (the data loader runs on the host, in worker processes), and the loop's own work (moving the batch,
the host-side packing, the step's one all-reduce) is counted with the model's.

Run: ``python tests/sync_count_worker.py OUT.json``; writes ``{"z2-unpad-L8-a3": [syncs of step 2, of step 3], ...}``
and the same under ``"ours/z2-unpad-L8-a3"`` for the syncs the trainer's code makes (not DeepSpeed's).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def _deepspeed_on_stack() -> bool:
    """Whether the sync was made by DeepSpeed's code: the nearest frame outside torch and this file is DeepSpeed's.
    (The guard's ``.item()`` runs inside DeepSpeed's step but is ours: its nearest frame is trainer/optim/build.py.)"""
    torch_dir = os.path.dirname(torch.__file__)
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(torch_dir) and name != __file__:
            return f"{os.sep}deepspeed{os.sep}" in name
        frame = frame.f_back
    return False


class SyncCounter:
    """Wraps the Tensor methods and torch functions that force a device->host sync; ``count`` while ``on``."""

    def __init__(self):
        self.on = False
        self.count = 0
        self.ours = 0
        """The syncs not made by DeepSpeed's code: the trainer's own (the loop, the guard, models, objectives)."""
        self.where: dict[str, int] = {}
        self._saved = []

    def _wrap(self, owner, name, is_sync=lambda *a, **k: True):
        original = getattr(owner, name)
        counter = self

        def wrapper(*args, **kwargs):
            if counter.on and is_sync(*args, **kwargs):
                counter.on = False  # not the calls made inside this one
                try:
                    counter.count += 1
                    counter.where[name] = counter.where.get(name, 0) + 1
                    counter.ours += not _deepspeed_on_stack()
                    return original(*args, **kwargs)
                finally:
                    counter.on = True
            return original(*args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def install(self):
        for name in ("item", "tolist", "cpu", "nonzero", "__bool__", "__int__", "__float__"):
            self._wrap(torch.Tensor, name)
        self._wrap(torch, "nonzero")
        self._wrap(torch, "masked_select")
        self._wrap(torch.Tensor, "masked_select")

        def bool_index(self_, index, *rest):
            items = index if isinstance(index, tuple) else (index,)
            return any(torch.is_tensor(i) and i.dtype == torch.bool for i in items)

        self._wrap(torch.Tensor, "__getitem__", bool_index)

        def host_data_to_device(data=None, *rest, **kwargs):
            # torch.tensor([...], device=...): host data copied to the training device. On a GPU a synchronous copy
            # from pageable memory; on the CPU the same call, so it is counted here whatever the device.
            return kwargs.get("device") is not None and not torch.is_tensor(data)

        self._wrap(torch, "tensor", host_data_to_device)
        self._wrap(torch, "as_tensor", host_data_to_device)
        return self

    def uninstall(self):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


def batches(cfg, micro: int, accum: int, steps: int, packed: bool, padded: bool, seed: int = 0) -> list[dict]:
    """Collated micro-batches (the real Collator) of random rows: padded to the batch's longest row when ``padded``
    (rows of different lengths), with 2-3 samples per row and ``pack_ids`` when ``packed``."""
    from trainer.data.loader import Collator
    from trainer.models.kernels import attach_packing

    rng = np.random.default_rng(seed)
    T, P = 32, 6
    collate = Collator(cfg.pad_token_id, T, P)
    out = []
    for _ in range(steps * accum):
        samples = []
        for _ in range(micro):
            n = int(rng.integers(12, T + 1)) if padded else T
            ids = rng.integers(5, cfg.vocab_size, n).astype(np.int32)
            pos = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(1, P + 1)), replace=False)).astype(np.int32)
            sample = {"input_ids": ids, "token_type_ids": np.zeros(n, np.int8), "mlm_positions": pos,
                      "mlm_labels": ids[pos].copy()}
            if packed:
                cut = sorted(rng.choice(np.arange(2, n - 1), size=int(rng.integers(1, 3)), replace=False))
                sample["pack_ids"] = np.searchsorted(np.asarray(cut), np.arange(n), side="right").astype(np.int8) + 1
            samples.append(sample)
        out.append(attach_packing(collate(samples)))  # host side, as the loop does before moving the batch
    return out


def count_steps(layers: int, accum: int, unpad: bool, packed: bool, padded: bool, stage: int,
                counter: SyncCounter, bf16: bool = False) -> tuple[list[int], list[int]]:
    from trainer.checkpoint import TrainState
    from trainer.engine import Engine, build_optimizer
    from trainer.loop import Components, Trainer
    from trainer.models import get_preset
    from trainer.objectives import get_objective
    from trainer.optim import OptimConfig

    torch.manual_seed(0)
    cfg = get_preset("tiny-roberta", num_layers=layers, unpad=unpad, max_position_embeddings=40)
    objective = get_objective({"name": "mlm"})
    model = objective.build_model(cfg)
    micro = 2
    ds_config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
                 "train_batch_size": micro * accum, "gradient_clipping": 1.0,
                 "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
                 "steps_per_print": 2**31 - 1}
    if bf16:  # ds_configs/zero1_bf16.json's precision: DeepSpeed's BF16_Optimizer (fp32 master, fp32 accumulation)
        ds_config.update(bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"})
    engine = Engine(model, build_optimizer(OptimConfig(lr=1e-3), model, 'cpu', ds_config), None, ds_config)
    comps = Components(model=model, loss=objective.loss, train_batches=lambda consumed: iter(()))
    trainer = Trainer(cfg=None, engine=engine, comps=comps, state=TrainState(), rank=0, world_size=1,
                      grad_accum=accum, metrics=None, preempt=SimpleNamespace(requested=False))
    stream = iter(batches(cfg, micro, accum, 3, packed, padded))
    # torch's AdamW keeps each parameter's step count in a host tensor and reads it with .item(): no sync on a GPU,
    # where the optimizer is fused anyway (FusedAdam / AdamW(fused=True)). Not counted; the guard around it is.
    inner_step = torch.optim.AdamW.step

    def uncounted_step(self, *args, **kwargs):
        was, counter.on = counter.on, False
        try:
            return inner_step(self, *args, **kwargs)
        finally:
            counter.on = was

    torch.optim.AdamW.step = uncounted_step
    counts, ours = [], []
    for step in range(3):
        counter.count, counter.ours, counter.where = 0, 0, {}
        counter.on = step > 0  # the first step builds DeepSpeed's buffers
        result = trainer.train_step(stream)
        counter.on = False
        if step > 0:
            counts.append(counter.count)
            ours.append(counter.ours)
            print(f"L{layers} accum {accum} unpad {unpad} packed {packed} padded {padded} stage {stage} bf16 {bf16}: "
                  f"{counter.count} syncs ({counter.ours} ours) {counter.where} loss {result.loss:.4f}", flush=True)
    torch.optim.AdamW.step = inner_step
    return counts, ours


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from trainer.engine import init_distributed

    init_distributed(5)
    counter = SyncCounter().install()
    results = {}
    # ZeRO-2 (the GPU recipes' default) for every attention path; stage 0 for one
    paths = {"plain": (False, False, False), "padded": (False, False, True), "unpad": (True, False, True),
             "packed": (False, True, True), "packed-unpad": (True, True, True)}
    for stage, names in ((2, ("plain", "unpad", "packed")), (0, ("padded",))):
        for name in names:
            for layers in (2, 8):
                for accum in (1, 3):
                    key = f"z{stage}-{name}-L{layers}-a{accum}"
                    results[key], results[f"ours/{key}"] = count_steps(layers, accum, *paths[name], stage, counter)
    for name in ("plain", "packed"):  # the GPU recipes' default: ZeRO-1, bf16 weights, fp32 master and accumulation
        for accum in (1, 3):
            key = f"z1bf16-{name}-L2-a{accum}"
            results[key], results[f"ours/{key}"] = count_steps(2, accum, *paths[name], 1, counter, bf16=True)
    counter.uninstall()
    Path(argv[0]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
