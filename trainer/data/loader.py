"""Collation and the torch DataLoader that feeds the trainer (worker processes, pinned memory on CUDA).

Collation is vectorised: the rows of a batch are concatenated once and scattered into the padded ``[B, T]`` tensor
with one fancy-indexing assignment per key (no per-token Python loop); the only Python loop is over the B samples
to gather their arrays. Collation runs in the loader workers, and the batch it builds stays compact on its way to
the device: token ids, positions and labels as int32, token types and the attention mask as int8 (int64 would be 2-8x
the bytes through the worker queue, the pinned buffer and the host-to-device copy), and the ``Packing`` of its real
tokens built here, on the host, once (``trainer.models.kernels.attach_packing``; pinned with the batch). The loop widens
the integer tensors to int64 on the device (``trainer.loop._to_device``), where the batch contract (DESIGN.md
"Batches") holds.
"""
from __future__ import annotations

import numpy as np
import torch

from .order import PretrainingBatchSampler
from .workers import WorkerSafeDataLoader

IGNORE_INDEX = -100


class Collator:
    """numpy samples -> the batch dict of DESIGN.md "Batches" (compact dtypes, see the module docstring) + packing."""

    def __init__(self, pad_id: int, max_seq_length: int, max_predictions: int, pad_to: str = "batch"):
        self.pad_id, self.max_seq_length, self.P = int(pad_id), int(max_seq_length), int(max_predictions)
        self.pad_to = pad_to

    def __call__(self, samples: list[dict]) -> dict:
        B = len(samples)
        lengths = np.fromiter((len(s["input_ids"]) for s in samples), dtype=np.int64, count=B)
        T = self.max_seq_length if self.pad_to == "max" else int(lengths.max())
        rows, cols = _ragged_coords(lengths)
        batch = {
            "input_ids": _scatter([s["input_ids"] for s in samples], rows, cols, (B, T), self.pad_id),
            "token_type_ids": _scatter([s["token_type_ids"] for s in samples], rows, cols, (B, T), 0, np.int8),
        }
        mask = np.zeros((B, T), dtype=np.int8)
        mask[rows, cols] = 1
        batch["attention_mask"] = torch.from_numpy(mask)
        if "pack_ids" in samples[0]:
            batch["pack_ids"] = _scatter([s["pack_ids"] for s in samples], rows, cols, (B, T), 0)
        num_pred = np.fromiter((len(s["mlm_positions"]) for s in samples), dtype=np.int64, count=B)
        prow, pcol = _ragged_coords(num_pred)
        batch["mlm_positions"] = _scatter([s["mlm_positions"] for s in samples], prow, pcol, (B, self.P), 0)
        batch["mlm_labels"] = _scatter([s["mlm_labels"] for s in samples], prow, pcol, (B, self.P), IGNORE_INDEX)
        if "sentence_label" in samples[0]:
            batch["sentence_label"] = torch.tensor([s["sentence_label"] for s in samples], dtype=torch.int64)
        from trainer.models.kernels import attach_packing
        return attach_packing(batch)


def _ragged_coords(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every element of B concatenated rows of the given lengths."""
    total = int(lengths.sum())
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    cols = np.arange(total) - np.repeat(starts, lengths)
    return rows, cols


def _scatter(arrays: list[np.ndarray], rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int],
             fill: int, dtype=np.int32) -> torch.Tensor:
    out = np.full(shape, fill, dtype=dtype)
    if len(rows):
        out[rows, cols] = np.concatenate(arrays)
    return torch.from_numpy(out)


def build_dataloader(dataset, collator: Collator, consumed_samples: int, global_batch: int, micro_batch: int,
                     rank: int, world_size: int, total_samples: int | None = None, num_workers: int = 2,
                     prefetch_factor: int = 4) -> torch.utils.data.DataLoader:
    """A DataLoader yielding this rank's micro-batches from ``consumed_samples`` on (see order.py).

    Workers only change *who* builds a sample, never *what* it is (each sample has its own generator), so the
    batches are identical for any ``num_workers``. ``pin_memory`` is on when CUDA is present: pinned host buffers
    make the host-to-device copy asynchronous. Workers ignore SIGTERM, SIGINT and SIGUSR1 (the rank decides what a stop
    signal means) and end with the run (``trainer.data.workers``).
    """
    sampler = PretrainingBatchSampler(consumed_samples, global_batch, micro_batch, rank, world_size, total_samples)
    if total_samples is not None and hasattr(dataset, "check_stream"):
        dataset.check_stream(total_samples)  # before any step, not in a worker at the first batch past the limit
        if rank == 0 and getattr(dataset, "split", None) == "train":
            for line in dataset.reading_note(total_samples):
                print(line, flush=True)
    kwargs = {}
    if num_workers > 0:
        kwargs = {"prefetch_factor": prefetch_factor, "persistent_workers": True}
    # A private generator: every iter(loader) draws a base seed for its workers, and from torch's global RNG that
    # draw would shift the dropout stream, so a resumed run (RNG restored, then a new iterator) would diverge from an
    # uninterrupted one. Samples never use it (each has its own generator).
    return WorkerSafeDataLoader(dataset, batch_sampler=sampler, collate_fn=collator, num_workers=num_workers,
                                pin_memory=torch.cuda.is_available(), generator=torch.Generator().manual_seed(0),
                                **kwargs)


def build_pretraining_loader(cfg, tokenizer, seed: int, consumed_samples: int, global_batch: int, micro_batch: int,
                             rank: int, world_size: int, total_samples: int | None = None, split: str = "train"):
    """The trainer's one call: dataset, collator and loader for a ``DataConfig`` section. Returns (loader, dataset)."""
    from .dataset import PretrainingDataset  # noqa: PLC0415 (keeps this module importable without megatron)

    dataset = PretrainingDataset(cfg, tokenizer, seed, split)
    collator = Collator(tokenizer.pad_id, cfg.max_seq_length, cfg.masking.max_predictions_per_seq, cfg.pad_to)
    loader = build_dataloader(dataset, collator, consumed_samples, global_batch, micro_batch, rank, world_size,
                              total_samples, cfg.num_workers, cfg.prefetch_factor)
    return loader, dataset
