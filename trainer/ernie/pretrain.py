"""Pretrain ERNIE 1.0 / 2.0 with the common trainer: ``trainer.pretrain`` with ERNIE's objective and data.

    python -m trainer.ernie.pretrain --config tiny_ernie
    torchrun --nproc_per_node 2 -m trainer.ernie.pretrain --config tiny_ernie2 --set run_dir=runs/e2

Options and exit codes are ``trainer.pretrain``'s. Once the objectives registry routes ``ernie`` / ``ernie2`` to
``trainer.ernie.components``, ``trainer/pretrain.py`` runs these recipes directly and this entry point is a synonym.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    from trainer import pretrain
    from trainer.ernie.components import SECTION_MODELS, ernie_components

    return pretrain.main(argv, components_factory=ernie_components, section_models=SECTION_MODELS)


if __name__ == "__main__":
    from trainer.pretrain import exit_process

    exit_process(main())
