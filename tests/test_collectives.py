"""One gradient reduction per optimizer step (issue 23): the GPU recipes' DeepSpeed configs communicate the same
amount whatever the gradient accumulation, counted through the real engine on 2 gloo ranks in bf16
(tests/collective_count_worker.py says what the count sees and what it cannot)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import fork_server
import pytest

from trainer.config import load_config
from trainer.ds_json import read_ds_json, zero_stage

REPO = Path(__file__).resolve().parents[1]
GPU_RECIPES = sorted(p.stem for p in (REPO / "trainer" / "recipes").glob("*.yaml") if not p.stem.startswith("tiny"))
# The configs the worker counts, and the optimizer each is counted with
COUNTED = {"ds_configs/zero1_bf16.json": "adamw", "ds_configs/zero1_bf16_lamb.json": "lamb"}


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_default_to_zero1_with_fp32_master_weights_and_accumulation(recipe):
    cfg = load_config(recipe, ["model.vocab_size=30522", "model.pad_token_id=0"])  # 'auto' reads a corpus
    ds_json = read_ds_json(cfg)
    assert zero_stage(cfg, ds_json) == 1, f"{recipe}: ZeRO-2/3 reduce gradients at every micro-batch"
    assert ds_json["bf16"]["enabled"] and ds_json["data_types"]["grad_accum_dtype"] == "fp32"
    assert COUNTED.get(cfg.deepspeed.config) == cfg.optim.name, (recipe, cfg.deepspeed.config, cfg.optim.name)


def test_albert_xxlarge_micro_batch_fills_the_gpu():
    assert load_config("albert_xxlarge").train.micro_batch_size == 32  # was 4: 64 micro-steps per step at 16 ranks


@pytest.mark.slow
@pytest.mark.timeout(1260)  # above the launch's own 1200 s timeout, so that its output is reported, not lost
def test_collectives_per_step_do_not_grow_with_accumulation(tmp_path):
    """Steps 2 and 3 at accumulation 1, 4 and 64: the default configs make the same calls with the same elements;
    ZeRO-2 (the old default, counted in the same launch) grows with every micro-batch. Step 4 is a logging step: the
    same calls, its one all-reduce longer by the ranks' timings (2 per rank: step and data-wait seconds)."""
    out = tmp_path / "collectives.json"
    # the ranks fork from a process that imported torch and DeepSpeed, with torchrun's environment and rendezvous
    # (tests/fork_server.py run_ranks): the count is the engine's, whatever started the ranks
    proc = fork_server.run_ranks([sys.executable, str(REPO / "tests" / "collective_count_worker.py"), str(out)], 2,
                                 cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = json.loads(out.read_text())
    per_case: dict[str, set] = {}
    for key, steps in counts.items():
        case = key.rsplit("-a", 1)[0]
        plain = [s for s in steps if not s["logs"]]
        per_case.setdefault(case, set()).update((s["calls"], s["elements"]) for s in plain)
        (logging,) = [s for s in steps if s["logs"]]
        assert (logging["calls"], logging["elements"]) == (plain[-1]["calls"], plain[-1]["elements"] + 2 * 2), steps
    for case in ("bert_base-zero1_bf16-adamw", "albert_base-zero1_bf16_lamb-lamb"):
        assert len(per_case[case]) == 1, (case, counts)
        calls, _ = next(iter(per_case[case]))
        assert calls <= 6, (case, counts)  # gradient all-reduce, norm, loop's one all-reduce, weight all-gathers
    z2 = [counts[f"bert_base-zero2_bf16-adamw-a{a}"][0]["elements"] for a in (1, 4, 64)]
    assert z2[0] < z2[1] < z2[2], z2
