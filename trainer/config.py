"""The typed run config: YAML -> ``RunConfig``, one pydantic model per concern, validated before any process does
real work.

Sections owned elsewhere (``model``, ``data``, ``objective``, ``optim``, ``schedule``) are defined next to their code;
the sections the trainer owns (``train``, ``checkpoint``, ``logging``) below, ``deepspeed`` in
config_sections.py (the fine-tuning config shares it); recipe files are read by recipe_files.py. Every model forbids
unknown keys, so a typo fails with the key's dotted path instead of being silently ignored. Every section imports
only pydantic and the standard library (and YAML here): validating a config, ``--check`` included, imports neither
torch, nor DeepSpeed, nor the encoder, so it answers in well under a second, also on a login node without torch.

Usage::

    cfg = load_config("trainer/recipes/tiny_roberta.yaml", overrides=["optim.lr=4e-4"], world_size=2)
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from trainer.config_checks import (downstream_problem, ignored_setting_problem, path_notes, path_problem,
                                   schedule_notes, schedule_problem)
from trainer.config_error import ConfigError  # noqa: F401 (defined apart, re-exported here: see that module)
from trainer.config_sets import apply_override  # (also re-exported: trainer.config.apply_override)
from trainer.config_sections import DeepSpeedConfig, _Section  # noqa: F401 (re-exported)
from trainer.recipe_files import (RECIPES_DIR, _read_yaml, inherited_values,  # noqa: F401 (re-exported)
                                  resolve_recipe)
from trainer.data.config import DataConfig
from trainer.ds_json import ds_config_path, grad_accum_problem, offload_problem, precision, read_ds_json
from trainer.finetune.downstream import EvalConfig
from trainer.models.config import ModelConfig
from trainer.models.presets import get_preset
from trainer.objectives import ObjectiveConfig, check_data_requirements
from trainer.optim.config import OptimConfig, ScheduleConfig



class TrainConfig(_Section):
    steps: int = Field(gt=0)
    """Optimizer steps of the whole run (the schedule decays to its end value at this step)."""
    global_batch_size: int = Field(gt=0)
    """Sequences per optimizer step over all ranks (RoBERTa: 8192)."""
    micro_batch_size: int = Field(gt=0)
    """The most sequences per forward/backward on one rank (a per-GPU memory ceiling): the run uses the largest
    micro-batch not above it that divides global / data-parallel size (``batch_plan``), and says so at start."""
    gradient_accumulation_steps: int | None = Field(default=None, gt=0)
    """None = global / (micro x data-parallel size); if given, micro = global / (this x data-parallel size), which
    must be whole and not above micro_batch_size."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate on the held-out split every N steps (0 = never)."""
    eval_batches: int = Field(default=4, gt=0)
    """Size of one evaluation in steps' worth of samples: eval_batches x global_batch_size held-out samples, a fixed
    shuffled set split over the ranks like a training step (eval_batches x accumulation micro-batches per rank), so
    the same samples at any world size. ERNIE objectives: eval_batches micro-batches per rank."""
    max_nonfinite_in_a_row: int = Field(default=5, gt=0)
    """Stop the run after this many consecutive steps whose loss or gradient was NaN/Inf (each one is skipped)."""
    stop_at_step: int | None = Field(default=None, gt=0)
    """End this launch after this step with a checkpoint (status "stopped"), leaving the schedule of ``steps`` as it
    is: for fixed-length allocations; the next launch with --resume auto continues as if never stopped."""


