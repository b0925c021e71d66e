"""Config checks that catch mistakes a schema cannot see, before any process is launched (called from
``trainer.config.config_from_dict``; each returns "" when all is well, else the message of a ``ConfigError``):

- ``ignored_setting_problem``: a value that the rest of the recipe makes a no-op (LAMB's knobs under AdamW, the
  polynomial ``power`` under a linear schedule, NSP's negative rate on a format without pairs, ...);
- ``schedule_problem``: a decay that ends before ``train.steps`` at lr 0 (``schedule.decay_steps`` is the step where
  the decay ends, counted from step 0 with the warmup, not the decay's length);
- ``downstream_problem``: ``eval.downstream`` entries checked as the fine-tuning child would read them, which it does
  only at the first due checkpoint, hours in;
- ``path_problem``: ``checkpoint.init_from`` and ERNIE's ``objective.options.dlm.path``, which otherwise fail with a
  traceback after the model is built.

Like trainer/config.py, this imports pydantic and the standard library only (the fine-tuning config module is
imported inside ``downstream_problem``, only for a run that has downstream entries: it imports trainer.config).
"""
from __future__ import annotations

from pathlib import Path

from trainer.config_error import ConfigError

_SCHEDULE_DEFAULTS = {"power": 1.0, "end_ratio": 0.0, "decay_steps": None}
_MASKING_DEFAULTS = {"max_ngram": 3, "span_p": 0.2, "max_span": 10}
_NO_PAIR_FORMATS = ("full-sentences", "doc-sentences")
"""Formats with one segment per row: ``data.nsp_negative_prob`` is read only by the pair formats (the NSP ones
decide negatives in the sample index, sop-pair swaps; trainer/data/sample_index.py ``nsp_share``)."""


def _section(raw: dict, name: str) -> dict:
    value = raw.get(name)
    return value if isinstance(value, dict) else {}


def _differs(raw_value, default) -> bool:
    """A value the config sets that is not the default (numbers compared as numbers: YAML's 1 and 1.0 are one)."""
    if raw_value is None or default is None:
        return raw_value is not default
    try:
        return abs(float(raw_value) - float(default)) > 1e-12
    except (TypeError, ValueError):
        return raw_value != default  # (pydantic names a bad value later)


def ignored_setting_problem(raw: dict, recipe_raw: dict | None = None) -> str:
    """Settings whose value has no effect under the rest of the recipe, set to something else than their default.

    Read on the raw dict, so only what the config (or a run's resolved config.json, which holds every default) says:
    a default never refuses, so a resume of any run whose config left these alone loads as before. Each case is where
    the code reads the setting: ``optim.max_trust_ratio``/``bias_correction`` only in LAMB (trainer/optim/build.py;
    AdamW is built without them), ``schedule.power`` only for kind polynomial and ``end_ratio``/``decay_steps`` not for
    constant (trainer/optim/schedules.py ``WarmupDecay``), ``data.masking.max_ngram`` only for strategy ngram,
    ``span_p``/``max_span`` only for span (trainer/data/masking.py ``tile_distribution``), ``data.pack_doc_sentences``
    only for doc-sentences and ``data.nsp_negative_prob`` only for the pair formats (sample_index.py).

    A shipped recipe's own value passes (``recipe_raw``, else the recipe the config names): `--set
    schedule.kind=linear` on bert_base_phase1 (power 0.5) or `--set optim.name=adamw` on a LAMB recipe overrides the
    recipe knowingly, and a resume of such a run must load. Under ``schedule.kind: constant`` the decay's settings
    are not refused either: the kind says there is no decay."""
    found = []
    optim = _section(raw, "optim")
    if optim.get("name", "adamw") == "adamw":
        if _differs(optim.get("max_trust_ratio"), None):
            found.append(("optim.max_trust_ratio", optim["max_trust_ratio"], "optim.name=adamw (it clips LAMB's "
                          "trust ratio)", "optim.name: lamb"))
        if "bias_correction" in optim and optim["bias_correction"] is not True:
            found.append(("optim.bias_correction", optim["bias_correction"], "optim.name=adamw (AdamW always "
                          "corrects its moments; the switch is LAMB's)", "optim.name: lamb"))
    schedule = _section(raw, "schedule")
    kind = schedule.get("kind", "linear")
    ignored = {"linear": ("power",)}.get(kind, ())
    for key in ignored:
        if key in schedule and _differs(schedule[key], _SCHEDULE_DEFAULTS[key]):
            found.append((f"schedule.{key}", schedule[key], f"schedule.kind={kind}",
                          "schedule.kind: polynomial" if key == "power" else "schedule.kind: linear or polynomial"))
    data = _section(raw, "data")
    fmt = data.get("format", "segment-pair")
    if "nsp_negative_prob" in data and fmt in _NO_PAIR_FORMATS and _differs(data["nsp_negative_prob"], 0.5):
        found.append(("data.nsp_negative_prob", data["nsp_negative_prob"], f"data.format={fmt} (one segment per "
                      "row: no pair to make negative)", "a pair format (segment-pair, sentence-pair, sop-pair)"))
    if data.get("pack_doc_sentences") not in (None, False) and fmt != "doc-sentences":
        found.append(("data.pack_doc_sentences", data["pack_doc_sentences"], f"data.format={fmt} (it packs "
                      "doc-sentences rows only)", "data.format: doc-sentences"))
    masking = _section(data, "masking")
    strategy = masking.get("strategy", "token")
    for key, reader in (("max_ngram", "ngram"), ("span_p", "span"), ("max_span", "span")):
        if key in masking and strategy != reader and _differs(masking[key], _MASKING_DEFAULTS[key]):
            found.append((f"data.masking.{key}", masking[key], f"data.masking.strategy={strategy}",
                          f"data.masking.strategy: {reader}"))
    if found and recipe_raw is None:  # read only when something is found
        recipe_raw = _shipped_recipe(raw.get("recipe") if isinstance(raw.get("recipe"), str) else None)
    found = [f for f in found if recipe_value(recipe_raw, f[0]) != f[1]]
    if not found:
        return ""
    key, value, why, instead = found[0]
    more = f" (also: {', '.join(k for k, *_ in found[1:])})" if found[1:] else ""
    return (f"{key}={value} has no effect under {why}, so the run would train with other settings than its config "
            f"says{more}: remove it (a run in flight then continues unchanged), or set {instead} to use it")


