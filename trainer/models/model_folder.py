"""Our plain model folder: ``model_config.json`` (a ModelConfig) + ``model.safetensors`` (the module's state dict).

It is what ``python -m trainer.export_hf --checkpoint`` accepts besides a trainer checkpoint, and a simple way to
hand a model between tools without DeepSpeed. Tied and shared tensors are stored once (safetensors refuses aliased
tensors), so ``complete_tied`` restores the duplicate keys (MLM decoder weight, ELECTRA's shared embeddings) that
``load_state_dict`` expects.
"""
import json
from pathlib import Path

import torch
from torch import nn

from trainer.models.config import ModelConfig
from trainer.models.vocab_padding import fit_to_config

CONFIG_FILE, WEIGHTS_FILE = "model_config.json", "model.safetensors"


def is_model_folder(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file() and (Path(path) / WEIGHTS_FILE).is_file()


def save_model_folder(model: nn.Module, cfg: ModelConfig, folder: str | Path) -> Path:
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(cfg.model_dump(), indent=1) + "\n")
    save_model(model, str(folder / WEIGHTS_FILE))
    from trainer.file_modes import share_as_umask
    share_as_umask(folder)  # safetensors writes 0600
    return folder


def load_model_folder(folder: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    folder = Path(folder)
    if not is_model_folder(folder):
        raise FileNotFoundError(f"{folder}: expected {CONFIG_FILE} and {WEIGHTS_FILE} (a folder written by "
                                f"trainer.models.model_folder.save_model_folder)")
    try:
        cfg = ModelConfig(**json.loads((folder / CONFIG_FILE).read_text()))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{folder / CONFIG_FILE}: not a valid model config: {err}") from err
    # a folder saved with other vocabulary padding (or before it existed) gets this config's row count
    return cfg, fit_to_config(complete_tied(load_file(str(folder / WEIGHTS_FILE))), cfg)


def complete_tied(state_dict: dict) -> dict:
    """Add back keys that alias others: each MLM head's decoder weight (= its encoder's word embedding) and, in an
    ELECTRA state dict, the embedding block under whichever of generator/discriminator lacks it."""
    sd = dict(state_dict)
    for key in list(sd):
        if key.endswith("decoder.bias") and ".heads." in f".{key}":
            prefix = key.split("heads.")[0]
            weight = key[: -len("bias")] + "weight"
            if weight not in sd and prefix + "encoder.embeddings.word.weight" in sd:
                sd[weight] = sd[prefix + "encoder.embeddings.word.weight"]
    for src, dst in (("discriminator.", "generator."), ("generator.", "discriminator.")):
        for key in [k for k in sd if k.startswith(src + "encoder.embeddings.")]:
            sd.setdefault(dst + key[len(src):], sd[key])
    # the generator's decoder may only now find its word embedding
    return complete_tied(sd) if sd.keys() != state_dict.keys() else sd
