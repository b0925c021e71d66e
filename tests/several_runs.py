"""Several trainer runs in one launch, for tests whose runs are independent:

    torchrun --nproc_per_node 2 tests/several_runs.py --config A.yaml [--set ...] --then --config B.yaml ...
    torchrun --nproc_per_node 2 tests/several_runs.py --finetune --checkpoint ... --task rte ... --then ...

calls ``trainer.pretrain.main`` (with ``--finetune``: ``trainer.finetune``'s) on each group of arguments in turn, in
the same process on every rank (the stand-in objective of tests/test_trainer_standin.py registered, so its configs
work too), and prints ``several_runs: run K exited C`` after each. It stops at the first run that does not exit 0
and exits with that code. (Fine-tuning's main leaves the process group up by design, for the same reason as below.)

Why: a rank's start-up (importing torch, torch._dynamo and DeepSpeed) costs ~5 CPU-s on the 2-core test machine,
more than the few steps such a test runs. Four 2-rank stand-in runs (tests/test_trainer_multiproc.py's ZeRO stages)
took 10.8 CPU-s in one launch against 8.2 CPU-s for one of them launched alone.

The process group stays up between runs: DeepSpeed caches its world group, and a ``deepspeed.initialize`` after
``destroy_process_group`` fails ("Group ... is not registered, please create group with torch.distributed.new_group
API"). So ``trainer.engine.shutdown`` is replaced here by its barrier and environment restore, and the group is torn
down once, after the last run. What this cannot see: a run's own teardown of the process group (every single-run
launch in the suite does it) and anything a fresh process would reset (imports' side effects, module-level caches).
Tests about start-up, signals, kills, run locks or resuming in a fresh process launch their runs separately.
"""
from __future__ import annotations

import sys
from pathlib import Path

# The trainer is imported in run_all only: tests import ``joined`` from here without loading it.


def _keep_group() -> None:
    import torch

    from trainer import engine
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    engine.restore_environment()


def groups(argv: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--then":
            out.append([])
        else:
            out[-1].append(arg)
    if any(not g for g in out):
        raise SystemExit(f"several_runs: an empty run in {argv} (--then separates the runs' arguments)")
    return out


def joined(runs: list[list[str]]) -> list[str]:
    """The command-line arguments for ``runs`` (each run's own arguments), separated by ``--then``."""
    return [x for k, args in enumerate(runs) for x in ((["--then"] if k else []) + list(args))]


def run_all(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_trainer_standin  # noqa: F401  (registers objective: standin)
    import torch

    from trainer import engine
    from trainer.pretrain import main as entry
    if argv[:1] == ["--finetune"]:
        from trainer.finetune.__main__ import main as entry
        argv = argv[1:]
    engine.shutdown = _keep_group
    code = 0
    for k, args in enumerate(groups(argv)):
        code = entry(args)
        print(f"several_runs: run {k} exited {code}", flush=True)
        if code:
            break
    if code == 0 and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return code


if __name__ == "__main__":
    from trainer.pretrain import exit_process
    exit_process(run_all(sys.argv[1:]))
