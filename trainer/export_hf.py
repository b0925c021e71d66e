"""``python -m trainer.export_hf --checkpoint DIR --output DIR``: a Hugging Face folder from a run or a model folder.

``--checkpoint`` is a trainer checkpoint (``RUN_DIR/checkpoints/global_stepN``, or the ``checkpoints`` folder for
its newest complete one, read through ``trainer.checkpoint.load_model_state``) or our plain model folder
(``model_config.json`` + ``model.safetensors``, see trainer/models/model_folder.py). The output is loadable with
``transformers``' ``from_pretrained`` offline; ELECTRA writes the discriminator and a ``generator/`` subfolder.
Tokenizer files come from ``--tokenizer``, else from the folder itself, else from the run's first corpus manifest.
"""
import argparse
from pathlib import Path

from trainer.log import print0, warn0


def model_config_from_run(config: dict):
    """The ModelConfig inside a resolved run config (``model`` section: full fields or ``preset`` + overrides)."""
    from trainer.models import ModelConfig, get_preset

    section = config.get("model", config)
    if not isinstance(section, dict):
        raise ValueError("the checkpoint's config has no 'model' section; pass a model folder instead")
    section = dict(section)
    if "preset" in section:
        return get_preset(section.pop("preset"), **section)
    return ModelConfig(**section)


def tokenizer_from_run(config: dict) -> Path | None:
    """The tokenizer folder a run used: ``data.tokenizer`` if the data section names one, else the tokenizer path
    recorded in the manifest of its first corpus."""
    data = config.get("data") or {}
    if isinstance(data.get("tokenizer"), str):
        return Path(data["tokenizer"])
    corpora = data.get("corpora") or []
    if not corpora:
        return None
    try:
        from data_prep.manifest import tokenizer_dir

        return tokenizer_dir(corpora[0]["prefix"])
    except (OSError, ValueError, KeyError, ImportError) as err:
        warn0(f"could not find the run's tokenizer through its corpus manifest ({err}); pass --tokenizer")
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.export_hf", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="trainer checkpoint (global_stepN or its checkpoints/ folder) or a model folder")
    p.add_argument("--output", required=True, type=Path, help="Hugging Face folder to write")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder whose files to copy")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from trainer.models.hf_convert import export_hf
    from trainer.models.model_folder import complete_tied, is_model_folder, load_model_folder

    tokenizer = args.tokenizer
    if is_model_folder(args.checkpoint):
        cfg, state = load_model_folder(args.checkpoint)
        if tokenizer is None and (args.checkpoint / "tokenizer.json").is_file():
            tokenizer = args.checkpoint
    elif args.checkpoint.is_dir():
        from trainer.checkpoint import load_model_state
        from trainer.safe_load import UntrustedCheckpointError

        try:
            state, run_config = load_model_state(args.checkpoint)
        except UntrustedCheckpointError as err:  # a file that would run code when loaded: nothing was loaded
            raise SystemExit(f"error: --checkpoint {args.checkpoint}: {err}") from None
        state = complete_tied(state)
        cfg = model_config_from_run(run_config)
        tokenizer = tokenizer or tokenizer_from_run(run_config)
    else:
        raise SystemExit(f"--checkpoint {args.checkpoint}: no such folder")
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise SystemExit(f"--tokenizer {tokenizer}: no such folder")
    for folder in export_hf(cfg, state, args.output, tokenizer):
        print0(f"wrote {folder} ({cfg.family})")
    if tokenizer is None:
        warn0("no tokenizer folder given or found: the export has no tokenizer files (pass --tokenizer DIR)")
    return 0


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    raise SystemExit(main())
