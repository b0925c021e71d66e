"""A small stand-in for the model / objective / data packages, so the trainer's tests exercise the real launcher,
DeepSpeed engine, checkpoints and loop without depending on code that lands separately.

It follows the DESIGN.md contracts: a sample is a pure function of (seed, global index); step s with global batch G
reads positions [s*G, (s+1)*G) and rank r of R reads its contiguous slice of each micro-batch; ``loss(model, batch)``
returns (loss, metrics). Each rank appends `pid step indices...` for every micro-batch it trained on to RUN_DIR/samples_rank{r}.txt, so tests
can check the sample order across kills and world-size changes.

Run as a script it is ``trainer.pretrain.main`` with these stand-ins:
``torchrun --nproc_per_node 2 tests/test_trainer_standin.py --config CFG.yaml``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from trainer.loop import Components  # noqa: E402


class StandinModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = 97
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    dropout: float = 0.0
    nan_after_step: int | None = None
    """Test hook: make every loss NaN from this training step on (exercises the NaN guard)."""


class StandinDataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_seq_length: int = 16
    masked_per_seq: int = 3
    record_samples: bool = True


class StandinObjectiveConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["mlm"] = "mlm"


SECTIONS = {"model": StandinModelConfig, "data": StandinDataConfig, "objective": StandinObjectiveConfig}


class TinyMLM(torch.nn.Module):
    def __init__(self, cfg: StandinModelConfig, seq_len: int):
        super().__init__()
        self.tok = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = torch.nn.Embedding(seq_len, cfg.hidden_size)
        layer = torch.nn.TransformerEncoderLayer(cfg.hidden_size, cfg.num_heads, 2 * cfg.hidden_size, cfg.dropout,
                                                 batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(cfg.hidden_size)
        self.out = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.calls = 0
        self.nan_after_step = cfg.nan_after_step

    def forward(self, input_ids, positions):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.layers(self.tok(input_ids) + self.pos(pos))
        h = self.norm(h)
        picked = torch.gather(h, 1, positions[..., None].expand(-1, -1, h.shape[-1]))
        return self.out(picked)


def sample(seed: int, index: int, cfg: StandinDataConfig, vocab: int) -> tuple[torch.Tensor, ...]:
    """Sample ``index``: tokens with a learnable pattern (each token = previous + a per-sample stride, mod vocab),
    some positions masked. A pure function of (seed, index)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    start, stride = torch.randint(4, vocab, (2,), generator=g)
    ids = (start + stride * torch.arange(cfg.max_seq_length)) % (vocab - 4) + 4
    pos = torch.randperm(cfg.max_seq_length - 1, generator=g)[: cfg.masked_per_seq] + 1
    labels = ids[pos].clone()
    ids = ids.clone()
    ids[pos] = 3  # [MASK]
    return ids, pos, labels


def build(cfg, rank: int, world_size: int, device: str) -> Components:
    model = TinyMLM(cfg.model, cfg.data.max_seq_length)
    G, m = cfg.train.global_batch_size, cfg.train.micro_batch_size
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    def micro_batch(indices: list[int]) -> dict:
        parts = [sample(cfg.seed, i, cfg.data, cfg.model.vocab_size) for i in indices]
        ids, pos, labels = (torch.stack(t) for t in zip(*parts))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mlm_positions": pos, "mlm_labels": labels,
                "sample_index": torch.tensor(indices)}

    def train_batches(consumed: int):
        step = consumed // G
        while True:
            for k in range(G // (m * world_size)):
                first = step * G + k * m * world_size + rank * m
                indices = list(range(first, first + m))
                if cfg.data.record_samples:
                    with open(run_dir / f"samples_rank{rank}.txt", "a") as f:
                        f.write(f"{os.getpid()} {step + 1} {' '.join(map(str, indices))}\n")
                yield micro_batch(indices)
            step += 1

    def eval_batches():
        for k in range(cfg.train.eval_batches):
            first = 10**9 + (k * world_size + rank) * m
            yield micro_batch(list(range(first, first + m)))

    def loss(engine, batch):
        logits = engine(batch["input_ids"], batch["mlm_positions"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["mlm_labels"].flatten())
        module = getattr(engine, "module", engine)
        if module.training:
            module.calls += 1
            steps_done = (module.calls - 1) // (G // (m * world_size))
            if module.nan_after_step is not None and steps_done >= module.nan_after_step:
                loss = loss * float("nan")
        acc = (logits.argmax(-1) == batch["mlm_labels"]).float().mean()
        return loss, {"mlm_loss": loss.detach(), "mlm_acc": acc}

    return Components(model=model, loss=loss, train_batches=train_batches, eval_batches=eval_batches,
                      seq_len=cfg.data.max_seq_length, num_layers=cfg.model.num_layers, hidden=cfg.model.hidden_size)


def test_samples_are_pure_functions_of_seed_and_index():
    cfg = StandinDataConfig()
    a = sample(7, 123, cfg, 97)
    b = sample(7, 123, cfg, 97)
    c = sample(7, 124, cfg, 97)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


if __name__ == "__main__":
    from trainer.pretrain import main
    sys.exit(main(sys.argv[1:], components_factory=build, section_models=SECTIONS))
