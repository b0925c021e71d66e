"""Optional fast kernels, each with a plain-torch fallback that computes the same thing.

- Variable-length ("unpadded") attention, chosen per call from the device and the dtype of q/k/v
  (``choose_varlen_method``): flash-attn's varlen kernel for fp16/bf16 on a GPU when flash-attn is installed (it has
  no fp32 kernel); otherwise PyTorch nested (jagged) tensors through ``scaled_dot_product_attention`` on a GPU, with
  the sequence-length metadata attached so SDPA does not read it back from the device (without it, 6 ``.item()``
  per layer); otherwise (CPU) a padded fallback that scatters the packed tokens back into a [B, T] grid for one dense
  SDPA call. The fallback is ours because no library offers varlen attention on CPU; it costs one scatter and one
  gather per layer, and the linear layers around it (most of the FLOPs) still see only the real tokens.
- ``Packing``: where the real tokens of a batch are. ``pack`` computes it; every number in it that a kernel needs on
  the host (token count, max/min sequence length, whether anything is padded) is a Python value. The training loop
  calls ``attach_packing`` on the collated batch while it is still on the CPU, so the model needs no device->host
  sync to learn them; built on the device instead (``pack`` of a CUDA mask), it costs 3 syncs per forward.

No fused LayerNorm: recent PyTorch LayerNorm kernels are about as fast as apex's (not on PyPI), so torch's is used.
Fused Adam is not here either: ``trainer/engine.py`` chooses the optimizer.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

VARLEN_METHODS = ("flash", "nested", "padded")
FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class Packing:
    """Where the real tokens of a padded [B, T] batch are, for running the layers on [N, H] packed tokens."""

    indices: torch.Tensor
    """Flat positions (into B*T) of the real tokens, row-major, [N]."""
    cu_seqlens: torch.Tensor
    """Cumulative sequence lengths, int32 [S + 1]: sequence s is packed rows cu_seqlens[s]:cu_seqlens[s+1]. One
    sequence per row, or one per packed sample when the batch carries pack_ids."""
    max_seqlen: int
    min_seqlen: int
    batch: int
    seqlen: int
    mask: torch.Tensor
    """[B, T] bool, True = real token."""
    pack_ids: torch.Tensor | None = None
    attended_squares: int = 0
    """Sum over the sequences of cu_seqlens of length^2 (Python int): the attention work the batch's real tokens ask
    for, whatever kernel computes it (trainer/flops.py's per_square part of MFU). Read in the same .tolist() as
    max/min_seqlen, in the loader workers: the loop gets it without a host read of its own."""
    _key_mask: torch.Tensor | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return self.indices.shape[0]

    @property
    def padded(self) -> bool:
        """Anything padded in the batch (known on the host: N is the shape of ``indices``)."""
        return self.tokens < self.batch * self.seqlen

    @property
    def key_mask(self) -> torch.Tensor:
        """The dense equivalent for the padded fallback: [B, 1, 1, T] (True = real key) or, with pack_ids, the
        block-diagonal [B, 1, T, T] of block_mask (built once per batch, on first use)."""
        if self._key_mask is None:
            self._key_mask = (block_mask(self.pack_ids) if self.pack_ids is not None
                              else self.mask[:, None, None, :])
        return self._key_mask

    def pin_memory(self) -> Packing:
        """The same packing with its tensors in pinned host memory. The DataLoader calls this on every object of a
        batch that has it when ``pin_memory`` is on (CUDA), so the packing built in the loader workers is copied to
        the device asynchronously like the rest of the batch."""
        pin = (lambda t: None if t is None else t.pin_memory())
        return replace(self, indices=pin(self.indices), cu_seqlens=pin(self.cu_seqlens), mask=pin(self.mask),
                       pack_ids=pin(self.pack_ids), _key_mask=pin(self._key_mask))

    def to(self, device, non_blocking: bool = False) -> Packing:
        """The same packing with its tensors on ``device`` (host->device copies only: no sync)."""
        move = (lambda t: None if t is None else t.to(device, non_blocking=non_blocking))
        return replace(self, indices=move(self.indices), cu_seqlens=move(self.cu_seqlens), mask=move(self.mask),
                       pack_ids=move(self.pack_ids), _key_mask=move(self._key_mask))


def block_mask(pack_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool attention mask for rows holding several packed samples (pack id 1, 2, ...; 0 = padding):
    a real query sees the keys of its own sample only; a padding query sees every real key of its row (its output is
    never used, and a query with no visible key would give NaN). Costs B*T*T bytes (2 MB at 8 x 512)."""
    real_key = (pack_ids != 0)[:, None, :]
    query = pack_ids[:, :, None]
    return ((query == pack_ids[:, None, :]) & real_key | (query == 0) & real_key)[:, None]


def pack(attention_mask: torch.Tensor, pack_ids: torch.Tensor | None = None) -> Packing:
    """Packing for a padded mask (1 real, 0 pad), optionally with packed samples inside rows (``pack_ids``).

    Example: mask [[1,1,0],[1,0,0]] -> indices [0,1,3], cu_seqlens [0,2,3], max_seqlen 2; with pack_ids
    [[1,2,0],[1,0,0]] -> cu_seqlens [0,1,2,3]. On a GPU the two nonzero() and the one tolist() are device->host
    syncs: call it on the CPU batch (``attach_packing``) where they cost nothing.
    """
    mask = attention_mask.bool()
    batch, seqlen = mask.shape
    indices = torch.nonzero(mask.reshape(-1), as_tuple=False).flatten()
    rows = torch.div(indices, seqlen, rounding_mode="floor")
    starts = torch.ones_like(indices, dtype=torch.bool)
    starts[1:] = rows[1:] != rows[:-1]
    if pack_ids is not None:
        ids = pack_ids.reshape(-1)[indices]
        starts[1:] |= ids[1:] != ids[:-1]
    bounds = torch.nonzero(starts, as_tuple=False).flatten()
    cu_seqlens = torch.cat([bounds, bounds.new_tensor([indices.numel()])]).to(torch.int32)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    wide = lengths.long()
    longest, shortest, squares = (torch.stack([wide.max(), wide.min(), (wide * wide).sum()]).tolist()
                                  if lengths.numel() else (0, 0, 0))
    return Packing(indices=indices, cu_seqlens=cu_seqlens, max_seqlen=int(longest), min_seqlen=int(shortest),
                   batch=batch, seqlen=seqlen, mask=mask, pack_ids=pack_ids, attended_squares=int(squares))


def attach_packing(batch: dict) -> dict:
    """The batch plus ``"packing"`` (``pack`` of its attention mask and pack ids), computed while the batch is still
    on the CPU (the loop calls it before moving the batch to the device). Objectives pass it to the model
    (``objectives.base.packing``), which then decides once per batch, without a device sync, whether to pass SDPA a
    mask at all and where the real tokens are. A batch without an attention mask, or already on a device, is
    returned as it is."""
    mask = batch.get("attention_mask")
    if not torch.is_tensor(mask) or mask.device.type != "cpu" or mask.dim() != 2 or "packing" in batch:
        return batch
    pack_ids = batch.get("pack_ids")
    return {**batch, "packing": pack((pack_ids != 0) if pack_ids is not None else mask, pack_ids)}


@functools.cache
def _flash_attn():
    """flash-attn's varlen kernel, or None when not installed. Tried once per process: a failed import is not cached
    by Python (~60 us per attempt, and choose_varlen_method asks in every attention call, 24 per BERT-large
    forward)."""
    try:
        from flash_attn import flash_attn_varlen_qkvpacked_func
    except ImportError:
        return None
    return flash_attn_varlen_qkvpacked_func


@functools.cache
def _flash_capable(index: int | None) -> bool:
    """flash-attn 2 runs on Ampere (sm80) and newer only: it stops with "FlashAttention only supports Ampere GPUs or
    newer" on a V100 or T4 (the fp16 recipes' GPUs), e.g. where one venv serves A100 and V100 nodes."""
    return torch.cuda.get_device_capability(index)[0] >= 8


def choose_varlen_method(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> str:
    """flash-attn for fp16/bf16 on an sm80+ GPU when installed (it has no fp32 kernel), else nested tensors on a
    GPU, else the padded fallback (CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        flash = dtype in FLASH_DTYPES and _flash_attn() is not None and _flash_capable(device.index)
        return "flash" if flash else "nested"
    return "padded"


def varlen_attention(qkv: torch.Tensor, packing: Packing, dropout_p: float = 0.0, method: str | None = None
                     ) -> torch.Tensor:
    """Self-attention over packed sequences. qkv: [N, 3, A, D] -> context [N, A, D].

    Each sequence attends only to its own real tokens, exactly as padded attention with a key-padding mask does.
    ``method`` forces one implementation (tests compare them); None picks the fastest for qkv's device and dtype.
    """
    method = method or choose_varlen_method(qkv.device, qkv.dtype)
    if method not in VARLEN_METHODS:
        raise ValueError(f"varlen attention method {method!r} is not one of {VARLEN_METHODS}")
    n, _, heads, dim = qkv.shape
    if method == "flash":
        fn = _flash_attn()
        if fn is None:
            raise RuntimeError("varlen method 'flash' needs flash-attn: pip install flash-attn (GPU only)")
        if qkv.dtype not in FLASH_DTYPES:
            raise RuntimeError(f"varlen method 'flash' needs fp16 or bf16 tensors, got {qkv.dtype}")
        return fn(qkv, packing.cu_seqlens, packing.max_seqlen, dropout_p)
    if method == "nested":
        # The host-known min/max lengths go in as metadata: SDPA reads them to pick a kernel and size its grid, and
        # would otherwise compute them with an .item() each (3 q/k/v x 2 per layer).
        offsets = packing.cu_seqlens.long()
        q, k, v = (torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets, min_seqlen=packing.min_seqlen,
                                                          max_seqlen=packing.max_seqlen).transpose(1, 2)
                   for t in qkv.unbind(1))
        ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        return ctx.transpose(1, 2).values()
    # padded fallback: scatter into the [B*T] grid, one dense masked SDPA call, gather the real rows back.
    grid = qkv.new_zeros(packing.batch * packing.seqlen, 3, heads, dim).index_copy(0, packing.indices, qkv)
    q, k, v = grid.view(packing.batch, packing.seqlen, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=packing.key_mask, dropout_p=dropout_p)
    return ctx.transpose(1, 2).reshape(packing.batch * packing.seqlen, heads, dim).index_select(0, packing.indices)