class CheckpointConfig(_Section):
    every_steps: int = Field(default=1000, ge=0)
    """Save every N steps (0 = only at the end and on preemption)."""
    keep_last: int = Field(default=3, gt=0)
    """Periodic checkpoints kept (multiples of every_steps or of a downstream task's every_steps), plus the newest of
    all (a preemption's, stop_at_step's) and, during a NaN/Inf streak, the one saved before it; older ones are deleted
    after a newer one is complete (trainer/checkpoint.py prune)."""
    dir: str | None = None
    """None = RUN_DIR/checkpoints."""
    save_at_end: bool = True
    init_from: str | None = None
    """Start a fresh run from these weights (a checkpoint folder, a run's checkpoints folder, our model folder or a
    local Hugging Face folder of the five families; optimizer, schedule and data position start over), e.g. BERT
    phase 2 (seq 512) from phase 1 (seq 128), or continued pretraining of a released model. Heads the source lacks
    start new; other sizes or a missing encoder tensor stop the run. Ignored when resuming."""
    lock_stale_s: float = Field(default=60.0, ge=1.0)
    """RUN_DIR/run.lock (one launch per run folder, trainer/run_lock.py): a lock whose heartbeat (every
    min(10 s, this / 6)) does not change for this long, by the new launch's own clock, is taken over; one whose
    heartbeat moves refuses the launch."""


class LoggingConfig(_Section):
    every_steps: int = Field(default=10, gt=0)
    """Console, TensorBoard and metrics.jsonl get one record every N steps."""
    tensorboard: bool = True
    progress_bar: bool | Literal["auto"] = "auto"
    """The tqdm bar on rank 0's stderr: auto = only when stderr is a terminal (a Slurm job log got ~40 MB of bar
    frames over 500k steps), true forces it, false hides it."""
    peak_tflops: float | None = Field(default=None, gt=0)
    """Per-rank peak for MFU. None = measure a fp32 matmul on this device once at start-up (~0.3 s)."""


class RunConfig(_Section):
    """A whole run: what ``load_config`` returns and ``Trainer.cfg`` holds."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    run_dir: str
    """Where metrics, status, config.json and (by default) checkpoints of the run go."""
    seed: int = Field(default=1234, ge=0, lt=2**32)
    """Weights, dropout and sample order. Below 2**32: numpy's legacy seeding takes no more, and a sample's key
    holds 48 bits of it (trainer/data/dataset.py ``sample_key``)."""
    train: TrainConfig
    optim: OptimConfig
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Downstream fine-tuning of checkpoint copies while pretraining runs (trainer/finetune/downstream.py)."""
    recipe: str | None = None
    """The recipe's name (its file's stem), filled in by ``load_config``."""
    data: DataConfig
    model: ModelConfig
    objective: ObjectiveConfig

    @model_validator(mode="after")
    def _held_out_split_supported(self):
        if self.data.valid_split > 0 and self.objective.name.startswith("ernie"):
            raise ValueError(f"data.valid_split={self.data.valid_split}: the held-out split is not supported by the "
                             f"'{self.objective.name}' objective yet (its tasks read neighbouring documents); set "
                             "data.valid_split: 0 and evaluate on data.valid_corpora")
        return self


# --- YAML, recipes and --set overrides ---------------------------------------------------------------------------

def _resolve_from_data(raw: dict) -> None:
    """``model.vocab_size: auto`` / ``model.pad_token_id: auto`` -> the tokenizer's, found through the manifest of
    the first training corpus, so one recipe fits any tokenizer data prep made."""
    model = raw.get("model")
    if not isinstance(model, dict) or "auto" not in (model.get("vocab_size"), model.get("pad_token_id")):
        return
    try:
        prefix = raw["data"]["corpora"][0]["prefix"]
    except (KeyError, IndexError, TypeError):
        raise ConfigError("model.vocab_size/pad_token_id: auto needs data.corpora[0].prefix") from None
    # imported here, only for `auto`: the tokenizer module loads numpy and HF tokenizers, which validation avoids
    from data_prep.manifest import read_manifest, tokenizer_dir
    try:
        tok = read_manifest(prefix)["tokenizer"]
        model = dict(model)
        if model.get("vocab_size") == "auto":
            model["vocab_size"] = tok["vocab_size"]
        if model.get("pad_token_id") == "auto":
            from data_prep.tokenizer import load_tokenizer
            model["pad_token_id"] = load_tokenizer(tokenizer_dir(prefix)).pad_id
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"model.vocab_size/pad_token_id: auto: {err}") from None
    raw["model"] = model


