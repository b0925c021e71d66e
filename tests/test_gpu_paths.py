"""The GPU code paths, checked on the CPU with fakes (issue 15): what a first GPU run would otherwise debug.

- MFU's denominator: datasheet peaks per GPU model and matmul dtype, the measurement at the training dtype otherwise;
- the varlen attention kernel chosen from device *and* dtype (flash-attn has no fp32 kernel), nested tensors carrying
  their sequence lengths, the host-computed packing (no mask at all when nothing is padded);
- host<->device syncs per optimizer step: a fixed few, whatever the number of layers and micro-batches.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fork_server
from trainer import metrics
from trainer.models import MLM, HeadSpec, PretrainingModel, flat_positions, get_preset, mlm_targets
from trainer.models import kernels
from trainer.models.kernels import attach_packing, choose_varlen_method, pack, varlen_attention

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from sync_count_worker import SyncCounter  # noqa: E402


# ----------------------------------------------------------------------------------------------------------- MFU
@pytest.mark.parametrize("name,dtype,tf32,tflops", [
    ("NVIDIA H200", torch.bfloat16, False, 989.4),
    ("NVIDIA H100 80GB HBM3", torch.float16, False, 989.4),
    ("NVIDIA H100 PCIe", torch.bfloat16, False, 756.5),
    ("NVIDIA A100-SXM4-80GB", torch.float32, True, 156.0),
    ("NVIDIA A100-SXM4-80GB", torch.float32, False, 19.5),
    ("Tesla V100-SXM2-32GB", torch.float16, False, 125.0),
    ("Tesla V100-PCIE-16GB", torch.float16, False, 112.0),
    ("NVIDIA L40S", torch.bfloat16, False, 362.05),
    ("NVIDIA L4", torch.bfloat16, False, 121.0),
])
def test_peak_flops_come_from_the_datasheet_at_the_training_dtype(monkeypatch, name, dtype, tf32, tflops):
    """torch.cuda.get_device_name is faked to return each datasheet GPU's name. The fake proves our side of the seam
    (the name and dtype picking the listed peak, with no measurement), not that a real GPU reports that exact name
    (a new driver or a MIG slice may spell it otherwise)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(metrics, "measure_peak_flops", lambda *a, **k: pytest.fail("measured a listed GPU"))
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        peak, source = metrics.peak_flops("cuda:3", dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert peak == pytest.approx(tflops * 1e12) and name in source


def test_unlisted_gpu_or_dtype_is_measured_at_the_training_dtype(monkeypatch):
    """torch.cuda.get_device_name is faked (a listed GPU without a bf16 peak, an unlisted one) and the measurement
    recorded. The fake proves our side of the seam (an unlisted name or dtype is measured, on the right device and
    dtype), not what a real GPU reports as its name nor a measurement on it."""
    calls = []
    monkeypatch.setattr(metrics, "measure_peak_flops", lambda device, dtype: calls.append((device, dtype)) or 1e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    assert metrics.peak_flops("cuda:1", torch.bfloat16)[0] == 1e12  # Volta has no bf16 peak to look up
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    metrics.peak_flops("cuda:0", torch.float16)
    metrics.peak_flops("cpu", torch.bfloat16)
    assert calls == [("cuda:1", torch.bfloat16), ("cuda:0", torch.float16), ("cpu", torch.bfloat16)]


def test_a_measured_peak_is_kept_for_the_run_and_a_listed_gpu_is_not_written(monkeypatch, tmp_path):
    """An unlisted GPU (faked name) was measured at every launch, so MFU jumped between relaunches (review): the first
    launch's measurement is kept in RUN_DIR/mfu_peak.json and reused on the same device kind and dtype; another dtype
    or device kind measures again; a datasheet GPU writes nothing."""
    values = iter([3e14, 5e14, 7e14])
    calls = []
    monkeypatch.setattr(metrics, "measure_peak_flops", lambda device, dtype: calls.append(dtype) or next(values))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    first = metrics.run_peak_flops(tmp_path, "cuda:0", torch.bfloat16, rank=0)
    again = metrics.run_peak_flops(tmp_path, "cuda:2", torch.bfloat16, rank=1)
    assert first[0] == again[0] == 3e14 and "first launch" in again[1] and calls == [torch.bfloat16]
    assert metrics.run_peak_flops(tmp_path, "cuda:0", torch.float16, rank=0)[0] == 5e14  # another dtype
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    listed = tmp_path / "listed"
    assert metrics.run_peak_flops(listed, "cuda:0", torch.bfloat16, rank=0)[0] == pytest.approx(989.4e12)
    assert not (listed / "mfu_peak.json").exists() and len(calls) == 2


def test_measured_peak_uses_the_requested_dtype(monkeypatch):
    seen = []
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: seen.append(k["dtype"]) or real_randn(*a, **k))
    assert metrics.measure_peak_flops("cpu", torch.bfloat16, n=64) > 0
    assert seen == [torch.bfloat16, torch.bfloat16]


# ------------------------------------------------------------------------------------------ attention kernels
def test_varlen_kernel_choice_depends_on_device_and_dtype(monkeypatch):
    """(torch.cuda.get_device_capability is faked: this proves our choice, not flash-attn's own check.)"""
    capability = {0: (9, 0), 1: (7, 0)}  # an H100, and a V100 in the same venv
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability[index or 0])
    kernels._flash_capable.cache_clear()
    monkeypatch.setattr(kernels, "_flash_attn", lambda: (lambda *a, **k: None))  # flash-attn "installed"
    assert choose_varlen_method(torch.device("cuda", 1), torch.float16) == "nested"  # flash-attn 2 needs sm80+
    assert choose_varlen_method(torch.device("cuda", 0), torch.bfloat16) == "flash"
    assert choose_varlen_method(torch.device("cuda", 0), torch.float16) == "flash"
    assert choose_varlen_method(torch.device("cuda", 0), torch.float32) == "nested"  # flash has no fp32 kernel
    assert choose_varlen_method(torch.device("cpu"), torch.bfloat16) == "padded"
    monkeypatch.setattr(kernels, "_flash_attn", lambda: None)  # not installed
    assert choose_varlen_method(torch.device("cuda", 0), torch.bfloat16) == "nested"
    monkeypatch.setattr(kernels, "_flash_attn", lambda: (lambda *a, **k: None))
    qkv = torch.randn(5, 3, 2, 4)
    with pytest.raises(RuntimeError, match="fp16 or bf16"):
        varlen_attention(qkv, pack(torch.ones(1, 5, dtype=torch.long)), method="flash")


