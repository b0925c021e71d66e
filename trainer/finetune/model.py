"""What a fine-tuning run starts from: a checkpoint's encoder and tokenizer, and the classifier built on it.

``load_source(PATH)`` accepts a trainer checkpoint (``global_stepN``, or a ``checkpoints`` folder: its newest complete
one, through ``trainer.checkpoint.load_model_state``), our model folder (``trainer.models.model_folder``) or a Hugging
Face folder of the five families (``trainer.models.hf_convert.import_hf``). It returns the encoder's weights (ELECTRA:
the discriminator's) and, where the pretraining model had one, its [CLS] pooler.

Heads follow the Hugging Face classes our exports load into, so a score here is the score of the exported model:

- bert, ernie, albert (``*ForSequenceClassification``): the pretrained pooler (dense + tanh, from the NSP/SOP head),
  dropout, a new classifier;
- roberta (``RobertaClassificationHead``): dropout, a new dense + tanh, dropout, classifier on <s>;
- electra (``ElectraClassificationHead``): dropout, a new dense + GELU, dropout, classifier on [CLS].
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models import Encoder, ModelConfig
from trainer.models.encoder import init_weights

FAMILIES = ("bert", "roberta", "albert", "electra", "ernie")
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


class SourceError(ValueError):
    """A checkpoint or tokenizer that cannot be fine-tuned; the message names the path and the fix."""


@dataclass
class Source:
    cfg: ModelConfig
    encoder: dict[str, torch.Tensor]
    """Encoder state dict (keys without the ``encoder.`` prefix)."""
    pooler: dict[str, torch.Tensor] | None
    """``weight``/``bias`` of the pretrained [CLS] pooler, if the model had one (BERT/ERNIE NSP, ALBERT SOP)."""
    tokenizer_dir: Path | None
    kind: str
    """'checkpoint', 'model folder' or 'hugging face'."""
    step: int | None = None
    """Pretraining step of a trainer checkpoint."""
    run_dir: Path | None = None
    tokenizer_fingerprint: str | None = None
    """The fingerprint recorded with the pretraining corpus, when known (checked against the tokenizer used)."""


def _split_state(state: dict[str, torch.Tensor]) -> tuple[dict, dict | None]:
    if any(k.startswith("discriminator.") for k in state):  # ELECTRA: fine-tune the discriminator
        state = {k[len("discriminator."):]: v for k, v in state.items() if k.startswith("discriminator.")}
    encoder = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    if not encoder:
        raise SourceError("the checkpoint's weights have no encoder.* tensors: not a model of this trainer")
    poolers = sorted(k[: -len(".pooler.weight")] for k in state if k.startswith("heads.") and
                     k.endswith(".pooler.weight"))
    pooler = None
    if poolers:
        p = poolers[0]
        pooler = {"weight": state[f"{p}.pooler.weight"], "bias": state[f"{p}.pooler.bias"]}
    return encoder, pooler


def _hf_family(folder: Path) -> str:
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as err:
        raise SourceError(f"{folder / 'config.json'}: cannot be read ({err})") from None
    if model_type not in FAMILIES:
        raise SourceError(f"--checkpoint {folder}: a Hugging Face {model_type!r} model; fine-tuning supports the "
                          f"families {', '.join(FAMILIES)}")
    return model_type


def load_source(path: str | Path) -> Source:
    from trainer.checkpoint import LATEST, STATE_FILE, load_model_state
    from trainer.init_from import folder_kind
    from trainer.models.model_folder import load_model_folder

    path = Path(path)
    if not path.is_dir():
        raise SourceError(f"--checkpoint {path}: no such folder (a trainer checkpoint, a checkpoints/ folder, our "
                          "model folder or a Hugging Face folder)")
    # a tokenizer written by data_prep, or a released model's in any of the layouts transformers reads (tokenizer.json;
    # vocab.txt for WordPiece; vocab.json + merges.txt for byte-level BPE; a SentencePiece model)
    tokenizer_here = path if any((path / name).is_file() for name in HF_TOKENIZER_FILES) else None
    kind = folder_kind(path)  # the precedence init_from uses: checkpoint markers, then model folder, then HF
    if kind == "model folder":
        cfg, state = load_model_folder(path)
        encoder, pooler = _split_state(state)
        return Source(cfg, encoder, pooler, tokenizer_here, "model folder", run_dir=path)
    if kind == "hugging face":
        _hf_family(path)
        from trainer.models.hf_convert import import_hf
        try:
            cfg, state = import_hf(path)
        except ValueError as err:  # weights that do not match config.json (hf_convert._check_body), and the like
            raise SourceError(f"--checkpoint {path}: {err}") from None
        encoder, pooler = _split_state(state)
        return Source(cfg, encoder, pooler, tokenizer_here, "hugging face", run_dir=path)
    if (path / STATE_FILE).is_file() or (path / LATEST).is_file() or any(path.glob("global_step*")):
        from trainer.export_hf import model_config_from_run, tokenizer_from_run
        from trainer.models.model_folder import complete_tied
        from trainer.safe_load import UntrustedCheckpointError
        try:
            state, run_config = load_model_state(path)
        except (FileNotFoundError, UntrustedCheckpointError) as err:
            from trainer.init_from import foreign_checkpoint_hint  # an HF Trainer checkpoint-N folder
            raise SourceError(f"--checkpoint {path}: {err}{foreign_checkpoint_hint(path)}") from None
        family = (run_config.get("model") or {}).get("family")
        if family is not None and family not in FAMILIES:
            raise SourceError(f"--checkpoint {path}: model family {family!r} is not supported ({FAMILIES})")
        cfg = model_config_from_run(run_config)
        from trainer.models.vocab_padding import fit_to_config  # a run saved with other vocabulary padding
        encoder, pooler = _split_state(fit_to_config(complete_tied(state), cfg))
        tag = path if (path / STATE_FILE).is_file() else None
        step = None
        if tag is None:
            from trainer.checkpoint import find_latest
            tag = find_latest(path)
        if tag is not None:
            step = json.loads((tag / STATE_FILE).read_text()).get("step")
        tok = tokenizer_from_run(run_config)
        fingerprint = None
        try:
            from data_prep.manifest import read_manifest
            fingerprint = read_manifest(run_config["data"]["corpora"][0]["prefix"])["tokenizer"]["fingerprint"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            pass
        # results go beside the checkpoint (or to --set run_dir), never to the run_dir its config names: a received
        # checkpoint's config names a path on its maker's filesystem, which may be someone else's folder here
        run_dir = tag.parent.parent if tag.parent.name == "checkpoints" else tag.parent
        return Source(cfg, encoder, pooler, tok, "checkpoint", step, run_dir, fingerprint)
    raise SourceError(f"--checkpoint {path}: not a trainer checkpoint (no {STATE_FILE} or {LATEST}), not a model "
                      "folder (model_config.json + model.safetensors) and not a Hugging Face folder (config.json)")


class HFTokenizer:
    """``transformers.AutoTokenizer`` behind the few members fine-tuning uses, for Hugging Face folders whose
    tokenizer was not written by data_prep/train_tokenizer.py (a released model's)."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer
        try:
            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SourceError(f"tokenizer {path}: neither a data_prep tokenizer folder (bertfamily_tokenizer.json) "
                              f"nor one transformers.AutoTokenizer reads ({type(err).__name__}: {err})") from None
        self.path, self._tok = path, tok
        self.vocab_size = len(tok)
        self.cls_id, self.sep_id, self.pad_id = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
        self.kind = "bbpe" if tok.cls_token == "<s>" else "wordpiece"
        self.fingerprint = None
        if None in (self.cls_id, self.sep_id, self.pad_id):
            raise SourceError(f"tokenizer {path}: needs cls, sep and pad tokens")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)


