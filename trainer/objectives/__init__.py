"""Pretraining objectives as plug-ins: one file each, one registry line each (below).

    objective:
      name: mlm+sop
      options: {sentence_weight: 1.0}      # validated by the objective's own Options model

A registry line names the objective class, the pydantic model of its ``options`` and the sample formats it trains on.
The class (torch, ``trainer.models``) is imported on first use; the options models and formats are all config
validation needs, so validating a recipe imports neither torch nor the encoder. Another package adds its own
objective the same way (``register("mine", options=MyOptions)(MyObjective)``, or ``"module:Class"`` strings) before
calling ``trainer.pretrain.main``; an objective that builds its own samples has a ``build_components`` method
(ERNIE's do), DESIGN.md "Objectives".
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


@dataclass
class Registered:
    """One objective of the registry."""

    objective: str | type
    """The class, or ``"module:Class"`` (imported when first used)."""
    options: str | type[BaseModel] | None = None
    """The pydantic model of ``objective.options``, or ``"module:Model"`` (pydantic only); None: the class's
    ``Options`` (a class registered as a string must name its options here)."""
    formats: tuple[str, ...] | None = None
    """The ``data.format`` values it trains on (None: any)."""


REGISTRY: dict[str, Registered] = {}


def register(name: str, options: str | type[BaseModel] | None = None, formats: tuple[str, ...] | None = None):
    """``register("mlm+sop", options=..., formats=("sop-pair",))("module:Class")``, or with a class."""
    def add(target):
        REGISTRY[name] = Registered(target, options, formats)
        return target
    return add


_OPTIONS = "trainer.objectives.options"
register("mlm", options=f"{_OPTIONS}:NoOptions")("trainer.objectives.mlm:MlmObjective")
register("mlm+nsp", options=f"{_OPTIONS}:SentenceTaskOptions", formats=("segment-pair", "sentence-pair"))(
    "trainer.objectives.mlm_nsp:MlmNspObjective")
register("mlm+sop", options=f"{_OPTIONS}:SentenceTaskOptions", formats=("sop-pair",))(
    "trainer.objectives.mlm_sop:MlmSopObjective")
register("electra", options=f"{_OPTIONS}:ElectraOptions")("trainer.objectives.electra:ElectraObjective")
register("ernie", options="trainer.ernie.config:ErnieOptions", formats=("doc-sentences", "segment-pair"))(
    "trainer.objectives.ernie:ErnieObjective")
register("ernie2", options="trainer.ernie.config:Ernie2Options", formats=("doc-sentences",))(
    "trainer.objectives.ernie2:Ernie2Objective")


def _load(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _entry(name: str) -> Registered:
    if name not in REGISTRY:
        raise ValueError(f"objective.name {name!r} is not registered; choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]


def objective_class(name: str) -> type:
    """The objective class registered as ``name`` (imports its module: torch)."""
    entry = _entry(name)
    if isinstance(entry.objective, str):
        entry.objective = _load(entry.objective)
    return entry.objective


def options_model(name: str) -> type[BaseModel]:
    """The pydantic model of ``objective.options`` for ``name`` (pydantic only, unless the objective was registered
    as a class without ``options=``)."""
    entry = _entry(name)
    if entry.options is None:
        entry.options = objective_class(name).Options
    elif isinstance(entry.options, str):
        entry.options = _load(entry.options)
    return entry.options


class ObjectiveConfig(BaseModel):
    """The ``objective`` section: which registered objective, and its options."""

    model_config = ConfigDict(extra="forbid")

    name: str = "mlm"
    """a registered objective: mlm, mlm+nsp, mlm+sop, electra, ernie, ernie2"""
    options: dict[str, Any] = Field(default_factory=dict)
    """the objective's own settings (its Options model; unknown keys are rejected)"""

    @model_validator(mode="after")
    def _known_and_valid(self):
        model = options_model(self.name)
        try:
            model.model_validate(self.options)
        except ValidationError as err:
            first = err.errors()[0]
            key = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"objective.options.{key}: {first['msg']} (objective {self.name!r} accepts "
                             f"{sorted(model.model_fields)})") from None
        return self


def get_objective(cfg: ObjectiveConfig | dict):
    """The objective instance for a config section."""
    cfg = cfg if isinstance(cfg, ObjectiveConfig) else ObjectiveConfig.model_validate(cfg)
    return objective_class(cfg.name)(options_model(cfg.name).model_validate(cfg.options))


def check_data_requirements(objective_cfg: ObjectiveConfig, data_cfg) -> None:
    """Raise ValueError when the data section cannot feed the objective (e.g. mlm+sop on full-sentences)."""
    formats = _entry(objective_cfg.name).formats
    if formats and data_cfg.format not in formats:
        raise ValueError(f"objective {objective_cfg.name!r} trains on data.format {' or '.join(formats)}, but "
                         f"data.format is {data_cfg.format!r}")


__all__ = ["ObjectiveConfig", "Registered", "REGISTRY", "register", "objective_class", "options_model",
           "get_objective", "check_data_requirements"]
