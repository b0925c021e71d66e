"""Determinism and resumption: samples as pure functions of (seed, epoch, index), rank-count independence, blending."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from test_samples import data_config, en_prepared, en_tokenizer, write_shards  # noqa: F401 (fixtures)
from trainer.data.dataset import PretrainingDataset
from trainer.data.loader import Collator, build_dataloader, build_pretraining_loader
from trainer.data.order import Blend, EpochOrder, PretrainingBatchSampler


def _digest(sample: dict) -> tuple:
    return tuple((k, np.asarray(v).tobytes()) for k, v in sorted(sample.items()))


@pytest.fixture(scope="module")
def dataset(en_prepared, en_tokenizer, tmp_path_factory):
    cfg = data_config(en_prepared, format="segment-pair", max_seq_length=64,
                      cache_dir=str(tmp_path_factory.mktemp("cache")), masking={"strategy": "whole-word"})
    return PretrainingDataset(cfg, en_tokenizer, seed=11)


def test_same_sample_in_another_process(dataset, en_prepared, en_tokenizer):
    positions = [0, 17, len(dataset) + 5, 3 * len(dataset) - 1]
    here = [{k: np.asarray(v).tolist() for k, v in dataset[p].items()} for p in positions]
    code = f"""
import json, numpy as np
from data_prep.tokenizer import load_tokenizer
from trainer.data.config import DataConfig
from trainer.data.dataset import PretrainingDataset
cfg = DataConfig.model_validate_json({dataset.cfg.model_dump_json()!r})
ds = PretrainingDataset(cfg, load_tokenizer({str(en_tokenizer.path)!r}), seed=11)
print(json.dumps([{{k: np.asarray(v).tolist() for k, v in ds[p].items()}} for p in {positions}]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


def test_samples_built_in_any_order_are_identical(dataset):
    forward = [_digest(dataset[p]) for p in range(40)]
    backward = [_digest(dataset[p]) for p in reversed(range(40))][::-1]
    assert forward == backward


def test_static_masking_repeats_across_epochs_and_dynamic_does_not(en_prepared, en_tokenizer, tmp_path):
    def views(dynamic: bool, dupe: int = 1):
        cfg = data_config(en_prepared, format="full-sentences", max_seq_length=64, cache_dir=str(tmp_path),
                          masking={"dynamic": dynamic, "dupe_factor": dupe})
        ds = PretrainingDataset(cfg, en_tokenizer, seed=2)
        return ds, [[_digest(ds.build(0, epoch, i)) for i in range(30)] for epoch in range(4)]

    _, static = views(False)
    assert static[0] == static[1] == static[3]
    ds, dynamic = views(True)
    assert all(a != b for a, b in zip(dynamic[0], dynamic[1]))  # every sample re-masked
    # the *text* of a sample is the same in every epoch; only the corruption differs
    labels = [ds.build(0, e, 5) for e in range(2)]
    orig = []
    for s in labels:
        ids = s["input_ids"].copy()
        ids[s["mlm_positions"]] = s["mlm_labels"]
        orig.append(ids.tolist())
    assert orig[0] == orig[1]
    _, dupe = views(False, dupe=2)
    assert dupe[0] == dupe[2] and dupe[1] == dupe[3] and dupe[0] != dupe[1]


def test_batched_fetch_equals_one_by_one(dataset):
    positions = [5, 900, 3, len(dataset) + 2]
    assert [_digest(s) for s in dataset.__getitems__(positions)] == [_digest(dataset[p]) for p in positions]


def test_rekeyed_generator_is_the_fresh_per_sample_generator(dataset):
    from trainer.data.dataset import sample_rng

    for epoch, sample_id in [(0, 3), (2, 3), (0, 4)]:
        _, rng = dataset.unmasked(0, epoch, sample_id)
        rng.integers(0, 7, 3)  # leave state (buffers) behind
        _, rng = dataset.unmasked(0, epoch, sample_id)
        fresh = sample_rng(dataset.seed, 0, epoch, sample_id)
        dataset.builders[0](sample_id, fresh)  # the same draws the builder took
        assert np.array_equal(rng.random(6), fresh.random(6))


def test_epoch_order_is_a_permutation_per_epoch():
    order = EpochOrder(1000, seed=4)
    seen = [order(g) for g in range(3000)]
    for e in range(3):
        ids = [s for ep, s in seen if ep == e]
        assert sorted(ids) == list(range(1000))
    assert [s for _, s in seen[:1000]] != [s for _, s in seen[1000:2000]]
    again = EpochOrder(1000, seed=4)  # a pure function of (seed, epoch, position): nothing cached, nothing stored
    assert [again(g) for g in range(2500, 2600)] == seen[2500:2600]
    epochs, ids = again.batch(np.arange(2950, 3000))
    assert list(zip(epochs.tolist(), ids.tolist())) == seen[2950:3000]


def test_sampler_worked_example():
    # order.py's docstring: G = 8, R = 2, m = 2, step 3: rank 1 reads 26, 27 then 30, 31.
    s = PretrainingBatchSampler(consumed_samples=24, global_batch=8, micro_batch=2, rank=1, world_size=2,
                                total_samples=32)
    assert list(s) == [[26, 27], [30, 31]] and len(s) == 2
    with pytest.raises(ValueError, match="global batch 8 is not a multiple"):
        PretrainingBatchSampler(0, 8, 3, 0, 2)
    # a resume with another global batch (16 -> 8 here): positions go on from where the old batch left them
    s = PretrainingBatchSampler(consumed_samples=20, global_batch=8, micro_batch=2, rank=1, world_size=2,
                                total_samples=36)
    assert list(s) == [[22, 23], [26, 27], [30, 31], [34, 35]] and len(s) == 4


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_resume_on_any_rank_count_reads_what_an_uninterrupted_run_reads(dataset, world_size):
    G, steps, resume_step = 8, 6, 3
    uninterrupted = [_digest(dataset[p]) for p in range(resume_step * G, steps * G)]
    micro = 2 if world_size < 4 else 1
    read = []
    for rank in range(world_size):
        sampler = PretrainingBatchSampler(resume_step * G, G, micro, rank, world_size, total_samples=steps * G)
        read += [_digest(dataset[p]) for batch in sampler for p in batch]
    assert Counter(read) == Counter(uninterrupted)


def test_loader_batches_do_not_depend_on_workers_and_follow_the_contract(dataset, en_tokenizer):
    from trainer.loop import _to_device
    from trainer.models.kernels import pack

    collate = Collator(en_tokenizer.pad_id, 64, dataset.cfg.masking.max_predictions_per_seq)
    batches = {}
    for workers in (0, 2):
        loader = build_dataloader(dataset, collate, consumed_samples=16, global_batch=8, micro_batch=4, rank=0,
                                  world_size=2, total_samples=40, num_workers=workers, prefetch_factor=2)
        batches[workers] = list(loader)
    assert len(batches[0]) == 3
    for a, b in zip(batches[0], batches[2]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if k != "packing")
        assert torch.equal(a["packing"].indices, b["packing"].indices)
        assert torch.equal(a["packing"].cu_seqlens, b["packing"].cu_seqlens)
    b = batches[2][0]  # as a worker built it: compact dtypes and the packing, built in the worker
    B, T = b["input_ids"].shape
    assert {k: v.dtype for k, v in b.items() if k != "packing"} == {
        "input_ids": torch.int32, "token_type_ids": torch.int8, "attention_mask": torch.int8,
        "mlm_positions": torch.int32, "mlm_labels": torch.int32, "sentence_label": torch.int64}
    want = pack(b["attention_mask"])
    assert torch.equal(b["packing"].indices, want.indices) and torch.equal(b["packing"].cu_seqlens, want.cu_seqlens)
    moved = _to_device(b, "cpu")  # what the loop gives the objectives: the contract's int64, the same values
    assert all(moved[k].dtype == torch.int64 and torch.equal(moved[k], b[k].long()) for k in b if k != "packing")
    assert moved["packing"].cu_seqlens.dtype == torch.int32  # flash-attn's dtype, kept
    b = moved
    assert B == 4 and T <= 64
    P = dataset.cfg.masking.max_predictions_per_seq
    assert b["mlm_positions"].shape == (B, P) and b["mlm_labels"].shape == (B, P)
    real = b["mlm_labels"] != -100
    rows = torch.arange(B)[:, None].expand(B, P)
    assert (b["attention_mask"][rows[real], b["mlm_positions"][real]] == 1).all()  # predictions on real tokens
    assert ((b["input_ids"] == en_tokenizer.pad_id) == (b["attention_mask"] == 0)).all()
    ref = dataset[16]  # rank 0's first micro-batch starts at position 16
    n = len(ref["input_ids"])
    assert b["input_ids"][0, :n].tolist() == ref["input_ids"].tolist()
    assert b["sentence_label"].shape == (B,)


def test_starting_a_loader_leaves_the_global_rng_alone(dataset, en_tokenizer):
    """A resumed run restores torch's RNG and then starts a new loader iterator; if that drew from the global RNG,
    every later dropout mask would differ from an uninterrupted run's."""
    collate = Collator(en_tokenizer.pad_id, 64, dataset.cfg.masking.max_predictions_per_seq)
    loader = build_dataloader(dataset, collate, consumed_samples=0, global_batch=8, micro_batch=4, rank=0,
                              world_size=2, total_samples=16, num_workers=0)
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    next(iter(loader))
    assert torch.equal(torch.rand(3), expected)


def test_pad_to_max_gives_fixed_shapes(dataset, en_tokenizer):
    collate = Collator(en_tokenizer.pad_id, 64, 20, pad_to="max")
    batch = collate([dataset[i] for i in range(3)])
    assert batch["input_ids"].shape == (3, 64)


def test_blending_meets_weights_and_stays_deterministic(en_prepared, en_tokenizer, tmp_path):
    blend = Blend([3.0, 1.0], period=1000)
    picks = [blend(g) for g in range(4000)]
    corpus = np.array([c for c, _ in picks])
    assert np.mean(corpus == 0) == pytest.approx(0.75, abs=1e-3)
    for c in (0, 1):
        local = [p for k, p in picks if k == c]
        assert local == list(range(len(local)))  # each corpus is read in its own stream order, no gaps
    small = write_shards([[[10 + i, 11 + i], [12 + i]] for i in range(40)], tmp_path / "small", 2000)
    cfg = data_config(en_prepared, format="full-sentences", max_seq_length=64, cache_dir=str(tmp_path / "c"))
    cfg = cfg.model_copy(update={"corpora": [cfg.corpora[0], cfg.corpora[0].model_copy(
        update={"prefix": str(small), "weight": 0.25})]})
    ds = PretrainingDataset(cfg, en_tokenizer, seed=0)
    located = [ds.locate(g) for g in range(400)]
    share = np.mean([c == 1 for c, _, _ in located])
    assert share == pytest.approx(0.2, abs=0.01)
    # the small corpus (40 samples) wraps into new epochs while the big one is still in its first
    assert max(e for c, e, _ in located if c == 1) >= 1 and max(e for c, e, _ in located if c == 0) == 0
    # deterministic: a dataset built afresh with the same seed gives the same samples, another seed other ones
    fresh, reseeded = PretrainingDataset(cfg, en_tokenizer, seed=0), PretrainingDataset(cfg, en_tokenizer, seed=1)
    picked = [_digest(ds[g]) for g in (3, 250)]
    assert [_digest(fresh[g]) for g in (3, 250)] == picked
    assert all(_digest(reseeded[g]) != p for g, p in zip((3, 250), picked))


def test_build_pretraining_loader_from_config(en_prepared, en_tokenizer, tmp_path):
    cfg = data_config(en_prepared, format="sop-pair", max_seq_length=64, num_workers=0, cache_dir=str(tmp_path))
    loader, ds = build_pretraining_loader(cfg, en_tokenizer, seed=1, consumed_samples=0, global_batch=4,
                                          micro_batch=4, rank=0, world_size=1, total_samples=8)
    batches = list(loader)
    assert len(batches) == 2 and set(batches[0]) >= {"input_ids", "sentence_label", "mlm_positions"}


def test_a_corpus_prepared_with_another_vocabulary_is_refused(en_tokenizer, tmp_path):
    prefix = write_shards([[[5, 6], [7]], [[8, 9]]], tmp_path / "other", 999)
    with pytest.raises(ValueError, match="other.*vocabulary of 999.*tokenizer has 2000"):
        PretrainingDataset(data_config(prefix, cache_dir=str(tmp_path)), en_tokenizer, seed=0)


def test_the_packing_built_in_the_workers_is_pinned_with_the_batch(monkeypatch):
    """With ``pin_memory`` on (CUDA), the DataLoader pins every object of a batch that has ``pin_memory``: the
    ``Packing`` must have one, or its tensors reach the device from pageable memory (a synchronous copy). This CPU
    build cannot pin, so ``Tensor.pin_memory`` is replaced by a recorder: what it cannot see is real pinned memory
    and the asynchronous copy on a GPU."""
    from torch.utils.data._utils.pin_memory import pin_memory

    from trainer.models.kernels import attach_packing

    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(self) or self.clone())
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.int8)
    batch = attach_packing({"input_ids": torch.ones(2, 3, dtype=torch.int32), "attention_mask": mask})
    out = pin_memory(batch)
    packing = batch["packing"]
    assert any(t is packing.indices for t in pinned) and any(t is packing.cu_seqlens for t in pinned)
    assert any(t is packing.mask for t in pinned) and any(t is batch["input_ids"] for t in pinned)
    assert out["packing"].indices is not packing.indices and torch.equal(out["packing"].indices, packing.indices)
    assert out["packing"].max_seqlen == 2 and out["packing"].batch == 2
