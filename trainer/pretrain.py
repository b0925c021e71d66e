"""Pretrain a model of the BERT family: parse, validate, build, train.

Launch it any of these ways (same result)::

    python -m trainer.pretrain --config tiny_roberta                   # one process: makes its own 1-rank group
    torchrun --nproc_per_node 2 trainer/pretrain.py --config tiny_roberta
    deepspeed --num_gpus 2 trainer/pretrain.py --config tiny_roberta
    mpirun -np 2 python trainer/pretrain.py --config tiny_roberta     # DeepSpeed discovers the MPI environment

Options: ``--set KEY=VALUE`` (any config key, repeatable, typed by the schema), ``--resume auto|none|PATH``
(default auto: the newest complete checkpoint of the run, if any), ``--check`` (validate and print the resolved
config; imports only pydantic, YAML and the standard library: no torch, deepspeed or model code).

Every model of the family goes through this one entry point: the recipe's ``objective.name`` picks the objective in
the registry (``trainer/objectives``), which builds the model and, for ERNIE, its own batches. Another package adds an
objective by registering it (``trainer.objectives.register``) and then calling ``main(argv)``.

Exit status: 0 done; 1 error; 2 invalid config (before anything was launched); 3 stopped by the NaN/Inf guard;
75 preempted by SIGTERM/SIGUSR1 after saving a checkpoint (or before training, when the signal came while a resume
converted its checkpoint for another world size): requeue and run the same command (``--resume auto``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as a script (torchrun trainer/pretrain.py): make `import trainer` work
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import (  # noqa: E402
    ConfigError, RunConfig, batch_plan, ceiling_note, checkpoint_dir, evaluation_note, load_config, start_notes,
)
from trainer.failures import (  # noqa: E402
    damaged_checkpoint_error, disk_full_line, other_model_error, peer_failure_hint, stopped,
)
from trainer.log import print0  # noqa: E402
from trainer.run_status import (  # noqa: E402
    EXIT_CONFIG, EXIT_ERROR, EXIT_NONFINITE, EXIT_REQUEUE, last_step, note_step, write_status,
)

if TYPE_CHECKING:  # imports torch: loaded in run(), after validation
    from trainer.loop import Components


def _is_head(key: str) -> bool:
    return key.startswith("heads.") or ".heads." in key


def corpus_vocab_size(cfg: RunConfig) -> int:
    """The vocabulary of the first corpus's tokenizer (its manifest), else model.vocab_size."""
    from data_prep.manifest import read_manifest
    try:
        return int(read_manifest(cfg.data.corpora[0].prefix)["tokenizer"]["vocab_size"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return cfg.model.vocab_size


def load_init_weights(model, weights: dict, init_from) -> str:
    """Load ``checkpoint.init_from``'s weights into ``model``; returns the line to print.

    Heads the source lacks start new (continued pretraining with another objective: an NSP head on a RoBERTa, a
    released BERT without its NSP head) and so does an ELECTRA generator the source lacks entirely (a discriminator
    folder alone); both are named. Encoder weights the source lacks, or tensors of another shape, stop the run: the
    source is another architecture (other sizes, family or sharing), and training it from random weights under the
    name of a continued run would waste the allocation."""
    own = model.state_dict()
    from trainer.init_from import as_electra_discriminator  # a hub discriminator folder alone (init_from.py)
    weights = as_electra_discriminator(own, weights)
    shapes = [f"{k} {tuple(v.shape)} there, {tuple(own[k].shape)} here" for k, v in weights.items()
              if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if shapes:
        raise ValueError(f"checkpoint.init_from {init_from}: {len(shapes)} tensors have another shape than in this "
                         f"run's model (first: {'; '.join(shapes[:3])}): set model.* (sizes, vocab_size, sharing) to "
                         "the source's, or start from another source")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    body = [k for k in missing if not _is_head(k)]
    fresh_generator = bool(body) and all(k.startswith("generator.") for k in body) and \
        not any(k.startswith("generator.") for k in weights)
    if body and not fresh_generator:
        raise ValueError(f"checkpoint.init_from {init_from}: the source lacks {len(body)} of this model's "
                         f"{sum(not _is_head(k) for k in own)} encoder tensors (first: {body[:3]}; it holds "
                         f"{sorted(weights)[:3]}...): another family or architecture than model.*; choose the "
                         "matching recipe or source")
    new_heads = sorted({k.split("heads.")[1].split(".")[0] for k in missing if _is_head(k)})
    said = [f"initialised from {init_from}"]
    if new_heads:
        said.append(f"new heads (not in the source): {new_heads}")
    if fresh_generator:
        said.append("ELECTRA generator: new (the source has none; to continue a pair such as the hub's "
                    "electra-*-discriminator and -generator, put the generator's folder in the discriminator's as "
                    "generator/)")
    if unexpected:
        said.append(f"not used: {len(unexpected)} tensors of the source (first: {sorted(unexpected)[:3]})")
    return "; ".join(said)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainer.pretrain", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a recipe name (tiny_roberta) or a YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set optim.lr=4e-4 --set run_dir=runs/x")
    p.add_argument("--resume", default="auto", help="auto (newest complete checkpoint, or a fresh start), none, or "
                                                     "a checkpoint folder")
    p.add_argument("--check", action="store_true", help="validate the config, print it resolved, and exit")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    return p.parse_args(argv)


def launcher_world_size() -> int:
    """Ranks the launcher started (torchrun/deepspeed: WORLD_SIZE; mpirun: OMPI_COMM_WORLD_SIZE; PMI; srun without a
    launcher: SLURM_STEP_NUM_TASKS), else 1."""
    for key in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"):
        if key in os.environ:
            return int(os.environ[key])
    return 1


def build_components(cfg: RunConfig, rank: int, world_size: int, device: str) -> Components:
    """The model, objective and data loader of ``cfg`` (``trainer.loop.Components``): the objective's own
    ``build_components`` if it has one (ERNIE, DESIGN.md "Objectives"), else its model on ``trainer/data``'s samples."""
    from data_prep.manifest import read_manifest, tokenizer_dir
    from data_prep.tokenizer import load_tokenizer
    from trainer.data.dataset import PretrainingDataset
    from trainer.data.loader import Collator, build_dataloader, build_pretraining_loader
    from trainer.loop import Components
    from trainer.flops import train_flops
    from trainer.objectives import get_objective

    objective = get_objective(cfg.objective)
    if hasattr(objective, "build_components"):
        return objective.build_components(cfg, rank, world_size, device)
    manifest = read_manifest(cfg.data.corpora[0].prefix)
    tokenizer = load_tokenizer(tokenizer_dir(cfg.data.corpora[0].prefix))
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary of the corpus's "
                         f"tokenizer ({tokenizer.vocab_size}, {manifest['tokenizer']['path']}); set "
                         "model.vocab_size: auto or at least that")
    model = objective.build_model(cfg.model)

    def train_batches(consumed_samples: int, end_samples: int):
        loader, _ = build_pretraining_loader(cfg.data, tokenizer, cfg.seed, consumed_samples,
                                             cfg.train.global_batch_size, cfg.train.micro_batch_size, rank,
                                             world_size, total_samples=end_samples, split="train")
        return iter(loader)

    # (held-out data with train.eval_every 0 is never read: its index is not built, so it cannot stop the run)
    evaluates = bool(cfg.train.eval_every) and (bool(cfg.data.valid_corpora) or cfg.data.valid_split > 0)
    # The evaluation dataset is built here, at start (rank 0 builds a missing held-out index while the others wait,
    # as for the training index), not at the first evaluation: a split that holds out nothing usable (a too small
    # data.valid_split) or a broken valid corpus then stops the run before step 1, not after eval_every steps of
    # training with nothing saved for them.
    valid = PretrainingDataset(cfg.data, tokenizer, cfg.seed, split="valid") if evaluates else None
    if valid is not None and len(valid) < cfg.train.eval_batches * cfg.train.global_batch_size:
        print0(eval_repeat_note(cfg, len(valid)))

    def eval_batches():
        # A fixed set: positions [0, eval_batches x G) of the held-out data's shuffled order, split over the ranks as
        # a training step is (eval_batches x accumulation micro-batches each), so the same samples at any world size
        G = cfg.train.global_batch_size
        per_eval = cfg.train.eval_batches * G
        collator = Collator(tokenizer.pad_id, cfg.data.max_seq_length, cfg.data.masking.max_predictions_per_seq,
                            cfg.data.pad_to)
        # In this process (no loader workers), as ERNIE's evaluation: a DataLoader built per evaluation forked new
        # workers from a rank whose gloo/NCCL, heartbeat and loader threads were running; in the suite one such
        # fork (of ~160 in a 40-step run evaluating every step) left a rank waiting forever on its evaluation
        # batches while the other waited in the collective after them. An evaluation is a few batches.
        return build_dataloader(valid, collator, 0, G, cfg.train.micro_batch_size, rank, world_size,
                                per_eval, 0)

    flops = train_flops(model, cfg.data.max_seq_length, cfg.data.masking.max_predictions_per_seq)
    return Components(model=model, loss=objective.loss, train_batches=train_batches,
                      eval_batches=eval_batches if evaluates else None, flops_per_token=flops.per_token,
                      attention_flops=flops.per_square)


def eval_repeat_note(cfg: RunConfig, held_out: int) -> str:
    """What an evaluation reads when the held-out data holds fewer samples than it takes (train.eval_batches x the
    global batch): the same samples again, up to its count, which the loss otherwise does not show."""
    per_eval = cfg.train.eval_batches * cfg.train.global_batch_size
    return (f"note: each evaluation reads {per_eval} samples (train.eval_batches={cfg.train.eval_batches} x "
            f"train.global_batch_size={cfg.train.global_batch_size}) but the held-out data holds {held_out}: it reads "
            f"them ~{per_eval / held_out:.1f} times over, so the eval loss is over {held_out} distinct samples. Lower "
            "train.eval_batches, or hold out more (data.valid_corpora; data.valid_split outside ERNIE)")


def global_batch_change(saved: dict, cfg: RunConfig, where: str) -> str | None:
    """A resume with another ``train.global_batch_size`` than the checkpoint's: the line to print, or ValueError
    before anything is loaded when the objective cannot take it.

    The steps after the resume read the global positions from ``consumed_samples`` on, the new batch at a time
    (trainer/data/order.py), so no sample is skipped or read twice and ``train.steps`` stays the number of optimizer
    steps (the schedule's unit). Objectives with their own components (ERNIE) number each sample's step as
    position // global batch (its knowledge-masking level, ERNIE 2.0's task plan): another batch would shift the
    steps of every later sample, so they are refused."""
    old = ((saved.get("config") or {}).get("train") or {}).get("global_batch_size")
    new = cfg.train.global_batch_size
    if old is None or old == new:
        return None
    from trainer.objectives import get_objective
    if hasattr(get_objective(cfg.objective), "build_components"):
        raise ValueError(
            f"{where} was trained with train.global_batch_size={old}; this launch sets {new}. Objective "
            f"{cfg.objective.name!r} derives each sample's step from its position / global batch, so the batch "
            f"cannot change within a run: resume with --set train.global_batch_size={old}, or start a new run "
            f"(another run_dir) from these weights with --set checkpoint.init_from={where} (weights only)")
    step, consumed = saved["step"], saved["consumed_samples"]
    return (f"resume: train.global_batch_size {old} -> {new} from step {step}: steps {step + 1}-{cfg.train.steps} "
            f"read {new} samples each, from position {consumed} on")


def run(args, cfg: RunConfig) -> int:
    """Everything after validation: process group, engine, resume, train. The modules that import torch and
    deepspeed are imported here, after validation, so ``--check`` and a bad config never load them."""
    from trainer import engine
    from trainer.loop import PreemptionFlag
    from trainer.run_lock import RunLockedError, RunLockLostError, take_run_folder

    preempt = PreemptionFlag()  # before the slow start-up, so an early SIGTERM is not lost
    from trainer.data.open_maps import raise_open_file_limit
    raise_open_file_limit()  # shards mapped per process follow the soft limit (trainer/data/open_maps.py)
    from trainer.ext_lock import ExtensionLockWaitStopped
    try:
        rank, world_size = engine.init_distributed(cfg.deepspeed.timeout_minutes, lambda: preempt.requested)
    except ExtensionLockWaitStopped as err:  # SIGTERM while waiting on a torch extension's build lock
        print(f"error: {err}; exiting with status {EXIT_REQUEUE} (run the same command again)", file=sys.stderr,
              flush=True)
        engine.restore_environment()
        return EXIT_REQUEUE
    micro, grad_accum = batch_plan(cfg.train, world_size)
    if ceiling_note(cfg.train, world_size):
        print0(ceiling_note(cfg.train, world_size))
    for line in start_notes(cfg):
        print0(line)
    # From here on the field holds the micro-batch this world size uses (the loaders, DeepSpeed's config and the
    # objectives' own components all read it); the recipe's ceiling is in the launch's --check output.
    cfg.train.micro_batch_size = micro
    device = engine.device_name()
    # the run folder is ours before anything in it is read or written (another live launch: RunLockedError)
    lock = take_run_folder(cfg.run_dir, cfg.checkpoint.lock_stale_s, rank, device, checkpoint_dir(cfg))
    try:
        return _run_locked(args, cfg, preempt, rank, world_size, grad_accum, device, lock)
    except Exception as err:
        if lock is not None and not isinstance(err, RunLockedError) and (lock.lost or not lock.owns()):
            # the folder is another launch's now: no "failed" status into it (main writes none for this error)
            raise RunLockLostError(f"this run failed after another launch took over {cfg.run_dir}: "
                                   f"{type(err).__name__}: {err}") from err
        raise
    finally:
        from trainer.data.workers import shutdown_workers
        shutdown_workers()  # the loader workers end with the run (the process leaves through os._exit)
        if lock is not None:
            lock.release()
        engine.restore_environment()  # also after a failure (shutdown() restores it after a finished run)


def _run_locked(args, cfg: RunConfig, preempt, rank: int, world_size: int, grad_accum: int, device: str,
                lock=None) -> int:
    """Everything after the run folder is ours: engine, resume, train."""
    import torch

    from trainer import checkpoint, engine
    from trainer.universal import needs_universal, prepare_universal, zero_stage_change_error
    from trainer.ds_json import precision, read_ds_json, zero_stage
    from trainer.loop import NonFiniteLossError, Trainer
    from trainer.metrics import MetricsLogger, run_peak_flops
    from trainer.optim.schedules import build_scheduler

    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)  # other ranks too (a node-local run_dir)
    root = checkpoint_dir(cfg)
    resume_dir = checkpoint.resolve_resume(root, args.resume)
    stage = zero_stage(cfg, read_ds_json(cfg))
    # refused before the lineage moves anything aside
    batch_note = None
    if resume_dir is not None:
        why = zero_stage_change_error(resume_dir, stage)
        if why:
            raise ValueError(why)
        batch_note = global_batch_change(checkpoint.read_state(resume_dir), cfg, str(resume_dir))
    # a start that is not the continuation of the folder's newest checkpoint moves the newer ones aside
    fence = lock.check if lock is not None else None  # before every write: the folder is still ours
    run_id = checkpoint.begin_lineage(root, resume_dir, rank, device, fence, explicit=args.resume != "auto")
    if resume_dir is not None:
        from trainer.models.vocab_padding import resume_padding_error
        saved_config = checkpoint.read_state(resume_dir).get("config")
        why = resume_padding_error(saved_config, cfg.model, str(resume_dir))
        if why:
            raise ValueError(why)
        from trainer.init_from import resume_field_changes
        changed = resume_field_changes(saved_config, cfg.model)
        if changed:
            print0(changed)
    from trainer.data_changes import resume_data_notes  # a blend, corpus or sample setting changed: with counts
    for line in resume_data_notes(resume_dir, cfg, rank):  # rank 0 also records the corpora's fingerprints
        print0(line)
    universal = resume_dir is not None and needs_universal(resume_dir, world_size, stage)
    if universal:
        saved = checkpoint.read_state(resume_dir)
        print0(f"resume: {resume_dir.name} was saved on {saved['world_size']} ranks at ZeRO-{saved['zero_stage']}; "
               f"converting to DeepSpeed's universal checkpoint for {world_size}")
        try:
            uni = prepare_universal(resume_dir, rank)
        except Exception:
            if not preempt.requested:
                raise
            # SIGTERM to the job's process group also killed the converter (a child in it): a preemption, not a
            # failure; the next launch converts again (prepare_universal removed the partial folder)
            uni = None
        # also after a signal during a conversion that finished (one all-reduce: every rank stops or none does),
        # rather than build, load and train a step before the loop's check
        if uni is None or checkpoint.all_max(int(preempt.requested), device):
            saved_step = checkpoint.read_state(resume_dir)["step"]
            print0(f"preempted during the universal conversion of {resume_dir}: nothing trained; exiting with status "
                   f"{EXIT_REQUEUE} (requeue and run again with --resume auto)")
            write_status(cfg.run_dir, rank, "preempted", saved_step, fence=fence)
            return EXIT_REQUEUE
        load_root, load_tag = uni.parent, uni.name
    elif resume_dir is not None:
        load_root, load_tag = resume_dir.parent, resume_dir.name
    ds_config = engine.build_ds_config(cfg, world_size, grad_accum, load_universal=universal)

    checkpoint.seed_everything(cfg.seed)  # identical initial weights on every rank
    comps = build_components(cfg, rank, world_size, device)
    held_out = comps.eval_batches is not None or (not cfg.train.eval_every and (
        bool(cfg.data.valid_corpora) or cfg.data.valid_split > 0))
    if evaluation_note(cfg, held_out):
        print0(evaluation_note(cfg, held_out))
    if resume_dir is None and cfg.checkpoint.init_from:
        from trainer.init_from import corpus_tokenizer_dir, init_weights
        weights = init_weights(cfg.checkpoint.init_from, Path(cfg.run_dir), rank,  # consolidated once
                               vocab_size=(corpus_vocab_size(cfg), cfg.model.vocab_size),
                               tokenizer_dir=corpus_tokenizer_dir(cfg),  # token-by-token check (init_from.py)
                               model_cfg=cfg.model)  # and activation, eps, pad id, position offset
        from trainer.models.vocab_padding import fit_to_config  # a source saved with other vocabulary padding
        weights = fit_to_config(weights, cfg.model)
        print0(load_init_weights(comps.model, weights, cfg.checkpoint.init_from))
        del weights  # a whole fp32 model per rank otherwise held for the run (1.4 GB for roberta_large, by review)
    checkpoint.seed_everything(cfg.seed + 1 + rank)  # each rank its own dropout stream
    optimizer = engine.build_optimizer(cfg.optim, comps.model, device, ds_config)
    scheduler = build_scheduler(cfg.schedule, optimizer, cfg.train.steps)
    ds_engine = engine.Engine(comps.model, optimizer, scheduler, ds_config)

    state = checkpoint.TrainState()
    if resume_dir is not None:
        try:
            ds_engine.load(load_root, load_tag)
        except Exception as err:  # noqa: BLE001  (DeepSpeed says a bare AssertionError when the folder is gone)
            if not checkpoint.is_complete(resume_dir):
                raise FileNotFoundError(
                    f"checkpoint {resume_dir}, chosen for resume, disappeared or became incomplete before it was "
                    f"loaded (deleted or pruned by another process writing to {cfg.run_dir}?); relaunch to resume "
                    f"from the newest complete checkpoint") from err
            damaged = damaged_checkpoint_error(resume_dir, Path(load_root) / load_tag, err)
            if damaged is not None:
                raise damaged from err
            other = other_model_error(resume_dir, cfg, err)
            if other is not None:
                raise other from err
            raise
        scheduler.sync_lr()
        saved = checkpoint.read_state(resume_dir)
        state = checkpoint.TrainState(step=saved["step"], consumed_samples=saved["consumed_samples"],
                                      skipped_steps=saved.get("skipped_steps", 0),
                                      nonfinite_in_a_row=saved.get("nonfinite_in_a_row", 0),
                                      before_streak=saved.get("before_streak", ""))
        checkpoint.restore_rng(resume_dir, rank, world_size, cfg.seed, state.step)
        print0(f"resumed from {resume_dir} at step {state.step} ({state.consumed_samples} samples consumed)")
        if batch_note:
            print0(batch_note)

    if cfg.logging.peak_tflops:
        peak, peak_source = cfg.logging.peak_tflops * 1e12, "logging.peak_tflops"
    else:  # the training's matmul dtype: fp16/bf16 runs against their own peak, not fp32's
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision(cfg, ds_config), torch.float32)
        peak, peak_source = run_peak_flops(cfg.run_dir, device, dtype, rank)
    print0(f"MFU denominator: {peak / 1e12:.3g} TFLOP/s per rank ({peak_source})")
    metrics = MetricsLogger(cfg.run_dir, cfg.logging, rank, cfg.train.steps, state.step)
    if rank == 0:
        (Path(cfg.run_dir) / "config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=1))
    print0(f"world size {world_size}, ZeRO stage {ds_engine.zero_stage}, micro batch {cfg.train.micro_batch_size} x "
           f"accumulation {grad_accum} x {world_size} ranks = {cfg.train.global_batch_size} sequences per step")
    from trainer.run_banner import start_banner
    print0(start_banner(cfg, comps.model, precision(cfg, ds_config), state.step))
    write_status(cfg.run_dir, rank, "running", state.step, fence=fence, total_steps=cfg.train.steps)
    downstream = None
    if cfg.eval.downstream:
        from trainer.finetune.downstream import DownstreamLauncher
        downstream = DownstreamLauncher(cfg.eval, cfg.run_dir, rank, say=metrics.message)
    trainer = Trainer(cfg=cfg, engine=ds_engine, comps=comps, state=state, rank=rank, world_size=world_size,
                      grad_accum=grad_accum, metrics=metrics, preempt=preempt, peak_flops=peak,
                      downstream=downstream, run_lock=lock, run_id=run_id, last_checkpoint=resume_dir)
    try:
        status = trainer.train()
    except NonFiniteLossError as err:
        metrics.message(str(err))
        write_status(cfg.run_dir, rank, "nonfinite", state.step, str(err), fence=fence)
        if downstream is not None:
            downstream.suspend()  # what is queued waits (said) for the launch that resumes the run
        status = EXIT_NONFINITE
    except checkpoint.DiskFullError as err:  # every rank raised it, with the same line: no traceback
        print(f"rank {rank}: error: {err}", file=sys.stderr, flush=True)
        try:  # the disk is full: this small write can fail too, and then it says so
            write_status(cfg.run_dir, rank, "disk_full", state.step, str(err), fence=fence)
        except OSError as status_err:
            print(f"rank {rank}: error: could not write {cfg.run_dir}/status.json either ({status_err})",
                  file=sys.stderr, flush=True)
        status = EXIT_ERROR
    finally:
        metrics.close()
    engine.shutdown()  # every rank reaches this (the stop decisions above were all-reduced)
    return status


def main(argv=None) -> int:
    args = parse_args(argv)
    world_size = launcher_world_size()
    try:
        cfg = load_config(args.config, args.set, world_size=world_size)
    except ConfigError as err:
        print0(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check:
        print0(json.dumps(cfg.model_dump(mode="json"), indent=1))
        note = ceiling_note(cfg.train, world_size)  # the batch was validated for this world size in load_config
        print0(note or f"micro batch {cfg.train.micro_batch_size} x accumulation "
               f"{batch_plan(cfg.train, world_size)[1]} x {world_size} ranks", file=sys.stderr)
        for line in start_notes(cfg):
            print0(line, file=sys.stderr)
        # the launch says it again once its components know their held-out data; a login node's --check says it
        # from the config: the papers' recipes set eval_every and name no held-out data
        held_out = bool(cfg.data.valid_corpora) or (cfg.data.valid_split > 0 and not cfg.objective.name.startswith("ernie"))
        if evaluation_note(cfg, held_out):
            print0(evaluation_note(cfg, held_out), file=sys.stderr)
        return 0
    # A shipped recipe's placeholder path (ernie_base's data/dialogues.jsonl, bert_base_phase2's phase-1 folder) passes
    # --check, which must hold for every recipe in a checkout without data; a launch that still lacks it stops here,
    # before any process group or model, instead of with a traceback after start-up
    from trainer.config_checks import path_problems
    missing = path_problems(cfg)
    if missing:
        for _, message in missing:
            print0(f"error: {message}", file=sys.stderr)
        return EXIT_CONFIG
    from trainer.run_lock import RunLockedError  # no torch: only the standard library

    note_step(-1)  # nothing trained by this run yet (a process may run several: tests/several_runs.py)
    try:
        return run(args, cfg)
    except RunLockedError as err:  # the folder belongs to another launch (or was taken over): write nothing into it
        print0(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as err:  # noqa: BLE001  (any rank's failure: say which rank, then exit non-zero so launchers stop)
        rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        from trainer.disk_space import is_disk_full
        if is_disk_full(err):  # metrics.jsonl, TensorBoard, the data index cache: one line, not a traceback
            return stopped(cfg, int(rank), "disk_full", disk_full_line(cfg, err))
        one_line = getattr(err, "one_line", None)
        if one_line:  # a fault this module explains in full (a damaged checkpoint): its line, no traceback
            return stopped(cfg, int(rank), "failed", one_line)
        print(f"rank {rank}: training failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        try:
            write_status(cfg.run_dir, int(rank), "failed", last_step(),
                         peer_failure_hint(err) + traceback.format_exc(limit=1))
        except OSError as err:  # (a full disk): said, not swallowed; the exit status still says failed
            print(f"rank {rank}: could not write {cfg.run_dir}/status.json: {err}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def exit_process(code: int) -> None:
    """End a command-line launch with ``code`` without running C++ static destructors: after a finished run (process
    group destroyed, files closed) gloo's threads can still abort interpreter teardown ("terminate called without an
    active exception", exit 134), which turns a completed job into a failed one for torchrun and Slurm."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    finalize_mpi(code)
    os._exit(code)


def finalize_mpi(code: int) -> None:
    """``MPI.Finalize()`` when this process initialised MPI (DeepSpeed's discovery under mpirun imports mpi4py):
    Open MPI's mpirun counts a rank that exits 0 without finalizing as failed ("exited without calling finalize",
    job status 1), so every completed mpirun run would look failed. Only when mpi4py is already imported (a launch
    without mpirun never loads it) and not for status 1: that status may be one rank's alone, and Finalize waits for
    the other ranks (a fence), which may be blocked in a collective; exiting at once lets mpirun end the job."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or code == EXIT_ERROR:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception as err:  # noqa: BLE001  (the exit status matters more than a clean MPI teardown)
        print(f"warning: MPI.Finalize() failed: {err}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    exit_process(main())
