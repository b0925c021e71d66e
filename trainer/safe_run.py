"""``python -m trainer.safe_run MODULE ARGS...``: a DeepSpeed tool (the universal converter) run with every
``torch.load`` weights-only and DeepSpeed's checkpoint classes allowed (``trainer.safe_load``). Its own module because
it needs both ``trainer.engine`` (the allow-list, which names DeepSpeed classes) and ``trainer.safe_load`` (which the
engine imports): kept in ``safe_load`` it made an import cycle."""
from __future__ import annotations

import os
import pickle
import runpy
import sys

import torch

from trainer import safe_load
from trainer.engine import checkpoint_globals


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.safe_run MODULE ARGS...``: run ``python -m MODULE ARGS...`` with every ``torch.load``
    weights-only and DeepSpeed's checkpoint classes allowed (for DeepSpeed's own tools, e.g. the universal
    converter, which load with ``weights_only=False``). A refusal exits 1 with the torch message."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m trainer.safe_run MODULE [ARGS...]", file=sys.stderr)
        return 2
    os.environ[safe_load.FORCE] = "1"
    torch.serialization.add_safe_globals(checkpoint_globals())
    sys.argv = [argv[0], *argv[1:]]
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except pickle.UnpicklingError as err:
        print(f"refused by the weights-only unpickler: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
