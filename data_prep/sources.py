"""Reading corpus inputs: files, directories, globs and ``builtin:pydocs``, as a stream of documents.

Layouts
  ``.txt``    one sentence or paragraph per line, a blank line between documents (BERT's original data layout).
  ``.jsonl``  one JSON object per line, the document's text under ``json_key`` (``.json`` and ``.ndjson`` too);
              the text's own newlines separate its lines.
  WikiExtractor  ``AA/wiki_00`` ... (no extension; or any file whose first line is a ``<doc `` tag, ``.txt``
              included): one document per ``<doc ...>`` ... ``</doc>`` block, tags dropped (``_wiki_documents``).
  Either may be compressed: ``.gz``, ``.bz2``, ``.zst``/``.zstd`` (decompressed as a stream, never whole).
  ``builtin:pydocs``  the docstrings of the installed Python standard library, one module per document, one
              paragraph per line; read with ``ast`` (never imported: some modules act on import).

Bad input: what is skipped and counted, what stops the run. Every skip is counted in ``skipped`` (a Counter by
reason, which build_indexed puts in its summary and manifest) and reported through ``on_skip(reason, where)`` with
the file and line (or byte offset), so nothing disappears silently.

  =========================  ===========================================================================
  reason                     what happens
  =========================  ===========================================================================
  invalid_utf8               the line is dropped (its document keeps its other lines); over 1 % of a file's (or
                             piece's) lines, at least 10, stops the run instead (InputError naming the file and
                             ``iconv -f GB18030 -t UTF-8``): the file is in another encoding, not noisy
  nul_bytes                  the line is dropped (NUL bytes mean binary or UTF-16 data, not text)
  line_too_long              a line over ``max_line_bytes`` (default 16 MiB) is dropped; it is read in 1 MiB
                             pieces, never held whole, so a 50 MB line costs no memory
  empty_document             a document with no text (jsonl ``""``, only whitespace, a module with no docstring)
  long_document_split        a .txt document over ``max_document_bytes`` (64 MiB) is cut into several documents
                             so memory stays bounded; the text is kept
  invalid_json               the jsonl line is dropped
  missing_json_key           the jsonl object has no ``json_key`` (or is not an object): dropped
  json_value_not_string      ``json_key`` holds a number, list, ...: dropped
  lone_surrogate             the jsonl text holds an unpaired UTF-16 surrogate escape (``"\\ud83d"`` alone,
                             common in crawled text cut mid-emoji): not text any tokenizer can take, dropped
  truncated_input            a compressed stream ends early or is corrupt: documents before that point are
                             kept, the document being read is dropped, the rest of the file is lost; the
                             message names the file and the uncompressed byte offset
  not_json_lines             a .json/.jsonl line holding a JSON array (not one object per line): dropped; a
                             pretty-printed file (first line ``[`` or ``{``): the file is not read, counted once
  text_outside_doc           WikiExtractor input: a line outside any ``<doc>`` ... ``</doc>`` block, dropped
  unsupported_file           a file inside a directory input whose name is not .txt/.jsonl[.gz|.bz2|.zst] and
                             that is not WikiExtractor output (reported in one line per folder, with a count)
  pydocs_unparsable          a standard-library file that ``ast`` cannot parse
  =========================  ===========================================================================

  Stops the run (``InputError``, naming the file): an input spec that matches nothing, an explicitly named file
  of an unsupported type, a file in another encoding (see invalid_utf8), a file whose lines end in CR alone
  (classic Mac OS: ``_check_line_ends``), a file that cannot be opened (permissions, vanished) or an I/O error
  reading a plain file. A corpus with a missing part is a configuration error, better found before hours of work
  than after.

Where the inputs come from (files, directories, globs, decompression) and how one file is cut into byte-range
pieces (``piece_bounds`` + ``iter_documents(start=, end=)``) is data_prep/input_files.py; every public name there is
importable from here too, so ``sources`` stays the one module callers read inputs through.
"""
from __future__ import annotations

import ast
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