def schedule_problem(cfg) -> str:
    """A decay that ends before ``train.steps`` with end lr 0: the steps after ``schedule.decay_steps`` train at lr 0
    (``WarmupDecay`` reads decay_steps as the step where the decay ends). A nonzero ``end_ratio`` is a deliberate
    floor and passes; so does ``kind: constant`` (no decay). Costs nothing to check; a run in flight with this
    mistake is refused at its resume too, and follows the corrected value from there (the scheduler's checkpoint
    holds only its position: trainer/optim/schedules.py ``WarmupDecayLR``)."""
    s, steps = cfg.schedule, cfg.train.steps
    if s.kind == "constant" or s.decay_steps is None or s.decay_steps >= steps or s.end_ratio > 0:
        return ""
    decay_len = steps - s.warmup_steps
    hint = (f"; if you meant a decay of {s.decay_steps} steps after the warmup, that is decay_steps="
            f"{s.warmup_steps + s.decay_steps}" if s.warmup_steps and s.warmup_steps + s.decay_steps <= steps else "")
    return (f"schedule.decay_steps={s.decay_steps} is before train.steps={steps}: decay_steps is the step at which the "
            f"decay ends (counted from step 0, warmup included), and with schedule.end_ratio=0 steps "
            f"{s.decay_steps + 1}-{steps} ({steps - s.decay_steps} steps) would train at lr 0. Remove "
            f"schedule.decay_steps (the decay then ends at train.steps: {s.warmup_steps} warmup + "
            f"{max(decay_len, 0)} decay steps){hint}, or set schedule.end_ratio above 0 to hold that fraction of "
            "optim.lr after the decay")


def schedule_notes(cfg) -> list[str]:
    """A warmup that does not end within ``train.steps`` (a short trial of a production recipe, or a typo): valid,
    so said at start and by --check instead of refused. The lr then rises to steps/warmup of optim.lr and never
    decays."""
    s, steps = cfg.schedule, cfg.train.steps
    if s.warmup_steps < steps:
        return []
    return [f"schedule.warmup_steps={s.warmup_steps} is not below train.steps={steps}: the lr rises to only "
            f"{steps / s.warmup_steps:.3g} x optim.lr={cfg.optim.lr:g} at the last step and never decays; set "
            f"schedule.warmup_steps below train.steps (e.g. {max(1, steps // 10)}, 10 %) to try the whole curve"]


def downstream_problem(cfg) -> str:
    """``eval.downstream`` entries the fine-tuning child would refuse (exit 2 at every due checkpoint, seen only in its
    log): an unknown task, a ``config`` or ``set``/``sweep``/``seeds`` the fine-tuning schema refuses (read exactly as
    the child reads them: trainer/finetune/__main__.py ``sweep_configs``), GLUE metrics that cannot apply, or a data
    folder that does not exist (relative paths: to this process's folder, where the child runs too). The task
    kinds' own file formats (jsonl, ner, squad, ...) are read by the child only: their readers import torch."""
    from trainer.finetune.config import load_finetune_config  # noqa: PLC0415  (it imports trainer.config)
    from trainer.finetune.sweep import parse_sweep  # noqa: PLC0415
    from trainer.finetune.tasks import ALIASES, GLUE, TASK_NAMES, glue_task, tsv_task_spec, with_metrics  # noqa

    for i, t in enumerate(cfg.eval.downstream):
        where = f"eval.downstream.{i} (task {t.task})"
        name = t.task.lower()
        if name not in TASK_NAMES and name not in ALIASES:
            return (f"eval.downstream.{i}.task={t.task!r}: no such fine-tuning task; choose one of "
                    f"{', '.join(TASK_NAMES)} (aliases: {', '.join(ALIASES)})")
        if not Path(t.data).is_dir():
            return (f"eval.downstream.{i}.data={t.data}: no such folder (the task's data, in its layout); every "
                    "fine-tuning of it would fail: give the folder, or remove the entry")
        extra = [f"train.seeds={t.seeds}"] if t.seeds is not None else []
        try:
            for point in parse_sweep(t.sweep):
                ft = load_finetune_config(t.config, [*t.set, *extra, *point])
                if name in GLUE or name in ALIASES:
                    if ft.task.metrics is not None:
                        with_metrics(glue_task(name), ft.task.metrics)
                elif name == "tsv" and ft.task.metrics is not None:
                    tsv_task_spec(ft.task)
        except ConfigError as err:
            return (f"{where}: its fine-tuning config is invalid (config {t.config or '(defaults)'}, set {t.set}, "
                    f"sweep {t.sweep}): {err}")
    return ""


