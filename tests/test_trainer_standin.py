"""A stand-in objective with its own tiny model and samples, so the trainer's tests exercise the real launcher,
DeepSpeed engine, checkpoints and loop in seconds, independently of the encoder and the data pipeline.

It plugs in through the seam every objective has: importing this module registers it as ``objective: {name:
standin}`` (``trainer.objectives.register``), and like ERNIE's objectives it builds its own ``Components``. The
recipe's ``model`` section gives the sizes (vocab_size, hidden_size, num_layers, num_heads, dropout), ``data``'s
max_seq_length the row length (``data.corpora`` is required by the schema but not read).

It follows the DESIGN.md contracts: a sample is a pure function of (seed, global index); step s with global batch G
reads positions [s*G, (s+1)*G) and rank r of R reads its contiguous slice of each micro-batch; ``loss(model, batch)``
returns (loss, metrics). Each rank appends `pid step indices...` for every micro-batch it trained on to
RUN_DIR/samples_rank{r}.txt, so tests can check the sample order across kills and world-size changes.

Run as a script it is ``trainer.pretrain.main`` with the stand-in registered:
``torchrun --nproc_per_node 2 tests/test_trainer_standin.py --config CFG.yaml``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from trainer.loop import Components  # noqa: E402
from trainer.models import ModelConfig  # noqa: E402
from trainer.objectives import register  # noqa: E402


class StandinOptions(BaseModel):
    """``objective.options`` of ``standin``."""

    model_config = ConfigDict(extra="forbid")
    masked_per_seq: int = 3
    record_samples: bool = True
    nan_after_step: int | None = None
    """Test hook: make every loss NaN from this training step on (exercises the NaN guard)."""
    fail_at_step: int | None = None
    """Test hook: the data raises RuntimeError when step N's first batch is asked for (a run that fails)."""


class TinyMLM(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, seq_len: int, nan_after_step: int | None = None):
        super().__init__()
        self.tok = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = torch.nn.Embedding(seq_len, cfg.hidden_size)
        layer = torch.nn.TransformerEncoderLayer(cfg.hidden_size, cfg.num_heads, 2 * cfg.hidden_size, cfg.dropout,
                                                 batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(cfg.hidden_size)
        self.out = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.calls = 0
        self.nan_after_step = nan_after_step

    def forward(self, input_ids, positions):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.layers(self.tok(input_ids) + self.pos(pos))
        h = self.norm(h)
        picked = torch.gather(h, 1, positions[..., None].expand(-1, -1, h.shape[-1]))
        return self.out(picked)


def sample(seed: int, index: int, seq_len: int, masked: int, vocab: int) -> tuple[torch.Tensor, ...]:
    """Sample ``index``: tokens with a learnable pattern (each token = previous + a per-sample stride, mod vocab),
    ``masked`` positions masked. A pure function of (seed, index)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    start, stride = torch.randint(4, vocab, (2,), generator=g)
    ids = (start + stride * torch.arange(seq_len)) % (vocab - 4) + 4
    pos = torch.randperm(seq_len - 1, generator=g)[:masked] + 1
    labels = ids[pos].clone()
    ids = ids.clone()
    ids[pos] = 3  # [MASK]
    return ids, pos, labels


def build(cfg, rank: int, world_size: int, device: str, options: StandinOptions) -> Components:
    seq_len = cfg.data.max_seq_length
    model = TinyMLM(cfg.model, seq_len, options.nan_after_step)
    G, m = cfg.train.global_batch_size, cfg.train.micro_batch_size
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    def micro_batch(indices: list[int]) -> dict:
        parts = [sample(cfg.seed, i, seq_len, options.masked_per_seq, cfg.model.vocab_size) for i in indices]
        ids, pos, labels = (torch.stack(t) for t in zip(*parts))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mlm_positions": pos, "mlm_labels": labels,
                "sample_index": torch.tensor(indices)}

    def train_batches(consumed: int, end: int):
        step = consumed // G
        while True:
            if options.fail_at_step is not None and step + 1 == options.fail_at_step:
                raise RuntimeError(f"stand-in failure at step {step + 1} (objective.options.fail_at_step)")
            for k in range(G // (m * world_size)):
                first = step * G + k * m * world_size + rank * m
                indices = list(range(first, first + m))
                if options.record_samples:
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

    flops = 6.0 * sum(p.numel() for p in model.parameters())  # the stand-in is no PretrainingModel: 6 x params
    return Components(model=model, loss=loss, train_batches=train_batches, eval_batches=eval_batches,
                      flops_per_token=flops)


@register("standin", options=StandinOptions)
class StandinObjective:
    """The stand-in as an objective: options validated by ``StandinOptions``, components from ``build``."""

    name = "standin"

    def __init__(self, options: StandinOptions):
        self.options = options

    def build_components(self, cfg, rank: int, world_size: int, device: str) -> Components:
        return build(cfg, rank, world_size, device, self.options)


def test_samples_are_pure_functions_of_seed_and_index():
    a = sample(7, 123, 16, 3, 97)
    b = sample(7, 123, 16, 3, 97)
    c = sample(7, 124, 16, 3, 97)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


if __name__ == "__main__":
    # ends the way trainer/pretrain.py's own entry point does (exit_process: no C++ static destructors, which gloo's
    # threads can abort after a completed run; a plain sys.exit here failed a completed ZeRO-3 run with exit 134)
    from trainer.pretrain import exit_process, main
    exit_process(main(sys.argv[1:]))
