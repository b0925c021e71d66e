"""Reading corpus inputs: files, directories, globs and ``builtin:pydocs``, as a stream of documents.

Layouts
  ``.txt``    one sentence or paragraph per line, a blank line between documents (BERT's original data layout).
  ``.jsonl``  one JSON object per line, the document's text under ``json_key`` (``.json`` and ``.ndjson`` too);
              the text's own newlines separate its lines.
  Either may be compressed: ``.gz``, ``.bz2``, ``.zst``/``.zstd`` (decompressed as a stream, never whole).
  ``builtin:pydocs``  the docstrings of the installed Python standard library, one module per document, one
              paragraph per line; read with ``ast`` (never imported: some modules act on import).

Bad input: what is skipped and counted, what stops the run. Every skip is counted in ``skipped`` (a Counter by
reason, which build_indexed puts in its summary and manifest) and reported through ``on_skip(reason, where)`` with
the file and line (or byte offset), so nothing disappears silently.

  =========================  ===========================================================================
  reason                     what happens
  =========================  ===========================================================================
  invalid_utf8               the line is dropped (its document keeps its other lines)
  nul_bytes                  the line is dropped (NUL bytes mean binary or UTF-16 data, not text)
  line_too_long              a line over ``max_line_bytes`` (default 16 MiB) is dropped; it is read in 1 MiB
                             pieces, never held whole, so a 50 MB line costs no memory
  empty_document             a document with no text (jsonl ``""``, only whitespace, a module with no docstring)
  long_document_split        a .txt document over ``max_document_bytes`` (64 MiB) is cut into several documents
                             so memory stays bounded; the text is kept
  invalid_json               the jsonl line is dropped
  missing_json_key           the jsonl object has no ``json_key`` (or is not an object): dropped
  json_value_not_string      ``json_key`` holds a number, list, ...: dropped
  truncated_input            a compressed stream ends early or is corrupt: documents before that point are
                             kept, the document being read is dropped, the rest of the file is lost; the
                             message names the file and the uncompressed byte offset
  unsupported_file           a file inside a directory input whose name is not .txt/.jsonl[.gz|.bz2|.zst]
  pydocs_unparsable          a standard-library file that ``ast`` cannot parse
  =========================  ===========================================================================

  Stops the run (``InputError``, naming the file): an input spec that matches nothing, an explicitly named file
  of an unsupported type, a file that cannot be opened (permissions, vanished) or an I/O error reading a plain
  file. A corpus with a missing part is a configuration error, better found before hours of work than after.

Pieces: an uncompressed file can be read as byte ranges (``piece_bounds`` + ``iter_documents(start=, end=)``) so
that one large file spreads over many workers. A range ``[start, end)`` owns the documents whose first byte lies
in ``cut(start) .. cut(end)``, where ``cut(c)`` is the position just after the first blank line at or after ``c``
(.txt) or the first line start at or after ``c`` (.jsonl). Every reader computes the same cuts, so every document
is read exactly once and the documents are the same as a whole-file read. Compressed files are one piece each (a
compressed stream cannot be entered in the middle).
"""
from __future__ import annotations

import ast
import bz2
import functools
import glob
import gzip
import io
import json
import os
import sysconfig
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

PYDOCS = "builtin:pydocs"
COMPRESSIONS = (".gz", ".bz2", ".zst", ".zstd")
TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
MAX_LINE_BYTES = 16 << 20
MAX_DOCUMENT_BYTES = 64 << 20
_SKIP_CHUNK = 1 << 20

SkipHook = Callable[[str, str], None]


class InputError(ValueError):
    """An input problem that stops the run; the message names the file and says what to do."""


@dataclass(slots=True)
class Document:
    lines: list[str]
    """Non-empty, stripped lines: sentences or paragraphs."""
    source: str
    """The input file (or ``builtin:pydocs:<module path>``)."""
    line: int
    """1-based line where the document starts; 0 when reading began mid-file and the line number is unknown."""
    offset: int = 0
    """Byte offset of the document's first line in the (uncompressed) input."""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line else f"{self.source} at byte {self.offset}"


# ---------------------------------------------------------------------------------------------------- inputs


def input_format(path: str) -> str:
    """``txt``, ``jsonl`` or ``pydocs`` from the name; InputError for anything else."""
    if path == PYDOCS:
        return "pydocs"
    name = path.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    if name.endswith(TEXT_SUFFIXES):
        return "txt"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    raise InputError(
        f"{path}: unsupported input type; name text files *.txt and JSON-lines files *.jsonl "
        f"(optionally compressed: {', '.join(COMPRESSIONS)})"
    )


