"""The non-finite guard decides for all ranks: under ZeRO each rank sees only its partition of the gradients, so a NaN
on one rank must make every rank skip the step (else the replicas diverge, or LAMB's all-reduce hangs)."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.optim import OptimConfig
from trainer.optim.build import build_optimizer

pytestmark = pytest.mark.multiproc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, name: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = torch.nn.Linear(4, 3)
        opt = build_optimizer(OptimConfig(name=name, lr=0.1), model)
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.ones(2, 4)).sum().backward()
        if rank == 0:  # only rank 0's piece of the gradients is bad, as with one rank's ZeRO partition
            model.weight.grad[0, 0] = float("nan")
        opt.step()
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()  # a clean step afterwards is applied on both ranks
        opt.step()
        moved = not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        results[rank] = (opt.overflow, unchanged, moved)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_one_rank_nan_skips_the_step_on_every_rank(name):
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(_free_port(), name, results), nprocs=2, join=True)
    # Both ranks skipped the bad step (weights untouched) and applied the following clean one.
    assert results[0][1] and results[1][1], dict(results)
    assert results[0][2] and results[1][2], dict(results)
