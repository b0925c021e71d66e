"""``mlm+nsp``: BERT. MLM plus next-sentence prediction on [CLS] (label 1 = B from another document)."""
from __future__ import annotations

from trainer.models import MLM, NSP, HeadSpec, ModelConfig

from .base import Objective, masked_positions, mlm_loss, pooled, prediction_count, sentence_loss
from .options import SentenceTaskOptions


class MlmNspObjective(Objective):
    name = "mlm+nsp"
    Options = SentenceTaskOptions
    head = NSP

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        return {MLM: HeadSpec("mlm"), self.head: HeadSpec("sequence", 2)}

    def loss(self, model, batch: dict):
        positions, labels = masked_positions(batch)
        out = self.forward_heads(model, batch, positions)
        m_loss, m_acc = mlm_loss(out[MLM], labels)
        s_loss, s_acc = sentence_loss(out[self.head], batch["sentence_label"])
        loss = m_loss + self.options.sentence_weight * s_loss
        n, rows = prediction_count(labels), batch["sentence_label"].numel()
        return loss, {"mlm_loss": pooled(m_loss, n), "mlm_acc": pooled(m_acc, n),
                      f"{self.head}_loss": pooled(s_loss, rows), f"{self.head}_acc": pooled(s_acc, rows)}
