"""``electra``: a small generator trained by MLM, and the discriminator by replaced-token detection (RTD).

One step (Clark et al. 2020, section 2):

1. the generator predicts the masked positions of the masked batch -> MLM loss;
2. replacements are *sampled* from its softmax with the Gumbel-max trick on detached logits, so no gradient flows
   through the sampling (the paper's choice: the discriminator loss does not train the generator);
3. the discriminator sees the original sequence with the masked positions replaced by the samples and labels every
   real token "replaced" (1) or "original" (0); a sample equal to the original token is labelled original;
4. loss = MLM + ``rtd_weight`` * RTD (λ = 50), RTD averaged over all real tokens ([CLS]/[SEP] included, as the
   official code weights by the input mask).

Variants (the paper's Table 5 ablations): ``electra-15`` computes RTD only at the masked ~15 %;
``replace-mlm`` trains the main model by MLM at the masked positions of the generator-corrupted input (no [MASK]
token at all); ``all-tokens-mlm`` predicts every token of that input, with the paper's copy mechanism
p(x_t) = D_t · 1[x_t = input_t] + (1 - D_t) · p_MLM(x_t), D_t = sigmoid of a per-token head. The ablations add an
MLM head to the discriminator (``ElectraAblationModel``); the plain variant uses ``ElectraPretrainingModel``
unchanged, whose discriminator is what export_hf writes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.models import MLM, RTD, ElectraPretrainingModel, HeadSpec, ModelConfig
from trainer.models.heads import build_head

from .base import Objective, binary_metrics, masked_positions, mlm_loss, packing, pooled, prediction_count
from .options import ElectraOptions


class ElectraAblationModel(ElectraPretrainingModel):
    """ELECTRA with an MLM head (and RTD head as the copy gate) on the discriminator, for the MLM ablations."""

    def __init__(self, cfg: ModelConfig, generator_fraction=None, sharing="embeddings"):
        super().__init__(cfg, generator_fraction, sharing)
        disc = self.discriminator
        disc.heads[MLM] = build_head(cfg, HeadSpec("mlm"), disc.encoder)
        disc.head_specs[MLM] = HeadSpec("mlm")

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None, part="discriminator",
                pack_ids=None, packing=None):
        if part == "discriminator_heads":
            return self.discriminator(input_ids, attention_mask, token_type_ids, None, positions, pack_ids=pack_ids,
                                      packing=packing)
        return super().forward(input_ids, attention_mask, token_type_ids, positions, part, pack_ids=pack_ids,
                               packing=packing)


def gumbel_sample(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """One draw per row from softmax(logits / T): argmax of logits/T plus Gumbel noise (no gradient)."""
    logits = logits.detach().float() / temperature
    u = torch.rand_like(logits).clamp_(1e-9, 1.0 - 1e-9)
    return (logits - torch.log(-torch.log(u))).argmax(-1)


class ElectraObjective(Objective):
    name = "electra"
    Options = ElectraOptions

    def heads(self, model_cfg: ModelConfig) -> dict[str, HeadSpec]:
        return {"generator." + MLM: HeadSpec("mlm"), "discriminator." + RTD: HeadSpec("token", 1)}

    def build_model(self, model_cfg: ModelConfig) -> torch.nn.Module:
        o = self.options
        cls = ElectraPretrainingModel if o.variant in ("electra", "electra-15") else ElectraAblationModel
        return cls(model_cfg, o.generator_fraction, o.sharing)

    def loss(self, model, batch: dict):
        o = self.options
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
        packed = packing(batch)
        B, T = ids.shape
        positions, labels = masked_positions(batch)

        gen_logits = model(ids, attention_mask=mask, token_type_ids=types, positions=positions, part="generator",
                           **packed)
        gen_loss, gen_acc = mlm_loss(gen_logits, labels)
        sampled = gumbel_sample(gen_logits, o.temperature)

        # positions has B*P entries; the padding ones (label -100) point at their row's [CLS] and write back the
        # token already there, so no entry a prediction needs is touched (masked_positions).
        valid = labels != -100
        original = ids.reshape(-1).clone()
        original[positions] = torch.where(valid, labels, original[positions])
        corrupted = original.clone()
        corrupted[positions] = torch.where(valid, sampled, original[positions])
        replaced = (corrupted != original).reshape(B, T)  # a sample equal to the original is "original"
        corrupted, original = corrupted.reshape(B, T), original.reshape(B, T)
        n = prediction_count(labels)
        metrics = {"gen_mlm_loss": pooled(gen_loss, n), "gen_mlm_acc": pooled(gen_acc, n),
                   "replaced_frac": torch.stack([replaced.float().sum(), mask.float().sum()]).detach()}

        if o.variant in ("electra", "electra-15"):
            disc_logits = model(corrupted, attention_mask=mask, token_type_ids=types, part="discriminator",
                                **packed)
            weight = mask.float()
            if o.variant == "electra-15":
                weight = (torch.zeros_like(weight).reshape(-1).index_put_((positions,), valid.float()).reshape(B, T)
                          * weight)
            per_token = F.binary_cross_entropy_with_logits(disc_logits.float(), replaced.float(), reduction="none")
            rtd_loss = (per_token * weight).sum() / weight.sum().clamp(min=1)
            metrics.update(rtd_loss=pooled(rtd_loss, weight.sum()), **binary_metrics(disc_logits, replaced, weight, "rtd"))
            return gen_loss + o.rtd_weight * rtd_loss, metrics

        if o.variant == "replace-mlm":
            out = model(corrupted, attention_mask=mask, token_type_ids=types, positions=positions,
                        part="discriminator_heads", **packed)
            main_loss, main_acc = mlm_loss(out[MLM], labels)
            main_n = n
        else:  # all-tokens-mlm with the copy mechanism
            # Every position is scored and padding weighted 0 (a nonzero() of the real ones would be a device sync).
            every = torch.arange(B * T, device=ids.device)
            real = mask.reshape(-1).float()
            out = model(corrupted, attention_mask=mask, token_type_ids=types, positions=every,
                        part="discriminator_heads", **packed)
            target = original.reshape(-1)
            log_p_mlm = F.log_softmax(out[MLM].float(), -1).gather(1, target[:, None]).squeeze(1)
            copy_logit = out[RTD].float().reshape(-1)
            same = (corrupted.reshape(-1) == target).float()
            # log(D * same + (1 - D) * p_mlm), in log space for stability
            log_copy = F.logsigmoid(copy_logit) + torch.log(same.clamp(min=1e-30))
            log_gen = F.logsigmoid(-copy_logit) + log_p_mlm
            main_n = real.sum()
            count = main_n.clamp(min=1)
            main_loss = -(torch.logaddexp(log_copy, log_gen) * real).sum() / count
            main_acc = ((out[MLM].argmax(-1) == target).float() * real).sum().detach() / count
        metrics.update(mlm_loss=pooled(main_loss, main_n), mlm_acc=pooled(main_acc, main_n))
        return gen_loss + main_loss, metrics
