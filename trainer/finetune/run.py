"""One fine-tuning run (one learning rate, one seed) through the trainer's DeepSpeed engine, and its dev scores.

Data parallel like pretraining: step s takes the next global batch of a seeded per-epoch shuffle; rank r of R runs
micro-batches ``k * R + r`` of it (k < accumulation steps), so any world size sees the same examples per step, and the
engine averages the gradients (ZeRO stage and precision from the config). Evaluation splits each dev set over the
ranks and gathers the predictions, so every rank computes the same scores with scikit-learn/scipy.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from trainer.finetune.kind_base import TaskKind, device_batch, run_model
from trainer.finetune.metrics import compute
from trainer.finetune.tasks import Example, TaskSpec


@dataclass
class Encoded:
    ids: list[list[int]]
    types: list[list[int]]
    labels: list
    """Class ids (regression: values); None each on an unlabelled split."""
    groups: list = field(default_factory=list)
    """Question id per example (``task.group``; None without one)."""
    index: list = field(default_factory=list)
    """What a prediction file names each example by: its ``index``/``id`` column, else its 0-based position."""


def encode(tokenizer, examples: list[Example], max_len: int, family: str, type_vocab_size: int) -> Encoded:
    """[CLS] A [SEP] (B [SEP]) with segment ids 0/1; RoBERTa: <s> A </s></s> B </s>, all segment ids 0 (fairseq's
    and Hugging Face's pair format). Pairs are truncated longest-first, as BERT's ``_truncate_seq_pair``."""
    texts_a = [e.text_a for e in examples]
    texts_b = [e.text_b for e in examples if e.text_b is not None]
    enc = getattr(tokenizer, "encode_batch", None)
    a_ids = enc(texts_a) if enc else [tokenizer.encode(t) for t in texts_a]
    b_all = (enc(texts_b) if enc else [tokenizer.encode(t) for t in texts_b]) if texts_b else []
    b_iter = iter(b_all)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    mid = [sep, sep] if family == "roberta" else [sep]
    out = Encoded([], [], [])
    for e, a in zip(examples, a_ids):
        b = list(next(b_iter)) if e.text_b is not None else None
        a = list(a)
        budget = max_len - (2 if b is None else 1 + len(mid) + 1)
        while len(a) + (len(b) if b else 0) > budget:
            (a if b is None or len(a) >= len(b) else b).pop()
        ids = [cls] + a + [sep]
        types = [0] * len(ids)
        if b is not None:
            tail = mid[1:] + b + [sep]
            ids += tail
            types += [1 if type_vocab_size > 1 else 0] * len(tail)
        out.ids.append(ids)
        out.types.append(types)
        out.labels.append(e.label)
        out.groups.append(e.group)
        out.index.append(e.index if e.index is not None else str(len(out.index)))
    return out


def collate(data: Encoded, idx, pad_id: int, regression: bool) -> dict[str, torch.Tensor]:
    width = max(len(data.ids[i]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(idx), width), dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        n = len(data.ids[i])
        ids[row, :n] = torch.tensor(data.ids[i])
        types[row, :n] = torch.tensor(data.types[i])
        mask[row, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if data.labels[idx[0]] is not None:  # an unlabelled split is only predicted
        batch["labels"] = torch.tensor([data.labels[i] for i in idx], dtype=torch.float32 if regression else torch.long)
    return batch


def task_loss(model, batch: dict) -> torch.Tensor:
    logits = run_model(model, batch).float()
    if batch["labels"].dtype.is_floating_point:
        return F.mse_loss(logits.squeeze(-1), batch["labels"])
    return F.cross_entropy(logits, batch["labels"])


class ClassificationKind(TaskKind):
    """GLUE, tsv and jsonl: the existing classifier (trainer/finetune/model.py) and GLUE's metrics."""

    head = "sequence"

    def __init__(self, spec, reader: Callable | None = None):
        self.spec, self.reader = spec, reader
        self.name, self.metrics, self.num_labels = spec.name, spec.metrics, spec.num_labels
        self.labels = list(spec.labels) if spec.labels else None  # the export's id2label (None: regression)
        self.unlabelled = tuple(spec.test)  # task.test_files: predicted and written, never scored

    def read(self, data_dir):
        from trainer.finetune.tasks import read_task
        return read_task(self.spec, data_dir, self.reader)

    def encode(self, tokenizer, split, max_len, family, types):
        return encode(tokenizer, split.examples, max_len, family, types)

    def build_model(self, source, cfg):
        from trainer.finetune.model import build_classifier
        return build_classifier(source, self.spec.num_labels, cfg.train.dropout, cfg.train.classifier_dropout,
                                cfg.train.from_scratch)

    def collate(self, data, idx, pad_id):
        return collate(data, idx, pad_id, self.spec.is_regression)

    def loss(self, model, batch):
        return task_loss(model, batch)

    def outputs(self, model, batch):
        """Regression: the value; classification: (class id, log-probability of the second class: what ``mrr``
        ranks by; float64 so that near-certain answers do not tie at 0)."""
        logits = run_model(model, batch).float()
        if self.spec.is_regression:
            return logits.squeeze(-1).tolist()
        positive = logits.double().log_softmax(-1)[:, min(1, logits.shape[-1] - 1)]
        return list(zip(logits.argmax(-1).tolist(), positive.tolist()))

    def predictions(self, outputs, data):
        return outputs if self.spec.is_regression else [o[0] for o in outputs]

    def write_predictions(self, predictions, data, folder, split):
        from trainer.finetune.predictions import submission_name, write_glue
        return [write_glue(folder / submission_name(self.name, split), data.index, predictions, self.labels)]

    def score(self, outputs, data):
        if self.spec.is_regression:
            return compute(self.spec.metrics, outputs, data.labels)
        return compute(self.spec.metrics, [o[0] for o in outputs], data.labels, [o[1] for o in outputs], data.groups)


def as_kind(spec) -> TaskKind:
    """A registered kind as is; a GLUE/tsv TaskSpec as the classification kind."""
    return spec if isinstance(spec, TaskKind) else ClassificationKind(spec)


def sample_stream(n: int, steps: int, global_batch: int, seed: int) -> np.ndarray:
    """steps x global_batch example indices: a fresh seeded permutation per epoch, concatenated."""
    need = steps * global_batch
    rng = np.random.default_rng(seed)
    chunks = [rng.permutation(n) for _ in range(math.ceil(need / n))]
    return np.concatenate(chunks)[:need].reshape(steps, global_batch)


def resolved_precision(cfg, device: str) -> str:
    if cfg.deepspeed.precision != "auto":
        return cfg.deepspeed.precision
    # bf16 where the GPU has bf16 units (sm80+); torch's default also says yes for V100's emulation, several times
    # slower than fp32 there
    return "bf16" if device.startswith("cuda") and torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"


def evaluate(engine, data, kind, batch_size: int, pad_id: int, rank: int, world: int) -> dict[str, float]:
    """The split's scores (``kind.score`` of ``predict``)."""
    return kind.score(predict(engine, data, kind, batch_size, pad_id, rank, world), data)


@torch.no_grad()
def predict(engine, data, kind, batch_size: int, pad_id: int, rank: int, world: int) -> list:
    """Every example's output (``kind.outputs``), in order, on every rank: each rank predicts every world-th
    example and the predictions are gathered."""
    import torch.distributed as dist
    engine.train(False)
    mine = list(range(rank, kind.size(data), world))
    preds: list = []
    for start in range(0, len(mine), batch_size):
        idx = mine[start:start + batch_size]
        batch = device_batch(kind.collate(data, idx, pad_id), engine.device)
        preds += engine(kind.outputs, batch)
    engine.train(True)
    pairs = list(zip(mine, preds))
    if dist.is_initialized() and world > 1:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, pairs)
        pairs = [p for part in gathered for p in part]
    pairs.sort(key=lambda p: p[0])
    return [p for _, p in pairs]


