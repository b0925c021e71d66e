"""The manifest of a prepared corpus, ``PREFIX.manifest.json``: written and read here only.

It lists the shards in order (prefix relative to the manifest's folder, counts, sha256 of both files), the tokenizer
they were made with (its fingerprint), the inputs and their sizes, bad input skipped by reason, and the settings
that define the output. It holds nothing that varies between runs of the same command (no times, no worker or rank
counts, no host names), so a rerun, a restart after a kill, or a run on another number of workers writes the same
bytes. An input's ``mtime_ns`` is the file's own (what ``build_indexed`` compares, for equality, to decide that the
corpus is up to date), not a time of the run. Shape (DESIGN.md "Shards and manifest"):

    {"format": "bertfamily-indexed", "version": 1, "tool_version": "0.1.0",
     "tokenizer": {"path", "fingerprint", "kind", "vocab_size"}, "dtype": "uint16",
     "shards": [{"prefix": "pydocs_00000", "documents", "sentences", "tokens", "bin_bytes", "bin_sha256",
                 "idx_sha256", "input", "input_range": [start, end or null], "input_documents" (grouped
                 small inputs only: documents per input from "input" on)}],
     "totals": {"shards", "documents", "sentences", "tokens", "bin_bytes", "input_bytes"},
     "inputs": [{"path", "bytes", "mtime_ns"}], "skipped": {"reason": count}, "settings": {...}}

The tokenizer's path is stored relative to the manifest's folder when the tokenizer folder lies inside that folder's
parent (under it, ``"tok"``, or next to it, ``"../tok"``), so a corpus prepared once and copied to shared storage
together with its tokenizer still finds it; elsewhere it is stored absolute. Manifests written before this stored it
absolute, and still read. ``read_manifest`` returns the path resolved (absolute) whichever way it was stored, and
``tokenizer_dir`` also checks the folder is there.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

FORMAT = "bertfamily-indexed"
VERSION = 1
SUFFIX = ".manifest.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizerInfo(_Strict):
    path: str
    """The tokenizer folder: on disk relative to the manifest's folder (see the module docstring) or absolute;
    ``read_manifest`` returns it absolute."""
    fingerprint: str
    kind: str
    vocab_size: int


class SidecarInfo(_Strict):
    """What a shard's ERNIE side-car header (data_prep/sidecar.py) said when ``data_prep/annotate.py`` wrote it: the
    trainer keys its side-car check by these (so a rank reads no ``.spans.json`` at start-up) and compares each
    side-car's header with them when it first opens that shard's spans."""
    annotator: str
    sequences: int
    spans: int
    lengths_sha256: str | None = None


class ShardInfo(_Strict):
    prefix: str
    """Shard path prefix relative to the manifest's folder (``NAME_00000``: the .bin/.idx pair)."""
    documents: int
    sentences: int
    """Sequences in the shard: sentences with --split-sentences, lines otherwise."""
    tokens: int
    bin_bytes: int
    bin_sha256: str
    idx_sha256: str
    input: str
    """The input this shard was made from (with ``input_documents``: the first of them)."""
    input_range: tuple[int, int | None]
    """The piece of that input: byte range (module-index range for builtin:pydocs); end None = to the end."""
    input_documents: list[int] | None = None
    """A shard of small inputs grouped into one piece: its documents per input, in order, from ``input`` on through
    the next inputs of the manifest's ``inputs`` (each read whole; 0: an input with no document, or none in this
    shard), so document d of the shard comes from the input whose running count first passes d. Absent: the shard
    holds documents of ``input`` alone (every shard of a manifest written before grouping)."""
    sidecar: SidecarInfo | None = None
    """The shard's ERNIE side-car as annotated (absent: none recorded; the trainer then reads the headers)."""


class Totals(_Strict):
    shards: int
    documents: int
    sentences: int
    tokens: int
    bin_bytes: int
    input_bytes: int


class InputInfo(_Strict):
    path: str
    bytes: int
    mtime_ns: int | None = None
    """The input's modification time (st_mtime_ns) when the corpus was planned; a rerun rebuilds unless the input
    still has this time and ``bytes``. Absent: a manifest written before it was recorded, or builtin:pydocs."""


class Manifest(_Strict):
    format: Literal["bertfamily-indexed"]
    version: Literal[1]
    tool_version: str
    tokenizer: TokenizerInfo
    dtype: Literal["uint16", "int32"]
    shards: list[ShardInfo]
    totals: Totals
    inputs: list[InputInfo]
    skipped: dict[str, int]
    settings: dict[str, Any]


def manifest_path(prefix: str | os.PathLike) -> Path:
    prefix = str(prefix)
    return Path(prefix if prefix.endswith(SUFFIX) else prefix + SUFFIX)


