"""``mlm+nsp``: BERT. MLM plus next-sentence prediction on [CLS] (label 1 = B from another document)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trainer.models import MLM, NSP, HeadSpec, ModelConfig

from .base import Objective, masked_positions, mlm_loss, sentence_loss


class SentenceTaskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sentence_weight: float = Field(1.0, ge=0.0)
    """weight of the sentence-level loss added to the MLM loss (BERT and ALBERT: 1)"""


class MlmNspObjective(Objective):
    name = "mlm+nsp"
    Options = SentenceTaskOptions
    formats = ("segment-pair", "sentence-pair")
    labels = ("mlm_positions", "mlm_labels", "sentence_label")
    head = NSP

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        return {MLM: HeadSpec("mlm"), self.head: HeadSpec("sequence", 2)}

    def loss(self, model, batch: dict):
        positions, labels = masked_positions(batch)
        out = self.forward_heads(model, batch, positions)
        m_loss, m_acc = mlm_loss(out[MLM], labels)
        s_loss, s_acc = sentence_loss(out[self.head], batch["sentence_label"])
        loss = m_loss + self.options.sentence_weight * s_loss
        return loss, {"mlm_loss": m_loss.detach(), "mlm_acc": m_acc, f"{self.head}_loss": s_loss.detach(),
                      f"{self.head}_acc": s_acc}
