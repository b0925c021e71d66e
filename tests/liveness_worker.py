"""The stand-in trainer (tests/test_trainer_standin.py) with one rank's data made to misbehave, for
tests/test_hang_timeout.py and tests/test_liveness.py:

- ``BERTFAMILY_TEST_STOP_RANK=R`` and ``BERTFAMILY_TEST_STOP_AT_STEP=N``: rank R sends itself SIGSTOP when its loader
  is asked for step N's first micro-batch, so the other ranks wait for it in step N's gradient reduction (DeepSpeed's
  collective, the first of the step). The signal is the real one (``kill -STOP``); only the moment is chosen from
  inside, so the test knows which collective the others are in.
- ``BERTFAMILY_TEST_SLOW_RANK=R`` and ``BERTFAMILY_TEST_SLOW_S=S``: rank R's loader sleeps S seconds before each
  micro-batch (a stalled input pipeline on one node).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import test_trainer_standin  # noqa: E402  (registers the stand-in objective)

_real_build = test_trainer_standin.build


def _build(cfg, rank, world_size, device, options):
    comps = _real_build(cfg, rank, world_size, device, options)
    real_batches = comps.train_batches
    per_step = cfg.train.global_batch_size // (cfg.train.micro_batch_size * world_size)
    stop_at = int(os.environ.get("BERTFAMILY_TEST_STOP_AT_STEP", "0"))
    stops = os.environ.get("BERTFAMILY_TEST_STOP_RANK") == str(rank) and stop_at > 0
    slow = float(os.environ.get("BERTFAMILY_TEST_SLOW_S", "0")) \
        if os.environ.get("BERTFAMILY_TEST_SLOW_RANK") == str(rank) else 0.0

    def train_batches(consumed, end):
        first_step = consumed // cfg.train.global_batch_size + 1
        for i, batch in enumerate(real_batches(consumed, end)):
            if stops and i == (stop_at - first_step) * per_step:
                os.kill(os.getpid(), signal.SIGSTOP)
            if slow:
                time.sleep(slow)
            yield batch

    comps.train_batches = train_batches
    return comps


test_trainer_standin.build = _build

if __name__ == "__main__":
    from trainer.pretrain import exit_process, main  # ends as trainer/pretrain.py does (see exit_process)
    exit_process(main(sys.argv[1:]))
