"""``mlm``: masked language modelling alone (RoBERTa; BERT without NSP). Any sample format."""
from __future__ import annotations

from trainer.models import MLM, HeadSpec, ModelConfig

from .base import Objective, masked_positions, mlm_loss, pooled, prediction_count


class MlmObjective(Objective):
    name = "mlm"

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        return {MLM: HeadSpec("mlm")}

    def loss(self, model, batch: dict):
        positions, labels = masked_positions(batch)
        out = self.forward_heads(model, batch, positions)
        loss, acc = mlm_loss(out[MLM], labels)
        n = prediction_count(labels)
        return loss, {"mlm_loss": pooled(loss, n), "mlm_acc": pooled(acc, n)}
