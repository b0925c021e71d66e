"""Conversion between our state dicts and Hugging Face ``transformers`` models, in both directions.

Pure functions on (ModelConfig, state_dict) do the mapping (``to_hf_state_dict`` / ``from_hf_state_dict``), from one
key table per family (``key_map``), so export and import cannot drift apart. ``export_hf`` writes a folder that
``from_pretrained`` loads offline (through ``transformers``' own ``save_pretrained``: config.json and
model.safetensors); ``import_hf`` reads one back for continued pretraining.

Targets (by family and by the heads present, found by kind):
  bert / ernie: mlm + 2-way sequence head -> *ForPreTraining; mlm -> *ForMaskedLM; otherwise *Model
  roberta: mlm -> RobertaForMaskedLM; otherwise RobertaModel
  albert: mlm + 2-way sequence head -> AlbertForPreTraining; mlm -> AlbertForMaskedLM; otherwise AlbertModel
  electra: the discriminator (rtd token head) -> ElectraForPreTraining in the folder, the generator -> a
  ``generator/`` subfolder as ElectraForMaskedLM.
Our fused QKV projection is split into query/key/value; our vocabulary padding rows (ModelConfig.pad_vocab_to) are
dropped on export and added back (zero) on import, so the exported logits are ours on the real vocabulary. Sharing
modes Hugging Face cannot express (attention- or ffn-only sharing; any sharing outside ALBERT) are exported unshared
(same values, copied per layer) with a warning: the export is exact for inference and fine-tuning, the sharing itself
is lost.
"""
import shutil
from pathlib import Path

import torch

from trainer.log import warn0
from trainer.models.config import ModelConfig
from trainer.models.heads import MLM, NSP, RTD, SOP, HeadSpec
from trainer.models.vocab_padding import fit_rows, fit_to_config, is_vocab_row_key

PREFIX = {"bert": "bert", "roberta": "roberta", "albert": "albert", "electra": "electra", "ernie": "ernie"}
CLASS_STEM = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra", "ernie": "Ernie"}
WORD = "encoder.embeddings.word.weight"


# ----------------------------------------------------------------------------------------------- heads and classes
def heads_from_state_dict(state_dict: dict) -> dict[str, HeadSpec]:
    """Recover the HeadSpecs of a PretrainingModel state dict from its ``heads.<name>.*`` keys and shapes."""
    # NSP / SOP first: the export maps the first 2-way sequence head to *ForPreTraining's seq_relationship, and
    # ERNIE 1.0's DLM head ("dlm", 2-way too) sorts before "nsp"
    names = sorted({key.split(".")[1] for key in state_dict if key.startswith("heads.")},
                   key=lambda n: (n not in (NSP, SOP), n))
    heads = {}
    for name in names:
        p = f"heads.{name}."
        if p + "decoder.bias" in state_dict:
            heads[name] = HeadSpec("mlm")
        elif p + "pooler.weight" in state_dict:
            heads[name] = HeadSpec("sequence", state_dict[p + "classifier.weight"].shape[0])
        elif p + "dense.weight" in state_dict:
            heads[name] = HeadSpec("token", state_dict[p + "classifier.weight"].shape[0])
        else:
            raise ValueError(f"head {name!r} in the state dict matches no head kind (keys under {p})")
    return heads


def _pick(heads: dict[str, HeadSpec], kind: str, num_labels: int | None = None) -> str | None:
    for name, spec in heads.items():
        if spec.kind == kind and (num_labels is None or spec.num_labels == num_labels):
            return name
    return None


def hf_architecture(cfg: ModelConfig, heads: dict[str, HeadSpec]) -> str:
    """The transformers class name an export targets (see the module docstring)."""
    stem = CLASS_STEM[cfg.family]
    mlm, seq = _pick(heads, "mlm"), _pick(heads, "sequence", 2)
    if cfg.family == "electra":
        if _pick(heads, "token", 1):
            return "ElectraForPreTraining"
        return "ElectraForMaskedLM" if mlm else "ElectraModel"
    if mlm and seq and cfg.family != "roberta":
        return f"{stem}ForPreTraining"
    return f"{stem}ForMaskedLM" if mlm else f"{stem}Model"


