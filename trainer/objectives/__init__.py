"""Pretraining objectives as plug-ins: one file each, one registry line each (below).

    objective:
      name: mlm+sop
      options: {sentence_weight: 1.0}      # validated by the objective's own Options model

Importing this package imports nothing heavy: objective modules (torch, trainer.models) load on first use, so the
config can be validated, and a registry entry can name a module another package ships (``"module:Class"``).
"""
from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

REGISTRY: dict[str, Any] = {}


def register(name: str):
    """``register("mlm+sop")(MlmSopObjective)``, or a ``"module:Class"`` string imported when first used."""
    def add(target):
        REGISTRY[name] = target
        return target
    return add


register("mlm")("trainer.objectives.mlm:MlmObjective")
register("mlm+nsp")("trainer.objectives.mlm_nsp:MlmNspObjective")
register("mlm+sop")("trainer.objectives.mlm_sop:MlmSopObjective")
register("electra")("trainer.objectives.electra:ElectraObjective")
register("ernie")("trainer.objectives.ernie:ErnieObjective")
register("ernie2")("trainer.objectives.ernie2:Ernie2Objective")


def objective_class(name: str):
    if name not in REGISTRY:
        raise ValueError(f"objective.name {name!r} is not registered; choose one of {sorted(REGISTRY)}")
    target = REGISTRY[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = REGISTRY[name] = getattr(importlib.import_module(module), attr)
    return target


class ObjectiveConfig(BaseModel):
    """The ``objective`` section: which registered objective, and its options."""

    model_config = ConfigDict(extra="forbid")

    name: str = "mlm"
    """a registered objective: mlm, mlm+nsp, mlm+sop, electra, ernie, ernie2"""
    options: dict[str, Any] = Field(default_factory=dict)
    """the objective's own settings (its Options model; unknown keys are rejected)"""

    @model_validator(mode="after")
    def _known_and_valid(self):
        cls = objective_class(self.name)
        options_model = getattr(cls, "Options", None)
        if options_model is not None:
            try:
                options_model.model_validate(self.options)
            except ValidationError as err:
                first = err.errors()[0]
                key = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"objective.options.{key}: {first['msg']} (objective {self.name!r} accepts "
                                 f"{sorted(options_model.model_fields)})") from None
        return self


def get_objective(cfg: ObjectiveConfig | dict):
    """The objective instance for a config section."""
    cfg = cfg if isinstance(cfg, ObjectiveConfig) else ObjectiveConfig.model_validate(cfg)
    cls = objective_class(cfg.name)
    if getattr(cls, "Options", None) is not None:
        return cls(cls.Options.model_validate(cfg.options))
    return cls(**cfg.options)


def check_data_requirements(objective_cfg: ObjectiveConfig, data_cfg) -> None:
    """Raise ValueError when the data section cannot feed the objective (e.g. mlm+sop on full-sentences)."""
    objective = get_objective(objective_cfg)
    needs = objective.data_requirements()
    formats = needs.get("formats")
    if formats and data_cfg.format not in formats:
        raise ValueError(f"objective {objective_cfg.name!r} trains on data.format {' or '.join(formats)}, but "
                         f"data.format is {data_cfg.format!r}")


__all__ = ["ObjectiveConfig", "get_objective", "check_data_requirements", "register", "REGISTRY"]