# Re-exported: callers (build_indexed, prep_work, train_tokenizer, tests) use sources.X for all of these.
from data_prep.input_files import (  # noqa: F401
    COMPRESSIONS,
    JSONL_SUFFIXES,
    MAX_DOCUMENT_BYTES,
    MAX_LINE_BYTES,
    PYDOCS,
    TEXT_SUFFIXES,
    InputError,
    SkipHook,
    _pydocs_files,
    _read_line,
    _stream_errors,
    check_readable,
    expand_inputs,
    input_bytes,
    input_format,
    is_splittable,
    open_binary,
    piece_bounds,
    piece_size,
)


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
    if start == 0:
        _check_line_ends(path)
    with open_binary(path) as fh:
        if start:
            fh.seek(start)
        lines = _iter_lines(fh, path, start, end, max_line_bytes, skip)
        if fmt == "txt":
            yield from _txt_documents(lines, path, start, max_document_bytes, skip)
        elif fmt == "wiki":
            yield from _wiki_documents(lines, path, max_document_bytes, skip)
        else:
            yield from _jsonl_documents(lines, path, json_key, skip)


def _check_line_ends(path: str) -> None:
    """A classic Mac OS file (lines ended by CR alone) would be one line: its documents merged into one, or the whole
    file dropped as line_too_long. Its first 64 KiB hold CRs and no LF: stop, naming the conversion."""
    try:
        with open_binary(path) as fh:
            head = fh.read(1 << 16)
    except _stream_errors():
        return  # a truncated stream is reported, with its offset, by the read itself
    if b"\n" not in head and head.count(b"\r") >= 2:
        raise InputError(f"{path}: its lines end in CR alone (classic Mac OS), which would read as one line and merge "
                         f"its documents; convert it: tr '\\r' '\\n' < {path} > {path}.unix.txt, and use the copy")


def _iter_lines(fh, path, start, end, limit, skip) -> Iterator[tuple[int, int, str | None]]:
    """(byte offset, line number or 0, decoded line) for each line; None marks a dropped line (already counted)."""
    pos, lineno = start, (1 if start == 0 else 0)
    stream_errors = _stream_errors()
    encoding = _Encoding(path, start)
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
            break
        encoding.lines += 1
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
                encoding.bad(where)
                text = None
            else:
                if text.startswith("\ufeff"):  # at the start, or mid-file where `cat` joined files saved with one
                    text = text[1:]
        yield pos, lineno, text
        pos += n
        if lineno:
            lineno += 1
    encoding.check(final=True)


class _Encoding:
    """Stops reading a file that is not UTF-8 (GB18030, latin-1): line by line it would be "read" as thousands of
    invalid_utf8 skips and the pure-ASCII lines kept, a corpus of fragments with exit 0. A handful of bad lines in a
    large file is crawl noise and stays a counted skip; over ``INVALID_UTF8_SHARE`` of the lines read (and at least
    ``INVALID_UTF8_MIN`` lines) it is InputError, naming the file and the conversion. Checked when the file (or
    piece) ends, and early once half of at least 1,000 lines are bad, so a 10 GB GB18030 file fails in seconds."""

    def __init__(self, path: str, start: int):
        self.path, self.start, self.lines, self.invalid, self.first = path, start, 0, 0, ""

    def bad(self, where: str) -> None:
        self.invalid += 1
        self.first = self.first or where
        if self.invalid >= 1000 and 2 * self.invalid > self.lines:
            self.check(final=False)

    def check(self, final: bool) -> None:
        if self.invalid < INVALID_UTF8_MIN or self.invalid <= INVALID_UTF8_SHARE * self.lines:
            return
        part = f" (the piece from byte {self.start})" if self.start else ""
        read = "" if final else " so far"
        raise InputError(
            f"{self.path}{part}: {self.invalid:,} of {self.lines:,} lines read{read} are not valid UTF-8 (first: "
            f"{self.first}), over {INVALID_UTF8_SHARE:.0%}: the file is in another encoding. Convert it and use the "
            f"copy, e.g. iconv -f GB18030 -t UTF-8 {self.path} > {self.path}.utf8.txt (Chinese; -f LATIN1 or "
            f"CP1252 for Western text; `file -i` or chardet guesses)")


