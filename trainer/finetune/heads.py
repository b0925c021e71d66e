"""Task models for span extraction, token classification and multiple choice, with the heads of Hugging Face's
``*ForQuestionAnswering``, ``*ForTokenClassification`` and ``*ForMultipleChoice`` of each family, and their export.

- span (every family): ``qa_outputs``, a linear layer to (start, end) logits on every token, no dropout;
- token (every family): dropout, then ``classifier`` on every token;
- choice: each (context, choice) pair -> [CLS] -> pooler (dense + tanh; ELECTRA's ``sequence_summary``: dense +
  GELU) -> dropout -> ``classifier`` to one score, scores of a question's choices side by side. BERT, ERNIE and
  ALBERT start the pooler from the pretrained one (NSP/SOP), as ``from_pretrained`` of their checkpoints does.

``export_finetuned`` writes a fine-tuned model (these, or model.py's sequence Classifier) to a folder that
``transformers.AutoModelFor...`` loads with the same logits (tests/test_finetune_heads.py, one test per head and
family). Encoder keys come from hf_convert's key table, so they cannot drift from the pretraining export.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch import nn

from trainer.models import Encoder, ModelConfig
from trainer.models.encoder import init_weights

HF_SUFFIX = {"span": "ForQuestionAnswering", "token": "ForTokenClassification", "choice": "ForMultipleChoice",
             "sequence": "ForSequenceClassification"}


class TaskModel(nn.Module):
    """Encoder + one task head; ``forward(input_ids, attention_mask, token_type_ids)`` -> span [B, T, 2] (start,
    end), token [B, T, labels], choice [B, C] (inputs [B, C, T])."""

    def __init__(self, cfg: ModelConfig, head: str, num_labels: int, classifier_dropout: float = 0.1):
        super().__init__()
        from trainer.finetune.model import ClassificationHead
        self.cfg, self.kind = cfg, head
        self.encoder = Encoder(cfg)
        if head == "span":
            self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        elif head == "token":
            self.dropout = nn.Dropout(classifier_dropout)
            self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        elif head == "choice":
            self.head = ClassificationHead(cfg, 1, classifier_dropout)
            self.head.dropout_first = False  # HF's pooler / sequence_summary take [CLS] as is
        else:
            raise ValueError(f"unknown head {head!r}: span, token or choice")
        for name, module in self.named_children():
            if name != "encoder":
                module.apply(lambda m: init_weights(m, cfg))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, packing=None):
        if self.kind == "choice":
            b, c, t = input_ids.shape
            flat = [x.reshape(b * c, t) if x is not None else None for x in (input_ids, attention_mask, token_type_ids)]
            return self.head(self.encoder(*flat, packing=packing)).view(b, c)
        hidden = self.encoder(input_ids, attention_mask, token_type_ids, packing=packing)
        if self.kind == "span":
            return self.qa_outputs(hidden)
        return self.classifier(self.dropout(hidden))


def build_task_model(source, head: str, num_labels: int, dropout: float | None, classifier_dropout: float,
                     from_scratch: bool = False) -> TaskModel:
    """The task model with the source's encoder (and pooler, for choice heads of BERT/ERNIE/ALBERT), or with a fresh
    init of the same architecture (``from_scratch``)."""
    from trainer.finetune.model import finetune_config, load_source_weights
    model = TaskModel(finetune_config(source, dropout), head, num_labels, classifier_dropout)
    return model if from_scratch else load_source_weights(model, source, pooler=head == "choice")


def _lin(out: dict, hf: str, module: nn.Linear) -> None:
    out[f"{hf}.weight"], out[f"{hf}.bias"] = module.weight.detach().clone(), module.bias.detach().clone()


def hf_state_dict(model: nn.Module) -> tuple[str, dict[str, torch.Tensor]]:
    """(transformers class name, its state dict) for a TaskModel or model.py's Classifier."""
    from trainer.models.heads import HeadSpec
    from trainer.models.hf_convert import CLASS_STEM, to_hf_state_dict
    cfg = model.cfg
    fam = cfg.family
    kind = getattr(model, "kind", "sequence")
    arch = CLASS_STEM[fam] + HF_SUFFIX[kind]
    ours = {f"encoder.{k}": v for k, v in model.encoder.state_dict().items()}
    heads = {}
    # bert/ernie/albert keep the pooler in the base model for sequence and choice heads; roberta for choice only
    pooled = (kind == "sequence" and fam in ("bert", "ernie", "albert")) or (kind == "choice" and fam != "electra")
    if pooled:
        ours["heads.pool.pooler.weight"], ours["heads.pool.pooler.bias"] = model.head.pooler.weight, \
            model.head.pooler.bias
        heads = {"pool": HeadSpec("sequence", 2)}
    out = to_hf_state_dict(cfg, ours, heads, arch=f"{CLASS_STEM[fam]}Model")
    if kind == "span":
        _lin(out, "qa_outputs", model.qa_outputs)
    elif kind == "token":
        _lin(out, "classifier", model.classifier)
    elif kind == "choice":
        if fam == "electra":
            _lin(out, "sequence_summary.summary", model.head.pooler)
        _lin(out, "classifier", model.head.classifier)
    elif fam in ("roberta", "electra"):
        _lin(out, "classifier.dense", model.head.pooler)
        _lin(out, "classifier.out_proj", model.head.classifier)
    else:
        _lin(out, "classifier", model.head.classifier)
    return arch, out


def export_finetuned(model: nn.Module, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
                     labels: list[str] | None = None, classifier_dropout: float = 0.1) -> str:
    """Write ``model`` as a transformers folder (config.json, model.safetensors, tokenizer files); returns the class
    name. Labels (token and sequence heads) go to ``id2label``."""
    import transformers

    from trainer.models.hf_convert import TOKENIZER_FILES, hf_config
    arch, state = hf_state_dict(model)
    config = hf_config(model.cfg, arch)
    kind = getattr(model, "kind", "sequence")
    if kind in ("token", "sequence"):
        n = model.classifier.out_features if kind == "token" else model.head.classifier.out_features
        names = labels or [f"LABEL_{i}" for i in range(n)]
        config.num_labels = n
        config.id2label = dict(enumerate(names))
        config.label2id = {v: k for k, v in config.id2label.items()}
    if model.cfg.family == "albert":
        config.classifier_dropout_prob = classifier_dropout
    else:
        config.classifier_dropout = classifier_dropout
    hf = getattr(transformers, arch)(config)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    if missing or unexpected:
        raise RuntimeError(f"{arch} export mapping is incomplete: missing {missing[:5]}, unexpected {unexpected[:5]}")
    out = Path(out_dir)
    hf.save_pretrained(out)
    from trainer.file_modes import share_as_umask
    share_as_umask(out)  # safetensors writes 0600: readable by the project's group as the umask says
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copy2(Path(tokenizer_dir) / name, out / name)
    return arch
