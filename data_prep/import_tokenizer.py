"""A released Hugging Face tokenizer as our tokenizer folder, and the comparison of two tokenizers' vocabularies.

``python data_prep/train_tokenizer.py --from-pretrained HF_FOLDER --output DIR`` calls ``import_pretrained``: the
common case of continued pretraining is bert-base-uncased or roberta-large on one's own text, whose corpus must be
tokenized with the released vocabulary; ``read_metadata`` refuses any folder without our metadata, and training a
new tokenizer of the same size scrambles every embedding row. The folder is read as the hub ships it (vocab.txt for
BERT, vocab.json + merges.txt for RoBERTa, spiece.model for ALBERT, with or without tokenizer.json, next to the
model's config.json) by ``transformers.AutoTokenizer`` (fast), whose ``tokenizer.json`` is saved with our metadata:
the kind from the tokenizer's model (WordPiece, byte-level BPE, Unigram), lowercasing from its normalizer, the special
tokens and their ids from its config. What cannot be inferred is refused, naming what is missing.

``vocabulary_difference`` compares two tokenizer folders token by token (``checkpoint.init_from`` uses it on the
source folder's tokenizer files and the run's corpus tokenizer).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from data_prep.tokenizer import (HF_SPECIAL_MAP, META_FILE, META_FORMAT, META_VERSION, ROLES, SPM_MODEL,
                                 TOKENIZER_JSON, load_tokenizer)

# Files whose presence says a folder carries a tokenizer (one of the layouts transformers reads).
SOURCE_FILES = (TOKENIZER_JSON, "vocab.txt", "vocab.json", SPM_MODEL, "sentencepiece.bpe.model")
# the tokenizer's model type -> (our kind, word-start convention, the class our metadata names)
_KINDS = {"WordPiece": ("wordpiece", "##-continuation", "BertTokenizerFast"),
          "BPE": ("bbpe", "Ġ-start", "RobertaTokenizerFast"),
          "Unigram": ("unigram", "▁-start", "AlbertTokenizerFast")}


class TokenizerImportError(ValueError):
    """A Hugging Face tokenizer folder that cannot be turned into ours; the message says what is missing."""


def has_tokenizer(folder: str | Path) -> bool:
    return any((Path(folder) / name).is_file() for name in SOURCE_FILES)


def _auto(folder: Path):
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), use_fast=True, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TokenizerImportError(f"{folder}: transformers.AutoTokenizer cannot read a tokenizer here ({type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}); a released folder needs its config.json "
                           "or tokenizer_config.json beside vocab.txt / vocab.json + merges.txt / spiece.model") from None
    if not getattr(tok, "is_fast", False) or getattr(tok, "backend_tokenizer", None) is None:
        raise TokenizerImportError(f"{folder}: transformers gives no fast tokenizer (tokenizer.json) for it")
    return tok


def _walk(node):
    """Every dict in a tokenizer.json component tree (Sequence normalizers nest them)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def infer_metadata(folder: Path, tok) -> dict:
    """Our metadata for transformers tokenizer ``tok`` read from ``folder``; refuses what it cannot infer."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    model_type = spec["model"]["type"]
    if model_type not in _KINDS:
        raise TokenizerImportError(f"{folder}: a {model_type} tokenizer; supported are WordPiece (BERT, ERNIE), byte-level "
                           "BPE (RoBERTa) and Unigram (ALBERT)")
    kind, convention, hf_class = _KINDS[model_type]
    pre = [n.get("type") for n in _walk(spec.get("pre_tokenizer"))]
    if kind == "bbpe" and "ByteLevel" not in pre:
        raise TokenizerImportError(f"{folder}: a BPE tokenizer without byte-level pre-tokenization ({pre}): not RoBERTa's "
                           "byte-level BPE, whose word starts ('Ġ') our masking relies on")
    normalizers = list(_walk(spec.get("normalizer")))
    lowercase = any(n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer" and n.get("lowercase"))
                    for n in normalizers)
    said = tok.init_kwargs.get("do_lower_case")
    if said is not None and bool(said) != lowercase:
        raise TokenizerImportError(f"{folder}: its config says do_lower_case={said} but the tokenizer's normalizer "
                           f"{'lowercases' if lowercase else 'keeps case'}; fix tokenizer_config.json")
    specials, lacking = {}, []
    for role in ROLES:
        token = getattr(tok, f"{role}_token", None)
        token_id = tok.convert_tokens_to_ids(token) if token is not None else None
        if token is None or token_id is None or (role != "unk" and token_id == tok.unk_token_id):
            lacking.append(role)
        else:
            specials[role] = {"token": str(token), "id": int(token_id)}
    if lacking:
        raise TokenizerImportError(f"{folder}: the tokenizer names no {'/'.join(lacking)} token in its vocabulary (BERT-family "
                           "pretraining needs cls, sep, mask, pad and unk); add them to tokenizer_config.json")
    size = tok.backend_tokenizer.get_vocab_size(with_added_tokens=True)
    return {"format": META_FORMAT, "version": META_VERSION, "kind": kind, "lowercase": lowercase,
            "vocab_size": size, "requested_vocab_size": size, "hf_tokenizer_class": hf_class,
            "word_start_convention": convention, "special_tokens": specials,
            "training": {"imported_from": str(Path(folder).resolve()), "hf_tokenizer_class": type(tok).__name__}}


PROBE = ("The quick brown fox jumps over the lazy dog's back, 1,234 times!  Naïve café — “quoted” text.\n"
         "Tabs\tand UPPER case; e-mail: a.b@example.com")


def import_pretrained(src: str | Path, out: str | Path) -> dict:
    """Write our tokenizer folder at ``out`` from the Hugging Face tokenizer in ``src``; returns our metadata.

    The ids come from the saved tokenizer.json, checked after writing: the folder must load, and encode a probe text
    to the same ids as ``AutoTokenizer`` on ``src``."""
    src, out = Path(src), Path(out)
    if not src.is_dir() or not has_tokenizer(src):
        raise TokenizerImportError(f"{src}: no tokenizer files ({', '.join(SOURCE_FILES)})")
    tok = _auto(src)
    meta = infer_metadata(src, tok)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)  # written last: a folder without it is recognisably unfinished
    tok.save_pretrained(str(out))
    if (src / SPM_MODEL).is_file() and not (out / SPM_MODEL).is_file():
        shutil.copy2(src / SPM_MODEL, out / SPM_MODEL)
    if not (out / TOKENIZER_JSON).is_file():
        tok.backend_tokenizer.save(str(out / TOKENIZER_JSON))
    special_map = {f"{role}_token": meta["special_tokens"][role]["token"] for role in ROLES}
    (out / HF_SPECIAL_MAP).write_text(json.dumps(special_map, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    ours = load_tokenizer(out)
    theirs = tok(PROBE, add_special_tokens=False)["input_ids"]
    if ours.encode(PROBE) != theirs:
        (out / META_FILE).unlink()
        raise TokenizerImportError(f"{out}: the imported tokenizer encodes a probe text differently from AutoTokenizer on "
                           f"{src} ({ours.encode(PROBE)[:12]} vs {theirs[:12]}); not imported")
    return meta


def read_vocabulary(folder: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(token -> id, role -> id) of a tokenizer folder: ours (load_tokenizer) or any transformers reads."""
    if (folder / META_FILE).is_file():
        tok = load_tokenizer(folder)
        return tok.backend.get_vocab(with_added_tokens=True), {r: getattr(tok, f"{r}_id") for r in ROLES}
    tok = _auto(folder)
    roles = {r: tok.convert_tokens_to_ids(getattr(tok, f"{r}_token")) for r in ROLES
             if getattr(tok, f"{r}_token", None) is not None}
    return tok.backend_tokenizer.get_vocab(with_added_tokens=True), roles


def vocabulary_difference(source: Path, corpus: Path) -> str | None:
    """None when the two folders map every token to the same id and give the special roles the same ids; else what
    differs first (the first tokens by id, the roles), for an error message."""
    vocab_a, roles_a = read_vocabulary(source)
    vocab_b, roles_b = read_vocabulary(corpus)
    differing = sorted({(i, t) for t, i in vocab_a.items() if vocab_b.get(t) != i}
                       | {(i, t) for t, i in vocab_b.items() if vocab_a.get(t) != i})
    roles = [f"{r} {roles_a.get(r)} there, {roles_b[r]} here" for r in ROLES if roles_a.get(r) != roles_b.get(r)]
    if not differing and not roles:
        return None
    first = ", ".join(f"id {i} {t!r} (there {vocab_a.get(t)}, here {vocab_b.get(t)})" for i, t in differing[:4])
    said = [f"{len({t for _, t in differing})} tokens have another id or are missing (first: {first})"] \
        if differing else []
    return "; ".join(said + ([f"special ids differ ({'; '.join(roles)})"] if roles else []))
