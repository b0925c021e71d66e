"""Counts the collectives of real optimizer steps on 2 gloo ranks (tests/test_collectives.py), one launch for every
case: ``torchrun --nproc_per_node 2 tests/collective_count_worker.py OUT.json``.

Each case takes a recipe's DeepSpeed JSON and optimizer as the trainer builds them (``load_config`` ->
``build_ds_config`` -> ``build_optimizer`` -> ``Engine``), a tiny model of the recipe's objective family in **bf16**
(the GPU recipes' precision: bf16 weights, fp32 master weights and fp32 gradient accumulation; bf16 is slow on this
CPU but the model is tiny), and runs ``Trainer.train_step`` three times at accumulation 1, 4 and 64. It counts the
calls of the second and third step into ``deepspeed.comm`` and ``torch.distributed`` (the outermost call only: a
``deepspeed.comm`` call that goes on into ``torch.distributed`` is one collective), with the elements they move (the
largest tensor argument: the input of a reduce-scatter, the output of an all-gather).

What this cannot see: NCCL's own bucketing and the overlap of communication with compute on a GPU (gloo runs the
same DeepSpeed calls, synchronously); ``overlap_comm`` streams are a no-op on the CPU accelerator.
Writes ``{case: [{"calls": n, "elements": e, "by_op": {...}} for step 2, step 3]}``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

# deepspeed.comm and torch.distributed functions that move tensors between ranks
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_fn", "_reduce_scatter_base", "all_gather",
               "all_gather_into_tensor", "allgather_fn", "all_gather_coalesced", "_all_gather_base", "broadcast",
               "all_to_all_single", "all_to_all", "barrier", "all_gather_object", "broadcast_object_list")


def _largest(args, kwargs) -> int:
    best = 0
    for a in list(args) + list(kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else [a]
        for t in items:
            if torch.is_tensor(t):
                best = max(best, t.numel())
    return best


class CollectiveCounter:
    def __init__(self):
        self.on = False
        self.depth = 0
        self.calls: dict[str, int] = {}
        self.elements = 0
        self._saved = []

    def _wrap(self, module, name):
        original = getattr(module, name, None)
        if original is None or getattr(original, "_counted", False):
            return
        counter = self

        def wrapper(*args, **kwargs):
            if counter.on and counter.depth == 0:
                counter.calls[name] = counter.calls.get(name, 0) + 1
                counter.elements += _largest(args, kwargs)
            counter.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                counter.depth -= 1

        wrapper._counted = True
        self._saved.append((module, name, original))
        setattr(module, name, wrapper)

    def install(self):
        import deepspeed.comm
        import deepspeed.comm.comm
        import torch.distributed
        import torch.distributed.distributed_c10d

        for module in (deepspeed.comm, deepspeed.comm.comm, torch.distributed, torch.distributed.distributed_c10d):
            for name in COLLECTIVES:
                self._wrap(module, name)
        return self

    def reset(self):
        self.calls, self.elements = {}, 0

    def snapshot(self) -> dict:
        return {"calls": sum(self.calls.values()), "elements": self.elements, "by_op": dict(self.calls)}


def run_case(recipe: str, overrides: list[str], accum: int, counter: CollectiveCounter, world_size: int) -> list:
    from sync_count_worker import batches
    from trainer.checkpoint import TrainState
    from trainer.config import load_config
    from trainer.engine import Engine, build_ds_config, build_optimizer
    from trainer.loop import Components, Trainer
    from trainer.models import get_preset
    from trainer.objectives import get_objective

    micro = 2
    cfg = load_config(recipe, [f"train.micro_batch_size={micro}",
                               f"train.global_batch_size={micro * accum * world_size}", *overrides])
    ds_config = build_ds_config(cfg, world_size, accum)
    torch.manual_seed(0)
    model_cfg = get_preset("tiny-roberta", max_position_embeddings=40)
    objective = get_objective({"name": "mlm"})
    model = objective.build_model(model_cfg)
    engine = Engine(model, build_optimizer(cfg.optim, model, "cpu", ds_config), None, ds_config)
    comps = Components(model=model, loss=objective.loss, train_batches=lambda consumed: iter(()))
    trainer = Trainer(cfg=None, engine=engine, comps=comps, state=TrainState(), rank=torch.distributed.get_rank(),
                      world_size=world_size, grad_accum=accum, metrics=None,
                      preempt=SimpleNamespace(requested=False))
    stream = iter(batches(model_cfg, micro, accum, 4, packed=False, padded=False,
                          seed=torch.distributed.get_rank()))
    out = []
    for step in range(4):
        counter.reset()
        counter.on = step > 0  # the first step builds DeepSpeed's buffers
        result = trainer.train_step(stream, logs=step == 3)  # the last as a logging step: per-rank timings ride along
        counter.on = False
        if step > 0:
            out.append({**counter.snapshot(), "logs": step == 3})
    if torch.distributed.get_rank() == 0:
        print(f"{recipe} {overrides} accum {accum}: {out[-1]} loss {result.loss:.4f} "
              f"optimizer {type(engine.engine.optimizer).__name__}", flush=True)
    return out


# (case name, recipe, overrides): the recipes' own JSON, and ZeRO-2 (the old default) to show what it costs
CASES = [("bert_base-zero1_bf16-adamw", "bert_base", []),
         ("albert_base-zero1_bf16_lamb-lamb", "albert_base", []),
         ("bert_base-zero2_bf16-adamw", "bert_base", ["deepspeed.config=ds_configs/zero2_bf16.json"])]
ACCUMS = (1, 4, 64)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from trainer.engine import init_distributed, shutdown

    rank, world_size = init_distributed(5)
    counter = CollectiveCounter().install()
    results = {}
    for name, recipe, overrides in CASES:
        for accum in ACCUMS:
            results[f"{name}-a{accum}"] = run_case(recipe, overrides, accum, counter, world_size)
    if rank == 0:
        Path(argv[0]).write_text(json.dumps(results, indent=1))
    shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