def test_nested_attention_carries_sequence_lengths(monkeypatch):
    """Without min/max seqlen metadata SDPA computes them with an .item() per q/k/v, twice, in every layer."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    packing = pack(mask)
    assert (packing.max_seqlen, packing.min_seqlen, packing.tokens, packing.padded) == (5, 2, 10, True)
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def sdpa(q, k, v, **kw):
        seen.append([(t._maybe_min_seqlen, t._maybe_max_seqlen) for t in (q, k, v)])
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    varlen_attention(torch.randn(10, 3, 2, 4), packing, method="nested")
    assert seen == [[(2, 5)] * 3]


def test_host_packing_drops_the_mask_when_nothing_is_padded(monkeypatch):
    cfg = get_preset("tiny-roberta", dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = PretrainingModel(cfg, {MLM: HeadSpec("mlm")}).eval()
    ids = torch.randint(5, cfg.vocab_size, (2, 7))
    full = torch.ones_like(ids)
    masks = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, **kw: masks.append(attn_mask) or real_sdpa(q, k, v, attn_mask,
                                                                                                   **kw))
    batch = attach_packing({"input_ids": ids, "attention_mask": full})
    assert not batch["packing"].padded
    with torch.no_grad():
        fast = model(ids, full, packing=batch["packing"])["hidden"]
        assert masks and all(m is None for m in masks)  # SDPA may take its flash kernel
        masks.clear()
        reference = model(ids, full)["hidden"]
        assert masks and all(m is not None for m in masks)
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-5)
    padded = full.clone()
    padded[1, 5:] = 0
    assert attach_packing({"input_ids": ids, "attention_mask": padded})["packing"].padded
    with pytest.raises(ValueError, match="packing is for"):
        model(ids[:, :5], full[:, :5], packing=batch["packing"])


@pytest.mark.parametrize("unpad", [False, True])
def test_host_packing_gives_the_same_model_outputs(unpad):
    cfg = get_preset("tiny-roberta", dropout=0.0, attention_dropout=0.0, unpad=unpad)
    torch.manual_seed(0)
    model = PretrainingModel(cfg, {MLM: HeadSpec("mlm")}).eval()
    ids = torch.randint(5, cfg.vocab_size, (2, 8))
    pack_ids = torch.tensor([[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 2, 2, 2, 3, 3, 3]])
    mask = (pack_ids != 0).long()
    for extra in ({}, {"pack_ids": pack_ids}):
        batch = attach_packing({"input_ids": ids, "attention_mask": mask, **extra})
        with torch.no_grad():
            torch.testing.assert_close(model(ids, mask, packing=batch["packing"], **extra)["hidden"],
                                       model(ids, mask, **extra)["hidden"], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ host-device syncs
def test_mlm_targets_need_no_sync_and_agree_with_flat_positions():
    positions = torch.tensor([[1, 3], [2, 0]])
    labels = torch.tensor([[7, 9], [5, -100]])
    counter = SyncCounter().install()
    try:
        counter.on = True
        flat, flat_labels = mlm_targets(positions, labels, 4)
        counter.on = False
        assert counter.count == 0
        counter.on = True
        real, real_labels = flat_positions(positions, labels, 4)  # boolean indexing: data-dependent shape
        counter.on = False
        assert counter.count == 2  # the counter sees what it is meant to
    finally:
        counter.uninstall()
    assert flat.tolist() == [1, 3, 6, 4] and flat_labels.tolist() == [7, 9, 5, -100]
    keep = flat_labels != -100
    assert flat[keep].tolist() == real.tolist() and flat_labels[keep].tolist() == real_labels.tolist()


def test_mlm_loss_ignores_padding_predictions_exactly():
    from trainer.objectives.base import mlm_loss

    torch.manual_seed(0)
    logits = torch.randn(6, 11)
    labels = torch.tensor([3, -100, 5, 7, -100, 1])
    loss, acc = mlm_loss(logits, labels)
    keep = labels != -100
    torch.testing.assert_close(loss, F.cross_entropy(logits[keep], labels[keep]))
    assert acc == (logits[keep].argmax(-1) == labels[keep]).float().mean()
    zero, _ = mlm_loss(logits.requires_grad_(), torch.full((6,), -100))
    assert zero.item() == 0.0 and zero.requires_grad  # every rank still runs its backward


def test_ernie_classification_loss_needs_no_sync_and_matches_the_reference():
    """ERNIE's token and sentence task losses: cross-entropy and accuracy over the labelled entries only, computed
    without a host sync (it runs once per task and micro-batch); 0 with a gradient when nothing is labelled."""
    from trainer.objectives.ernie import classification_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 3, requires_grad=True)
    labels = torch.tensor([[0, -100, 2, 1, -100], [-100, 1, 1, 0, 2]])
    counter = SyncCounter().install()
    try:
        counter.on = True
        loss, acc = classification_loss(logits, labels)
        zero, zero_acc = classification_loss(logits, torch.full((2, 5), -100))
        counter.on = False
        assert counter.count == 0, counter.where
    finally:
        counter.uninstall()
    flat, flat_labels = logits.reshape(-1, 3), labels.reshape(-1)
    keep = flat_labels != -100
    torch.testing.assert_close(loss, F.cross_entropy(flat[keep], flat_labels[keep]))
    assert acc.item() == (flat[keep].argmax(-1) == flat_labels[keep]).float().mean().item()
    assert zero.item() == 0.0 and zero_acc.item() == 0.0 and zero.requires_grad
    (loss + zero).backward()
    assert logits.grad[labels == -100].abs().sum() == 0 and logits.grad[labels != -100].abs().sum() > 0


@pytest.mark.slow
@pytest.mark.timeout(1260)  # above the worker's own 1200 s timeout, so that its output is reported, not lost
def test_syncs_per_optimizer_step_do_not_grow_with_layers_or_micro_batches(tmp_path):
    """Real trainer steps (DeepSpeed engine, MLM objective, the real collator) on a 1-rank gloo group: the syncs of
    step 2 and 3, for 2 and 8 layers and 1 and 3 micro-batches, on every attention path, and in bf16 under the GPU
    recipes' ZeRO-1 (DeepSpeed's BF16_Optimizer). Host-device copies count as syncs (``torch.tensor(..., device=)``).
    What it cannot see: syncs inside CUDA-only code (kernels, NCCL) and allocator stalls; the GPU script measures those
    with torch.cuda.set_sync_debug_mode."""
    out = tmp_path / "syncs.json"
    proc = fork_server.run([sys.executable, str(REPO / "tests" / "sync_count_worker.py"), str(out)], cwd=REPO,
                           timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = json.loads(out.read_text())
    by_path: dict[str, set[int]] = {}
    for key, steps in counts.items():
        path = key.rsplit("-", 2)[0]  # z2-unpad-L8-a3 -> z2-unpad
        by_path.setdefault(path, set()).update(steps)
    log = proc.stdout[-3000:]
    # one number per path, whatever L and accumulation: nothing per layer, nothing per micro-batch
    assert all(len(v) == 1 for v in by_path.values()), (by_path, log)
    # stage 0: the non-finite guard's .item() and the loop's one .tolist() (ours), DeepSpeed's clip_grad_norm_ makes
    # two host tensors on the device; ZeRO-2 and the bf16 ZeRO-1 wrapper make their own overflow checks instead of
    # the guard (issue 23: the loop's host-made flag tensor was one more on every path)
    assert by_path["ours/z0-padded"] == {2} and by_path["z0-padded"] == {4}, (by_path, log)
    assert all(v == {6} for k, v in by_path.items() if k.startswith("z2")), (by_path, log)
    # the GPU recipes' default (ZeRO-1, bf16): the loop's one .tolist() is the trainer's only sync per step
    for name in ("z1bf16-plain", "z1bf16-packed"):
        assert by_path[f"ours/{name}"] == {1} and by_path[name] == {4}, (by_path, log)


def test_a_missing_flash_attn_is_looked_for_once(monkeypatch):
    """Issue 23: the failed import was retried in every attention call (Python caches no failed import)."""
    import builtins

    attempts = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        if name == "flash_attn":
            attempts.append(name)
            raise ImportError("no flash_attn here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    kernels._flash_attn.cache_clear()
    try:
        for _ in range(5):
            assert choose_varlen_method(torch.device("cuda", 0), torch.bfloat16) == "nested"
    finally:
        kernels._flash_attn.cache_clear()
    assert attempts == ["flash_attn"]
