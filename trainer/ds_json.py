"""The DeepSpeed JSON a recipe names, read without DeepSpeed: its path, contents, precision, ZeRO stage and offload.

Config validation (``trainer/config.py``) and the engine (``trainer/engine.py``, which adds what the trainer computes
and hands the result to DeepSpeed) both read the JSON through these functions, so they agree on what it says. Only the
standard library: ``--check`` runs on a login node without torch or DeepSpeed.

``cfg`` below is a run config (``trainer.config.RunConfig``), read for its ``deepspeed`` and ``optim`` sections; the
JSON itself is called ``ds_json`` throughout, never ``ds`` (which would read like the deepspeed module).
"""
from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def ds_config_path(cfg) -> Path:
    """``deepspeed.config``, relative to the repository root unless absolute."""
    path = Path(cfg.deepspeed.config)
    return path if path.is_absolute() else REPO_ROOT / path


def read_ds_json(cfg) -> dict:
    """The JSON object of ``deepspeed.config``; ValueError naming the file when it is not one."""
    path = ds_config_path(cfg)
    try:
        ds_json = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"deepspeed.config: {path} is not valid JSON: {err}") from None
    if not isinstance(ds_json, dict):
        raise ValueError(f"deepspeed.config: {path} must hold a JSON object")
    return ds_json


def precision(cfg, ds_json: dict | None = None) -> str:
    """fp32 | bf16 | fp16: deepspeed.precision if set, else what the JSON enables; a contradiction is an error.
    ``ds_json``: the JSON if already read (else it is read from ``cfg``)."""
    ds_json = read_ds_json(cfg) if ds_json is None else ds_json
    enabled = [p for p in ("bf16", "fp16") if ds_json.get(p, {}).get("enabled")]
    if len(enabled) > 1:
        raise ValueError(f"deepspeed.config: {ds_config_path(cfg)} enables both bf16 and fp16")
    from_json = enabled[0] if enabled else "fp32"
    wanted = cfg.deepspeed.precision
    if wanted is not None and enabled and wanted != from_json:
        raise ValueError(f"deepspeed.precision={wanted} but {ds_config_path(cfg)} enables {from_json}; "
                         "drop one of them")
    return wanted or from_json


def zero_stage(cfg, ds_json: dict) -> int:
    """The ZeRO stage the run uses: deepspeed.zero_stage if set, else the JSON's (0 if it names none)."""
    if cfg.deepspeed.zero_stage is not None:
        return cfg.deepspeed.zero_stage
    return int((ds_json.get("zero_optimization") or {}).get("stage", 0))


def offloads_optimizer(ds_json: dict) -> bool:
    """True when ZeRO keeps the fp32 partitions and optimizer state off the accelerator (``offload_optimizer``
    device cpu or nvme): the same test DeepSpeed applies (``zero_use_cpu_optimizer``) before it demands its own
    CPU optimizer."""
    offload = (ds_json.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return offload.get("device", "none") in ("cpu", "nvme")


def offload_problem(optim_cfg, ds_json: dict, source: str = "deepspeed.config") -> str | None:
    """Why the ``optim`` section cannot train under ``ds_json`` with ZeRO's optimizer offload, or None.

    With ``offload_optimizer`` ``adamw`` steps DeepSpeed's CPU Adam (``trainer/engine.py``). ``lamb`` is refused:
    its trust-ratio all-reduce runs on the device of the offloaded (CPU) partitions, which NCCL does not reduce, and
    a substitute optimizer would silently train something else. Checked once, by config validation, before any
    process is launched (exit status 2); the engine relies on it.
    """
    if optim_cfg.name == "lamb" and offloads_optimizer(ds_json):
        device = ds_json["zero_optimization"]["offload_optimizer"]["device"]
        return (f"deepspeed.config: {source} offloads the optimizer (zero_optimization.offload_optimizer "
                f"device={device}), which optim.name=lamb does not support; use a config without "
                "offload (ds_configs/zero2.json or zero3.json: ZeRO already partitions LAMB's state over the ranks), "
                "or optim.name=adamw, which offloads as DeepSpeedCPUAdam")
    return None


def grad_accum_problem(cfg, ds_json: dict, source: str = "deepspeed.config") -> str | None:
    """Why DeepSpeed would refuse ``ds_json``'s gradient-accumulation dtype at the run's ZeRO stage, or None.

    ``data_types.grad_accum_dtype`` different from the model's dtype (``zero2_bf16.json``: bf16 weights, fp32
    gradients) is something only the ZeRO optimizers (stages 1-3) implement; at stage 0 DeepSpeed raises
    "unsupported mix of model_dtype and grad_accum_dtype" after every rank has started. Refused at validation.
    """
    accum = (ds_json.get("data_types") or {}).get("grad_accum_dtype")
    prec = precision(cfg, ds_json)
    if accum is None or zero_stage(cfg, ds_json) != 0 or accum == prec:
        return None
    return (f"deepspeed.config: {source} accumulates gradients in {accum} (data_types.grad_accum_dtype) for "
            f"{prec} weights, which DeepSpeed supports only under ZeRO (stages 1-3), not at ZeRO stage 0; use "
            "deepspeed.zero_stage 1 or more (stage 1 partitions only the optimizer state), or a config without "
            f"data_types.grad_accum_dtype (gradients then accumulate in {prec})")