def _supported(path: str) -> bool:
    try:
        input_format(path)
        return True
    except InputError:
        return False


def expand_inputs(specs: list[str], skipped: Counter | None = None, on_skip: SkipHook | None = None) -> list[str]:
    """Files, directories (recursively, sorted, hidden entries skipped) and globs -> a list of files, in order.

    Duplicates are kept once (first occurrence). A spec that matches nothing raises InputError naming it. Files
    inside a directory that are not .txt/.jsonl are counted as ``unsupported_file``; an explicitly named one is an
    error.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        if path not in seen:
            seen.add(path)
            out.append(path)

    def add_dir(root: str) -> None:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = os.path.join(dirpath, name)
                if _supported(path):
                    add(path)
                else:
                    if skipped is not None:
                        skipped["unsupported_file"] += 1
                    if on_skip is not None:
                        on_skip("unsupported_file", path)

    for spec in specs:
        if spec == PYDOCS:
            add(PYDOCS)
            continue
        if any(ch in spec for ch in "*?["):
            matches = sorted(glob.glob(spec, recursive=True))
        elif os.path.exists(spec):
            matches = [spec]
        else:
            matches = []
        if not matches:
            raise InputError(f"input {spec!r} matches no file or directory; check the path (and quote globs)")
        for path in matches:
            if os.path.isdir(path):
                before = len(out)
                add_dir(path)
                if len(out) == before and spec == path:
                    raise InputError(f"input directory {spec!r} holds no .txt or .jsonl files")
            else:
                input_format(path)
                add(path)
    return out


def input_bytes(path: str) -> int:
    """Size on disk (for pydocs: the bytes of the standard-library sources it reads)."""
    if path == PYDOCS:
        return sum(size for _, _, size in _pydocs_files())
    try:
        return os.path.getsize(path)
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror}); fix permissions or remove it from --input") from err


def piece_size(path: str, start: int, end: int | None) -> int:
    """Input bytes of a piece from ``piece_bounds`` (for pydocs: the source bytes of its modules)."""
    if path == PYDOCS:
        return sum(size for _, _, size in _pydocs_files()[start:end])
    if not is_splittable(path):
        return input_bytes(path)
    return (input_bytes(path) if end is None else end) - start


def check_readable(path: str) -> None:
    """Open and read one byte, so that an unreadable input stops the run before any work starts."""
    if path == PYDOCS:
        return
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror}); fix permissions or remove it from --input") from err


# ---------------------------------------------------------------------------------------------------- streams


class _ZstdReader(io.RawIOBase):
    """zstandard's stream_reader reports a truncated stream as a clean EOF; this one raises EOFError instead."""

    def __init__(self, fh: BinaryIO):
        import zstandard

        self._fh = fh
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._dobj = self._new()
        self._buf = b""
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            chunk = self._fh.read(1 << 16)
            if not chunk:
                if self._started and not self._dobj.eof:
                    raise EOFError("zstd stream ended before the end of its frame")
                return 0
            self._started = True
            if self._dobj.eof:  # a new frame follows the previous one
                self._dobj = self._new()
            self._buf = self._dobj.decompress(chunk)
            while self._dobj.eof and self._dobj.unused_data:
                rest = self._dobj.unused_data
                self._dobj = self._new()
                self._buf += self._dobj.decompress(rest)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


def open_binary(path: str) -> BinaryIO:
    """The decompressed byte stream of ``path``; InputError when it cannot be opened."""
    try:
        name = path.lower()
        if name.endswith(".gz"):
            return gzip.open(path, "rb")
        if name.endswith(".bz2"):
            return bz2.open(path, "rb")
        if name.endswith((".zst", ".zstd")):
            return io.BufferedReader(_ZstdReader(open(path, "rb")), buffer_size=1 << 20)
        return open(path, "rb", buffering=1 << 20)
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror}); fix permissions or remove it from --input") from err


# Errors a corrupt or cut-off compressed stream raises while being read (gzip: EOFError, BadGzipFile (an
# OSError), zlib.error; bz2: EOFError, OSError; zstd: EOFError from _ZstdReader, ZstdError).
def _stream_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [EOFError, zlib.error, gzip.BadGzipFile]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def is_splittable(path: str) -> bool:
    """Whether ``path`` can be read in byte ranges (uncompressed files and pydocs' module list)."""
    return path == PYDOCS or not path.lower().endswith(COMPRESSIONS)


