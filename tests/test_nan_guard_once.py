"""The non-finite guard checks once per optimizer step, not once per param group (issue 23): under ZeRO-1/2 DeepSpeed
steps the client optimizer once per group, and its own wrappers (ZeRO-1/2, bf16) already skip a step whose global
gradient norm is not finite, so the guard stands down there; at stage 0 it is the only check and runs once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import fork_server

REPO = Path(__file__).resolve().parents[1]


def test_guard_norms_per_step_and_nan_steps_still_skipped(tmp_path):
    out = tmp_path / "guard.json"
    proc = fork_server.run([sys.executable, str(REPO / "tests" / "nan_guard_once_worker.py"), str(out)], cwd=REPO,
                           timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    # old code: 2 per step at ZeRO-1/2 fp32 (two param groups), 1 under the bf16 ZeRO-1 wrapper
    assert results["z0-fp32"]["guard_norms_per_step"] == [1, 1], results
    for case in ("z1-fp32", "z2-fp32", "z1-bf16"):
        assert results[case]["guard_norms_per_step"] == [0, 0], results
    assert results["z1-bf16"]["wrapper"] == "BF16_Optimizer"
    for case, r in results.items():  # a NaN gradient is still a skipped step, weights untouched
        assert not r["nan_step_applied"] and r["weights_unchanged_by_nan_step"], (case, r)
