"""The non-finite guard decides for all ranks: under ZeRO each rank sees only its partition of the gradients, so a NaN
on one rank must make every rank skip the step (else the replicas diverge, or LAMB's all-reduce hangs).

Two gloo ranks, forked with torchrun's environment and rendezvous (tests/fork_server.py run_ranks), run both
optimizers one after the other in one process group."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fork_server
from trainer.optim import OptimConfig
from trainer.optim.build import build_optimizer

pytestmark = pytest.mark.multiproc
NAMES = ("adamw", "lamb")


def _step_with_one_bad_rank(name: str) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = build_optimizer(OptimConfig(name=name, lr=0.1), model)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(2, 4)).sum().backward()
    if rank == 0:  # only rank 0's piece of the gradients is bad, as with one rank's ZeRO partition
        model.weight.grad[0, 0] = float("nan")
    opt.step()
    flagged = bool(opt.overflow)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()  # a clean step afterwards is applied on both ranks
    opt.step()
    moved = not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return {"flagged": flagged, "unchanged": unchanged, "moved": moved, "flagged_after": bool(opt.overflow)}


def _worker(out: str) -> None:
    """One rank: each optimizer in turn; writes ``{name: {...}}`` to ``out/rank<r>.json``."""
    dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT
    try:
        results = {name: _step_with_one_bad_rank(name) for name in NAMES}
        Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("nan_ranks")
    code = "import sys, test_nan_guard_ranks as t; t._worker(sys.argv[1])"
    proc = fork_server.run_ranks([sys.executable, "-c", code, str(out)], 2, cwd=Path(__file__).parent,
                                 env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("name", NAMES)
def test_one_rank_nan_skips_the_step_on_every_rank(results, name):
    # Both ranks skipped the bad step (weights untouched) and applied the following clean one.
    got = [r[name] for r in results]
    assert [g["unchanged"] for g in got] == [True, True], got
    assert [g["moved"] for g in got] == [True, True], got
    # every rank reports the skip (the trainer counts it), and the clean step clears the flag
    assert [(g["flagged"], g["flagged_after"]) for g in got] == [(True, False), (True, False)], got
