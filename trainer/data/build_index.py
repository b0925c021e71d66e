"""Build a run's data caches ahead of the job: ``python -m trainer.data.build_index --config RECIPE [--set KEY=VAL ...]
[--workers N] [--memory-gb G]``.

For every training and validation corpus of the config's ``data`` section it writes (or finds, already valid) the
corpus arrays and the sample index that the ranks will map at start (trainer/data/sample_index.py), in the config's
``data.cache_dir``. The Slurm templates run it once on the batch host before launching the ranks, so no GPU waits
for it; an existing valid index is skipped in milliseconds. For the ERNIE objectives it also builds what their ranks
would otherwise build at start: the side-car check of every annotated corpus (an error where the run masks phrases or
entities and a corpus has none), and for ERNIE 1.0 the tokenized (and annotated) dialogue cache of
``objective.options.dlm.path`` and, where evaluation reads it (``data.valid_corpora``), ``dlm.valid_path``. ERNIE
2.0's labelled-pair files (``discourse``, ``ir_relevance``) have no cache file: every rank tokenizes them in memory at
start, so there is nothing to build ahead for them (it says so). Options other than ``--config``, ``--set`` and
``--workers`` that the trainer takes (``--resume`` ...) are accepted and ignored, so a launcher can pass the trainer's
arguments unchanged; any other option (a typo) is refused (exit 2).

Exit status: 0 built or already there; 1 error (message names the corpus or file); 2 invalid config.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `import trainer` work
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainer.data.build_index", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a recipe name (roberta_large) or a YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as for trainer.pretrain (e.g. --set data.cache_dir=/lustre/cache)")
    p.add_argument("--workers", type=int, default=None,
                   help="threads building shards in parallel (default: the CPUs this process may use, e.g. its Slurm allocation, at most 16; fewer "
                        "if --memory-gb cannot hold their shards)")
    p.add_argument("--memory-gb", type=float, default=None,
                   help="memory the build may hold in flight (default: data.index_memory_gb, 2): caps the threads, "
                        "and a shard too large for it is walked in pieces")
    args, rest = p.parse_known_args(argv)
    if rest:  # the trainer's own options are fine (a launcher passes them unchanged); anything else is a typo
        import contextlib  # noqa: PLC0415
        import io  # noqa: PLC0415

        from trainer import pretrain  # noqa: PLC0415

        try:
            with contextlib.redirect_stderr(io.StringIO()):
                pretrain.parse_args(["--config", args.config, *rest])
        except SystemExit:
            p.error(f"unrecognized arguments: {' '.join(rest)} (build_index takes --config, --set, --workers and "
                    "--memory-gb, "
                    "and accepts the trainer's own options)")
    return args


def command_for(config: str, sets: list[str]) -> str:
    """The command line that builds a run's caches (printed in the trainer's error messages)."""
    return " ".join(["python -m trainer.data.build_index", "--config", config] + [f"--set {s}" for s in sets])


def _check_sidecars(corpus, required: bool = False) -> bool:
    """Verify an annotated corpus's ERNIE side-cars into the cache now (the ranks then read them by offset).
    ``required`` (an ERNIE run that masks phrases/entities): a corpus without side-cars is an error here, as it
    would be in every rank at start (the message says how to annotate it)."""
    from trainer.ernie.sidecars import has_sidecars, verified_sidecars  # noqa: PLC0415

    if not required and not has_sidecars(corpus):
        return False
    verified_sidecars(corpus)
    return True


def _ernie_options(cfg):
    """``objective.options`` of an ERNIE run as its options model (pydantic only, no torch), else None."""
    if cfg.objective.name not in ("ernie", "ernie2"):
        return None
    from trainer.objectives import options_model  # noqa: PLC0415

    return options_model(cfg.objective.name).model_validate(cfg.objective.options)


def _needs_sidecars(options) -> bool:
    """Whether the ERNIE run masks phrases/entities (a stage above ``basic``): its ranks then open every corpus's
    side-cars, and a corpus without them stops the run."""
    return options is not None and any(stage.level != "basic" for stage in options.knowledge_masking.stages)


def _ernie_files(cfg, options, split: str, policy) -> list[str]:
    """Build the ERNIE caches of ``split`` that are not per corpus (the dialogue cache of ERNIE 1.0's DLM, by the
    trainer's own function, so the ranks find the same file) -> the lines to print. Raises what the build raises."""
    if options is None:
        return []
    from data_prep.manifest import tokenizer_dir  # noqa: PLC0415
    from data_prep.tokenizer import load_tokenizer  # noqa: PLC0415

    lines = []
    if cfg.objective.name == "ernie" and options.dlm is not None:
        from trainer.ernie.dlm import dlm_dialogues  # noqa: PLC0415

        key = "path" if split == "train" else "valid_path"
        if getattr(options.dlm, key) is None:
            if split == "valid":
                lines.append("valid: objective.options.dlm.valid_path is not set: evaluation has no DLM batches "
                             "(nothing to build)")
            return lines
        tokenizer = load_tokenizer(tokenizer_dir(cfg.data.corpora[0].prefix))  # the trainer's (components.py)
        dialogues = dlm_dialogues(options.dlm, tokenizer, split, policy)
        annotated = f", annotated with {options.dlm.annotate}" if options.dlm.annotate else ""
        lines.append(f"{split}: objective.options.dlm.{key}: {dialogues.path}: {len(dialogues):,} dialogues "
                     f"tokenized{annotated} -> the dialogue cache in {policy.dir}")
    if cfg.objective.name == "ernie2" and split == "train":
        for name in ("discourse", "ir_relevance"):
            task = getattr(options, name)
            if task is not None:
                lines.append(f"note: objective.options.{name}.path ({task.path}): ERNIE 2.0's labelled pairs have no "
                             "cache file; every rank reads and tokenizes them in memory at start, so build_index has "
                             "nothing to build for them")
    return lines


def main(argv=None) -> int:
    from data_prep.cpus import usable_cpus
    from trainer.config import ConfigError, load_config
    from trainer.data.dataset import build_indexes, cache_policy

    args = parse_args(argv)
    if args.workers is not None and args.workers < 1:
        print(f"error: --workers {args.workers}: must be at least 1 (leave it out for the default)", file=sys.stderr)
        return 2
    if args.memory_gb is not None and not (math.isfinite(args.memory_gb) and args.memory_gb > 0):  # nan: not <= 0
        print(f"error: --memory-gb {args.memory_gb}: must be positive", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    data = cfg.data.model_copy(update={"require_prebuilt_index": False})
    workers = args.workers or min(16, usable_cpus())
    policy = cache_policy(data, builder=True, workers=workers, hint=command_for(args.config, args.set),
                          memory_gb=args.memory_gb)
    policy.dir.mkdir(parents=True, exist_ok=True)
    try:
        options = _ernie_options(cfg)
    except ValueError as err:  # load_config validated them: not expected
        print(f"error: objective.options: {err}", file=sys.stderr)
        return 2
    for split in ("train", "valid"):
        if split == "valid" and not data.valid_corpora and not data.valid_split > 0:
            continue
        start = time.perf_counter()
        try:
            built = build_indexes(data, split, policy)
        except (OSError, ValueError, TimeoutError) as err:
            print(f"error: {split} corpora: {err}", file=sys.stderr)
            return 1
        for corpus, index in built:
            print(f"{split}: {corpus.prefix}: {corpus.num_sentences:,} sentences, {len(index):,} '{data.format}' "
                  f"samples -> {index.path}")
            try:
                checked = _check_sidecars(corpus, required=_needs_sidecars(options))
            except (OSError, ValueError, TimeoutError) as err:
                print(f"error: {split} corpora: {err}", file=sys.stderr)
                return 1
            if checked:
                print(f"{split}: {corpus.prefix}: ERNIE side-cars checked against the shards (once per cache entry)")
        try:
            for line in _ernie_files(cfg, options, split, policy):
                print(line)
        except (OSError, ValueError, TimeoutError) as err:
            print(f"error: {split}: {err}", file=sys.stderr)
            return 1
        print(f"{split}: ready in {time.perf_counter() - start:.1f} s ({workers} worker(s), cache {policy.dir})")
    return 0


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    sys.exit(main())
