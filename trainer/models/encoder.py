"""The one Transformer encoder behind BERT, RoBERTa, ALBERT, ELECTRA and ERNIE; every difference is a ModelConfig field.

Embeddings (token E-wide, learned positions, segments, optional extra tables, LayerNorm, dropout) -> optional E->H
projection (ALBERT/ELECTRA factorization) -> L post-LN layers (fused QKV projection + SDPA, GELU feed-forward).

Cross-layer sharing is structural, not a flag checked per step: the encoder stores ``attention`` and ``ffn`` as
ModuleLists of length L or 1, and layer i uses entry ``i`` or ``0``. So 'all' stores exactly one layer's tensors
(the state dict has one copy) and the optimizer sees them once.
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.models.config import ModelConfig
from trainer.models.kernels import Packing, block_mask, pack, varlen_attention

RECOMPILE_LIMIT = 32
"""Variants of one compiled block that dynamo may compile (``Encoder.compile_layers``); dynamo's default is 8."""


def activation_fn(name: str):
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unknown activation {name!r}")


class Embeddings(nn.Module):
    """Sum of token, position, segment and extra embeddings (all E wide), then LayerNorm and dropout."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = cfg.emb_size
        self.cfg = cfg
        self.word = nn.Embedding(cfg.padded_vocab_size, width, padding_idx=cfg.pad_token_id)
        self.position = nn.Embedding(cfg.max_position_embeddings, width)
        self.token_type = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.extra = nn.ModuleDict({name: nn.Embedding(rows, width) for name, rows in cfg.extra_embeddings.items()})
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids, position_ids, token_type_ids=None, extra_ids=None):
        extra_ids = extra_ids or {}
        unknown = set(extra_ids) - set(self.extra)
        if unknown:
            raise KeyError(f"extra_ids has {sorted(unknown)} but the model's extra_embeddings are "
                           f"{sorted(self.extra)}: add them to model.extra_embeddings")
        x = self.word(input_ids)
        replaced = any(extra_ids.get(name) is not None for name in self.cfg.segment_alternatives)
        if self.token_type is not None and not replaced:
            # Missing segment ids mean segment 0, as in Hugging Face (so exported models agree without them).
            ids = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = x + self.token_type(ids)
        x = x + self.position(position_ids)
        for name, table in self.extra.items():
            ids = extra_ids.get(name)
            if ids is None:
                if name in self.cfg.segment_alternatives:
                    continue
                ids = torch.zeros_like(input_ids)
            x = x + table(ids)
        return self.dropout(self.norm(x))


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV GEMM, output projection, dropout, residual, post-LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.attention_dropout = cfg.attention_dropout
        self._compiled = None  # torch.compile of self.output (compile_layers); not a submodule, not in state_dict

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, T, H]; key_mask [B, 1, 1, T] bool (True = real token) or None (no padding)."""
        batch, seqlen, width = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask,
                                             dropout_p=self.attention_dropout if self.training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(batch, seqlen, width)
        return (self._compiled or self.output)(x, ctx)

    def forward_packed(self, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        """x [N, H] real tokens only (see kernels.pack)."""
        n, width = x.shape
        qkv = self.qkv(x).view(n, 3, self.heads, self.head_dim)
        ctx = varlen_attention(qkv, packing, self.attention_dropout if self.training else 0.0).reshape(n, width)
        return (self._compiled or self.output)(x, ctx)

    def output(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Output projection, dropout, residual, post-LayerNorm: the part ``compile_layers`` compiles."""
        return self.norm(x + self.dropout(self.out(ctx)))


class FeedForward(nn.Module):
    """H -> intermediate -> H with the configured activation, dropout, residual, post-LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inner = nn.Linear(cfg.hidden_size, cfg.ffn_size)
        self.outer = nn.Linear(cfg.ffn_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.act = activation_fn(cfg.hidden_act)
        self._compiled = None  # torch.compile of self.block (compile_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self._compiled or self.block)(x)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(self.outer(self.act(self.inner(x)))))


class Encoder(nn.Module):
    """``Encoder(cfg)(input_ids, attention_mask=None, token_type_ids=None, extra_ids=None, pack_ids=None,
    packing=None) -> hidden [B, T, H]``.

    ``attention_mask`` is 1 for real tokens and 0 for padding; None means no padding (and skips the mask entirely,
    which lets SDPA pick its fastest kernel). With ``cfg.unpad`` and a mask, hidden states at padding are 0.
    ``pack_ids`` [B, T] (1, 2, ... per packed sample, 0 = padding; DESIGN.md "Batches") makes each packed sample
    attend only to itself and restart its positions, so a packed row gives each sample the hidden states it would
    have alone; it implies the attention mask. ``packing`` (``kernels.attach_packing``, computed on the host) spares
    the device->host syncs of finding the real tokens and lets a batch without padding run with no mask at all.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.project = nn.Linear(cfg.emb_size, cfg.hidden_size) if cfg.emb_size != cfg.hidden_size else None
        n_attention = 1 if cfg.sharing in ("all", "attention") else cfg.num_layers
        n_ffn = 1 if cfg.sharing in ("all", "ffn") else cfg.num_layers
        self.attention = nn.ModuleList(Attention(cfg) for _ in range(n_attention))
        self.ffn = nn.ModuleList(FeedForward(cfg) for _ in range(n_ffn))
        self._compile_decided = False  # cfg.compile is applied at the first forward, when the device is known
        self.apply(lambda m: init_weights(m, cfg))
        if cfg.padded_vocab_size > cfg.vocab_size and self.embeddings.word.weight.device.type != "meta":
            with torch.no_grad():  # padding rows: zero, and kept zero (no id looks them up, no logit is used)
                self.embeddings.word.weight[cfg.vocab_size:].zero_()

    def layer(self, i: int) -> tuple[Attention, FeedForward]:
        """The (attention, feed-forward) modules layer i applies; shared modules are the same objects."""
        return self.attention[i if len(self.attention) > 1 else 0], self.ffn[i if len(self.ffn) > 1 else 0]

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     pack_ids: torch.Tensor | None = None) -> torch.Tensor:
        seqlen = input_ids.shape[1]
        offset = self.cfg.position_offset
        if pack_ids is not None:
            # Index within the packed sample: t minus the index where its run of equal pack ids starts.
            # Example: pack_ids [1,1,1,2,2,0] -> [0,1,2,0,1,0] (+ offset; padding sits at max(offset - 1, 0)).
            t = torch.arange(seqlen, device=input_ids.device).expand_as(pack_ids)
            starts = torch.ones_like(pack_ids, dtype=torch.bool)
            starts[:, 1:] = pack_ids[:, 1:] != pack_ids[:, :-1]
            within = t - torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values
            return torch.where(pack_ids != 0, within + offset, max(offset - 1, 0))
        if offset == 0 or attention_mask is None:
            return torch.arange(offset, offset + seqlen, device=input_ids.device).unsqueeze(0)
        # RoBERTa/fairseq: real tokens count up from offset, padding sits at offset - 1 (= pad_token_id), exactly as
        # Hugging Face's create_position_ids_from_input_ids, so exported models agree at every position.
        mask = attention_mask.long()
        return torch.cumsum(mask, dim=1) * mask + (offset - 1)

    def compile_layers(self, enable: bool = True) -> bool:
        """Compile (or, with ``enable=False``, un-compile) every layer's feed-forward and attention-output blocks with
        ``torch.compile(dynamic=True)``: one graph each, reused for any batch shape (packed rows change the token
        count every batch). Returns whether they are compiled. Called by the first forward per ``cfg.compile``."""
        self._compile_decided = True
        if enable:
            # Each block's code object is shared by every layer and compiled once per variant: training / eval x
            # packed rows ([tokens, H]) / full rows ([B, T, H]) x each width. ELECTRA's generator and discriminator
            # (two widths) need 9 variants of the attention-output block, past dynamo's default recompile_limit of 8:
            # the ninth ran eager from then on (tests/test_compile.py).
            import torch._dynamo
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        for module in (*self.attention, *self.ffn):
            fn = module.output if isinstance(module, Attention) else module.block
            module._compiled = torch.compile(fn, dynamic=True) if enable else None
        return enable

    def _decide_compile(self, device: torch.device) -> None:
        mode = self.cfg.compile
        zero3 = any(hasattr(p, "ds_id") for p in self.parameters())  # DeepSpeed ZeRO-3 partitioned parameters
        if mode == "on" and zero3:
            raise ValueError("model.compile: on is not supported under ZeRO-3 (dynamo would trace DeepSpeed's "
                             "parameter-gathering hooks): use model.compile: auto or off, or ZeRO stage 0-2")
        self.compile_layers(mode == "on" or (mode == "auto" and device.type == "cuda" and not zero3))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, extra_ids=None, pack_ids=None,
                packing: Packing | None = None) -> torch.Tensor:
        if not self._compile_decided:
            self._decide_compile(input_ids.device)
        if pack_ids is not None:
            attention_mask = (pack_ids != 0).long()
        if packing is not None and (packing.batch, packing.seqlen) != tuple(input_ids.shape):
            raise ValueError(f"packing is for a [{packing.batch}, {packing.seqlen}] batch, input_ids is "
                             f"{list(input_ids.shape)}: pass the packing attach_packing made for this batch")
        positions = self.position_ids(input_ids, attention_mask, pack_ids)
        x = self.embeddings(input_ids, positions, token_type_ids, extra_ids)
        if self.project is not None:
            x = self.project(x)
        if packing is not None and pack_ids is None and not packing.padded:
            # Nothing padded (decided on the host, once per batch): no mask at all, so SDPA may take its flash kernel
            # (it takes none with an attn_mask) and unpad has nothing to remove.
            attention_mask = None
        # Packed rows on a GPU go through varlen attention (flash / nested) instead of a dense T x T block mask.
        varlen = attention_mask is not None and (self.cfg.unpad or (pack_ids is not None and x.device.type == "cuda"))
        if varlen:
            return self._forward_unpadded(x, packing if packing is not None else pack(attention_mask, pack_ids))
        if pack_ids is not None:
            key_mask = packing.key_mask if packing is not None else block_mask(pack_ids)
        else:
            key_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        for i in range(self.cfg.num_layers):
            x = self._run_layer(i, x, key_mask, packed=False)
        return x

    def _forward_unpadded(self, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        batch, seqlen, width = x.shape
        packed = x.reshape(batch * seqlen, width).index_select(0, packing.indices)
        for i in range(self.cfg.num_layers):
            packed = self._run_layer(i, packed, packing, packed=True)
        return packed.new_zeros(batch * seqlen, width).index_copy(0, packing.indices, packed).view(batch, seqlen,
                                                                                                   width)

    def _run_layer(self, i, x, mask_or_packing, packed: bool):
        if self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled():
            # Recompute this layer in backward: activation memory of one layer instead of L, ~1/3 more FLOPs.
            return checkpoint(self._layer_forward, i, x, mask_or_packing, packed, use_reentrant=False)
        return self._layer_forward(i, x, mask_or_packing, packed)

    def _layer_forward(self, i, x, mask_or_packing, packed: bool):
        attention, ffn = self.layer(i)
        x = attention.forward_packed(x, mask_or_packing) if packed else attention(x, mask_or_packing)
        return ffn(x)


def init_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """BERT's initialization: N(0, initializer_range) for Linear/Embedding weights, zero biases, unit LayerNorm."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=cfg.initializer_range)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=cfg.initializer_range)
        if module.padding_idx is not None and module.weight.device.type != "meta":
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
