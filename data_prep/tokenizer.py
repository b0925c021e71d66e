"""The tokenizer folder and the one object everything else tokenizes with: ``load_tokenizer(DIR) -> Tokenizer``.

A folder written by ``data_prep/train_tokenizer.py`` holds (DESIGN.md, "Tokenizer folder"):

- ``tokenizer.json``: the Hugging Face fast tokenizer; every id we ever write comes from it;
- ``spiece.model``: the SentencePiece model, for ``unigram`` only (kept for ALBERT's slow tokenizer and the export);
- ``tokenizer_config.json``, ``special_tokens_map.json``: what ``transformers.AutoTokenizer`` needs offline;
- ``bertfamily_tokenizer.json``: our metadata (kind, lowercase, vocab size, special tokens and their ids, the
  word-start convention).

This module is imported by every ``build_indexed`` worker process, so it imports only ``tokenizers``, ``numpy`` and
the standard library (no torch, no megatron, no transformers).

Corpus text never turns into control tokens: ``encode`` sets the backend's ``encode_special_tokens``, so a literal
"[SEP]" or "<mask>" in a document is tokenized as text instead of becoming a separator or a mask the sampler would
then treat as special. ``transformers.AutoTokenizer`` on the same folder gives the same ids on any text that does not
contain a special token's literal string, and on all text with ``split_special_tokens=True``.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer as _Backend

TOKENIZER_JSON = "tokenizer.json"
SPM_MODEL = "spiece.model"
HF_CONFIG = "tokenizer_config.json"
HF_SPECIAL_MAP = "special_tokens_map.json"
META_FILE = "bertfamily_tokenizer.json"
META_FORMAT = "bertfamily-tokenizer"
META_VERSION = 1

KINDS = ("wordpiece", "bbpe", "unigram", "zh")
ROLES = ("cls", "sep", "mask", "pad", "unk")

# How a token says "I start a word". WordPiece (and zh) mark continuations with "##"; byte-level BPE marks a
# preceding space with "Ġ" (so the first word of a text, which has no space before it, looks like a continuation:
# the sampler treats the token after a special token as a word start); SentencePiece marks word starts with "▁", and
# ALBERT's rule also starts a word at a lone punctuation mark or a piece holding a non-letter (digits, CJK).
_ALBERT_PUNCT = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~\u20ac\u00a3')  # ALBERT's list: no apostrophe
_ALBERT_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz") | _ALBERT_PUNCT


def _sentencepiece_word_start(token: str) -> bool:
    """ALBERT's ``_is_start_piece_sp`` (create_pretraining_data.py): a piece starts a word when it starts with "▁"
    or "<", is a lone punctuation mark, or holds any character that is not an ASCII letter or punctuation (digits,
    CJK, accented letters, the apostrophe, which ALBERT's list lacks: "foreign characters ... always treated as a
    whole piece"). Only pieces of letters and punctuation without "▁" continue a word. The "▁" prefix alone joined digits and punctuation to the word before
    them: 16.6 % of tokens were grouped differently from ALBERT's, words 1.39 pieces long against 1.13 (review of
    2026-12-06, on the ALBERT recipe's unigram tokenizer)."""
    if token.startswith(("\u2581", "<")) or token in _ALBERT_PUNCT:
        return True
    return not all(c.lower() in _ALBERT_WORD_CHARS for c in token)


WORD_START_CONVENTIONS = {
    "##-continuation": lambda token: not token.startswith("##"),
    "Ġ-start": lambda token: token.startswith("\u0120"),
    "▁-start": _sentencepiece_word_start,
}

# The files whose bytes define the id mapping; the fingerprint is over these (metadata and HF configs excluded, so
# retraining on the same data at another path, or editing a model_max_length, does not invalidate shards).
FINGERPRINT_FILES = (TOKENIZER_JSON, SPM_MODEL)


class TokenizerFolderError(ValueError):
    """A folder that is missing, incomplete or not written by train_tokenizer.py."""


def fingerprint_folder(path: str | Path) -> str:
    """sha256 over the names and bytes of the files that define the id mapping (tokenizer.json, spiece.model)."""
    path = Path(path)
    digest = hashlib.sha256()
    for name in FINGERPRINT_FILES:
        file = path / name
        if file.exists():
            digest.update(name.encode() + b"\0")
            digest.update(file.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


class Tokenizer:
    """A trained tokenizer folder: encode/decode through the fast tokenizer plus the ids the trainer needs."""

    def __init__(self, path: Path, backend: _Backend, meta: dict):
        self.path = path
        self.meta = meta
        self.kind: str = meta["kind"]
        self.lowercase: bool = bool(meta["lowercase"])
        self.word_start_convention: str = meta["word_start_convention"]
        self._backend = backend
        # Corpus text is text: "[MASK]" written in a document must not become the mask id (see module docstring).
        self._backend.encode_special_tokens = True
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        specials = meta["special_tokens"]
        self.special_tokens: dict[str, str] = {role: specials[role]["token"] for role in ROLES}
        self.cls_id: int = specials["cls"]["id"]
        self.sep_id: int = specials["sep"]["id"]
        self.mask_id: int = specials["mask"]["id"]
        self.pad_id: int = specials["pad"]["id"]
        self.unk_id: int = specials["unk"]["id"]
        added = {i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
        self.special_ids: list[int] = sorted(added | {self.cls_id, self.sep_id, self.mask_id, self.pad_id, self.unk_id})

    def __setstate__(self, state: dict) -> None:
        # tokenizers pickles the backend as its JSON, which does not carry encode_special_tokens: without this a
        # worker process that receives a pickled Tokenizer would turn "[SEP]" in corpus text into the separator.
        self.__dict__.update(state)
        self._backend.encode_special_tokens = True

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, path={str(self.path)!r})"

    @property
    def backend(self) -> _Backend:
        """The Hugging Face ``tokenizers.Tokenizer`` (with ``encode_special_tokens`` on)."""
        return self._backend

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, no special tokens added."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, through the fast tokenizer's batch path (parallel in Rust unless
        TOKENIZERS_PARALLELISM=false); ``encode_batch_fast`` skips computing offsets we never use."""
        texts = list(texts)
        encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [enc.ids for enc in encode(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(int(token_id))

    @cached_property
    def tokens(self) -> list[str]:
        """Every token, indexed by id (what megatron-core calls ``inv_vocab``)."""
        return [self._backend.id_to_token(i) or "" for i in range(self.vocab_size)]

    @cached_property
    def word_start(self) -> np.ndarray:
        """bool[vocab_size]: True where a token starts a word (special tokens count as starts), so whole-word
        masking is a table lookup. Built once per process: ~50k Python calls, a few tens of ms."""
        starts = WORD_START_CONVENTIONS[self.word_start_convention]
        table = np.fromiter((starts(tok) for tok in self.tokens), dtype=bool, count=self.vocab_size)
        table[self.special_ids] = True
        return table

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint_folder(self.path)


def read_metadata(path: str | Path) -> dict:
    """Our metadata file, checked for the keys the loader relies on; errors name the file and the fix."""
    path = Path(path)
    meta_file = path / META_FILE
    if not path.exists():
        raise TokenizerFolderError(f"tokenizer folder {path} does not exist: train one with "
                                   f"`python data_prep/train_tokenizer.py --kind ... --input ... --output {path}`")
    if not path.is_dir():
        raise TokenizerFolderError(f"{path} is a file, not a tokenizer folder (pass the folder that holds {META_FILE})")
    if not meta_file.exists():
        found = sorted(p.name for p in path.iterdir())[:8]
        hint = (" It looks like a Hugging Face tokenizer folder not written by data_prep/train_tokenizer.py;"
                " retrain with train_tokenizer.py (our metadata records the special-token ids and word-start"
                " convention the trainer needs)." if (path / TOKENIZER_JSON).exists() else "")
        raise TokenizerFolderError(f"{path} is not a bertfamily tokenizer folder: {META_FILE} is missing "
                                   f"(found {found}).{hint}")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokenizerFolderError(f"{meta_file}: not valid JSON ({err}); the folder is damaged, retrain it") from err
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise TokenizerFolderError(f"{meta_file}: 'format' is {meta.get('format') if isinstance(meta, dict) else None!r},"
                                   f" expected {META_FORMAT!r}")
    if meta.get("version") != META_VERSION:
        raise TokenizerFolderError(f"{meta_file}: version {meta.get('version')!r} is not supported by this code "
                                   f"(expected {META_VERSION}); retrain the tokenizer or update bertfamily")
    for key in ("kind", "lowercase", "vocab_size", "special_tokens", "word_start_convention"):
        if key not in meta:
            raise TokenizerFolderError(f"{meta_file}: key {key!r} is missing; retrain the tokenizer")
    if meta["kind"] not in KINDS:
        raise TokenizerFolderError(f"{meta_file}: kind {meta['kind']!r} is not one of {KINDS}")
    if meta["word_start_convention"] not in WORD_START_CONVENTIONS:
        raise TokenizerFolderError(f"{meta_file}: word_start_convention {meta['word_start_convention']!r} is not one "
                                   f"of {sorted(WORD_START_CONVENTIONS)}")
    for role in ROLES:
        entry = meta["special_tokens"].get(role)
        if not isinstance(entry, dict) or "token" not in entry or "id" not in entry:
            raise TokenizerFolderError(f"{meta_file}: special_tokens.{role} must be {{'token': ..., 'id': ...}}")
    return meta


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a folder written by train_tokenizer.py; the ids in our metadata are checked against tokenizer.json."""
    path = Path(path)
    meta = read_metadata(path)
    json_file = path / TOKENIZER_JSON
    if not json_file.exists():
        raise TokenizerFolderError(f"{path}: {TOKENIZER_JSON} is missing; the folder is incomplete, retrain it")
    try:
        backend = _Backend.from_file(str(json_file))
    except Exception as err:  # tokenizers raises a bare Exception on a malformed file
        raise TokenizerFolderError(f"{json_file}: cannot be read by Hugging Face tokenizers ({err})") from err
    for role in ROLES:
        entry = meta["special_tokens"][role]
        actual = backend.token_to_id(entry["token"])
        if actual != entry["id"]:
            raise TokenizerFolderError(f"{path / META_FILE}: special_tokens.{role} says {entry['token']!r} has id "
                                       f"{entry['id']}, but {TOKENIZER_JSON} gives {actual}; the files do not belong "
                                       f"together, retrain the tokenizer")
    return Tokenizer(path, backend, meta)
