"""Prediction heads and PretrainingModel, the encoder plus the heads an objective asks for.

An objective declares its heads as ``{name: HeadSpec(kind, num_labels)}``; PretrainingModel builds them under
``heads.<name>``. Export to Hugging Face finds heads by kind, not by name; import names them MLM / NSP / SOP / RTD
(the constants below), so objectives that use these names can continue from an imported model.
"""
import torch
from torch import nn

from trainer.models.config import MLM, NSP, RTD, SOP, HeadSpec, ModelConfig  # noqa: F401  (re-exported)
from trainer.models.encoder import Embeddings, Encoder, activation_fn, init_weights


class MLMHead(nn.Module):
    """Transform (H -> E, activation, LayerNorm) and a decoder tied to the E-wide input embeddings, plus a bias.

    Logits are computed only at ``positions`` (flat indices into B*T): with 15 % masking this is ~7x less decoder
    work than scoring every token, and the [N, V] logits are the largest activation of a BERT step.
    The decoder is an nn.Linear whose weight *is* the embedding Parameter (not a copy), as in Hugging Face, so the
    module that uses it owns it (ZeRO-3 gathers it for this module's forward) and the optimizer sees it once.
    It has ``cfg.padded_vocab_size`` outputs (a GEMM width that is a multiple of 64); the logits are cut back to
    ``cfg.vocab_size`` (a view: the loss's softmax reads the real columns only), so padding never wins an argmax,
    is never sampled and gets no gradient.
    """

    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding, transform_act: str | None = None):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.emb_size)
        self.act = activation_fn(transform_act or cfg.hidden_act)
        self.norm = nn.LayerNorm(cfg.emb_size, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.emb_size, cfg.padded_vocab_size)
        self.apply(lambda m: init_weights(m, cfg))
        self.decoder.weight = word_embeddings.weight
        self.vocab_size = cfg.vocab_size

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [B, T, H]; positions [N] flat indices into B*T -> logits [N, V]; None -> all positions [B, T, V]."""
        if positions is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        logits = self.decoder(self.norm(self.act(self.dense(hidden))))
        return logits[..., : self.vocab_size] if logits.shape[-1] != self.vocab_size else logits


class SequenceHead(nn.Module):
    """Classifier on the first ([CLS]) token through BERT's pooler (dense + tanh): NSP, SOP, later multi-class.

    No dropout between the pooler and the classifier: pretraining's sentence heads have none in BERT's
    ``get_next_sentence_output``, ALBERT's ``get_sentence_order_output``, ERNIE's ``next_sent_fc`` or transformers'
    ``BertPreTrainingHeads`` (fine-tuning classifiers, trainer/finetune/heads.py, keep theirs)."""

    def __init__(self, cfg: ModelConfig, num_labels: int = 2):
        super().__init__()
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.apply(lambda m: init_weights(m, cfg))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, H] -> logits [B, num_labels]."""
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


