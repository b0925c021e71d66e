"""Launched by tests/test_lamb_zero.py on N ranks (forked with torchrun's environment; torchrun itself works too):
train a tiny encoder with Lamb through DeepSpeed at several ZeRO stages and write the final fp32 parameters (and
losses) to one file for the test to compare.

One launch per world size runs every requested configuration in turn (a DeepSpeed engine starts in ~1 s, a launch
costs more), so the suite stays within its time budget. Also importable: the test builds the same model and
data for its float64 reference.

    torchrun --nproc_per_node 2 tests/lamb_zero_worker.py --out R.pt --stages 0,1,2,3 --naive 2 --resume-dir D
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB, HIDDEN, FFN, SEQ = 37, 12, 20, 8
GLOBAL_BATCH, GRAD_ACC = 8, 2
HP = dict(lr=2e-2, weight_decay=0.01)
CLIP = 1.0
STEPS, SAVE_AT = 20, 10


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, FFN)
        self.down = nn.Linear(FFN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN)

    def forward(self, h):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = self.ln1(h + self.out(nn.functional.scaled_dot_product_attention(q, k, v)))
        return self.ln2(h + self.down(nn.functional.gelu(self.up(h))))


class TinyEncoder(nn.Module):
    """Embeddings, two post-LN blocks and an untied vocabulary head: uneven sizes so ZeRO splits tensors mid-way."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(SEQ, HIDDEN)
        self.emb_ln = nn.LayerNorm(HIDDEN)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids, targets):
        h = self.emb_ln(self.tok(ids) + self.pos.weight[: ids.shape[1]])
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


class AlbertWithLoss(nn.Module):
    """The real encoder: the ``tiny-albert`` preset (factorized embeddings, all layers shared, MLM decoder tied to
    the word embeddings, SOP head), dropout 0 as in ALBERT v2, with an MLM-over-every-token + SOP loss."""

    def __init__(self):
        super().__init__()
        from trainer.models import PRESET_ROWS, PretrainingModel
        row = PRESET_ROWS["tiny-albert"]
        self.model = PretrainingModel(row.config.replace(vocab_size=VOCAB), row.heads)

    def forward(self, ids, targets):
        out = self.model(ids)
        mlm = out["mlm"].reshape(-1, VOCAB).float()
        return nn.functional.cross_entropy(mlm, targets.reshape(-1)) + nn.functional.cross_entropy(
            out["sop"].float(), targets[:, 0] % 2)