def _resolve_model_preset(raw: dict) -> None:
    """``model: {preset: roberta-base, dropout: 0.0}`` -> the full ModelConfig fields from the presets table."""
    model = raw.get("model")
    if isinstance(model, dict) and "preset" in model:
        model = dict(model)
        name = model.pop("preset")
        try:
            preset = get_preset(name, **model)
        except (KeyError, ValueError, TypeError) as err:
            raise ConfigError(f"model.preset={name!r}: {err}") from err
        raw["model"] = preset.model_dump()


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid config ({err.error_count()} error(s)):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        hint = " (unknown key: check its spelling, or remove it)" if e["type"] == "extra_forbidden" else ""
        given = "" if e["type"] in ("missing", "extra_forbidden") else f" (got {e.get('input')!r})"
        lines.append(f"  {key}: {e['msg']}{given}{hint}")
    return "\n".join(lines)


def batch_plan(train: TrainConfig, world_size: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) of ``train`` on ``world_size`` data-parallel ranks.

    ``train.micro_batch_size`` is a per-GPU ceiling (what fits in one device's memory): the micro-batch used is the
    largest one not above it that divides the per-rank share of the global batch, so a recipe runs unchanged at any
    world size that divides its global batch. Examples: electra_small (global 128, ceiling 128) on 8 ranks: share 16
    -> 16 x 1; ernie2_base (768, ceiling 32) on 16 ranks: share 48 -> 24 x 2 (32 does not divide 48); on 64: 12 x 1.
    An explicit ``train.gradient_accumulation_steps`` is kept: micro = share / it, which must be whole and within the
    ceiling. Refused (ConfigError): a global batch that the ranks cannot share evenly, naming the world sizes that can.
    """
    g, ceiling = train.global_batch_size, train.micro_batch_size
    if g % world_size:
        works = [n for n in range(1, g + 1) if g % n == 0]
        shown = ", ".join(map(str, works[:24])) + (", ..." if len(works) > 24 else "")
        raise ConfigError(
            f"train.global_batch_size={g} cannot be split evenly over {world_size} data-parallel ranks ({g} / "
            f"{world_size} = {g / world_size:.4g} sequences each); world sizes that work with it: {shown}. Launch on "
            f"one of those, or set train.global_batch_size to a multiple of {world_size}")
    share = g // world_size
    accum = train.gradient_accumulation_steps
    if accum is not None:
        if share % accum or share // accum > ceiling:
            raise ConfigError(
                f"train.gradient_accumulation_steps={accum} does not fit: train.global_batch_size={g} over "
                f"{world_size} data-parallel ranks is {share} sequences per rank, which is not {accum} micro-batches "
                f"of at most train.micro_batch_size={ceiling}; set gradient_accumulation_steps: null to have it "
                "chosen, or change it")
        return share // accum, accum
    micro = max(m for m in range(1, min(ceiling, share) + 1) if share % m == 0)
    return micro, share // micro


def validate_batch(cfg: RunConfig, world_size: int) -> int:
    """Check that the global batch can be split over ``world_size`` ranks (``batch_plan``); returns the accumulation
    steps to use."""
    return batch_plan(cfg.train, world_size)[1]


def ceiling_note(train: TrainConfig, world_size: int) -> str:
    """What a run says once at start when it uses a micro-batch below the ceiling ("" when it uses the ceiling)."""
    micro, accum = batch_plan(train, world_size)
    if micro == train.micro_batch_size:
        return ""
    share = train.global_batch_size // world_size
    return (f"train.micro_batch_size={train.micro_batch_size} is a per-GPU ceiling: on {world_size} ranks each rank's "
            f"share of train.global_batch_size={train.global_batch_size} is {share} sequences, so the micro-batch is "
            f"{micro} (the largest not above the ceiling that divides {share}) x accumulation {accum}")


def load_config(path_or_name: str, overrides: list[str] | tuple[str, ...] = (),
                world_size: int | None = None) -> RunConfig:
    """Read, merge, override and validate a run config; ``world_size`` also checks the batch arithmetic."""
    path = resolve_recipe(path_or_name)
    raw = _read_yaml(path)
    # a shipped recipe's own values, before the overrides: its placeholder paths pass (config_checks.path_problem),
    # its settings do under a kind or optimizer overridden (ignored_setting_problem). A user's file passes the settings
    # it inherits through `base:` (it did not write them: a `base: bert_base_phase1` file with kind linear was refused
    # for the base's power 0.5, with "remove it" for a key the file does not have), but not the base's placeholder
    # paths: its launch needs them as much as --check does (both found by the diff reviews)
    shipped = copy.deepcopy(raw) if path.parent == RECIPES_DIR else None
    inherited = shipped if shipped is not None else inherited_values(path)
    for override in overrides:
        apply_override(raw, override)
    raw.setdefault("recipe", path.stem)
    return config_from_dict(raw, source=str(path), world_size=world_size, recipe_raw=shipped, inherited=inherited)


def config_from_dict(raw: dict, source: str = "config", world_size: int | None = None,
                     recipe_raw: dict | None = None, inherited: dict | None = None) -> RunConfig:
    raw = dict(raw)
    _resolve_from_data(raw)
    # before the preset fills in every model field: only what the config itself sets can disagree
    problem = unused_setting_problem(raw) or ignored_setting_problem(raw, inherited or recipe_raw)
    if problem:  # accepted and echoed by --check, and without effect: a run trained with other values than it said
        raise ConfigError(f"{source}: {problem}")
    _resolve_model_preset(raw)
    _follow_objective(raw)
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None
    ds_path = ds_config_path(cfg)
    if not ds_path.exists():
        raise ConfigError(f"{source}: deepspeed.config: {ds_path} does not exist (see ds_configs/)")
    try:
        ds_json = read_ds_json(cfg)
        precision(cfg, ds_json)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    problem = offload_problem(cfg.optim, ds_json, str(ds_path))
    if problem:  # LAMB under optimizer offload: refused before any process starts (exit 2)
        raise ConfigError(f"{source}: {problem}")
    problem = grad_accum_problem(cfg, ds_json, str(ds_path))
    if problem:  # e.g. zero2_bf16.json at zero_stage 0: DeepSpeed would raise on every rank after start-up
        raise ConfigError(f"{source}: {problem}")
    try:  # the objective says which sample format it needs; a mismatch with data fails here, not at step 1
        check_data_requirements(cfg.objective, cfg.data)
    except ValueError as err:
        raise ConfigError(f"{source}: objective/data mismatch: {err}") from None
    problem = positions_problem(cfg)
    if problem:  # else an IndexError in the position embedding at step 1
        raise ConfigError(f"{source}: {problem}")
    problem = dlm_valid_path_problem(cfg)
    if problem:  # else found when the evaluation set is built, after launch
        raise ConfigError(f"{source}: {problem}")
    problem = continual_plan_problem(cfg)
    if problem:  # ERNIE 2.0: found after launch (a traceback at the first batch) without this
        raise ConfigError(f"{source}: {problem}")
    # trainer/config_checks.py: a decay ending at lr 0 before train.steps (else trained at lr 0, unsaid), the
    # fine-tunings eval.downstream starts (else each fails at its checkpoint, hours in) and the paths read at start
    # (else a traceback after the model is built): a few stat calls and, with downstream entries, a YAML read each
    problem = schedule_problem(cfg) or (downstream_problem(cfg) if cfg.eval.downstream else "") or \
        path_problem(cfg, recipe_raw)
    if problem:
        raise ConfigError(f"{source}: {problem}")
    if world_size is not None:
        try:
            validate_batch(cfg, world_size)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
    return cfg


def unused_setting_problem(raw: dict) -> str:
    """Settings that the objective would take from elsewhere, set to another value than it uses: ERNIE masks by
    ``objective.options.knowledge_masking``, never ``data.masking`` (its defaults, as a run's resolved config holds
    them, pass); ELECTRA sizes its generator by ``objective.options.generator_fraction`` when set, over a
    ``model.generator_fraction`` the config sets itself (a preset's is replaced, ``_follow_objective``)."""
    from trainer.data.config import MaskingConfig
    objective = raw.get("objective") if isinstance(raw.get("objective"), dict) else {}
    name, options = objective.get("name"), objective.get("options") or {}
    masking = (raw.get("data") or {}).get("masking") if isinstance(raw.get("data"), dict) else None
    if name in ("ernie", "ernie2") and masking is not None:
        defaults = MaskingConfig().model_dump(mode="json")
        changed = [k for k, v in masking.items() if defaults.get(k, object()) != v] if isinstance(masking, dict) \
            else ["(the section)"]
        if changed:
            return (f"{', '.join(f'data.masking.{k}' for k in changed)}: objective {name} does not read "
                    "data.masking, so the setting never had an effect: remove it (a run in flight then continues "
                    "unchanged). ERNIE masks by objective.options.knowledge_masking (its stages, rate, "
                    "max_predictions_per_seq): set those to change its masking")
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    ours, theirs = options.get("generator_fraction"), model.get("generator_fraction")
    # a model section without a preset is a resolved one (a run's config.json): its generator_fraction is the
    # preset's, filled in, not the user's (before 2026-12-05 it did not follow the objective's)
    if name == "electra" and "preset" in model and ours is not None and theirs is not None and \
            not _same_number(ours, theirs):
        return (f"model.generator_fraction={theirs} and objective.options.generator_fraction={ours} disagree: the "
                f"objective's {ours} sizes the generator, as it did for every run so far; remove "
                "model.generator_fraction (a run in flight then continues unchanged), or change "
                "objective.options.generator_fraction for a new run")
    return ""


def _follow_objective(raw: dict) -> None:
    """The resolved model section says the generator size the objective builds: ELECTRA's
    ``objective.options.generator_fraction``, when set, replaces the preset's ``model.generator_fraction`` (so --check,
    the run's config.json and a config fed back from it agree with the model)."""
    objective = raw.get("objective") if isinstance(raw.get("objective"), dict) else {}
    fraction = (objective.get("options") or {}).get("generator_fraction")
    if objective.get("name") == "electra" and fraction is not None and isinstance(raw.get("model"), dict):
        raw["model"] = {**raw["model"], "generator_fraction": fraction}


def _same_number(a, b) -> bool:
    try:
        return abs(float(a) - float(b)) <= 1e-9
    except (TypeError, ValueError):
        return False  # (pydantic names the bad value)


def positions_problem(cfg: RunConfig) -> str:
    """A ``data.max_seq_length`` longer than the model's learned position table holds ("" when it fits): position
    ids run from ``model.position_offset`` to offset + length - 1 (RoBERTa: 2..513 of 514 rows)."""
    rows, offset = cfg.model.max_position_embeddings, cfg.model.position_offset
    if cfg.data.max_seq_length <= rows - offset:
        return ""
    return (f"data.max_seq_length={cfg.data.max_seq_length} is longer than model.max_position_embeddings={rows}"
            + (f" minus model.position_offset={offset}" if offset else "") + f" allows ({rows - offset} positions): "
            f"lower data.max_seq_length or raise model.max_position_embeddings")


def dlm_valid_path_problem(cfg: RunConfig) -> str:
    """ERNIE 1.0: ``objective.options.dlm.valid_path`` names no file although evaluation reads it (held-out corpora
    and ``train.eval_every`` set); "" otherwise. Checked here, unlike the data's other paths (which --check on a
    login node without the data must accept), because the run would otherwise train until it builds its
    evaluation set."""
    if cfg.objective.name != "ernie" or not (cfg.data.valid_corpora and cfg.train.eval_every):
        return ""
    path = ((cfg.objective.options or {}).get("dlm") or {}).get("valid_path")
    if path is None or Path(path).is_file():
        return ""
    return (f"objective.options.dlm.valid_path={path}: no such file (held-out dialogues for evaluation); give the "
            "file, or remove the key to evaluate on MLM batches only")


def continual_plan(cfg: RunConfig):
    """ERNIE 2.0's ``ContinualPlan`` of ``cfg`` (numpy only, no torch), or None for other objectives."""
    if cfg.objective.name != "ernie2":
        return None
    from trainer.ernie.continual import ContinualPlan  # noqa: PLC0415  (numpy: only for ernie2)
    from trainer.objectives import options_model  # noqa: PLC0415

    return ContinualPlan(options_model("ernie2").model_validate(cfg.objective.options).continual)


def continual_plan_problem(cfg: RunConfig) -> str:
    """A ``train.steps`` longer than the ERNIE 2.0 continual plan (the plan has no task for the steps after it);
    "" when it fits. A shorter one is allowed (a short trial run) and said at start (``start_notes``)."""
    plan = continual_plan(cfg)
    if plan is None or cfg.train.steps <= plan.total_steps:
        return ""
    return (f"train.steps={cfg.train.steps} but the continual plan (objective.options.continual.tasks) has "
            f"{plan.total_steps} steps: set train.steps: {plan.total_steps}, or raise the tasks' iterations\n"
            f"{plan.describe()}")


def start_notes(cfg: RunConfig) -> list[str]:
    """What a run says once at start (and ``--check`` prints) about settings that are valid but easy to get wrong
    unnoticed."""
    notes = [*schedule_notes(cfg), *path_notes(cfg)]
    plan = continual_plan(cfg)
    if plan is not None and cfg.train.steps < plan.total_steps:
        cut = [f"{name} {n} of {plan.iterations()[name]}"
               for name, n in _plan_iterations(plan, cfg.train.steps).items() if n < plan.iterations()[name]]
        notes.append(f"train.steps={cfg.train.steps} ends the continual plan ({plan.total_steps} steps) early: "
                     f"stage(s) after step {cfg.train.steps} do not train; iterations trained: {', '.join(cut)}")
    return notes


def evaluation_note(cfg: RunConfig, evaluates: bool) -> str:
    """What a run says once at start when ``train.eval_every`` and the evaluation data disagree ("" when they agree):
    ``evaluates`` is whether the objective's components have held-out batches. The papers' recipes set eval_every
    but name no held-out data (it is the user's), so without this line they would train without evaluating unsaid."""
    if cfg.train.eval_every and not evaluates:
        how = ("data.valid_corpora (ERNIE reads no held-out split of data.corpora)" if
               cfg.objective.name.startswith("ernie") else
               "data.valid_split (e.g. 0.005: 0.5 % of the documents of data.corpora held out) or data.valid_corpora")
        return (f"evaluation is off: train.eval_every={cfg.train.eval_every} but no held-out data is set; to evaluate, "
                f"set {how}")
    if evaluates and not cfg.train.eval_every:
        return "evaluation is off: held-out data is set but train.eval_every is 0; set train.eval_every to evaluate"
    return ""


def _plan_iterations(plan, steps: int) -> dict[str, int]:
    """Iterations each task of ``plan`` trains in its first ``steps`` steps."""
    masks = plan.masks[:steps]
    return {name: int(((masks >> k) & 1).sum()) for k, name in enumerate(plan.names)}


def checkpoint_dir(cfg: RunConfig) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path(cfg.run_dir) / "checkpoints"