# ------------------------------------------------------------------------------------------------------ key table
def _linear(hf: str, ours: str, part: int | None = None) -> list[tuple[str, str, int | None]]:
    return [(f"{hf}.weight", f"{ours}.weight", part), (f"{hf}.bias", f"{ours}.bias", part)]


def key_map(cfg: ModelConfig, heads: dict[str, HeadSpec], arch: str) -> list[tuple[str, str, int | None]]:
    """(hf_key, our_key, part): ``part`` k means rows k*H:(k+1)*H of our fused QKV tensor (0 q, 1 k, 2 v)."""
    fam, p = cfg.family, PREFIX[cfg.family]
    if fam not in ("albert", "electra") and cfg.emb_size != cfg.hidden_size:
        raise ValueError(f"{fam} in Hugging Face has no embedding projection, but embedding_size {cfg.emb_size} "
                         f"!= hidden_size {cfg.hidden_size}: export as family albert or electra instead")
    if fam == "albert" and cfg.emb_size == cfg.hidden_size:
        raise ValueError("AlbertModel always has an embedding projection; this model has embedding_size == "
                         "hidden_size and none: set embedding_size smaller or export as family bert")
    if cfg.type_vocab_size == 0:
        raise ValueError("Hugging Face models need type_vocab_size >= 1; this model has no segment embedding")
    m = [(f"{p}.embeddings.word_embeddings.weight", WORD, None),
         (f"{p}.embeddings.position_embeddings.weight", "encoder.embeddings.position.weight", None),
         (f"{p}.embeddings.token_type_embeddings.weight", "encoder.embeddings.token_type.weight", None)]
    m += _linear(f"{p}.embeddings.LayerNorm", "encoder.embeddings.norm")
    if fam == "ernie" and "task" in cfg.extra_embeddings:
        m.append((f"{p}.embeddings.task_type_embeddings.weight", "encoder.embeddings.extra.task.weight", None))
    if cfg.emb_size != cfg.hidden_size:
        proj = f"{p}.encoder.embedding_hidden_mapping_in" if fam == "albert" else f"{p}.embeddings_project"
        m += _linear(proj, "encoder.project")
    shared = cfg.sharing == "all" and fam == "albert"
    for i in range(1 if shared else cfg.num_layers):
        a = f"encoder.attention.{i if cfg.sharing in ('none', 'ffn') else 0}"
        f = f"encoder.ffn.{i if cfg.sharing in ('none', 'attention') else 0}"
        if fam == "albert":
            h = f"{p}.encoder.albert_layer_groups.{i}.albert_layers.0"
            m += (_linear(f"{h}.attention.query", f"{a}.qkv", 0) + _linear(f"{h}.attention.key", f"{a}.qkv", 1)
                  + _linear(f"{h}.attention.value", f"{a}.qkv", 2) + _linear(f"{h}.attention.dense", f"{a}.out")
                  + _linear(f"{h}.attention.LayerNorm", f"{a}.norm") + _linear(f"{h}.ffn", f"{f}.inner")
                  + _linear(f"{h}.ffn_output", f"{f}.outer") + _linear(f"{h}.full_layer_layer_norm", f"{f}.norm"))
        else:
            h = f"{p}.encoder.layer.{i}"
            m += (_linear(f"{h}.attention.self.query", f"{a}.qkv", 0)
                  + _linear(f"{h}.attention.self.key", f"{a}.qkv", 1)
                  + _linear(f"{h}.attention.self.value", f"{a}.qkv", 2)
                  + _linear(f"{h}.attention.output.dense", f"{a}.out")
                  + _linear(f"{h}.attention.output.LayerNorm", f"{a}.norm")
                  + _linear(f"{h}.intermediate.dense", f"{f}.inner") + _linear(f"{h}.output.dense", f"{f}.outer")
                  + _linear(f"{h}.output.LayerNorm", f"{f}.norm"))
    mlm, seq, tok = _pick(heads, "mlm"), _pick(heads, "sequence", 2), _pick(heads, "token", 1)
    if arch.endswith("ForPreTraining") and fam in ("bert", "ernie") and seq:
        m += _linear(f"{p}.pooler.dense", f"heads.{seq}.pooler") + _linear("cls.seq_relationship",
                                                                           f"heads.{seq}.classifier")
    if arch.endswith(("ForPreTraining", "ForMaskedLM")) and fam in ("bert", "ernie") and mlm:
        m += (_linear("cls.predictions.transform.dense", f"heads.{mlm}.dense")
              + _linear("cls.predictions.transform.LayerNorm", f"heads.{mlm}.norm")
              + [("cls.predictions.bias", f"heads.{mlm}.decoder.bias", None),
                 ("cls.predictions.decoder.bias", f"heads.{mlm}.decoder.bias", None),
                 ("cls.predictions.decoder.weight", WORD, None)])
    elif arch == "RobertaForMaskedLM" and mlm:
        m += (_linear("lm_head.dense", f"heads.{mlm}.dense") + _linear("lm_head.layer_norm", f"heads.{mlm}.norm")
              + [("lm_head.bias", f"heads.{mlm}.decoder.bias", None),
                 ("lm_head.decoder.bias", f"heads.{mlm}.decoder.bias", None),
                 ("lm_head.decoder.weight", WORD, None)])
    elif arch in ("AlbertForPreTraining", "AlbertForMaskedLM"):
        if arch == "AlbertForPreTraining" and seq:
            m += _linear(f"{p}.pooler", f"heads.{seq}.pooler") + _linear("sop_classifier.classifier",
                                                                         f"heads.{seq}.classifier")
        if mlm:
            m += (_linear("predictions.dense", f"heads.{mlm}.dense") + _linear("predictions.LayerNorm",
                                                                               f"heads.{mlm}.norm")
                  + [("predictions.bias", f"heads.{mlm}.decoder.bias", None),
                     ("predictions.decoder.bias", f"heads.{mlm}.decoder.bias", None),
                     ("predictions.decoder.weight", WORD, None)])
    elif arch == "ElectraForPreTraining" and tok:
        m += (_linear("discriminator_predictions.dense", f"heads.{tok}.dense")
              + _linear("discriminator_predictions.dense_prediction", f"heads.{tok}.classifier"))
    elif arch == "ElectraForMaskedLM" and mlm:
        m += (_linear("generator_predictions.dense", f"heads.{mlm}.dense")
              + _linear("generator_predictions.LayerNorm", f"heads.{mlm}.norm")
              + [("generator_lm_head.weight", WORD, None), ("generator_lm_head.bias", f"heads.{mlm}.decoder.bias",
                                                           None)])
    elif arch.endswith("Model") and seq and fam != "electra":
        pooler = f"{p}.pooler" if fam == "albert" else f"{p}.pooler.dense"
        m += _linear(pooler, f"heads.{seq}.pooler")
    return m