def init_from_kind(path: Path) -> str | None:
    """What ``checkpoint.init_from`` names, as trainer/init_from.py ``init_source`` will read it, from file names
    only (that module imports torch): "checkpoint", "model folder", "hugging face", or None (nothing it can start
    from)."""
    from trainer.checkpoint_files import LATEST, find_latest, is_complete  # noqa: PLC0415  (standard library only)
    if not path.is_dir():
        return None
    if is_complete(path) or find_latest(path) is not None:
        return "checkpoint"
    if (path / LATEST).is_file() or any(path.glob("global_step*")):
        return None  # checkpoint markers but no complete checkpoint: init_source reads it as one, and finds none
    if (path / "model_config.json").is_file() and (path / "model.safetensors").is_file():
        return "model folder"
    return "hugging face" if (path / "config.json").is_file() else None


def _resumes(cfg) -> bool:
    """The run folder holds a complete checkpoint: ``--resume auto`` continues it and ignores ``init_from``."""
    from trainer.checkpoint_files import find_latest  # noqa: PLC0415
    root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path(cfg.run_dir) / "checkpoints"
    return root.is_dir() and find_latest(root) is not None


def path_problems(cfg) -> list[tuple[str, str]]:
    """(key, message) for each path the run reads at start that is missing or of the wrong kind: a few stat calls."""
    found = []
    init = cfg.checkpoint.init_from
    if init and init_from_kind(Path(init)) is None and not _resumes(cfg):
        what = "does not exist" if not Path(init).exists() else "is not a trainer checkpoint (no complete global_stepN)"
        found.append(("checkpoint.init_from", f"checkpoint.init_from={init} {what}, nor a model folder "
                      "(model_config.json + model.safetensors) or a Hugging Face folder (config.json): name a "
                      "checkpoint (global_stepN), a run's checkpoints folder, or such a folder"))
    if cfg.objective.name == "ernie":
        dlm = (cfg.objective.options or {}).get("dlm") or {}
        path = dlm.get("path") if isinstance(dlm, dict) else None
        if path and not Path(path).is_file():
            found.append(("objective.options.dlm.path", f"objective.options.dlm.path={path}: no such file "
                          "(the dialogues DLM trains on): give the file, or set objective.options.dlm: null to "
                          "train without DLM"))
    return found


def recipe_value(recipe_raw: dict | None, key: str):
    """The value a shipped recipe itself gives the dotted ``key`` (None when it gives none)."""
    node = recipe_raw
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def path_problem(cfg, recipe_raw: dict | None = None) -> str:
    """The first of ``path_problems`` to refuse. A path that is a shipped recipe's own placeholder (bert_base_phase2's
    phase-1 folder, ernie_base's data/dialogues.jsonl), left as the recipe gives it, is not refused: every shipped
    recipe must pass --check in a checkout without data; ``path_notes`` says it at start and in --check instead.
    ``recipe_raw``: the shipped recipe's values (``load_config``); None = the recipe ``cfg.recipe`` names, if any."""
    for key, message in path_problems(cfg):
        if recipe_raw is None:  # (a run's config.json fed back: its ``recipe`` names the recipe it came from)
            recipe_raw = _shipped_recipe(cfg.recipe)
        if recipe_value(recipe_raw, key) == _value(cfg, key):
            continue
        return message
    return ""


def _shipped_recipe(name: str | None) -> dict:
    """The shipped recipe ``name``'s own raw values ({} for none): read only when a path is missing."""
    from trainer.recipe_files import RECIPES_DIR, _read_yaml  # noqa: PLC0415
    path = RECIPES_DIR / f"{name}.yaml"
    return _read_yaml(path) if name and path.is_file() else {}


def path_notes(cfg) -> list[str]:
    return [f"{message} (the recipe's placeholder: this launch fails at start unless it exists by then)"
            for _, message in path_problems(cfg)]


def _value(cfg, key: str):
    if key == "checkpoint.init_from":
        return cfg.checkpoint.init_from
    return ((cfg.objective.options or {}).get("dlm") or {}).get("path")
