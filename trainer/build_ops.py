"""Compile, once and ahead of any run, the DeepSpeed ops that this trainer would otherwise compile at start-up.

DeepSpeed builds some of its C++ ops just in time, on first use, into torch's extensions folder
(``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``):

- ``cpu_adam``: DeepSpeedCPUAdam, the optimizer of every ZeRO-Offload config (``ds_configs/*offload*.json``);
  ~80 s of one core.
- ``deepspeed_shm_comm``: loaded by every process-group start on the CPU accelerator (the CPU test and smoke runs);
  ~40 s.

Built at start-up, that time lands inside a job: the first ranks compile while the others wait on torch's build
lock, a launch's time limit can run out during it, and a rank killed mid-build leaves the lock behind (the trainer
removes such a lock once it is stale, or stops naming it when the op is not built: ``trainer/ext_lock.py``; this
command removes it either way, then builds). ``python -m trainer.build_ops`` builds them beforehand (``make venv``
runs it; on a cluster, run it once per node image or shared extensions folder) and says what it built. An op this
machine cannot build is reported and skipped, and training falls back as it would have (the trainer never needs these
ops: torch's AdamW and torch.distributed work without them).

Ops DeepSpeed installs prebuilt (``DS_BUILD_FUSED_ADAM=1 pip install deepspeed``, README "GPU setup") are not
touched: DeepSpeed loads those from its install and never JIT-compiles them.
"""
from __future__ import annotations

import argparse
import sys
import time

from data_prep.known_noise import choose_cpu_accelerator
from trainer.ext_lock import clear_stale_locks

# (DeepSpeed builder name, when the trainer loads it)
OPS = (("CPUAdamBuilder", "ZeRO-Offload's optimizer"),
       ("ShareMemCommBuilder", "process-group start on the CPU accelerator"))


def build(names: tuple[str, ...] | None = None, quiet: bool = False) -> list[tuple[str, bool | None, str]]:
    """Build (or find already built) each op this accelerator has a builder for; returns (op, ready, outcome)
    triples: ready is True (built or found), False (the build failed) or None (not used or not buildable here)."""
    choose_cpu_accelerator()
    from deepspeed.accelerator import get_accelerator
    import deepspeed.ops  # noqa: F401  (fills deepspeed.ops.__compatible_ops__)

    results = []
    for name, use in OPS:
        if names and name not in names:
            continue
        builder = get_accelerator().create_op_builder(name)
        if builder is None:
            results.append((name, None, f"not used on the {get_accelerator().device_name()} accelerator"))
            continue
        if not builder.is_compatible(verbose=False):
            results.append((builder.NAME, None, "cannot be built here (DeepSpeed's compatibility check); skipped"))
            continue
        t0 = time.perf_counter()
        try:
            # a lock left by a killed build or load would make torch wait forever (trainer/ext_lock.py); this
            # command builds next, so a stale lock of an unbuilt op is removed too
            clear_stale_locks([builder.name], allow_unbuilt=True)
            builder.load(verbose=False)
        except Exception as err:  # noqa: BLE001  (a compiler error: reported, the run falls back without the op)
            first = str(err).splitlines()[0] if str(err) else ""
            results.append((builder.NAME, False, f"build failed ({type(err).__name__}: {first}); skipped"))
            continue
        results.append((builder.NAME, True, f"ready ({time.perf_counter() - t0:.1f} s; used by {use})"))
    if not quiet:
        for name, _, outcome in results:
            print(f"{name}: {outcome}", flush=True)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", action="append", choices=[n for n, _ in OPS],
                    help="build only this op (repeatable); default: all that apply here")
    ap.add_argument("--strict", action="store_true", help="exit 1 if an op that applies here failed to build")
    args = ap.parse_args(argv)
    failed = [name for name, ready, _ in build(tuple(args.op) if args.op else None) if ready is False]
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    sys.exit(main())