def encode_split(spec, tokenizer, split, max_len: int, family: str, type_vocab_size: int):
    """A split's examples as the task's model inputs (GLUE/tsv: ``encode``; other kinds: their own)."""
    return as_kind(spec).encode(tokenizer, split, max_len, family, type_vocab_size)


def run_one(cfg, source, spec: TaskSpec, train: Encoded, devs: dict[str, Encoded], pad_id: int, seed: int,
            rank: int, world: int, device: str, run_index: int = 0, tests: dict | None = None,
            keep_predictions: bool = False) -> dict:
    """Train on ``train`` with ``cfg`` and ``seed``; returns {"metrics": {split: {metric: v}}, "train_loss", ...}.
    ``spec``: a GLUE/tsv TaskSpec or a registered kind (trainer/finetune/kinds.py). ``tests``: unlabelled splits,
    only predicted. With ``keep_predictions``, "predictions": {split: kind.predictions} for devs and tests."""
    from trainer import engine as ds
    from trainer.checkpoint import seed_everything
    from trainer.finetune.config import batch_split
    from trainer.finetune.model import optimizer_groups
    from trainer.optim.config import ScheduleConfig
    from trainer.optim.schedules import build_scheduler

    start = time.perf_counter()
    micro, grad_accum = batch_split(cfg, world)
    G = cfg.train.global_batch_size
    kind = as_kind(spec)
    steps = max(1, math.ceil(cfg.train.epochs * kind.size(train) / G))
    seed_everything(seed)  # the same head init on every rank
    model = kind.build_model(source, cfg)
    groups = optimizer_groups(model, cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.layer_decay)
    ds_cfg = cfg.model_copy(deep=True)
    ds_cfg.deepspeed.precision = resolved_precision(cfg, device)
    ds_cfg.train.micro_batch_size = micro  # the micro-batch this world size uses (batch_split)
    ds_config = ds.build_ds_config(ds_cfg, world, grad_accum)
    optimizer = ds.build_optimizer(cfg.optim, model, device, ds_config, groups=groups)
    schedule = ScheduleConfig(kind="linear", warmup_steps=round(cfg.schedule.warmup_ratio * steps))
    scheduler = build_scheduler(schedule, optimizer, steps)
    engine = ds.Engine(model, optimizer, scheduler, ds_config)
    seed_everything(seed + 1 + rank)  # each rank its own dropout stream
    stream = sample_stream(kind.size(train), steps, G, seed)
    losses = []  # on the device: reading each loss back would wait for the GPU at every micro-batch
    for step in range(steps):
        total = None
        for k in range(grad_accum):
            lo = (k * world + rank) * micro
            batch = kind.collate(train, stream[step, lo:lo + micro].tolist(), pad_id)
            loss = engine(kind.loss, device_batch(batch, engine.device))
            engine.backward(loss)
            engine.step()
            part = loss.detach().double()
            total = part if total is None else total + part
        losses.append(total / grad_accum)
    per_step = torch.stack(losses).cpu()  # one copy for the whole run
    import torch.distributed as dist
    if dist.is_initialized() and world > 1:  # once per run: the mean over every rank's micro-batches of each step
        per_step = per_step.to(engine.device)
        dist.all_reduce(per_step)
        per_step = per_step.cpu() / world
    losses = per_step.tolist()
    scores, predictions = {}, {}
    for split, data in {**devs, **(tests or {})}.items():
        outputs = predict(engine, data, kind, cfg.train.eval_batch_size, pad_id, rank, world)
        result, predictions[split] = kind.scored(outputs, data, split in devs)
        if split in devs:
            scores[split] = result
    if cfg.train.export_dir and rank == 0:
        from pathlib import Path

        from trainer.finetune.heads import export_finetuned
        export_finetuned(model, Path(cfg.train.export_dir) / f"{run_index}_seed{seed}", getattr(source,
                         "tokenizer_dir", None), getattr(kind, "labels", None) or None,
                         cfg.train.classifier_dropout)
    tail = losses[-max(1, len(losses) // 10):]
    engine.close()  # a sweep runs many in one process: each run's memory is freed before the next (Engine.close)
    del engine, optimizer, model
    out = {"metrics": scores, "train_loss_last": float(np.mean(tail)), "train_loss_first": losses[0],
           "train_losses": losses, "steps": steps, "seconds": time.perf_counter() - start}
    if keep_predictions:
        out["predictions"] = predictions
    return out
