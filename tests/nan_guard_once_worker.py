"""How often the non-finite guard computes a gradient norm per optimizer step, through the real DeepSpeed engine on a
1-rank gloo group (tests/test_nan_guard_once.py), and whether a NaN gradient still skips the step.

Run: ``python tests/nan_guard_once_worker.py OUT.json``; writes ``{case: {"guard_norms_per_step": [..],
"nan_step_applied": bool, "weights_unchanged_by_nan_step": bool}}``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def run_case(stage: int, bf16: bool) -> dict:
    from trainer.engine import Engine, build_optimizer
    from trainer.optim import OptimConfig
    from trainer.optim.build import NonFiniteGuard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))  # 2 groups
    accum = 2
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": accum,
                 "train_batch_size": 2 * accum, "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
                 "zero_allow_untested_optimizer": True, "steps_per_print": 2**31 - 1,
                 "bf16": {"enabled": bf16}}
    if bf16:
        ds_config["data_types"] = {"grad_accum_dtype": "fp32"}
    engine = Engine(model, build_optimizer(OptimConfig(lr=1e-2), model, "cpu", ds_config), None, ds_config)
    dtype = torch.bfloat16 if bf16 else torch.float32
    norms = [0]
    real_norm = torch._foreach_norm

    def counted_norm(*args, **kwargs):
        if sys._getframe(1).f_code is NonFiniteGuard.step.__code__:
            norms[0] += 1
        return real_norm(*args, **kwargs)

    torch._foreach_norm = counted_norm
    per_step = []
    try:
        for step in range(3):
            norms[0] = 0
            nan = step == 2
            if nan:
                before = [p.detach().clone() for p in engine.module.parameters()]
            for _ in range(accum):
                loss = engine.engine(torch.ones(2, 8, dtype=dtype)).float().pow(2).mean()
                engine.backward(loss * float("nan") if nan else loss)
                engine.step()
            if not nan:
                per_step.append(norms[0])
    finally:
        torch._foreach_norm = real_norm
    unchanged = all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    return {"guard_norms_per_step": per_step, "nan_step_applied": engine.engine.was_step_applied(),
            "weights_unchanged_by_nan_step": unchanged, "wrapper": type(engine.engine.optimizer).__name__}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from trainer.engine import init_distributed

    init_distributed(5)
    results = {f"z{stage}-{'bf16' if bf16 else 'fp32'}": run_case(stage, bf16)
               for stage, bf16 in ((0, False), (1, False), (2, False), (1, True))}
    print(json.dumps(results), flush=True)
    Path(argv[0]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
