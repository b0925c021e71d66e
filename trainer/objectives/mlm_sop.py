"""``mlm+sop``: ALBERT. MLM plus sentence-order prediction (label 1 = the two segments swapped)."""
from __future__ import annotations

from trainer.models import SOP

from .mlm_nsp import MlmNspObjective


class MlmSopObjective(MlmNspObjective):
    """Same heads and losses as ``mlm+nsp``; the negatives differ (built by the ``sop-pair`` format)."""

    name = "mlm+sop"
    head = SOP
