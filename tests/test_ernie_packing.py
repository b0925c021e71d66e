"""ERNIE 1.0 (MLM and DLM) and ERNIE 2.0 batches reach the encoder with the host-built packing (issue 23, "no compute
on padding"), and the packed path's hidden states equal plain per-sample attention: each sample run alone through the
same weights with torch.nn.functional.scaled_dot_product_attention and no mask (written out here, not another product
path). On the CPU the varlen path is kernels.varlen_attention's padded fallback; flash / nested varlen on a GPU are
compared with per-sample SDPA in tests/test_gpu.py."""
import pytest
import torch
import torch.nn.functional as F

import trainer.models.encoder as encoder_module
from trainer.models import get_preset
from trainer.models.kernels import attach_packing
from trainer.ernie.tasks import TASK_ID, TASKS
from trainer.objectives.ernie import ErnieObjective
from trainer.objectives.ernie2 import Ernie2Objective

LENGTHS = (13, 5, 9, 2)  # unequal rows: the collator pads to 13


ERNIE2 = {"continual": {"tasks": [{"name": "mlm", "iterations": 10, "level": "token"},
                                  {"name": "capitalization", "iterations": 10, "level": "token"}]}}


def _batch(kind: str, vocab: int) -> dict:
    g = torch.Generator().manual_seed(0)
    B, T, P = len(LENGTHS), max(LENGTHS), 2
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        ids[b, :n] = torch.randint(1, vocab, (n,), generator=g)
        mask[b, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask,
             "mlm_positions": torch.tensor([[1, 0]] * B), "mlm_labels": torch.tensor([[7, -100]] * B)}
    if kind == "dlm":
        batch["role_ids"] = (torch.arange(T)[None, :] >= 3).long().expand(B, T) * mask
        batch["dlm_label"] = torch.tensor([0, 1, 1, 0])
    else:
        batch["token_type_ids"] = (torch.arange(T)[None, :] >= 4).long().expand(B, T) * mask
    if kind == "ernie2":
        batch["task_ids"] = torch.full((B, T), TASK_ID["mlm"]) * mask
    return batch


def _per_sample_reference(enc, batch: dict, b: int, kind: str) -> torch.Tensor:
    """Sample b alone ([1, n], no padding): embeddings, then each layer with plain SDPA (no mask)."""
    n = LENGTHS[b]
    ids = batch["input_ids"][b:b + 1, :n]
    positions = torch.arange(n)[None] + enc.cfg.position_offset
    extra = {"role": batch["role_ids"][b:b + 1, :n]} if kind == "dlm" else None
    if kind == "ernie2":
        extra = {"task": batch["task_ids"][b:b + 1, :n]}
    types = None if kind == "dlm" else batch["token_type_ids"][b:b + 1, :n]
    x = enc.embeddings(ids, positions, types, extra)
    heads, dim = enc.cfg.num_heads, enc.cfg.head_dim
    for i in range(enc.cfg.num_layers):
        att, ffn = enc.layer(i)
        q, k, v = att.qkv(x).view(1, n, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, n, heads * dim)
        x = att.norm(x + att.out(ctx))
        x = ffn.norm(x + ffn.outer(ffn.act(ffn.inner(x))))
    return x[0]


@pytest.mark.parametrize("kind", ["mlm", "dlm", "ernie2"])
def test_ernie_batches_take_the_packed_path_and_equal_per_sample_sdpa(kind, monkeypatch):
    torch.manual_seed(0)
    if kind == "ernie2":
        cfg = get_preset("tiny-ernie", extra_embeddings={"task": len(TASKS)}, dropout=0.0, attention_dropout=0.0,
                         unpad=True)
        obj = Ernie2Objective(ERNIE2)
    else:
        cfg = get_preset("tiny", extra_embeddings={"role": 2}, segment_alternatives=["role"], family="ernie",
                         dropout=0.0, attention_dropout=0.0, unpad=True)
        obj = ErnieObjective({"dlm": {"path": "dialogues.jsonl"}} if kind == "dlm" else {})
    model = obj.build_model(cfg).eval()
    batch = attach_packing(_batch(kind, cfg.vocab_size))  # what the training loop does before the copy to the device

    # The encoder must use the packing the loop built on the host, not rebuild it (3 device syncs per forward on a
    # GPU): on main ERNIE's objective dropped it and the encoder called pack() itself.
    def no_pack(*args, **kwargs):
        raise AssertionError("the encoder rebuilt the packing: the objective did not pass batch['packing']")
    monkeypatch.setattr(encoder_module, "pack", no_pack)

    seen = {}
    model.encoder.register_forward_hook(lambda mod, args, out: seen.update(hidden=out))
    with torch.no_grad():
        loss, _ = obj.loss(model, batch)
        assert torch.isfinite(loss)
        for b, n in enumerate(LENGTHS):
            ref = _per_sample_reference(model.encoder, batch, b, kind)
            torch.testing.assert_close(seen["hidden"][b, :n], ref, rtol=1e-5, atol=1e-5)
            assert not seen["hidden"][b, n:].any(), "unpadded path leaves zeros at padding"
