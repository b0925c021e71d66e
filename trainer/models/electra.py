"""ELECTRA: a small generator (MLM) and the discriminator (replaced-token detection), trained jointly.

The generator is the same encoder with hidden size, feed-forward width and heads scaled by a fraction of the
discriminator's (paper, Table 6: small 1/4, base 1/3, large 1/4; heads = hidden / 64 as in the official code), and
the same embedding width E, so it can share the discriminator's embedding block (token, position, segment tables
and their LayerNorm, as the official code shares the ``embeddings`` scope). Where the generator's hidden size
differs from E it has its own E -> H projection. Sharing: ``none`` | ``embeddings`` (the paper's choice) | ``all``
(generator = discriminator encoder; needs fraction 1).

The loss and the sampling live in the ELECTRA objective (trainer/objectives), which calls:

- ``generator_logits(input_ids, attention_mask, token_type_ids, positions)`` -> [N, V] at flat positions into B*T
  (see heads.flat_positions), for the generator's MLM loss and for sampling replacements;
- ``discriminator_logits(input_ids, attention_mask, token_type_ids)`` -> [B, T], one logit per token (replaced = 1).

``forward(..., part="generator" | "discriminator")`` dispatches to them, so the objective can call a DeepSpeed engine
wrapping this module (``engine(..., part="generator")``) and ZeRO-3's hooks see a top-level forward. State dict keys
are ``generator.*`` and ``discriminator.*`` (shared tensors appear under both; export and import handle either).
"""
from typing import Literal

import torch
from torch import nn

from trainer.models.config import (DISCRIMINATOR_HEADS, GENERATOR_HEADS, MLM, RTD, HeadSpec,  # noqa: F401
                                   ModelConfig, generator_config, infer_generator_fraction)
from trainer.models.encoder import Encoder
from trainer.models.heads import PretrainingModel

ElectraSharing = Literal["none", "embeddings", "all"]


class ElectraPretrainingModel(nn.Module):
    """Generator + discriminator, with the embedding sharing of the paper. See the module docstring for the API."""

    def __init__(self, cfg: ModelConfig, generator_fraction: float | None = None,
                 sharing: ElectraSharing = "embeddings", generator_cfg: ModelConfig | None = None):
        super().__init__()
        gen_cfg = generator_cfg or generator_config(cfg, generator_fraction)
        self.cfg, self.generator_cfg, self.sharing = cfg, gen_cfg, sharing
        self.discriminator = PretrainingModel(cfg, DISCRIMINATOR_HEADS)
        if sharing == "all":
            if gen_cfg.model_dump() != cfg.replace(generator_fraction=None).model_dump():
                raise ValueError("ELECTRA sharing 'all' ties every generator weight to the discriminator, so the "
                                 "generator must be the same size: use generator fraction 1.0 or sharing "
                                 "'embeddings'")
            encoder = self.discriminator.encoder
        else:
            encoder = Encoder(gen_cfg)
            if sharing == "embeddings":
                if gen_cfg.emb_size != cfg.emb_size or gen_cfg.vocab_size != cfg.vocab_size:
                    raise ValueError(f"ELECTRA sharing 'embeddings' needs the same embedding size and vocabulary "
                                     f"(generator {gen_cfg.emb_size}x{gen_cfg.vocab_size}, discriminator "
                                     f"{cfg.emb_size}x{cfg.vocab_size})")
                encoder.embeddings = self.discriminator.encoder.embeddings
            elif sharing != "none":
                raise ValueError(f"ELECTRA sharing {sharing!r} is not one of none, embeddings, all")
        self.generator = PretrainingModel(gen_cfg, GENERATOR_HEADS, encoder=encoder)

    def generator_logits(self, input_ids, attention_mask=None, token_type_ids=None, positions=None, pack_ids=None,
                         packing=None) -> torch.Tensor:
        """Generator MLM logits [N, V] at ``positions`` (flat indices into B*T); all positions [B, T, V] if None."""
        hidden = self.generator.encoder(input_ids, attention_mask, token_type_ids, pack_ids=pack_ids, packing=packing)
        return self.generator.heads[MLM](hidden, positions)

    def discriminator_logits(self, input_ids, attention_mask=None, token_type_ids=None, pack_ids=None,
                             packing=None) -> torch.Tensor:
        """Replaced-token-detection logits [B, T] (> 0 means 'replaced')."""
        hidden = self.discriminator.encoder(input_ids, attention_mask, token_type_ids, pack_ids=pack_ids,
                                            packing=packing)
        return self.discriminator.heads[RTD](hidden).squeeze(-1)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None,
                part: Literal["generator", "discriminator"] = "discriminator", pack_ids=None, packing=None
                ) -> torch.Tensor:
        if part == "generator":
            return self.generator_logits(input_ids, attention_mask, token_type_ids, positions, pack_ids, packing)
        if part == "discriminator":
            return self.discriminator_logits(input_ids, attention_mask, token_type_ids, pack_ids, packing)
        raise ValueError(f"part must be 'generator' or 'discriminator', not {part!r}")