# ------------------------------------------------------------------------------------------- state dicts, configs
def to_hf_state_dict(cfg: ModelConfig, state_dict: dict, heads: dict[str, HeadSpec] | None = None,
                     arch: str | None = None) -> dict[str, torch.Tensor]:
    """Our PretrainingModel state dict -> the state dict of ``arch`` (default: hf_architecture(cfg, heads))."""
    heads = heads if heads is not None else heads_from_state_dict(state_dict)
    arch = arch or hf_architecture(cfg, heads)
    out = {}
    for hf_key, ours, part in key_map(cfg, heads, arch):
        if ours not in state_dict:
            raise KeyError(f"state dict has no {ours!r} (needed for {arch}.{hf_key}); is this a {cfg.family} model "
                           f"with heads {sorted(heads)}?")
        tensor = state_dict[ours]
        if is_vocab_row_key(ours):  # our padding rows (ModelConfig.pad_vocab_to) are not part of the vocabulary
            tensor = fit_rows(tensor, cfg.vocab_size, cfg.vocab_size, ours)
        out[hf_key] = (tensor if part is None else tensor.chunk(3, dim=0)[part]).detach().clone().float()
    dropped = [n for n in cfg.extra_embeddings if not (cfg.family == "ernie" and n == "task")]
    if dropped:
        warn0(f"export to {arch}: extra embedding tables {dropped} have no Hugging Face counterpart and are left out")
    if cfg.sharing != "none" and not (cfg.family == "albert" and cfg.sharing == "all"):
        warn0(f"export to {arch}: sharing {cfg.sharing!r} is written as separate copies per layer")
    return out