def shard_name(prefix: str | os.PathLike, index: int) -> str:
    """``PREFIX_00000``: five digits, 100k shards of up to --shard-size-mb each before the names stop sorting."""
    return f"{prefix}_{index:05d}"


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def totals_of(shards: list[dict], input_bytes: int) -> dict:
    return {
        "shards": len(shards),
        "documents": sum(s["documents"] for s in shards),
        "sentences": sum(s["sentences"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "bin_bytes": sum(s["bin_bytes"] for s in shards),
        "input_bytes": input_bytes,
    }


def dumps(manifest: dict) -> str:
    """The exact bytes written: validated, keys in model order, skipped reasons sorted."""
    model = Manifest.model_validate(manifest)
    data = model.model_dump(mode="json")
    data["skipped"] = dict(sorted(data["skipped"].items()))
    for item in data["inputs"]:  # no mtime recorded (builtin:pydocs, older manifests): the key stays out
        if item.get("mtime_ns") is None:
            item.pop("mtime_ns", None)
    for shard in data["shards"]:  # an unannotated corpus's manifest stays as it was, and one of large inputs
        for key in ("sidecar", "input_documents"):
            if shard.get(key) is None:
                shard.pop(key, None)
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def _portable_tokenizer_path(folder: Path, tokenizer: str) -> str:
    """The path to store: relative to ``folder`` (the manifest's) when ``tokenizer`` is under it or under its parent
    (unless that parent is the filesystem root), else absolute. ``tokenizer`` may be relative to the working
    directory. Lexical (no symlinks resolved), as ``_resolve_tokenizer_path`` is. E.g. folder /data/corpus:
    /data/corpus/tok -> "tok", /data/tok -> "../tok", /data/toks/wp -> "../toks/wp", /home/me/tok -> "/home/me/tok"."""
    folder = os.path.abspath(folder)
    tokenizer = os.path.abspath(tokenizer)
    parent = os.path.dirname(folder)
    near = os.path.commonpath([folder, tokenizer]) == folder or (
        parent != os.path.dirname(parent) and os.path.commonpath([parent, tokenizer]) == parent)
    return Path(os.path.relpath(tokenizer, folder)).as_posix() if near else tokenizer


def _resolve_tokenizer_path(folder: Path, stored: str) -> Path:
    """The absolute tokenizer folder for a stored path: absolute as is, relative against the manifest's folder."""
    if os.path.isabs(stored):
        return Path(stored)
    return Path(os.path.normpath(os.path.join(os.path.abspath(folder), stored)))


IDX_HEADER_BYTES = 34  # megatron-core's .idx header: magic 9, version 8, dtype code 1, two counts 8 + 8


def idx_bytes(sentences: int, documents: int) -> int:
    """The size of a shard's ``.idx`` holding ``sentences`` sequences in ``documents`` documents (megatron-core's
    layout: the header, int32 lengths, int64 pointers, int64 document indices with a leading 0)."""
    return IDX_HEADER_BYTES + 12 * sentences + 8 * (documents + 1)


def write_manifest(prefix: str | os.PathLike, manifest: dict) -> Path:
    """Validate and write atomically (temporary name, fsync, rename): a reader never sees half a manifest.

    ``manifest["tokenizer"]["path"]`` is given absolute or relative to the working directory (a read manifest's
    resolved path does); it is stored relative to the manifest's folder where that makes the corpus portable."""
    path = manifest_path(prefix)
    tokenizer = manifest.get("tokenizer")
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("path"), str) and tokenizer["path"]:
        manifest = {**manifest, "tokenizer": {**tokenizer,
                                              "path": _portable_tokenizer_path(path.parent, tokenizer["path"])}}
    text = dumps(manifest)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_manifest(prefix: str | os.PathLike) -> dict:
    """The manifest of ``PREFIX`` (or of the ``PREFIX.manifest.json`` path) as a dict, validated, with
    ``["tokenizer"]["path"]`` resolved to an absolute path (not checked: see ``tokenizer_dir``)."""
    path = manifest_path(prefix)
    data = _read_stored(path)
    if data["tokenizer"]["path"]:  # "" (no folder recorded: hand-made test corpora) stays ""
        data["tokenizer"]["path"] = str(_resolve_tokenizer_path(path.parent, data["tokenizer"]["path"]))
    return data


def tokenizer_dir(prefix: str | os.PathLike) -> Path:
    """The absolute tokenizer folder the corpus ``PREFIX`` was made with; FileNotFoundError naming the manifest and
    the path when the folder is not there (a corpus copied without its tokenizer, or the tokenizer moved)."""
    path = manifest_path(prefix)
    stored = _read_stored(path)["tokenizer"]["path"]
    if not stored:
        raise FileNotFoundError(f"{path}: records no tokenizer folder; rebuild the corpus with build_indexed.py "
                                "--tokenizer DIR")
    folder = _resolve_tokenizer_path(path.parent, stored)
    if not folder.is_dir():
        how = (f"stored as {stored!r}, relative to the manifest's folder" if not os.path.isabs(stored)
               else "stored absolute")
        raise FileNotFoundError(
            f"{path}: the tokenizer folder {folder} ({how}) does not exist; copy the tokenizer folder along with the "
            f"corpus so it sits at that place again, or rebuild the corpus with build_indexed.py --tokenizer DIR")
    return folder


def _read_stored(path: Path) -> dict:
    """The manifest at ``path`` validated, exactly as stored."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no manifest; prepare the corpus with data_prep/build_indexed.py --output-prefix "
            f"{str(path)[: -len(SUFFIX)]} (an unfinished run leaves no manifest: rerun it to finish)"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); rebuild the corpus") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a bertfamily-indexed manifest (format {data.get('format')!r})")
    try:
        model = Manifest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{path}: key {key!r}: {first['msg']} ({len(err.errors())} problem(s)); rebuild the corpus "
                         f"with this version of build_indexed.py") from err
    data = model.model_dump(mode="json")
    for item in data["inputs"]:  # as stored: no key where no mtime was recorded
        if item.get("mtime_ns") is None:
            item.pop("mtime_ns", None)
    return data
