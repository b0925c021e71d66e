"""The encoder and heads: sharing really shares, masked-only MLM logits, padding invariance, activation
checkpointing, the unpadded path, ELECTRA's generator/discriminator wiring, extra embedding tables."""
import pytest
import torch

from trainer.models import (MLM, NSP, ElectraPretrainingModel, Encoder, HeadSpec, PretrainingModel,
                            count_parameters, flat_positions, get_preset)
from trainer.models.kernels import pack, varlen_attention

HEADS = {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}


def padded_batch(cfg, lengths=(13, 9, 4, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    seqlen = max(lengths)
    ids = torch.randint(5, cfg.vocab_size, (len(lengths), seqlen), generator=g)
    mask = (torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = cfg.pad_token_id
    types = (torch.arange(seqlen)[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids, mask, types * (cfg.type_vocab_size > 1)


def no_dropout(name="tiny", **kw):
    return get_preset(name, dropout=0.0, attention_dropout=0.0, **kw)


# ------------------------------------------------------------------------------------------------------ sharing
@pytest.mark.parametrize("sharing,n_attention,n_ffn", [("none", 4, 4), ("all", 1, 1), ("attention", 1, 4),
                                                       ("ffn", 4, 1)])
def test_sharing_modes_share_storage_and_identity(sharing, n_attention, n_ffn):
    cfg = get_preset("tiny", num_layers=4, sharing=sharing)
    enc = Encoder(cfg)
    attention = count_parameters(enc.attention[0])
    ffn = count_parameters(enc.ffn[0])
    base = count_parameters(enc.embeddings)
    assert count_parameters(enc) == base + n_attention * attention + n_ffn * ffn
    layers = [enc.layer(i) for i in range(4)]
    assert (layers[0][0] is layers[3][0]) == (n_attention == 1)
    assert (layers[0][1] is layers[3][1]) == (n_ffn == 1)
    assert len({id(a.qkv.weight) for a, _ in layers}) == n_attention
    # stored once: the state dict holds one copy of each shared tensor
    keys = enc.state_dict().keys()
    assert sum(k.endswith("qkv.weight") for k in keys) == n_attention
    assert sum(k.endswith("inner.weight") for k in keys) == n_ffn


def test_shared_layer_gradient_collects_every_application():
    # 'all' applies one layer L times: its gradient is the sum over applications, so a 2-layer shared model differs
    # from applying the layer once. Check against an explicit unrolled computation.
    cfg = no_dropout(num_layers=3, sharing="all")
    enc = Encoder(cfg)
    ids, mask, types = padded_batch(cfg)
    enc(ids, mask, types).square().mean().backward()
    grad = enc.attention[0].qkv.weight.grad.clone()
    enc.zero_grad()
    x = enc.embeddings(ids, enc.position_ids(ids, mask), types)
    key_mask = mask.bool()[:, None, None, :]
    for _ in range(3):
        x = enc.ffn[0](enc.attention[0](x, key_mask))
    x.square().mean().backward()
    torch.testing.assert_close(grad, enc.attention[0].qkv.weight.grad)


# --------------------------------------------------------------------------------------------------- MLM head
def test_masked_only_mlm_logits_equal_full_computation():
    cfg = no_dropout()
    model = PretrainingModel(cfg, HEADS).eval()
    ids, mask, types = padded_batch(cfg)
    mlm_positions = torch.tensor([[1, 5, 0], [2, 8, 0], [3, 0, 0], [0, 0, 0]])
    mlm_labels = torch.tensor([[7, 9, -100], [5, 6, -100], [4, -100, -100], [-100, -100, -100]])
    flat, labels = flat_positions(mlm_positions, mlm_labels, ids.shape[1])
    assert flat.tolist() == [1, 5, 13 + 2, 13 + 8, 26 + 3] and labels.tolist() == [7, 9, 5, 6, 4]
    with torch.no_grad():
        some = model(ids, mask, types, mlm_positions=flat)[MLM]
        full = model(ids, mask, types)[MLM]
    assert some.shape == (5, cfg.vocab_size) and full.shape == (*ids.shape, cfg.vocab_size)
    torch.testing.assert_close(some, full.reshape(-1, cfg.vocab_size)[flat], rtol=0, atol=1e-5)


def test_mlm_decoder_is_tied_to_input_embeddings():
    for name in ("tiny", "tiny-albert"):
        model = PretrainingModel(get_preset(name), HEADS)
        assert model.heads[MLM].decoder.weight is model.encoder.embeddings.word.weight
        assert model.heads[MLM].decoder.weight.shape == (model.cfg.padded_vocab_size, model.cfg.emb_size)
        assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


def test_sequence_and_token_heads_shapes():
    cfg = no_dropout()
    heads = {"cls": HeadSpec("sequence", 5), "tok": HeadSpec("token", 3)}
    out = PretrainingModel(cfg, heads)(*padded_batch(cfg))
    assert out["cls"].shape == (4, 5) and out["tok"].shape == (4, 13, 3) and out["hidden"].shape == (4, 13, 64)
    with pytest.raises(ValueError, match="unknown head kind"):
        PretrainingModel(cfg, {"x": HeadSpec("pooled")})


def test_pretraining_sentence_heads_have_no_dropout_after_the_pooler():
    """NSP/SOP logits in training mode are a function of the [CLS] hidden state alone, as in BERT's
    get_next_sentence_output and ALBERT's get_sentence_order_output (no dropout between pooler and classifier);
    the encoder's own dropout is untouched."""
    from trainer.models.heads import SequenceHead

    cfg = get_preset("tiny", dropout=0.5)
    head = SequenceHead(cfg, 2).train()
    hidden = torch.randn(64, 3, cfg.hidden_size)
    torch.manual_seed(0)
    a = head(hidden)
    torch.manual_seed(1)
    assert torch.equal(a, head(hidden))


# ---------------------------------------------------------------------------------------------------- padding
@pytest.mark.parametrize("name", ["tiny", "tiny-roberta", "tiny-albert"])
@pytest.mark.parametrize("unpad", [False, True])
def test_padding_never_changes_real_tokens(name, unpad):
    cfg = no_dropout(name, unpad=unpad)
    enc = Encoder(cfg).eval()
    ids, mask, types = padded_batch(cfg)
    with torch.no_grad():
        batched = enc(ids, mask, types)
        for row, length in enumerate(mask.sum(1).tolist()):
            alone = enc(ids[row:row + 1, :length], mask[row:row + 1, :length], types[row:row + 1, :length])
            torch.testing.assert_close(batched[row, :length], alone[0], rtol=0, atol=2e-5)
            # and more padding than needed changes nothing either
            wider = torch.cat([ids[row:row + 1], torch.full((1, 7), cfg.pad_token_id)], 1)
            wider_mask = torch.cat([mask[row:row + 1], torch.zeros(1, 7, dtype=torch.long)], 1)
            out = enc(wider, wider_mask, torch.cat([types[row:row + 1], torch.zeros(1, 7, dtype=torch.long)], 1))
            torch.testing.assert_close(out[0, :length], alone[0], rtol=0, atol=2e-5)


def test_roberta_positions_start_after_padding_id():
    cfg = get_preset("tiny-roberta")
    enc = Encoder(cfg)
    ids, mask, _ = padded_batch(cfg, lengths=(4, 2))
    assert enc.position_ids(ids, mask).tolist() == [[2, 3, 4, 5], [2, 3, 1, 1]]
    assert enc.position_ids(ids, None).tolist() == [[2, 3, 4, 5]]


# --------------------------------------------------------------------------------- unpad and varlen attention
def per_sample_attention(qkv_dense, samples):
    """The reference, independent of pack(): plain SDPA on each sample's own tokens, no mask. qkv_dense [B, T, 3, A, D],
    samples [(row, start, end)] in packed order -> [N, A, D]."""
    out = []
    for row, a, b in samples:
        q, k, v = qkv_dense[row, a:b].permute(1, 2, 0, 3).unbind(0)  # each [A, L, D]
        out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(0, 1))
    return torch.cat(out)


# Rows of real tokens 5, 2, 3; with pack_ids the first row holds two samples (2 + 3 tokens) and the last two (1 + 2).
VARLEN_CASES = {"padded_rows": (None, [(0, 0, 5), (1, 0, 2), (2, 0, 3)], [0, 5, 7, 10]),
                "packed_rows": ([[1, 1, 2, 2, 2], [1, 1, 0, 0, 0], [1, 2, 2, 0, 0]],
                                [(0, 0, 2), (0, 2, 5), (1, 0, 2), (2, 0, 1), (2, 1, 3)], [0, 2, 5, 7, 8, 10])}


@pytest.mark.parametrize("case", sorted(VARLEN_CASES))
@pytest.mark.parametrize("method", ["padded", "nested"])
def test_varlen_attention_equals_per_sample_attention(method, case):
    """Each packed sample attends to its own tokens only: checked against SDPA run on each sample alone (a wrong
    key mask or cu_seqlens in pack() would pass a reference built from pack()'s own mask)."""
    torch.manual_seed(0)
    pack_ids, samples, cu_seqlens = VARLEN_CASES[case]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    packing = pack(mask, None if pack_ids is None else torch.tensor(pack_ids))
    assert packing.indices.tolist() == [0, 1, 2, 3, 4, 5, 6, 10, 11, 12]
    assert packing.cu_seqlens.tolist() == cu_seqlens and packing.max_seqlen == max(b - a for _, a, b in samples)
    qkv_dense = torch.randn(3, 5, 3, 2, 4)
    ref = per_sample_attention(qkv_dense, samples)
    qkv = qkv_dense.reshape(15, 3, 2, 4)[packing.indices].requires_grad_()
    out = varlen_attention(qkv, packing, method=method)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    out.sum().backward()
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()


def test_unpad_path_equals_padded_path_forward_and_gradients():
    base = no_dropout("tiny-albert", sharing="none")
    torch.manual_seed(0)
    padded = PretrainingModel(base, HEADS)
    unpadded = PretrainingModel(base.replace(unpad=True), HEADS)
    unpadded.load_state_dict(padded.state_dict())
    ids, mask, types = padded_batch(base)
    flat = torch.tensor([0, 3, 14, 27, 39])  # real tokens only, as masking picks
    grads = []
    for model in (padded, unpadded):
        out = model(ids, mask, types, mlm_positions=flat)
        (out[MLM].logsumexp(-1).sum() + out[NSP].sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.last = out
    real = mask.bool()
    torch.testing.assert_close(unpadded.last["hidden"][real], padded.last["hidden"][real], rtol=0, atol=2e-5)
    assert (unpadded.last["hidden"][~real] == 0).all()
    torch.testing.assert_close(unpadded.last[MLM], padded.last[MLM], rtol=0, atol=2e-5)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------------- activation checkpointing
def test_activation_checkpointing_gives_the_same_gradients():
    # With dropout on: torch.utils.checkpoint replays the RNG state, so the recomputed forward drops the same units.
    cfg = get_preset("tiny", num_layers=3, dropout=0.1, attention_dropout=0.1)
    torch.manual_seed(0)
    plain = PretrainingModel(cfg, HEADS).train()
    ckpt = PretrainingModel(cfg.replace(activation_checkpointing=True), HEADS).train()
    ckpt.load_state_dict(plain.state_dict())
    ids, mask, types = padded_batch(cfg)
    grads = []
    for model in (plain, ckpt):
        torch.manual_seed(1)
        out = model(ids, mask, types, mlm_positions=torch.tensor([1, 2, 15]))
        (out[MLM].logsumexp(-1).sum() + out[NSP].sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


# ---------------------------------------------------------------------------------------------------- ELECTRA
def test_electra_generator_shares_embeddings_and_has_its_projection():
    cfg = get_preset("tiny-electra")
    model = ElectraPretrainingModel(cfg)
    gen, disc = model.generator.encoder, model.discriminator.encoder
    assert gen.embeddings is disc.embeddings
    assert model.generator.heads[MLM].decoder.weight is disc.embeddings.word.weight
    # fraction 1/4: generator H = 16, shared embeddings E = 32, so the generator projects 32 -> 16
    assert gen.project.weight.shape == (cfg.hidden_size // 4, cfg.emb_size) and disc.project is not gen.project
    none = ElectraPretrainingModel(cfg, sharing="none")
    assert none.generator.encoder.embeddings is not none.discriminator.encoder.embeddings
    assert count_parameters(none) - count_parameters(model) == count_parameters(disc.embeddings)
    tied = ElectraPretrainingModel(cfg, generator_fraction=1.0, sharing="all")
    assert tied.generator.encoder is tied.discriminator.encoder
    with pytest.raises(ValueError, match="same size"):
        ElectraPretrainingModel(cfg, sharing="all")


def test_electra_logits_shapes_and_forward_dispatch():
    cfg = no_dropout("tiny-electra")
    model = ElectraPretrainingModel(cfg).eval()
    ids, mask, types = padded_batch(cfg)
    flat = torch.tensor([0, 7, 20])
    with torch.no_grad():
        g = model.generator_logits(ids, mask, types, flat)
        d = model.discriminator_logits(ids, mask, types)
        assert g.shape == (3, cfg.vocab_size) and d.shape == ids.shape
        torch.testing.assert_close(model(ids, mask, types, flat, part="generator"), g)
        torch.testing.assert_close(model(ids, mask, types, part="discriminator"), d)


# ---------------------------------------------------------------------------------------- extra embedding tables
def test_task_embeddings_default_to_row_zero():
    cfg = no_dropout("tiny-ernie")
    enc = Encoder(cfg).eval()
    ids, mask, types = padded_batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(enc(ids, mask, types), enc(ids, mask, types, {"task": torch.zeros_like(ids)}))
        assert not torch.allclose(enc(ids, mask, types), enc(ids, mask, types, {"task": torch.ones_like(ids)}))
    with pytest.raises(KeyError, match="extra_embeddings"):
        enc(ids, mask, types, {"role": ids})


def test_role_embeddings_replace_segment_embeddings_only_when_given():
    cfg = no_dropout(extra_embeddings={"role": 4}, segment_alternatives=["role"])
    enc = Encoder(cfg)
    ids, mask, types = padded_batch(cfg)
    enc(ids, mask, extra_ids={"role": types}).sum().backward()  # a dialogue batch
    assert enc.embeddings.token_type.weight.grad is None and enc.embeddings.extra["role"].weight.grad is not None
    enc.zero_grad(set_to_none=True)
    enc(ids, mask, types).sum().backward()  # an MLM batch
    assert enc.embeddings.extra["role"].weight.grad is None and enc.embeddings.token_type.weight.grad is not None


def test_padding_row_of_word_embeddings_gets_no_gradient():
    cfg = no_dropout("tiny-roberta")
    enc = Encoder(cfg)
    ids, mask, _ = padded_batch(cfg)
    enc(ids, mask).sum().backward()
    assert (enc.embeddings.word.weight.grad[cfg.pad_token_id] == 0).all()


# ------------------------------------------------------------------------------------------- packed samples
def test_pack_positions_and_sequences():
    cfg = get_preset("tiny-roberta")
    pack_ids = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 2, 3, 3, 0, 0]])
    assert Encoder(cfg).position_ids(pack_ids, None, pack_ids).tolist() == [[2, 3, 4, 2, 3, 1], [2, 2, 2, 3, 1, 1]]
    assert Encoder(get_preset("tiny")).position_ids(pack_ids, None, pack_ids)[0].tolist() == [0, 1, 2, 0, 1, 0]
    packing = pack((pack_ids != 0).long(), pack_ids)
    assert packing.cu_seqlens.tolist() == [0, 3, 5, 6, 7, 9] and packing.max_seqlen == 3


@pytest.mark.parametrize("name", ["tiny", "tiny-roberta"])
@pytest.mark.parametrize("unpad", [False, True])
def test_packed_row_gives_each_sample_its_own_hidden_states(name, unpad):
    cfg = no_dropout(name, unpad=unpad)
    enc = Encoder(cfg).eval()
    g = torch.Generator().manual_seed(3)
    samples = [torch.randint(5, cfg.vocab_size, (n,), generator=g) for n in (5, 3, 6, 2)]
    # row 0: samples 0 and 1 then padding; row 1: samples 2 and 3, full
    ids = torch.full((2, 8), cfg.pad_token_id)
    pack_ids = torch.zeros(2, 8, dtype=torch.long)
    ids[0, :5], ids[0, 5:8], ids[1, :6], ids[1, 6:8] = samples
    pack_ids[0, :5], pack_ids[0, 5:8], pack_ids[1, :6], pack_ids[1, 6:8] = 1, 2, 1, 2
    ids[0, 7] = cfg.pad_token_id
    pack_ids[0, 7] = 0
    samples[1] = samples[1][:2]
    spans = [(0, 0, 5), (0, 5, 7), (1, 0, 6), (1, 6, 8)]
    with torch.no_grad():
        packed = enc(ids, pack_ids=pack_ids)
        for sample, (row, start, end) in zip(samples, spans):
            alone = enc(sample[None], torch.ones(1, end - start, dtype=torch.long))
            torch.testing.assert_close(packed[row, start:end], alone[0], rtol=0, atol=2e-5)


def test_varlen_methods_agree_on_packed_samples():
    """Both methods against SDPA on each sample alone (they were compared only with each other: a pack() that
    dropped pack_ids made both attend across samples, and agree)."""
    torch.manual_seed(0)
    pack_ids = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 2, 3]])
    packing = pack((pack_ids != 0).long(), pack_ids)
    qkv_dense = torch.randn(2, 6, 3, 2, 8)
    qkv = qkv_dense.reshape(12, 3, 2, 8)[packing.indices]
    ref = per_sample_attention(qkv_dense, [(0, 0, 2), (0, 2, 5), (1, 0, 4), (1, 4, 5), (1, 5, 6)])
    for method in ("nested", "padded"):
        torch.testing.assert_close(varlen_attention(qkv, packing, method=method), ref, rtol=0, atol=1e-6,
                                   msg=method)
