"""What a fine-tuning task kind provides (``TaskKind``), and the small encoding helpers the kinds share.

The registry of kinds by task name is ``trainer/finetune/kinds.py``; GLUE's and tsv's classification kind lives in
``trainer/finetune/run.py`` with the encoding it wraps.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100
"""Label of positions that take no loss (sub-tokens after a word's first; padding)."""


def pair_ids(cls: int, sep: int, a: list[int], b: list[int] | None, family: str, type_vocab_size: int
             ) -> tuple[list[int], list[int]]:
    """[CLS] A [SEP] (B [SEP]) with segment ids 0/1; RoBERTa: <s> A </s></s> B </s>, segment ids 0."""
    ids = [cls] + a + [sep]
    types = [0] * len(ids)
    if b is not None:
        tail = ([sep] if family == "roberta" else []) + b + [sep]
        ids += tail
        types += [1 if type_vocab_size > 1 else 0] * len(tail)
    return ids, types


def pair_overhead(family: str, pair: bool) -> int:
    return (4 if family == "roberta" else 3) if pair else 2


def run_model(model, batch: dict) -> torch.Tensor:
    """The task model on a batch: its ids, mask and segment ids, and the ``packing`` that ``device_batch`` computed
    on the host (without it an ``unpad`` model finds the real tokens on the device: two ``nonzero`` and a ``tolist``,
    host syncs, per forward)."""
    return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], packing=batch.get("packing"))


def device_batch(batch: dict, device) -> dict:
    """A collated CPU batch on ``device``, with its ``Packing`` (``trainer.models.kernels.pack`` of the attention
    mask, as the pretraining loop attaches one) computed first, on the host, where finding the real tokens costs no
    device sync. A multiple-choice mask [B, C, T] is packed as the [B*C, T] rows the encoder sees."""
    from trainer.models.kernels import Packing, pack

    mask = batch.get("attention_mask")
    if torch.is_tensor(mask) and mask.device.type == "cpu" and mask.dim() in (2, 3) and "packing" not in batch:
        batch = {**batch, "packing": pack(mask.reshape(-1, mask.shape[-1]))}
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) or isinstance(v, Packing) else v
            for k, v in batch.items()}


def pad_rows(rows: list[list[int]], value: int, width: int | None = None) -> torch.Tensor:
    width = width or max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


class TaskKind:
    """What a task kind provides (see the module docstring). ``metrics[0]`` is the main score (best setting)."""

    name: str
    metrics: tuple[str, ...]
    head: str
    """'sequence', 'span', 'token' or 'choice' (trainer/finetune/heads.py)."""
    max_seq_length: int = 128
    """Used when train.max_seq_length is not set (SQuAD 384, RACE 512, as the papers)."""
    num_labels: int = 1

    def __init__(self, task_cfg):
        self.cfg = task_cfg

    def build_model(self, source, cfg):
        from trainer.finetune.heads import build_task_model
        return build_task_model(source, self.head, self.num_labels, cfg.train.dropout, cfg.train.classifier_dropout,
                                cfg.train.from_scratch)

    def collate(self, data, idx, pad_id: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model, batch) -> torch.Tensor:
        raise NotImplementedError

    def outputs(self, model, batch) -> list:
        raise NotImplementedError

    def score(self, outputs: list, data) -> dict[str, float]:
        raise NotImplementedError

    def size(self, data) -> int:
        return len(data.ids)

    unlabelled: tuple[str, ...] = ()
    """Splits that are predicted (and written), never scored (``task.test_files``)."""

    def predictions(self, outputs: list, data):
        """What the prediction files are written from, compact (a sweep keeps one run's per setting); None: the
        kind writes no files."""
        return None

    def scored(self, outputs: list, data, labelled: bool = True) -> tuple[dict[str, float] | None, object]:
        """(the split's scores, or None for an unlabelled split; its ``predictions``). A kind whose scores and
        predictions share work (SQuAD's best spans) does it once here."""
        return (self.score(outputs, data) if labelled else None), self.predictions(outputs, data)

    def write_predictions(self, predictions, data, folder, split: str) -> list:
        """Write ``predictions`` of ``split`` into ``folder`` (trainer/finetune/predictions.py); the paths."""
        return []


def choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)
