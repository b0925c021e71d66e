"""Lamb against a float64 reference LAMB written as plainly as possible, in one process; param-group rules.

``reference_lamb`` is also the reference of tests/test_lamb_zero.py (ZeRO 0-3 on 1, 2 and 4 ranks).
"""
import copy
import math

import pytest
import torch
from torch import nn

from trainer.optim.lamb import Lamb, PartitionLayout
from trainer.optim.param_groups import excluded_names, param_groups


def reference_lamb(params, grads, state, *, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                   bias_correction=True, max_trust_ratio=None, excluded=()):
    """One LAMB step over float64 ``params`` (a dict name -> tensor, updated in place), one parameter at a time.

    Weight decay is not applied to excluded parameters (biases, LayerNorm), whose trust ratio is 1.
    """
    beta1, beta2 = betas
    for name, w in params.items():
        g = grads[name]
        st = state.setdefault(name, {"t": 0, "m": torch.zeros_like(w), "v": torch.zeros_like(w)})
        st["t"] += 1
        st["m"] = beta1 * st["m"] + (1 - beta1) * g
        st["v"] = beta2 * st["v"] + (1 - beta2) * g * g
        m_hat, v_hat = st["m"], st["v"]
        if bias_correction:
            m_hat = m_hat / (1 - beta1 ** st["t"])
            v_hat = v_hat / (1 - beta2 ** st["t"])
        decay = 0.0 if name in excluded else weight_decay
        update = m_hat / (v_hat.sqrt() + eps) + decay * w
        ratio = 1.0
        if name not in excluded:
            w_norm, u_norm = w.norm().item(), update.norm().item()
            if w_norm > 0 and u_norm > 0:
                ratio = w_norm / u_norm
            if max_trust_ratio is not None:
                ratio = min(ratio, max_trust_ratio)
        w -= lr * ratio * update


def clip_reference(grads, max_norm):
    """Global-norm clipping as torch and DeepSpeed do it: scale by max_norm / (norm + 1e-6) when that is < 1."""
    total = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads.values():
            g.mul_(coef)


class Small(nn.Module):
    """Embedding, two linears and a LayerNorm of uneven sizes; the decoder shares the embedding (listed once)."""

    def __init__(self, vocab=23, hidden=10, ffn=14):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids):
        h = self.emb(ids)
        h = self.norm(h + self.down(torch.nn.functional.gelu(self.up(h))))
        return h @ self.emb.weight.t() + self.decoder_bias


def _loss(model, step):
    gen = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, 23, (6, 7), generator=gen).to(model.emb.weight.device)
    logits = model(ids)
    return nn.functional.cross_entropy(logits.reshape(-1, 23).to(torch.float64), ids.roll(1, dims=1).reshape(-1))


# Small's parameters that LAMB leaves without weight decay and with trust ratio 1 (biases and LayerNorm weights, as
# ALBERT's exclude_from_layer_adaptation names them), written out here: the reference must not take them from the
# product's own excluded_names(), or a wrong exclusion rule would pass on both sides.
SMALL_EXCLUDED = {"decoder_bias", "up.bias", "down.bias", "norm.weight", "norm.bias"}


def _run_both(steps=20, lr=2e-2, weight_decay=0.01, **hp):
    torch.manual_seed(0)
    model = Small()
    ref_model = copy.deepcopy(model).double()
    opt = Lamb(param_groups(model, weight_decay, mark_trust_ratio=True), lr=lr, weight_decay=weight_decay, **hp)
    excluded = SMALL_EXCLUDED
    ref_params = dict(ref_model.named_parameters())
    assert excluded <= set(ref_params), sorted(excluded - set(ref_params))
    ref_state = {}
    for step in range(steps):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
        ref_model.zero_grad()
        _loss(ref_model, step).backward()
        with torch.no_grad():
            reference_lamb(ref_params, {n: p.grad for n, p in ref_params.items()}, ref_state, lr=lr,
                           weight_decay=weight_decay, excluded=excluded, **hp)
    return model, ref_model, opt


@pytest.mark.parametrize("hp", [{}, {"bias_correction": False}, {"max_trust_ratio": 0.5}],
                         ids=["reference", "albert_no_bias_correction", "clipped_ratio"])
def test_lamb_matches_float64_reference(hp):
    model, ref_model, _ = _run_both(**hp)
    for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.double(), q, rtol=0, atol=2e-5, msg=f"{name} differs from the reference")
        assert not torch.equal(p.double(), torch.zeros_like(q))


def test_trust_ratio_is_what_makes_it_lamb():
    # Guards the reference test against passing for an Adam-like update: the clipped variant moves differently.
    model, _, _ = _run_both(steps=5)
    clipped, _, _ = _run_both(steps=5, max_trust_ratio=0.05)
    assert (model.up.weight - clipped.up.weight).abs().max() > 1e-3