def from_hf_state_dict(cfg: ModelConfig, hf_state_dict: dict, heads: dict[str, HeadSpec], arch: str
                       ) -> dict[str, torch.Tensor]:
    """The inverse of to_hf_state_dict: a Hugging Face state dict -> ours (tied decoder key included)."""
    ours, parts = {}, {}
    for hf_key, key, part in key_map(cfg, heads, arch):
        if hf_key not in hf_state_dict:
            if hf_key.endswith(("decoder.weight", "decoder.bias", "lm_head.weight")):
                continue  # tied copies that some transformers versions leave out of the state dict
            raise KeyError(f"{arch} state dict has no {hf_key!r}")
        tensor = hf_state_dict[hf_key].detach().clone().float()
        if part is None and key in ours and not torch.equal(ours[key], tensor):
            first = next(h for h, k, _ in key_map(cfg, heads, arch) if k == key and h in hf_state_dict)
            raise ValueError(f"{arch}: {hf_key} differs from {first}, which our model holds as one tensor ({key}): "
                             "an untied output layer cannot be imported exactly (our encoders tie the MLM decoder "
                             "to the word embeddings)")
        if part is None:
            ours.setdefault(key, tensor)
        else:
            parts.setdefault(key, {})[part] = tensor
    for key, pieces in parts.items():
        ours[key] = torch.cat([pieces[k] for k in range(3)], dim=0)
    ours = fit_to_config(ours, cfg)  # zero padding rows up to cfg.padded_vocab_size
    mlm = _pick(heads, "mlm")
    if mlm:
        ours[f"heads.{mlm}.decoder.weight"] = ours[WORD]
    return ours


def hf_config(cfg: ModelConfig, arch: str):
    """A transformers config for this ModelConfig, built by transformers' own config class."""
    import transformers

    kwargs = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                  num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size, hidden_act=cfg.hidden_act,
                  hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
                  max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
                  initializer_range=cfg.initializer_range, layer_norm_eps=cfg.layer_norm_eps,
                  pad_token_id=cfg.pad_token_id, architectures=[arch])
    if cfg.family == "albert":
        kwargs.update(embedding_size=cfg.emb_size, num_hidden_groups=1 if cfg.sharing == "all" else cfg.num_layers,
                      # the classifier Hugging Face adds for fine-tuning: 0.1 as in the released albert-*-v2,
                      # whose hidden dropout is 0 (cfg.dropout would switch it off)
                      inner_group_num=1, classifier_dropout_prob=0.1)
    elif cfg.family == "electra":
        kwargs.update(embedding_size=cfg.emb_size)
    elif cfg.family == "ernie":
        kwargs.update(use_task_id="task" in cfg.extra_embeddings,
                      task_type_vocab_size=cfg.extra_embeddings.get("task", 3))
    elif cfg.family == "roberta" and cfg.position_offset != cfg.pad_token_id + 1:
        raise ValueError(f"RoBERTa export needs position_offset = pad_token_id + 1 = {cfg.pad_token_id + 1} "
                         f"(Hugging Face derives positions from the pad id), got {cfg.position_offset}")
    return getattr(transformers, f"{CLASS_STEM[cfg.family]}Config")(**kwargs)