MODELS = {"stand-in": TinyEncoder, "tiny-albert": AlbertWithLoss}
MODEL = "stand-in"  # set by --model; the test sets it before building the reference


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return MODELS[MODEL]()


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch; the target of a token is its left neighbour (learnable, so losses fall)."""
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=gen)
    return ids, ids.roll(1, dims=1)


def micro_batch(step: int, micro: int, rank: int, world: int, grad_acc: int):
    ids, targets = global_batch(step)
    size = GLOBAL_BATCH // (world * grad_acc)
    rows = slice((micro * world + rank) * size, (micro * world + rank + 1) * size)
    return ids[rows], targets[rows]


def _ds_config(stage: int, world: int, grad_acc: int, universal: bool = False, bf16: bool = False,
               offload: bool = False) -> dict:
    cfg = {
        "train_batch_size": GLOBAL_BATCH,
        "gradient_accumulation_steps": grad_acc,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // (world * grad_acc),
        "gradient_clipping": 0.0 if bf16 else CLIP,  # the bf16 check replays one step from DeepSpeed's own grads
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
    }
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    if offload:
        # ZeRO-Offload with a client optimizer: DeepSpeed steps it on the CPU copies of the fp32 partitions.
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        cfg["zero_force_ds_cpu_optimizer"] = False
    if bf16:
        # fp32 gradient accumulation makes ZeRO-1 use DeepSpeed's BF16_Optimizer, the other flat-partition wrapper.
        cfg["bf16"] = {"enabled": True}
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def _engine(stage: int, world: int, bind: bool, grad_acc: int = GRAD_ACC, universal: bool = False,
            bf16: bool = False, offload: bool = False):
    import deepspeed

    from trainer.optim.lamb import Lamb
    from trainer.optim.zero_lamb import bind_zero_layout
    from trainer.optim.param_groups import param_groups

    model = make_model()
    opt = Lamb(param_groups(model, HP["weight_decay"], mark_trust_ratio=True), **HP)
    config = _ds_config(stage, world, grad_acc, universal, bf16, offload)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    if bind:
        bind_zero_layout(engine)
    return engine


def _train(engine, steps, rank, world, grad_acc=GRAD_ACC) -> list[float]:
    losses = []
    for step in steps:
        total = 0.0
        for micro in range(grad_acc):
            ids, targets = micro_batch(step, micro, rank, world, grad_acc)
            loss = engine(ids, targets)
            engine.backward(loss)
            engine.step()
            total += float(loss) / grad_acc
        losses.append(total)
    return losses


def _full_params(engine, stage: int) -> dict[str, torch.Tensor]:
    import deepspeed
    params = list(engine.module.named_parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            return {n: p.detach().clone() for n, p in params}
    return {n: p.detach().clone() for n, p in params}


def _bf16_step(stage: int, world: int, rank: int, bind: bool, warmup: int = 5) -> dict:
    """bf16 (fp32 masters): the full fp32 masters, gradients and moments before one engine step, and the masters
    after it, read through DeepSpeed's ``safe_get_full_*`` so the test can replay that step with the reference.

    bf16 forward/backward noise makes 20-step trajectories drift by ~0.1 from a float64 run, so the check is one step.
    """
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state

    engine = _engine(stage, world, bind=bind, bf16=True)
    _train(engine, range(warmup), rank, world)
    for micro in range(GRAD_ACC):
        ids, targets = micro_batch(warmup, micro, rank, world, GRAD_ACC)
        engine.backward(engine(ids, targets))
        if micro < GRAD_ACC - 1:
            engine.step()
    named = list(engine.module.named_parameters())
    if hasattr(engine.optimizer, "_hp_optimizer_states_linked"):
        # DeepSpeed links optimizer-state fragments right after the first step of the first param group, before the
        # second group has any state (ZeRO 1/2 step one group at a time): relink so safe_get_full_optimizer_state
        # finds the excluded group's moments too.
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    before = {n: {"w": safe_get_full_fp32_param(p).clone(), "g": safe_get_full_grad(p).float().clone(),
                  "m": safe_get_full_optimizer_state(p, "exp_avg").clone(),
                  "v": safe_get_full_optimizer_state(p, "exp_avg_sq").clone()} for n, p in named}
    engine.step()
    after = {n: safe_get_full_fp32_param(p).clone() for n, p in named}
    return {"before": before, "after": after, "t": warmup, "wrapper": type(engine.optimizer).__name__}


def _cut_params(engine) -> int:
    """How many parameters ZeRO 1/2 cut at this rank's partition boundary (the case a naive LAMB gets wrong)."""
    cut = 0
    for p in engine.module.parameters():
        mapping = getattr(p, "_hp_mapping", None)
        if mapping is not None and mapping.get_hp_fragment_address().numel < p.numel():
            cut += 1
    return cut


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="stand-in")
    parser.add_argument("--stages", default="0,1,2,3", help="ZeRO stages to train with the bound (correct) Lamb")
    parser.add_argument("--naive", default="", help="stages to also train without bind_zero_layout")
    parser.add_argument("--offload", default="", help="stages to also train with the optimizer offloaded to cpu")
    parser.add_argument("--bf16", default="", help="stages at which to record one bf16 step")
    parser.add_argument("--bf16-naive", default="", help="the same without bind_zero_layout")
    parser.add_argument("--resume-dir", help="ZeRO-2: save at step 10, resume into a new engine, finish at 20")
    parser.add_argument("--load-universal", help="ZeRO-2: load DIR/global_step10_universal, finish at 20")
    parser.add_argument("--albert-stages", default="",
                        help="after the rest, these stages again with the tiny-albert model (results albert_zeroN)")
    args = parser.parse_args(argv)
    global MODEL
    MODEL = args.model

    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    results: dict[str, dict] = {}

    for stage in [int(s) for s in args.stages.split(",") if s]:
        engine = _engine(stage, world, bind=True)
        losses = _train(engine, range(STEPS), rank, world)
        results[f"zero{stage}"] = {"params": _full_params(engine, stage), "losses": losses,
                                   "cut_on_rank0": _cut_params(engine)}
    for stage in [int(s) for s in args.naive.split(",") if s]:
        engine = _engine(stage, world, bind=False)
        _train(engine, range(STEPS), rank, world)
        results[f"naive{stage}"] = {"params": _full_params(engine, stage)}

    for stage in [int(s) for s in args.offload.split(",") if s]:
        engine = _engine(stage, world, bind=True, offload=True)
        _train(engine, range(STEPS), rank, world)
        results[f"offload{stage}"] = {"params": _full_params(engine, stage)}
    for stage in [int(s) for s in args.bf16.split(",") if s]:
        results[f"bf16_zero{stage}"] = _bf16_step(stage, world, rank, bind=True)
    for stage in [int(s) for s in args.bf16_naive.split(",") if s]:
        results[f"bf16_naive{stage}"] = _bf16_step(stage, world, rank, bind=False)

    if args.resume_dir:
        engine = _engine(2, world, bind=True)
        first = _train(engine, range(SAVE_AT), rank, world)
        engine.save_checkpoint(args.resume_dir, tag=f"global_step{SAVE_AT}")
        engine = _engine(2, world, bind=True)
        engine.load_checkpoint(args.resume_dir, tag=f"global_step{SAVE_AT}")
        rest = _train(engine, range(SAVE_AT, STEPS), rank, world)
        results["resumed2"] = {"params": _full_params(engine, 2), "losses": first + rest}

    if args.load_universal:
        grad_acc = GLOBAL_BATCH // world // (GLOBAL_BATCH // (2 * GRAD_ACC))  # keep the saved run's micro batch
        engine = _engine(2, world, bind=True, grad_acc=grad_acc, universal=True)
        engine.load_checkpoint(args.load_universal, tag=f"global_step{SAVE_AT}_universal")
        losses = _train(engine, range(SAVE_AT, STEPS), rank, world, grad_acc)
        results["universal2"] = {"params": _full_params(engine, 2), "losses": losses}

    albert = [int(s) for s in args.albert_stages.split(",") if s]
    if albert:  # the same launch (one start-up) for the project's encoder
        MODEL = "tiny-albert"
    for stage in albert:
        engine = _engine(stage, world, bind=True)
        losses = _train(engine, range(STEPS), rank, world)
        results[f"albert_zero{stage}"] = {"params": _full_params(engine, stage), "losses": losses,
                                          "cut_on_rank0": _cut_params(engine)}

    if rank == 0:
        torch.save(results, args.out + ".tmp")
        os.replace(args.out + ".tmp", args.out)
    torch.distributed.barrier()


if __name__ == "__main__":
    from trainer.pretrain import exit_process

    main()
    # as the trainer's own launches do: gloo's threads can abort interpreter teardown after the work is done
    # ("terminate called without an active exception", seen once with 4 ranks in a fresh-clone run)
    exit_process(0)