def _read_line(fh: BinaryIO, limit: int) -> tuple[bytes | None, int]:
    """One line of at most ``limit`` bytes -> (line, bytes consumed); (None, n) for a longer line (skipped in 1 MiB
    reads so it is never held whole); (b"", 0) at the end."""
    raw = fh.readline(limit + 1)
    if len(raw) <= limit or raw.endswith(b"\n"):
        return raw, len(raw)
    consumed = len(raw)
    while True:
        more = fh.readline(_SKIP_CHUNK)
        consumed += len(more)
        if not more or more.endswith(b"\n"):
            return None, consumed


def _cut(fh: BinaryIO, c: int, size: int, fmt: str, limit: int) -> int:
    """The piece boundary at or after byte ``c`` (see the module docstring)."""
    if c <= 0:
        return 0
    if c >= size:
        return size
    fh.seek(c - 1)
    pos = c
    if fh.read(1) != b"\n":
        raw, n = _read_line(fh, limit)
        pos += n
    if fmt == "jsonl":
        return min(pos, size)
    while pos < size:
        raw, n = _read_line(fh, limit)
        if n == 0:
            break
        pos += n
        if raw is not None and not raw.strip():
            return pos
    return size


def piece_bounds(path: str, chunk_bytes: int, max_line_bytes: int = MAX_LINE_BYTES) -> list[tuple[int, int]]:
    """Split ``path`` into ~``chunk_bytes`` pieces cut at document boundaries -> [(start, end)], end None = EOF.

    Compressed files are one piece. For pydocs the bounds are module indices, cut by source bytes.
    """
    if path == PYDOCS:
        files = _pydocs_files()
        bounds, start, acc = [], 0, 0
        for i, (_, _, size) in enumerate(files):
            acc += size
            if acc >= chunk_bytes and i + 1 < len(files):
                bounds.append((start, i + 1))
                start, acc = i + 1, 0
        bounds.append((start, None))
        return bounds
    if not is_splittable(path):
        return [(0, None)]
    size = input_bytes(path)
    fmt = input_format(path)
    cuts = [0]
    with open_binary(path) as fh:
        c = chunk_bytes
        while c < size:
            cut = _cut(fh, c, size, fmt, max_line_bytes)
            if cut >= size:
                break
            if cut > cuts[-1]:
                cuts.append(cut)
            c = max(cut, c) + chunk_bytes
    return [(a, b) for a, b in zip(cuts, cuts[1:])] + [(cuts[-1], None)]


# ---------------------------------------------------------------------------------------------------- documents


@dataclass
class _Skips:
    skipped: Counter | None
    on_skip: SkipHook | None

    def __call__(self, reason: str, where: str) -> None:
        if self.skipped is not None:
            self.skipped[reason] += 1
        if self.on_skip is not None:
            self.on_skip(reason, where)


def iter_documents(
    path: str,
    json_key: str = "text",
    skipped: Counter | None = None,
    *,
    start: int = 0,
    end: int | None = None,
    on_skip: SkipHook | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
) -> Iterator[Document]:
    """The documents of one input (or of its piece ``[start, end)`` from ``piece_bounds``), in file order.

    Bad input is handled as the module docstring's table says: counted in ``skipped`` by reason, reported to
    ``on_skip(reason, where)``, or raised as InputError.
    """
    skip = _Skips(skipped, on_skip)
    fmt = input_format(path)
    if fmt == "pydocs":
        yield from _iter_pydocs(skip, start, end)
        return
    if start and not is_splittable(path):
        raise InputError(f"{path}: a compressed input cannot be read from byte {start}")
    with open_binary(path) as fh:
        if start:
            fh.seek(start)
        lines = _iter_lines(fh, path, start, end, max_line_bytes, skip)
        if fmt == "txt":
            yield from _txt_documents(lines, path, start, max_document_bytes, skip)
        else:
            yield from _jsonl_documents(lines, path, json_key, skip)