def config_from_hf(hf_cfg) -> ModelConfig:
    """Our ModelConfig for a transformers config of one of the five families."""
    fam = hf_cfg.model_type
    if fam not in PREFIX:
        raise ValueError(f"cannot import model_type {fam!r}: supported are {sorted(PREFIX)}")
    act = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "relu": "relu",
           "gelu_python": "gelu"}.get(hf_cfg.hidden_act)
    if act is None:
        raise ValueError(f"hidden_act {hf_cfg.hidden_act!r} is not supported (gelu, gelu_new, relu)")
    kw = dict(vocab_size=hf_cfg.vocab_size, hidden_size=hf_cfg.hidden_size, num_layers=hf_cfg.num_hidden_layers,
              num_heads=hf_cfg.num_attention_heads, intermediate_size=hf_cfg.intermediate_size, hidden_act=act,
              dropout=hf_cfg.hidden_dropout_prob, attention_dropout=hf_cfg.attention_probs_dropout_prob,
              max_position_embeddings=hf_cfg.max_position_embeddings, type_vocab_size=hf_cfg.type_vocab_size,
              initializer_range=hf_cfg.initializer_range, layer_norm_eps=hf_cfg.layer_norm_eps,
              pad_token_id=hf_cfg.pad_token_id if hf_cfg.pad_token_id is not None else 0, family=fam)
    if fam in ("albert", "electra"):
        kw["embedding_size"] = hf_cfg.embedding_size
    if fam == "albert":
        if hf_cfg.inner_group_num != 1 or hf_cfg.num_hidden_groups not in (1, hf_cfg.num_hidden_layers):
            raise ValueError(f"ALBERT with num_hidden_groups={hf_cfg.num_hidden_groups}, inner_group_num="
                             f"{hf_cfg.inner_group_num} has no equivalent sharing mode (supported: one group of "
                             f"one layer = 'all', or one group per layer = 'none')")
        kw["sharing"] = "all" if hf_cfg.num_hidden_groups == 1 else "none"
    if fam == "roberta":
        kw["position_offset"] = kw["pad_token_id"] + 1
    if fam == "ernie" and getattr(hf_cfg, "use_task_id", False):
        kw["extra_embeddings"] = {"task": hf_cfg.task_type_vocab_size}
    return ModelConfig(**kw)


def heads_for_architecture(fam: str, arch: str) -> dict[str, HeadSpec]:
    """The heads (with our canonical names) that an imported Hugging Face class carries."""
    if arch.endswith("ForPreTraining"):
        if fam == "electra":
            return {RTD: HeadSpec("token", 1)}
        return {MLM: HeadSpec("mlm"), (SOP if fam == "albert" else NSP): HeadSpec("sequence", 2)}
    if arch.endswith("ForMaskedLM"):
        return {MLM: HeadSpec("mlm")}
    return {}


# ----------------------------------------------------------------------------------------------- folders on disk
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spiece.model", "added_tokens.json", "bertfamily_tokenizer.json")


