"""``checkpoint.init_from``: a new run's weights from a trainer checkpoint, our model folder or a Hugging Face folder,
consolidated once by rank 0 for every rank (``init_weights``); and ``folder_kind``, which fine-tuning's
``--checkpoint`` shares, so that one folder is read the same way by both.

The collective parts (``_barrier``, waiting for rank 0 on the filesystem) are ``trainer.checkpoint``'s, called through
the module so that a test's stand-in for them applies here too.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from trainer import checkpoint


def init_weights(init_from: str | Path, cache_dir: str | Path, rank: int, wait_s: float | None = None,
                 poll_s: float = 2.0, vocab_size: tuple[int, int] | None = None,
                 tokenizer_dir: str | Path | None = None, model_cfg=None) -> dict[str, torch.Tensor]:
    """``checkpoint.init_from``'s consolidated fp32 weights, consolidated once per run.

    ``init_from`` is a trainer checkpoint (``global_stepN``, or a ``checkpoints`` folder: its newest complete one), our
    model folder (``python -m trainer.export_hf``'s sibling, ``trainer.models.model_folder``) or a local Hugging Face
    folder of the five families (a released model, or an export of ours: ``trainer.models.hf_convert.import_hf``).
    ``vocab_size`` (the corpus tokenizer's, the model's): the source's vocabulary must lie between them.
    ``tokenizer_dir`` (the corpus tokenizer's folder): where the source folder holds tokenizer files, every token must
    have the same id in both, and so must pad/cls/sep/mask/unk (``check_vocabulary``). ``model_cfg`` (the run's
    ModelConfig): the source's activation, LayerNorm eps, pad id and position offset must be its (``check_fields``).

    Rank 0 runs the consolidation (``load_model_state``: every ZeRO shard of the source checkpoint) and writes one
    file in ``cache_dir``; the other ranks wait for it on the shared filesystem (not in a collective: consolidating a
    large model can outlast the process group's timeout) and read that file. Without this, 64 ranks would each read
    every shard of the source, optimizer state included, through the shared filesystem. The file is named after
    the resolved source checkpoint (a checkpoints folder means its newest complete one, which can change) and the
    launch, made anew by every launch and removed once every rank has read it.
    """
    from trainer.data.cache_file import launch_id
    source = init_source(init_from)
    cache_dir = Path(cache_dir)
    # named by the source and this launch (what all of its ranks share, and no other launch): a file another launch
    # left, which a rank on another NFS client may still see after rank 0 removed it, is never this launch's name
    key = hashlib.sha256(f"{source.resolve()}|{launch_id()}".encode()).hexdigest()[:12]
    out = cache_dir / f"init_from_{key}.pt"
    failed = cache_dir / f".init_from_{key}.failed"
    if rank == 0:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # what launches that died before removing theirs left (the source may have changed since at the same path:
        # a redone phase 1): never reused, removed before any rank looks for this launch's file
        # (init_from_*.tmp: a kill during the save left a whole fp32 weights file, which no glob removed; review)
        for left in [*cache_dir.glob("init_from_*.pt"), *cache_dir.glob("init_from_*.tmp"),
                     *cache_dir.glob(".init_from_*.failed")]:
            left.unlink(missing_ok=True)
    checkpoint._barrier()
    if rank == 0:
        try:
            weights, source_cfg = _source_weights(source)
            source_vocab = getattr(source_cfg, "vocab_size", None)
            check_fields(init_from, source_cfg, model_cfg)
            low, high = vocab_size if vocab_size is not None else (None, None)
            if source_vocab is not None and low is not None and not low <= source_vocab <= high:
                # Rows cannot be fitted across tokenizers: above the model's vocab_size fit_rows would cut real rows;
                # below the corpus tokenizer's, the corpus has ids the source never learned. In between (NVIDIA's
                # 30528 rows for a 30522-token tokenizer) the rows are padding.
                which = "" if source == Path(init_from) else f" ({source.name})"
                raise ValueError(f"checkpoint.init_from {init_from}{which}: trained with a vocabulary of "
                                 f"{source_vocab} tokens; this run's corpus tokenizer has {low} and its model "
                                 f"{high} rows (model.vocab_size): another tokenizer; use the source's tokenizer and "
                                 "corpus")
            check_vocabulary(init_from, source, tokenizer_dir)
            tmp = out.with_suffix(".tmp")
            try:
                torch.save(weights, tmp)
                os.replace(tmp, out)
            finally:
                tmp.unlink(missing_ok=True)
        except BaseException as err:
            failed.write_text(f"{type(err).__name__}: {err}\n")
            raise
    elif rank != 0:
        checkpoint._wait_for_rank0(out, failed, rank, f"consolidate {source} (checkpoint.init_from)", out, wait_s,
                                   poll_s)
    weights = torch.load(out, map_location="cpu", weights_only=True)
    checkpoint._barrier()
    if rank == 0:
        out.unlink(missing_ok=True)
    return weights


def folder_kind(path: Path) -> str | None:
    """"model folder" or "hugging face" for such a folder, None for anything else (a trainer checkpoint, a
    ``checkpoints`` folder, a run folder holding them: checkpoint markers come first). Shared by ``init_from`` and
    fine-tuning's ``--checkpoint``, so one folder is read the same way by both."""
    from trainer.models.model_folder import is_model_folder
    if not path.is_dir() or checkpoint.is_complete(path) or (path / checkpoint.LATEST).is_file() or \
            any(path.glob("global_step*")):
        return None
    if is_model_folder(path):
        return "model folder"
    if (path / "config.json").is_file():
        return "hugging face"
    return None


def init_source(init_from: str | Path) -> Path:
    """The folder ``init_from`` names: a model or Hugging Face folder as is, else the checkpoint it resolves to."""
    path = Path(init_from)
    if folder_kind(path):
        return path
    try:
        return checkpoint.resolve_checkpoint(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint.init_from {init_from}: not a trainer checkpoint (no complete "
                                f"global_stepN), not a model folder (model_config.json + model.safetensors) and not a "
                                f"Hugging Face folder (config.json){foreign_checkpoint_hint(path)}") from None


HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")


def foreign_checkpoint_hint(path: Path) -> str:
    """What to say about a Hugging Face Trainer checkpoint (``checkpoint-500/``: config.json and the model's weights
    beside DeepSpeed's ``latest`` and ``global_step500/``), "" for anything else.

    ``folder_kind`` gives checkpoint markers precedence (our own checkpoints hold them), so such a folder is read as a
    DeepSpeed checkpoint of ours, which it is not, and the refusal said it was "not a Hugging Face folder
    (config.json)" although it holds one (review of 2026-12-06)."""
    if not (path / "config.json").is_file() or not any((path / n).is_file() for n in HF_WEIGHT_FILES):
        return ""
    return (f". {path} holds config.json and Hugging Face weights beside a DeepSpeed checkpoint ({checkpoint.LATEST}"
            " / global_step*) that another trainer wrote (a Hugging Face Trainer checkpoint-N folder), not this "
            "trainer's: copy config.json, the weights file(s) and the tokenizer files into a folder of their own "
            "and name that folder")


def init_source_weights(source: Path) -> tuple[dict[str, torch.Tensor], int | None]:
    """Our model's state dict from a folder ``init_source`` returned, and the vocabulary size it was trained with
    (None where a checkpoint's config does not say)."""
    weights, cfg = _source_weights(source)
    return weights, getattr(cfg, "vocab_size", None)


def _source_weights(source: Path):
    """(state dict, the source's ModelConfig or None where a checkpoint's config cannot be read as one)."""
    kind = folder_kind(source)
    if kind == "model folder":
        from trainer.models.model_folder import load_model_folder
        cfg, weights = load_model_folder(source)
        return weights, cfg
    if kind == "hugging face":
        from trainer.models.hf_convert import import_hf
        try:
            cfg, weights = import_hf(source)
        except ValueError as err:  # weights that do not match the config, a family we cannot import: say which key
            raise ValueError(f"checkpoint.init_from {source}: {err}") from None
        return weights, cfg
    weights, run_config = checkpoint.load_model_state(source)
    try:
        from trainer.export_hf import model_config_from_run
        return weights, model_config_from_run(run_config or {})
    except Exception:  # noqa: BLE001  (an old or partial config: the vocabulary size alone, as before)
        from types import SimpleNamespace
        return weights, SimpleNamespace(vocab_size=((run_config or {}).get("model") or {}).get("vocab_size"))


FIELDS = ("hidden_act", "layer_norm_eps", "pad_token_id", "position_offset")


def _field_differences(there: dict, model_cfg) -> list[tuple[str, object, object]]:
    """(field, value there, value in ``model_cfg``) for each of ``FIELDS`` that ``there`` records and that differs."""
    return [(f, there[f], getattr(model_cfg, f)) for f in FIELDS
            if f in there and hasattr(model_cfg, f) and there[f] != getattr(model_cfg, f)]


def check_fields(init_from, source_cfg, model_cfg) -> None:
    """Refuse a source whose activation, LayerNorm eps, pad id or position offset differ from the run's ``model.*``.

    Shapes are checked by loading; these are not, and the source's values were replaced by the recipe's silently
    (ernie-1.0-base-zh, relu and eps 1e-5, continued as gelu and 1e-12 in a config fitted to its shapes; review of
    2026-12-06): the weights were trained for the source's values."""
    if model_cfg is None or source_cfg is None:
        return
    differ = _field_differences({f: getattr(source_cfg, f) for f in FIELDS if hasattr(source_cfg, f)}, model_cfg)
    if differ:
        there = ", ".join(f"{f} {a!r} there, {b!r} here" for f, a, b in differ)
        sets = " ".join(f"--set model.{f}={a}" for f, a, _ in differ)
        raise ValueError(f"checkpoint.init_from {init_from}: the source was trained with other model settings "
                         f"({there}); its weights need the source's: {sets}")


def resume_field_changes(saved_config: dict | None, model_cfg) -> str | None:
    """A warning when a resume builds the model with other ``FIELDS`` values than the checkpoint's run did (a recipe
    or preset changed by an upgrade: ``ernie2-base``'s LayerNorm eps went from 1e-12 to 1e-5 on 2026-12-06), or
    None. A resume takes the launch's config, so the run continues with the new values; unlike ``check_fields`` for
    init_from this is said, not refused (the weights load either way and a deliberate change is legitimate)."""
    differ = _field_differences((saved_config or {}).get("model") or {}, model_cfg)
    if not differ:
        return None
    there = ", ".join(f"{f} {a!r} in the checkpoint's run, {b!r} now" for f, a, b in differ)
    sets = " ".join(f"--set model.{f}={a}" for f, a, _ in differ)
    return (f"warning: resume builds the model with other settings than the checkpoint's run ({there}): the run "
            f"continues with the new ones; to keep the old, relaunch with {sets}")


def as_electra_discriminator(model_keys, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` of one unprefixed model (no ``discriminator.``/``generator.`` keys, no MLM head) given the
    ``discriminator.`` prefix when the run's model is an ELECTRA pair (``model_keys`` hold ``discriminator.*``);
    anything else is returned as is.

    The hub ships google/electra-*-discriminator and -generator as two folders; the discriminator's folder alone
    imports as one model, and loading it into the pair said "the source lacks 62 of 62 encoder tensors" (review of
    2026-12-06). Taken as the discriminator, the run starts a new generator, which ``load_init_weights`` names. A
    model with an MLM head is a generator (or a BERT-like model), not a discriminator: it is left to be refused."""
    if not any(k.startswith("discriminator.") for k in model_keys) or \
            any(k.startswith(("discriminator.", "generator.", "heads.mlm.")) for k in weights):
        return weights
    return {f"discriminator.{k}": v for k, v in weights.items()}


def corpus_tokenizer_dir(cfg) -> Path | None:
    """The tokenizer folder of a run's first corpus (its manifest), None where it cannot be found (then the
    vocabulary is checked by size only)."""
    try:
        from data_prep.manifest import tokenizer_dir
        return tokenizer_dir(cfg.data.corpora[0].prefix)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def check_vocabulary(init_from, source: Path, tokenizer_dir: str | Path | None) -> None:
    """Refuse a source folder whose own tokenizer files map tokens to other ids than the run's corpus tokenizer.

    The size check alone let a WordPiece bert folder continue on a byte-level BPE corpus of the same size (every
    embedding row meaning another token; review of 2026-12-06). Only folders that carry tokenizer files can be
    compared (a released model's, an export of ours); a trainer checkpoint's corpus is checked by fingerprint when
    resumed, not here."""
    from data_prep.import_tokenizer import TokenizerImportError, has_tokenizer, vocabulary_difference
    from data_prep.tokenizer import TokenizerFolderError
    if tokenizer_dir is None or not source.is_dir() or not has_tokenizer(source):
        return
    try:
        diff = vocabulary_difference(source, Path(tokenizer_dir))
    except (TokenizerImportError, TokenizerFolderError) as err:
        raise ValueError(f"checkpoint.init_from {init_from}: cannot compare its tokenizer with the corpus "
                         f"tokenizer {tokenizer_dir}: {err}") from None
    if diff:
        raise ValueError(f"checkpoint.init_from {init_from}: its tokenizer is not the corpus tokenizer "
                         f"{tokenizer_dir}: {diff}. Build the corpus with the source's tokenizer "
                         f"(python data_prep/train_tokenizer.py --from-pretrained {source} --output DIR, then "
                         "build_indexed.py --tokenizer DIR), or start from a source trained on this tokenizer")
