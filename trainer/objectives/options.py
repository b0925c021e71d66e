"""``objective.options`` of the objectives in this package: pydantic and the standard library only, so the registry
(``trainer/objectives/__init__.py``) validates a recipe's options without importing torch or the encoder. ERNIE's are
in ``trainer/ernie/config.py``."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class NoOptions(BaseModel):
    """An objective without settings: ``options`` must be empty."""

    model_config = ConfigDict(extra="forbid")


class SentenceTaskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sentence_weight: float = Field(1.0, ge=0.0)
    """weight of the sentence-level loss added to the MLM loss (BERT and ALBERT: 1)"""


class ElectraOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rtd_weight: float = Field(50.0, ge=0.0)
    """λ: weight of the discriminator loss (paper: 50)"""
    generator_fraction: float | None = Field(None, gt=0.0, le=1.0)
    """generator hidden size / discriminator's; None = model.generator_fraction (paper: 1/4 small and large, 1/3
    base)"""
    sharing: Literal["none", "embeddings", "all"] = "embeddings"
    """weights tied between generator and discriminator (paper: embeddings; all needs fraction 1)"""
    variant: Literal["electra", "electra-15", "replace-mlm", "all-tokens-mlm"] = "electra"
    temperature: float = Field(1.0, gt=0.0)
    """sampling temperature of the generator's softmax (paper: 1)"""