def _save_one(cfg: ModelConfig, state_dict: dict, out: Path) -> str:
    import transformers

    heads = heads_from_state_dict(state_dict)
    arch = hf_architecture(cfg, heads)
    hf_sd = to_hf_state_dict(cfg, state_dict, heads, arch)
    model = getattr(transformers, arch)(hf_config(cfg, arch))
    missing, unexpected = model.load_state_dict(hf_sd, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    if unexpected or missing:
        raise RuntimeError(f"{arch} export mapping is incomplete: missing {missing[:5]}, unexpected "
                           f"{unexpected[:5]}")
    model.tie_weights()
    model.save_pretrained(out)
    from trainer.file_modes import share_as_umask
    share_as_umask(out)  # safetensors writes 0600: readable by the project's group as the umask says
    return arch


def export_hf(cfg: ModelConfig, state_dict: dict, out_dir: str | Path, tokenizer_dir: str | Path | None = None
              ) -> list[Path]:
    """Write a Hugging Face folder (config.json, model.safetensors, tokenizer files) for our model.

    ``state_dict`` is a PretrainingModel's, or an ElectraPretrainingModel's (keys ``generator.*`` and
    ``discriminator.*``): then the discriminator goes to ``out_dir`` and the generator to ``out_dir/generator``.
    Returns the folders written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if any(k.startswith("discriminator.") for k in state_dict):
        from trainer.models.electra import generator_config, infer_generator_fraction

        disc = {k[len("discriminator."):]: v for k, v in state_dict.items() if k.startswith("discriminator.")}
        gen = {k[len("generator."):]: v for k, v in state_dict.items() if k.startswith("generator.")}
        for key, value in disc.items():  # shared embeddings may be stored once, under the discriminator
            if key.startswith("encoder.embeddings.") and key not in gen:
                gen[key] = value
        _save_one(cfg, disc, out)
        written.append(out)
        if gen:
            gen_hidden = gen["encoder.attention.0.qkv.weight"].shape[1]
            gen_cfg = generator_config(cfg, infer_generator_fraction(cfg, gen_hidden))
            _save_one(gen_cfg, gen, out / "generator")
            written.append(out / "generator")
    else:
        _save_one(cfg, state_dict, out)
        written.append(out)
    if tokenizer_dir is not None:
        copied = 0
        for folder in written:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, folder / name)
                    copied += 1
        if not copied:
            warn0(f"no tokenizer files found in {tokenizer_dir}; the export has weights and config only")
    return written


TIED_COPIES = ("decoder.weight", "decoder.bias", "generator_lm_head.weight")
"""Hugging Face keys that hold a copy of another tensor (the MLM decoder tied to the word embeddings, its bias to the
head's bias): a file may store either copy, so neither one alone has to be in it."""


def _load_reporting(cls_name: str, folder: Path):
    """``cls_name.from_pretrained(folder)`` and transformers' loading report (missing/unexpected/mismatched keys).

    Its log is kept at error level (it would call the heads a folder lacks "newly initialized": we drop those); the
    report itself is what ``_check_body`` reads, so nothing it says is lost."""
    import transformers
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return getattr(transformers, cls_name).from_pretrained(folder, local_files_only=True,
                                                               output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)


def _common_prefix(keys: list[str]) -> str | None:
    """The first dotted component every key shares ("module.", "model."), if any."""
    firsts = {k.split(".", 1)[0] for k in keys if "." in k}
    return f"{firsts.pop()}." if len(firsts) == 1 and all("." in k for k in keys) else None


def _check_body(folder: Path, cls_name: str, table: list, info: dict) -> set[str]:
    """Refuse a folder whose file lacks (or holds in another shape) any tensor of the model's body; returns the
    Hugging Face keys that were not loaded (missing or mismatched), for the caller to decide which heads are held.

    ``from_pretrained`` fills what the file lacks with random values and, at the log level we load with, says
    nothing: a DDP/Lightning state dict saved as is (every key prefixed ``module.``/``model.``), a truncated save
    without its last layer or a file without its word embeddings were imported as the checkpoint's weights, and a
    "continued" run or a fine-tuning score started from random tensors (review of 2026-12-06). Heads are optional
    (a head the file lacks is dropped, and a new one is named by whoever builds the model); tied copies are not
    needed when their original is there."""
    mismatched = {m[0] if isinstance(m, (tuple, list)) else m for m in info.get("mismatched_keys") or []}
    not_loaded = set(info.get("missing_keys") or []) | mismatched
    body = [h for h, ours, _ in table if ours.startswith("encoder.") and not h.endswith(TIED_COPIES)]
    lacking = sorted(dict.fromkeys(h for h in body if h in not_loaded))
    if lacking:
        wrong_shape = [h for h in lacking if h in mismatched]
        unexpected = sorted(info.get("unexpected_keys") or [])
        said = (f"{folder}: its weights do not match its config.json: {len(lacking)} of the {len(set(body))} "
                f"tensors of the model body ({cls_name}) are not in the file"
                f"{f' or have another shape ({len(wrong_shape)}: {wrong_shape[:3]})' if wrong_shape else ''} "
                f"(first: {lacking[:4]}); transformers would fill them with random values, so it is refused")
        prefix = _common_prefix(unexpected)
        if prefix and prefix not in ("cls.", "lm_head.", "predictions.", "sop_classifier.", "qa_outputs.",
                                     "classifier."):
            said += (f". All {len(unexpected)} keys it does not use start with {prefix!r}: a wrapper's state dict "
                     f"(DDP, Lightning, another trainer) saved as is. Save the inner model with save_pretrained, or "
                     f"strip the prefix ({{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}) and save "
                     "the weights again")
        elif unexpected:
            said += f". The file holds {len(unexpected)} keys the config does not use (first: {unexpected[:3]})"
        else:
            said += (". The file is incomplete (a truncated or partial save, or a config.json of another size): "
                     "fetch or save the folder again")
        raise ValueError(said)
    return not_loaded


def _read_weights(folder: Path, cfg: ModelConfig, arch: str) -> tuple[dict, dict[str, HeadSpec], str]:
    """A folder's weights as a transformers state dict, the heads they hold, and the class whose key names it uses.

    BERT, ERNIE and ALBERT are read through ``*ForPreTraining`` whatever class ``architectures`` names: released
    folders (bert-base-uncased, albert-base-v2) name ``*ForMaskedLM`` while their weights keep the pooler and the
    NSP/SOP head, and reading them through the named class would drop the pooler that fine-tuning starts from (as
    ``*ForSequenceClassification.from_pretrained`` keeps it). RoBERTa and ELECTRA have no pooler: they are read
    through the named class. For every family, a body tensor the file lacks is refused (``_check_body``); a head is
    taken when the file holds all of its weights (transformers' own loading report); a pooler without its NSP/SOP
    classifier is taken with a new classifier, said once.
    """
    fam = cfg.family
    seq = SOP if fam == "albert" else NSP
    if fam in ("bert", "ernie", "albert"):
        read_as, candidates = f"{CLASS_STEM[fam]}ForPreTraining", {MLM: HeadSpec("mlm"), seq: HeadSpec("sequence", 2)}
    else:
        read_as, candidates = arch, heads_for_architecture(fam, arch)
    model, info = _load_reporting(read_as, folder)
    table = key_map(cfg, candidates, read_as)
    not_loaded = _check_body(folder, read_as, table, info)

    def held(ours_prefix: str) -> bool:
        keys = {h for h, k, _ in table if k.startswith(ours_prefix) and not h.endswith(TIED_COPIES)}
        return bool(keys) and not keys & not_loaded

    heads = {}
    for name, spec in candidates.items():
        if name == seq and spec.kind == "sequence":
            if held(f"heads.{seq}.pooler"):
                heads[seq] = spec
                if not held(f"heads.{seq}.classifier"):
                    warn0(f"{folder}: the pooler is imported, the {seq.upper()} classifier is not in the folder "
                          "(a new one)")
        elif held(f"heads.{name}."):
            heads[name] = spec
    return model.state_dict(), heads, read_as


def import_hf(folder: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A local Hugging Face folder -> (ModelConfig, our state dict) to continue pretraining from.

    Heads are named MLM / NSP / SOP / RTD (heads.py). An ELECTRA discriminator folder with a ``generator/``
    subfolder gives an ElectraPretrainingModel state dict (``discriminator.*``, ``generator.*``) and a config whose
    generator_fraction matches the generator found.
    """
    import transformers

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder")
    hf_cfg = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    cfg = config_from_hf(hf_cfg)
    arch = (hf_cfg.architectures or [f"{CLASS_STEM[cfg.family]}Model"])[0]
    hf_state, heads, arch = _read_weights(folder, cfg, arch)
    state = from_hf_state_dict(cfg, hf_state, heads, arch)
    if cfg.family == "electra" and (folder / "generator" / "config.json").is_file():
        gen_cfg, gen_state = import_hf(folder / "generator")
        cfg = cfg.replace(generator_fraction=gen_cfg.hidden_size / cfg.hidden_size)
        state = {**{f"discriminator.{k}": v for k, v in state.items()},
                 **{f"generator.{k}": v for k, v in gen_state.items()}}
    return cfg, state