class TokenHead(nn.Module):
    """Per-token classifier: dense, activation, projection (ELECTRA's replaced-token detection, ERNIE
    capitalization)."""

    def __init__(self, cfg: ModelConfig, num_labels: int = 1):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation_fn(cfg.hidden_act)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.apply(lambda m: init_weights(m, cfg))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, H] -> logits [B, T, num_labels]."""
        return self.classifier(self.act(self.dense(hidden)))


def build_head(cfg: ModelConfig, spec: HeadSpec, encoder: Encoder) -> nn.Module:
    if spec.kind == "mlm":
        # RoBERTa's and ELECTRA's LM heads hard-code GELU in the transform whatever the encoder uses.
        act = "gelu" if cfg.family in ("roberta", "electra") else None
        return MLMHead(cfg, encoder.embeddings.word, transform_act=act)
    if spec.kind == "sequence":
        return SequenceHead(cfg, spec.num_labels)
    if spec.kind == "token":
        return TokenHead(cfg, spec.num_labels)
    raise ValueError(f"unknown head kind {spec.kind!r}: use 'mlm', 'sequence' or 'token'")


class PretrainingModel(nn.Module):
    """``PretrainingModel(cfg, heads)``: the encoder and the heads an objective declared.

    ``forward(input_ids, attention_mask=None, token_type_ids=None, extra_ids=None, mlm_positions=None,
    pack_ids=None, packing=None)`` returns
    ``{"hidden": [B, T, H], <head name>: logits}``: an 'mlm' head gives [N, V] at ``mlm_positions`` (flat indices
    into B*T, see ``flat_positions``; all positions [B, T, V] when None), a 'sequence' head [B, num_labels], a
    'token' head [B, T, num_labels]. One forward call computes everything, so a DeepSpeed engine can wrap it.
    """

    def __init__(self, cfg: ModelConfig, heads: dict[str, HeadSpec], encoder: Encoder | None = None):
        super().__init__()
        self.cfg = cfg
        self.head_specs = dict(heads)
        self.encoder = encoder if encoder is not None else Encoder(cfg)
        self.heads = nn.ModuleDict({name: build_head(cfg, spec, self.encoder) for name, spec in heads.items()})

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, extra_ids=None, mlm_positions=None,
                pack_ids=None, packing=None):
        hidden = self.encoder(input_ids, attention_mask, token_type_ids, extra_ids, pack_ids=pack_ids,
                              packing=packing)
        out = {"hidden": hidden}
        for name, head in self.heads.items():
            out[name] = head(hidden, mlm_positions) if self.head_specs[name].kind == "mlm" else head(hidden)
        return out


def flat_positions(mlm_positions: torch.Tensor, mlm_labels: torch.Tensor, seq_len: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch layout -> head layout: ``mlm_positions [B, P]`` (within the row, padded with 0) and ``mlm_labels
    [B, P]`` (-100 = padding) -> (flat positions [N] into B*T, labels [N]) for the N real predictions.

    Example: T=4, positions [[1, 3], [2, 0]], labels [[7, 9], [5, -100]] -> ([1, 3, 6], [7, 9, 5]).
    Boolean indexing is a device->host sync on GPU (N is data-dependent): the training objectives use
    ``mlm_targets`` instead; this is for tools and tests that want the real predictions only.
    """
    rows = torch.arange(mlm_positions.shape[0], device=mlm_positions.device).unsqueeze(1)
    keep = mlm_labels != -100
    return (mlm_positions + rows * seq_len)[keep], mlm_labels[keep]


def mlm_targets(mlm_positions: torch.Tensor, mlm_labels: torch.Tensor, seq_len: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``flat_positions`` without the device->host sync: all B*P entries, the padding ones kept with label -100
    (the losses ignore them) and pointing where the batch pads them, at their row's first token ([CLS], never
    masked). The MLM head then scores B*P rows instead of N: with P = max_predictions (~15 % of T plus rounding)
    that is a few percent more decoder rows for full rows, in exchange for a shape known on the host.

    Example: T=4, positions [[1, 3], [2, 0]], labels [[7, 9], [5, -100]] -> ([1, 3, 6, 4], [7, 9, 5, -100]).
    """
    rows = torch.arange(mlm_positions.shape[0], device=mlm_positions.device).unsqueeze(1)
    return (mlm_positions + rows * seq_len).reshape(-1), mlm_labels.reshape(-1)


def count_parameters(module: nn.Module, padding: bool = False) -> int:
    """Distinct parameters (tied and shared tensors counted once), as papers and Hugging Face count them: without the
    vocabulary padding rows (ModelConfig.pad_vocab_to) unless ``padding``, so a count equals the exported model's."""
    total = sum(p.numel() for p in module.parameters())
    if padding:
        return total
    pads = {}
    for m in module.modules():
        if isinstance(m, Embeddings):
            pads[id(m.word.weight)] = (m.word.weight, m.cfg.vocab_size)
        elif isinstance(m, MLMHead):
            pads[id(m.decoder.bias)] = (m.decoder.bias, m.vocab_size)
    return total - sum((t.shape[0] - vocab) * t[0].numel() for t, vocab in pads.values())