def load_tokenizer_for(source: Source, override: str | None):
    """The tokenizer to fine-tune with, checked against the model before anything trains."""
    from data_prep.tokenizer import META_FILE, TokenizerFolderError, load_tokenizer
    path = Path(override) if override else source.tokenizer_dir
    if path is None:
        raise SourceError(f"no tokenizer: the {source.kind} names none; pass tokenizer=DIR (--set tokenizer=DIR)")
    try:
        tok = load_tokenizer(path) if (path / META_FILE).is_file() else HFTokenizer(path)
    except TokenizerFolderError as err:
        raise SourceError(f"tokenizer: {err}") from None
    cfg = source.cfg
    if tok.vocab_size > cfg.vocab_size:
        raise SourceError(f"tokenizer {path} has {tok.vocab_size} tokens but the model's embedding table has "
                          f"{cfg.vocab_size} rows: it is not the tokenizer this model was pretrained with")
    if tok.pad_id != cfg.pad_token_id:
        raise SourceError(f"tokenizer {path} pads with id {tok.pad_id}, the model with {cfg.pad_token_id}: not the "
                          "tokenizer this model was pretrained with")
    if source.tokenizer_fingerprint and tok.fingerprint and tok.fingerprint != source.tokenizer_fingerprint:
        raise SourceError(f"tokenizer {path} differs from the one the checkpoint's corpus was made with "
                          f"(fingerprint {tok.fingerprint[:12]} vs {source.tokenizer_fingerprint[:12]})")
    return tok


