"""Default thread counts follow the CPUs this process may use (its affinity: Slurm's cgroup, taskset), not the
node's count. Found by review (F11): a SentencePiece run in an 8-CPU allocation on a 128-core node took 128 threads."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
from data_prep import train_tokenizer
from trainer.data.config import DataConfig
from trainer.data.dataset import cache_policy
data = DataConfig(corpora=[{"prefix": "/nonexistent/corpus"}])
print(json.dumps({"threads": train_tokenizer.build_parser().get_default("threads"),
                  "index_workers": cache_policy(data, builder=False).workers}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs CPU affinity and 2+ CPUs")
def test_default_threads_follow_the_affinity_mask_not_the_node():
    """A process bound to one CPU (as `taskset -c 0` or a 1-CPU Slurm step binds it) on a node of 2+: train_tokenizer's
    --threads and the trainer's index workers default to 1."""
    one = sorted(os.sched_getaffinity(0))[0]
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         preexec_fn=lambda: os.sched_setaffinity(0, {one}))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"threads": 1, "index_workers": 1}