def test_state_dict_round_trip_is_bit_identical():
    torch.manual_seed(0)
    model = Small()
    opt = Lamb(param_groups(model, 0.01, mark_trust_ratio=True), lr=1e-2, weight_decay=0.01)

    def train(m, o, steps):
        for step in steps:
            o.zero_grad()
            _loss(m, step).backward()
            o.step()

    train(model, opt, range(10))
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    train(model, opt, range(10, 20))

    resumed = Small()
    resumed.load_state_dict(saved_model)
    opt2 = Lamb(param_groups(resumed, 0.01, mark_trust_ratio=True), lr=1e-2, weight_decay=0.01)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, range(10, 20))
    for (name, p), (_, q) in zip(model.named_parameters(), resumed.named_parameters()):
        assert torch.equal(p, q), name


def _flat_problem(seed=0):
    """Uneven parameters flattened into one tensor (what ZeRO hands an optimizer) with alignment padding after the
    second one and at the end, and their (start, length, slot) pieces."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (13,), (3, 11), (2,)]
    params = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(6)]
    pad = {1: 3, 3: 4}  # padding after parameter i
    pieces, start = [], 0
    for i, p in enumerate(params):
        pieces.append((start, p.numel(), i))
        start += p.numel() + pad.get(i, 0)
    return params, grads, pieces, pad


def _flatten(tensors, pad):
    parts = []
    for i, t in enumerate(tensors):
        parts += [t.reshape(-1), torch.zeros(pad.get(i, 0), dtype=t.dtype)]
    return torch.cat(parts)


def test_partition_layout_gives_per_parameter_ratios_on_a_flat_tensor():
    params, grads, pieces, pad = _flat_problem()
    ref = {str(i): p.clone() for i, p in enumerate(params)}
    state = {}
    flat = torch.nn.Parameter(_flatten(params, pad))
    bound = Lamb([flat], lr=0.05, weight_decay=0.1)
    bound.partition_layout = PartitionLayout(num_slots=len(params), slot_names=list(ref))
    bound.partition_layout.add(flat, list(reversed(pieces)))  # any order
    assert bound.partition_layout.segments_of(flat).lengths == [35, 13, 3, 33, 2, 4]
    naive_flat = torch.nn.Parameter(flat.detach().clone())
    naive = Lamb([naive_flat], lr=0.05, weight_decay=0.1)
    for step_grads in grads:
        g = _flatten(step_grads, pad)
        flat.grad, naive_flat.grad = g.clone(), g.clone()
        bound.step()
        naive.step()
        reference_lamb(ref, {str(i): x for i, x in enumerate(step_grads)}, state, lr=0.05, weight_decay=0.1)
    expected = _flatten([ref[str(i)] for i in range(len(params))], pad)
    torch.testing.assert_close(flat.detach(), expected, rtol=0, atol=1e-12)
    assert (naive_flat.detach() - expected).abs().max() > 1e-3  # one ratio for the whole flat tensor is wrong
    assert bound.last_trust_ratios.shape == (len(params),)


def test_overlapping_or_oversized_pieces_are_refused():
    flat = torch.zeros(10)
    layout = PartitionLayout(num_slots=2, slot_names=["a", "b"])
    with pytest.raises(ValueError, match="overlaps"):
        layout.add(flat, [(0, 6, 0), (5, 3, 1)])
    with pytest.raises(ValueError, match="flat tensor has 10"):
        layout.add(flat, [(0, 6, 0), (6, 5, 1)])


def test_unknown_flat_tensor_is_refused_with_a_clear_message():
    flat = torch.nn.Parameter(torch.zeros(8, dtype=torch.float64))
    opt = Lamb([flat], lr=0.1)
    opt.partition_layout = PartitionLayout(num_slots=4, slot_names=list("abcd"))
    flat.grad = torch.ones_like(flat)
    with pytest.raises(RuntimeError, match="bind_zero_layout"):
        opt.step()


def test_param_groups_exclude_biases_and_norms_and_list_shared_once():
    model = Small()
    groups = param_groups(model, 0.01, mark_trust_ratio=True)
    decay, no_decay = groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == ["down.weight", "emb.weight", "up.weight"]
    assert sorted(names[id(p)] for p in no_decay["params"]) == [
        "decoder_bias", "down.bias", "norm.bias", "norm.weight", "up.bias"]
    assert decay["weight_decay"] == 0.01 and not decay["exclude_from_trust_ratio"]
    assert no_decay["weight_decay"] == 0.0 and no_decay["exclude_from_trust_ratio"]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert "exclude_from_trust_ratio" not in param_groups(model, 0.01)[0]


def test_param_groups_recognise_a_custom_norm_module_by_type():
    class ScaleNorm(nn.Module):  # a 2-D gain would otherwise look like a weight matrix
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1, 4))

    class WithNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4, bias=False)
            self.ln = ScaleNorm()
    assert excluded_names(WithNorm()) == ["ln.scale"]


@pytest.mark.parametrize("kwargs, field", [({"lr": -1.0}, "lr"), ({"betas": (0.9, 1.0)}, "betas"),
                                           ({"eps": 0.0}, "eps"), ({"max_trust_ratio": 0.0}, "max_trust_ratio")])
def test_bad_hyperparameters_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Lamb([nn.Parameter(torch.zeros(2))], **kwargs)
