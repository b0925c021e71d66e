"""``python -m trainer.finetune --checkpoint CKPT --task TASK --data DIR``: fine-tune a pretrained model on a GLUE
task (or a ``tsv`` task of your own) and report its dev scores the way the papers do.

    python -m trainer.finetune --checkpoint runs/bert/checkpoints --task rte --data glue_data/RTE
    python -m trainer.finetune --checkpoint hf/electra --task mrpc --data glue_data/MRPC \\
        --sweep optim.lr=5e-5,1e-4 --seeds 5 --set optim.layer_decay=0.8
    torchrun --nproc_per_node 8 -m trainer.finetune --checkpoint ... --task mnli --data glue_data/MNLI

CKPT: a trainer checkpoint (``global_stepN``, or a ``checkpoints/`` folder: its newest complete one), our model folder
or a Hugging Face folder of the BERT family. Options: ``--config FILE`` (YAML, ``trainer/finetune/config.py``),
``--set KEY=VALUE`` (repeatable), ``--sweep KEY=V1,V2,...`` (repeatable: the grid of their combinations), ``--seeds N``
(runs per setting; the median is reported). Results: ``RUN_DIR/finetune/<task>/results.json`` and a table on stdout;
prediction files under ``RUN_DIR/finetune/<task>/predictions/`` (``train.predictions``; trainer/finetune/predictions.py).
Exit status: 0 done; 1 error while training; 2 invalid config, data, checkpoint or tokenizer (nothing was trained).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import traceback
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

EXIT_OK, EXIT_ERROR, EXIT_INPUT = 0, 1, 2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.finetune", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path, help="trainer checkpoint, model folder or HF folder")
    p.add_argument("--task", required=True, help="cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli, tsv; "
                   "jsonl, ner, squad, race, swag (trainer/finetune/kinds.py)")
    p.add_argument("--data", required=True, help="the task's folder in its layout (GLUE, SQuAD, CoNLL, RACE, SWAG)")
    p.add_argument("--config", default=None, help="fine-tuning YAML (optional; defaults are the papers')")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2", help="grid over a key's values")
    p.add_argument("--seeds", type=int, default=None, help="runs per setting (train.seeds)")
    # Used by the pretraining run's downstream launcher (trainer/finetune/downstream.py):
    p.add_argument("--report-run", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--report-step", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--cleanup", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def task_spec(cfg):
    from trainer.finetune.kinds import task_kind
    from trainer.finetune.tasks import glue_task, tsv_task_spec, with_metrics
    t = cfg.task
    kind = task_kind(t)  # jsonl, ner, squad, race, swag (trainer/finetune/kinds.py)
    if kind is not None:
        return kind
    if t.name != "tsv":  # GLUE's columns and labels; task.skip_malformed and task.metrics still apply
        spec = dataclasses.replace(glue_task(t.name), skip_malformed=t.skip_malformed, test=dict(t.test_files))
        return with_metrics(spec, t.metrics) if t.metrics is not None else spec
    return tsv_task_spec(t)


def sweep_configs(args, world: int) -> list[tuple[str, object]]:
    """(setting name, config) per point of the sweep. Precedence, lowest first: defaults, ``--config`` YAML,
    ``--set`` in order, ``--seeds`` (as ``train.seeds``), the sweep point."""
    from trainer.finetune.config import accumulation, load_finetune_config
    from trainer.finetune.sweep import parse_sweep
    extra = [f"train.seeds={args.seeds}"] if args.seeds is not None else []
    configs = []
    for point in parse_sweep(args.sweep):
        cfg = load_finetune_config(args.config, [*args.set, *extra, *point])
        cfg.task.name, cfg.task.data = args.task.lower(), args.data
        accumulation(cfg, world)
        configs.append((" ".join(point) or "config", cfg))
    return configs


def prepare(args):
    """Everything that can be wrong, checked before any process group or training: config, sweep, task files,
    checkpoint, tokenizer, batch arithmetic, layer decay."""
    from trainer.finetune.model import load_source, load_tokenizer_for
    from trainer.finetune.tasks import read_task
    from trainer.pretrain import launcher_world_size

    world = launcher_world_size()
    configs = sweep_configs(args, world)
    cfg = configs[0][1]
    spec = task_spec(cfg)
    splits = read_task(spec, cfg.task.data)
    source = load_source(args.checkpoint)
    for _, c in configs:
        if c.optim.layer_decay < 1 and source.cfg.sharing != "none":
            raise ValueError(f"optim.layer_decay={c.optim.layer_decay} needs unshared layers; this "
                             f"{source.cfg.family} model shares them ({source.cfg.sharing}): use 1.0")
    tokenizer = load_tokenizer_for(source, cfg.tokenizer)
    return configs, spec, splits, source, tokenizer


def main(argv=None) -> int:
    args = parse_args(argv)
    from data_prep.tokenizer import TokenizerFolderError
    from trainer.config import ConfigError
    from trainer.finetune.model import SourceError
    from trainer.finetune.tasks import TaskDataError
    from trainer.log import print0

    try:
        configs, spec, splits, source, tokenizer = prepare(args)
    except (ConfigError, TaskDataError, SourceError, TokenizerFolderError, ValueError) as err:
        print0(f"error: {err}", file=sys.stderr)
        return EXIT_INPUT
    for split in splits.values():
        print0(split.describe())
    try:
        return train_and_report(args, configs, spec, splits, source, tokenizer)
    except Exception:  # noqa: BLE001  (say which rank failed, exit non-zero so launchers stop the others)
        print(f"rank {os.environ.get('RANK', '0')}: fine-tuning failed:\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        return EXIT_ERROR
    finally:
        # the group stays up (below); what init_distributed wrote into os.environ is not left behind
        from trainer.engine import restore_environment
        restore_environment()


def train_and_report(args, configs, spec, splits, source, tokenizer) -> int:
    from trainer import engine as ds
    from trainer.finetune.predictions import BestPredictions, publish, staging, write_splits
    from trainer.finetune.run import as_kind, encode_split, resolved_precision, run_one
    from trainer.finetune.sweep import format_table, summarize, write_json
    from trainer.log import print0

    cfg0 = configs[0][1]
    rank, world = ds.init_distributed(cfg0.deepspeed.timeout_minutes)
    device = ds.device_name()
    family, types = source.cfg.family, source.cfg.type_vocab_size
    max_len = min(cfg0.train.max_seq_length or getattr(spec, "max_seq_length", 128),
                  source.cfg.max_position_embeddings - source.cfg.position_offset)
    data = {name: encode_split(spec, tokenizer, split, max_len, family, types) for name, split in splits.items()}
    kind = as_kind(spec)
    unlabelled = set(kind.unlabelled)  # task.test_files: predicted, never scored
    devs = {name: d for name, d in data.items() if name != "train" and name not in unlabelled}
    init = "random init (train.from_scratch)" if cfg0.train.from_scratch else f"{source.kind} {args.checkpoint}"
    print0(f"fine-tuning {spec.name} from {init}: {family}, {len(data['train'].ids)} training examples, "
           f"{world} rank(s), {resolved_precision(cfg0, device)}")
    run_dir = Path(cfg0.run_dir) if cfg0.run_dir else (source.run_dir or Path("runs/finetune"))
    task_dir = run_dir / "finetune" / spec.name
    mode = cfg0.train.predictions  # best / all / none (trainer/finetune/predictions.py)
    tests = {name: d for name, d in data.items() if name in unlabelled} if mode != "none" else {}
    staged = None  # rank 0's folder of new prediction files, put in place once results.json is ready
    best = BestPredictions(kind.metrics[0])
    runs = []
    for setting, cfg in configs:
        for i in range(cfg.train.seeds):
            seed = cfg.seed + i
            result = run_one(cfg, source, spec, data["train"], devs, tokenizer.pad_id, seed, rank, world, device,
                             len(runs), tests, mode != "none")
            predictions = result.pop("predictions", None)
            if predictions is not None and mode == "all" and rank == 0:
                staged = staged or staging(task_dir)
                write_splits(kind, predictions, data, staged / f"{len(runs)}_seed{seed}")
            elif predictions is not None and mode == "best":
                best.offer(setting, len(runs), seed, result["metrics"], predictions)
            runs.append({"setting": setting, "seed": seed, "lr": cfg.optim.lr, **result})
            scores = "  ".join(f"{sp}/{m}={100 * v:.2f}" for sp, ms in result["metrics"].items() for m, v in ms.items())
            print0(f"  {setting} seed {seed}: {scores}  (loss {result['train_loss_first']:.3f} -> "
                   f"{result['train_loss_last']:.3f}, {result['steps']} steps, {result['seconds']:.0f} s)")
    summary = summarize(spec.name, spec.metrics[0], runs)
    summary.update(checkpoint=str(args.checkpoint), source=source.kind, family=family,
                   pretraining_step=args.report_step if args.report_step is not None else source.step,
                   from_scratch=cfg0.train.from_scratch, world_size=world,
                   examples={name: len(d.ids) for name, d in data.items()})
    if mode == "best" and (chosen := best.of(summary["best_setting"])) is not None:
        run_index, seed, predictions = chosen
        summary["predictions"] = {"folder": "predictions", "setting": summary["best_setting"], "seed": seed,
                                  "run": run_index, "splits": list(predictions)}
        if rank == 0:
            staged = staging(task_dir)
            write_splits(kind, predictions, data, staged)
    elif mode == "all":
        summary["predictions"] = {"folder": "predictions", "runs": [f"{i}_seed{r['seed']}" for i, r in
                                                                    enumerate(runs)]}
    out = task_dir / "results.json"
    if rank == 0:
        if staged is not None:
            publish(staged, task_dir)  # before results.json: a reader of the record finds its files
        write_json(out, summary)
        print0(format_table(summary))
        print0(f"results: {out}")
        if args.cleanup:  # before the report: a reader that sees the score finds the copy gone
            shutil.rmtree(args.checkpoint, ignore_errors=True)
        if args.report_run is not None:
            from trainer.finetune.downstream import report
            report(args.report_run, summary)
    # The process group stays up (the CLI ends with os._exit, see trainer.pretrain.exit_process): DeepSpeed keeps
    # handles to its groups, so a torn-down group could not be re-created for a second call of main() in a process.
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
    return EXIT_OK


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    from trainer.pretrain import exit_process
    exit_process(main())
