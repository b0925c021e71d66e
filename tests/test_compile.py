"""``model.compile``: the compiled layers compute what the eager layers compute, share their parameters and state-dict
keys, compile one graph that every layer reuses, and are chosen as documented (auto: CUDA only, never under ZeRO-3).

Runs inductor's CPU backend (a C++ compiler is needed: .ci/run installs g++); the first compile takes ~15-20 s here.
What this cannot see: the Triton kernels inductor generates for CUDA, and bf16 numerics; bench/gpu.sh runs the
compiled model against Hugging Face on a GPU.
"""
import pytest
import torch
from torch._dynamo.utils import counters

from trainer.models import MLM, NSP, HeadSpec, PretrainingModel, get_preset

HEADS = {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)}


@pytest.fixture(autouse=True)
def _restore_recompile_limit():
    """compile_layers raises dynamo's process-wide recompile_limit (the product does so on purpose): put it back after
    each test, so that the modules after this one run with the limit they would have had without it."""
    before = torch._dynamo.config.recompile_limit
    yield
    torch._dynamo.config.recompile_limit = before


def _pair(layers=4, **kw):
    torch.manual_seed(0)
    cfg = get_preset("tiny", num_layers=layers, dropout=0.0, attention_dropout=0.0, **kw)
    eager = PretrainingModel(cfg.replace(compile="off"), HEADS).train()
    compiled = PretrainingModel(cfg.replace(compile="on"), HEADS).train()
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


def _loss(model, ids, mask):
    out = model(ids, mask)
    return out[MLM].float().logsumexp(-1).mean() + out[NSP].float().pow(2).mean() + out["hidden"].pow(2).mean()


@pytest.mark.parametrize("unpad", [False, True])
def test_compiled_layers_equal_eager_forward_and_gradients(unpad):
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _pair(layers=6, unpad=unpad)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    gen = torch.Generator().manual_seed(1)
    for batch, seq in ((4, 32), (3, 48)):  # a second shape must reuse the dynamic graphs, not break them
        ids = torch.randint(5, eager.cfg.vocab_size, (batch, seq), generator=gen)
        mask = torch.ones_like(ids)
        mask[1, seq // 2:] = 0
        ids[mask == 0] = 0
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            _loss(model, ids, mask).backward()
        torch.testing.assert_close(compiled(ids, mask)["hidden"], eager(ids, mask)["hidden"], atol=1e-5, rtol=1e-5)
        for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    assert all(m._compiled is not None for m in (*compiled.encoder.attention, *compiled.encoder.ffn))
    # One graph per block kind (feed-forward, attention output; + a recompile for the second shape at most), shared
    # by the 6 layers: a graph per layer would be 12 or more.
    assert 2 <= counters["stats"]["unique_graphs"] <= 6, dict(counters["stats"])


def test_compile_auto_is_off_on_cpu_and_under_zero3_and_on_refuses_zero3():
    cfg = get_preset("tiny", num_layers=2)
    ids = torch.randint(5, cfg.vocab_size, (2, 16))
    model = PretrainingModel(cfg, HEADS)
    assert cfg.compile == "auto"
    model(ids)
    assert all(m._compiled is None for m in (*model.encoder.attention, *model.encoder.ffn))

    class FakeCuda:  # what _decide_compile reads of the device
        type = "cuda"

    model = PretrainingModel(cfg, HEADS)
    model.encoder._decide_compile(FakeCuda())
    assert all(m._compiled is not None for m in model.encoder.ffn)  # auto on CUDA: compiled (not run here)

    zero3 = PretrainingModel(cfg, HEADS)
    for p in zero3.parameters():
        p.ds_id = 0  # the attribute ZeRO-3 gives partitioned parameters
    zero3.encoder._decide_compile(FakeCuda())
    assert all(m._compiled is None for m in zero3.encoder.ffn)
    on = PretrainingModel(cfg.replace(compile="on"), HEADS)
    for p in on.parameters():
        p.ds_id = 0
    with pytest.raises(ValueError, match="model.compile: on is not supported under ZeRO-3"):
        on(ids)


def test_electra_compiles_every_variant_its_training_and_evaluation_run(monkeypatch):
    """ELECTRA's generator and discriminator (two widths), in training and evaluation, on packed rows and on full
    rows (a batch the host found unpadded): dynamo compiled 17 variants of the two blocks, 9 of the attention output,
    past its default recompile_limit of 8, and ran the ninth eager from then on. Every variant is compiled now.
    dynamo's graph capture and its limit are real; the graphs go to the 'eager' backend (inductor would take minutes
    here for 16 graphs), so this says nothing of inductor's kernels."""
    import functools

    from trainer.models import ElectraPretrainingModel
    from trainer.models.kernels import pack
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)  # dynamo's default, whatever ran before
    torch.manual_seed(0)
    model = ElectraPretrainingModel(get_preset("tiny-electra", compile="on", unpad=True))
    ids = torch.randint(5, 1000, (4, 32))
    padded = torch.ones_like(ids)
    padded[1, 16:] = 0
    for training in (True, False):
        model.train(training)
        for mask in (padded, torch.ones_like(ids)):
            for part in ("generator", "discriminator"):
                with torch.set_grad_enabled(training):
                    out = model(ids, mask, part=part, packing=pack(mask))
                    if training:
                        out.float().sum().backward()
    assert counters["frames"]["total"] == counters["frames"]["ok"] == counters["stats"]["unique_graphs"] >= 16, \
        dict(counters["frames"])
    assert not any("recompile limit" in k for k in counters["unimplemented"]), dict(counters["unimplemented"])