INVALID_UTF8_SHARE = 0.01
INVALID_UTF8_MIN = 10


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


def _wiki_documents(lines, path, max_document_bytes, skip) -> Iterator[Document]:
    """WikiExtractor output: one document per ``<doc ...>`` ... ``</doc>`` block, the tags dropped, blank lines inside
    a block ignored (WikiExtractor puts one after the title, so the .txt layout would cut every article in two).

    The title line WikiExtractor repeats as the block's first line is kept as the document's first line: it is the
    article's heading, text a reader of the article sees, and dropping "the first line" would drop real text from
    any file whose blocks do not start with it. A block without ``</doc>`` ends at the next ``<doc`` or at the end
    (its text is kept). Text outside any block is dropped and counted as ``text_outside_doc``.
    """
    doc: list[str] | None = None
    doc_line, doc_offset, doc_bytes = 0, 0, 0
    for offset, lineno, text in lines:
        if text is _TRUNCATED:
            return
        if text is None:
            continue
        text = text.strip()
        if text.startswith("<doc") and text.endswith(">") and (len(text) == 5 or text[4].isspace()):
            if doc:
                yield Document(doc, path, doc_line, doc_offset)
            doc, doc_line, doc_offset, doc_bytes = [], lineno, offset, 0
        elif text == "</doc>":
            if doc:
                yield Document(doc, path, doc_line, doc_offset)
            elif doc is not None:
                skip("empty_document", f"{path}:{doc_line or doc_offset}: <doc> block with no text")
            doc = None
        elif text:
            if doc is None:
                skip("text_outside_doc", f"{path}:{lineno or offset}: text outside a <doc> ... </doc> block")
                continue
            if doc and doc_bytes + len(text) > max_document_bytes:
                skip("long_document_split", f"{path}:{doc_line or doc_offset}: document over {max_document_bytes} "
                                            f"bytes")
                yield Document(doc, path, doc_line, doc_offset)
                doc, doc_bytes, doc_line, doc_offset = [], 0, lineno, offset
            doc.append(text)
            doc_bytes += len(text)
    if doc:
        yield Document(doc, path, doc_line, doc_offset)


_SURROGATE = re.compile("[\ud800-\udfff]")
_JQ = "Convert it to JSON lines: jq -c '.[]' {path} > out.jsonl (an array) or jq -c . {path} > out.jsonl"


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
            if lineno == 1 and text.strip() in ("[", "{", "[{"):  # pretty-printed: every line would be invalid_json
                skip("not_json_lines", f"{where}: pretty-printed JSON, not one object per line; the file is not "
                                       f"read. {_JQ.format(path=path)}")
                return
            skip("invalid_json", f"{where}: invalid JSON ({err.msg} at column {err.colno})")
            continue
        if isinstance(obj, list):
            skip("not_json_lines", f"{where}: a JSON array of {len(obj):,} element(s), not one object per line; "
                                   f"skipped. {_JQ.format(path=path)}")
            continue
        if not isinstance(obj, dict) or json_key not in obj:
            skip("missing_json_key", f"{where}: no key {json_key!r} (use --json-key)")
            continue
        value = obj[json_key]
        if not isinstance(value, str):
            skip("json_value_not_string", f"{where}: {json_key!r} holds {type(value).__name__}, not text")
            continue
        # Valid UTF-8 never decodes to a surrogate, so only a \u escape can make one; a pair is joined by json.
        if "\\u" in text and (bad := _SURROGATE.search(value)) is not None:
            skip("lone_surrogate", f"{where}: {json_key!r} holds an unpaired surrogate escape "
                                   f"\\u{ord(bad.group()):04x} at character {bad.start()}")
            continue
        doc = [s for s in (part.strip() for part in value.split("\n")) if s]
        if not doc:
            skip("empty_document", f"{where}: empty text")
            continue
        yield Document(doc, path, lineno, offset)


# ---------------------------------------------------------------------------------------------------- pydocs


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
