"""status.json is rank 0's: when rank 0 fails only because another rank's failure closed the collective under it (a
loader worker of rank 1 killed by the OOM killer: review reproduced status "Connection closed by peer" while the cause
was in rank 1's log), the status says so first and points at the other ranks' output. The gloo/NCCL messages are
the ones those libraries print; this checks our reading of them, not that every NCCL version words them so."""
from __future__ import annotations

import pytest

from trainer.failures import peer_failure_hint


@pytest.mark.parametrize("message", [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41231",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer",
    "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error",
])
def test_a_collective_that_lost_its_peer_points_at_the_other_ranks(message):
    hint = peer_failure_hint(RuntimeError(message))
    assert hint.startswith("another rank most likely failed first") and "that rank's output" in hint


def test_a_rank_s_own_failure_gets_no_hint():
    assert peer_failure_hint(ValueError("model.vocab_size: 30000 is smaller than the tokenizer's 30522")) == ""
    assert peer_failure_hint(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == ""