def _iter_lines(fh, path, start, end, limit, skip) -> Iterator[tuple[int, int, str | None]]:
    """(byte offset, line number or 0, decoded line) for each line; None marks a dropped line (already counted)."""
    pos, lineno = start, (1 if start == 0 else 0)
    stream_errors = _stream_errors()
    while end is None or pos < end:
        try:
            raw, n = _read_line(fh, limit)
        except stream_errors as err:
            skip("truncated_input", f"{path}: corrupt or truncated after uncompressed byte {pos} ({err})")
            yield pos, lineno, _TRUNCATED
            return
        except OSError as err:
            raise InputError(f"{path}: read error at byte {pos} ({err}); check the file and rerun") from err
        if n == 0:
            return
        where = f"{path}:{lineno}" if lineno else f"{path} at byte {pos}"
        if raw is None:
            skip("line_too_long", f"{where}: line of {n} bytes over the {limit}-byte limit")
            text = None
        elif b"\x00" in raw:
            skip("nul_bytes", f"{where}: NUL bytes (binary or UTF-16 data?)")
            text = None
        else:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                skip("invalid_utf8", f"{where}: invalid UTF-8 at column byte {err.start}")
                text = None
            else:
                if pos == 0 and text.startswith("\ufeff"):
                    text = text[1:]
        yield pos, lineno, text
        pos += n
        if lineno:
            lineno += 1


_TRUNCATED = "\x00truncated"  # sentinel: a decoded line can never hold NUL (such lines are dropped)


def _txt_documents(lines, path, start, max_document_bytes, skip) -> Iterator[Document]:
    doc: list[str] = []
    doc_line, doc_offset, doc_bytes = 0, start, 0
    for offset, lineno, text in lines:
        if text is _TRUNCATED:
            return  # the document being read is dropped; counted as truncated_input
        if text is None:
            continue
        text = text.strip()
        if not text:
            if doc:
                yield Document(doc, path, doc_line, doc_offset)
                doc, doc_bytes = [], 0
            continue
        if not doc:
            doc_line, doc_offset = lineno, offset
        elif doc_bytes + len(text) > max_document_bytes:
            skip("long_document_split", f"{path}:{doc_line or doc_offset}: document over {max_document_bytes} bytes")
            yield Document(doc, path, doc_line, doc_offset)
            doc, doc_bytes, doc_line, doc_offset = [], 0, lineno, offset
        doc.append(text)
        doc_bytes += len(text)
    if doc:
        yield Document(doc, path, doc_line, doc_offset)


def _jsonl_documents(lines, path, json_key, skip) -> Iterator[Document]:
    for offset, lineno, text in lines:
        if text is _TRUNCATED:
            return
        if text is None or not text.strip():
            continue  # dropped lines are counted already; blank lines between objects are layout
        where = f"{path}:{lineno}" if lineno else f"{path} at byte {offset}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            skip("invalid_json", f"{where}: invalid JSON ({err.msg} at column {err.colno})")
            continue
        if not isinstance(obj, dict) or json_key not in obj:
            skip("missing_json_key", f"{where}: no key {json_key!r} (use --json-key)")
            continue
        value = obj[json_key]
        if not isinstance(value, str):
            skip("json_value_not_string", f"{where}: {json_key!r} holds {type(value).__name__}, not text")
            continue
        doc = [s for s in (part.strip() for part in value.split("\n")) if s]
        if not doc:
            skip("empty_document", f"{where}: empty text")
            continue
        yield Document(doc, path, lineno, offset)


# ---------------------------------------------------------------------------------------------------- pydocs

_PYDOCS_EXCLUDE = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@functools.lru_cache(maxsize=1)
def _pydocs_files() -> list[tuple[str, Path, int]]:
    """(relative path, path, size) of the standard library's .py files, sorted; test suites left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if _PYDOCS_EXCLUDE.intersection(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            found.append((rel.as_posix(), path, path.stat().st_size))
        except OSError:
            continue
    found.sort()
    return found


def _docstring_paragraphs(tree: ast.AST) -> list[str]:
    """Every module/class/function docstring in source order, one paragraph (whitespace-joined) per line."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                for para in doc.split("\n\n"):
                    line = " ".join(para.split())
                    if line:
                        out.append(line)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child)

    visit(tree)
    return out


def _iter_pydocs(skip: _Skips, start: int, end: int | None) -> Iterator[Document]:
    files = _pydocs_files()
    for index in range(start, len(files) if end is None else min(end, len(files))):
        rel, path, _ = files[index]
        source = f"{PYDOCS}:{rel}"
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError) as err:
            skip("pydocs_unparsable", f"{source}: {err}")
            continue
        lines = _docstring_paragraphs(tree)
        if not lines:
            skip("empty_document", f"{source}: no docstrings")
            continue
        yield Document(lines, source, 1, index)