class ClassificationHead(nn.Module):
    """[CLS] -> (dropout) -> pooler (dense + act) -> dropout -> classifier; see the module docstring per family."""

    def __init__(self, cfg: ModelConfig, num_labels: int, dropout: float):
        super().__init__()
        self.act = torch.tanh if cfg.family != "electra" else F.gelu
        self.dropout_first = cfg.family in ("roberta", "electra")
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.apply(lambda m: init_weights(m, cfg))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden[:, 0]
        if self.dropout_first:
            x = self.dropout(x)
        return self.classifier(self.dropout(self.act(self.pooler(x))))


class Classifier(nn.Module):
    """Encoder + ClassificationHead: ``forward(input_ids, attention_mask, token_type_ids) -> logits [B, labels]``."""

    def __init__(self, cfg: ModelConfig, num_labels: int, classifier_dropout: float = 0.1):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.head = ClassificationHead(cfg, num_labels, classifier_dropout)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, packing=None):
        return self.head(self.encoder(input_ids, attention_mask, token_type_ids, packing=packing))


def finetune_config(source: Source, dropout: float | None) -> ModelConfig:
    """The source's model config for fine-tuning: no activation checkpointing, and ``dropout`` (when given) for the
    hidden and attention dropout."""
    cfg = source.cfg.replace(activation_checkpointing=False)
    return cfg if dropout is None else cfg.replace(dropout=dropout, attention_dropout=dropout)


def load_source_weights(model: nn.Module, source: Source, pooler: bool) -> nn.Module:
    """``model`` (with ``.encoder`` and ``.head.pooler``) given the source's encoder weights, and its pooler where
    ``pooler`` and the family has one (BERT, ERNIE, ALBERT)."""
    missing, unexpected = model.encoder.load_state_dict(source.encoder, strict=False)
    if missing or unexpected:
        raise SourceError(f"the checkpoint's encoder does not fit its config: missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]}")
    if pooler and source.pooler is not None and source.cfg.family in ("bert", "ernie", "albert"):
        model.head.pooler.load_state_dict(source.pooler)
    return model


def build_classifier(source: Source, num_labels: int, dropout: float | None, classifier_dropout: float,
                     from_scratch: bool = False) -> Classifier:
    """The classifier with the source's weights (or, ``from_scratch``, its architecture with a fresh init)."""
    model = Classifier(finetune_config(source, dropout), num_labels, classifier_dropout)
    return model if from_scratch else load_source_weights(model, source, pooler=True)


def layer_depth(name: str, num_layers: int) -> int:
    """ELECTRA's depths: embeddings (and the E->H projection) 0, layer i -> i + 1, the task head L + 2."""
    parts = name.split(".")
    if parts[0] == "encoder" and parts[1] in ("attention", "ffn"):
        return int(parts[2]) + 1
    if parts[0] == "encoder":
        return 0
    return num_layers + 2


def optimizer_groups(model: Classifier, lr: float, weight_decay: float, layer_decay: float) -> list[dict]:
    """Param groups: no decay for biases and norms (``trainer.optim.param_groups``'s rule), and with
    ``layer_decay`` < 1 ELECTRA's per-depth learning rates (``lr * layer_decay ** (L + 2 - depth)``, as in its
    ``_get_layer_lrs``). The scheduler multiplies each group's own lr, so the ratios hold through warmup and decay."""
    from trainer.optim.param_groups import param_groups
    L = model.cfg.num_layers
    if layer_decay < 1 and model.cfg.sharing != "none":
        raise ValueError(f"optim.layer_decay={layer_decay} needs unshared layers; this {model.cfg.family} model "
                         f"shares them ({model.cfg.sharing}): use layer_decay 1.0")
    no_decay = {id(p) for g in param_groups(model, weight_decay) if g["weight_decay"] == 0 for p in g["params"]}
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        depth = layer_depth(name, L) if layer_decay < 1 else L + 2
        decayed = id(p) not in no_decay
        g = groups.setdefault((depth, decayed), {"params": [], "weight_decay": weight_decay if decayed else 0.0,
                                                 "lr": lr * layer_decay ** (L + 2 - depth)})
        g["params"].append(p)
    return [groups[k] for k in sorted(groups)]
