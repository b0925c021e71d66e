"""Finding, opening and cutting corpus inputs: which files a spec names, their decompressed byte streams, and the
byte ranges ("pieces") one large file is spread over workers in. What is *in* the files (documents, bad lines) is
read by data_prep/sources.py, which re-exports everything here; its docstring has the bad-input table.

Inputs: files, directories (recursive, sorted, hidden entries skipped, symlinked folders followed), globs and
``builtin:pydocs`` (the installed standard library's ``.py`` files, listed here by ``_pydocs_files``); each file once,
by its real path; build_indexed's own output files are never inputs (``output_matcher``). Names decide the layout:
``.txt``/``.text``, ``.jsonl``/``.json``/``.ndjson``, optionally compressed ``.gz``, ``.bz2``, ``.zst``/``.zstd``
(decompressed as a stream, never whole); a file whose first line is a ``<doc `` tag is WikiExtractor output
(``AA/wiki_00``, no extension), whatever its name (``input_format``). A spec that matches nothing, an explicitly
named file of another type, or a file that cannot be opened raises ``InputError`` naming it.

Pieces: an uncompressed file can be read as byte ranges (``piece_bounds`` + ``sources.iter_documents(start=,
end=)``) so that one large file spreads over many workers. A range ``[start, end)`` owns the documents whose first
byte lies in ``cut(start) .. cut(end)``, where ``cut(c)`` is the position just after the first blank line at or
after ``c`` (.txt), the first line start at or after ``c`` (.jsonl) or the start of the first ``<doc`` line at or
after ``c`` (WikiExtractor). Every reader computes the same cuts, so every document is read exactly once and the
documents are the same as a whole-file read. Compressed files are one piece each (a compressed stream cannot be
entered in the middle). For pydocs the bounds are module indices.
"""
from __future__ import annotations

import bz2
import functools
import glob
import gzip
import io
import os
import re
import sysconfig
import zlib
from collections import Counter
from pathlib import Path
from typing import BinaryIO, Callable

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


# ---------------------------------------------------------------------------------------------------- inputs


def input_format(path: str) -> str:
    """``txt``, ``jsonl``, ``wiki`` or ``pydocs``, from the name and (for WikiExtractor) the first bytes;
    InputError for anything else.

    ``wiki`` is WikiExtractor's output: ``<doc id=.. url=.. title=..>`` ... ``</doc>`` blocks, in files named
    ``AA/wiki_00`` with no extension (optionally ``.bz2``, its ``--compress``). A file is read as such when its
    first line is a ``<doc `` tag, whatever its name: without an extension (WikiExtractor's own names), and also
    as ``.txt`` (the usual rename), where the blank-line layout would cut each article in two and tokenize the tags.
    A ``wiki_NN`` file starting with ``{`` is WikiExtractor's ``--json`` output: JSON lines.
    """
    if path == PYDOCS:
        return "pydocs"
    name = path.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    if name.endswith(TEXT_SUFFIXES):
        return "wiki" if _sniff(path) == "wiki" else "txt"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    sniffed = _sniff(path)
    if sniffed == "wiki" or (sniffed == "jsonl" and _WIKI_NAME.fullmatch(os.path.basename(name))):
        return sniffed
    raise InputError(
        f"{path}: unsupported input type; name text files *.txt and JSON-lines files *.jsonl "
        f"(optionally compressed: {', '.join(COMPRESSIONS)}){convert_hint([path])}"
    )


_WIKI_NAME = re.compile(r"wiki_\d+")
_CONVERT = {".parquet": "convert to JSON lines first (pyarrow / datasets: Dataset.from_parquet(F).to_json(OUT))",
            ".arrow": "convert to JSON lines first (datasets: load_from_disk(DIR).to_json(OUT))",
            ".xz": "decompress first (xz -d) or recompress with zstd",
            ".csv": "convert the text column to JSON lines first (e.g. pandas read_csv(F).to_json(OUT, "
                    "orient='records', lines=True))",
            ".tsv": "convert the text column to JSON lines first"}


def convert_hint(paths: list[str]) -> str:
    """'; X files: what to do' for the kinds of unsupported file that have a usual conversion, else ''."""
    hints = {ext: how for p in paths for ext, how in _CONVERT.items() if p.lower().endswith(ext)}
    return "".join(f"; {ext} files: {how}" for ext, how in sorted(hints.items()))


def _sniff(path: str) -> str | None:
    """``wiki`` when the first line (decompressed) is a ``<doc `` tag, ``jsonl`` when it starts with ``{``; None
    otherwise or when the file cannot be read (an unreadable input is reported by check_readable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _sniff_cached(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4096)
def _sniff_cached(path: str, mtime_ns: int, size: int) -> str | None:
    try:
        with open_binary(path) as fh:
            head = fh.read(64)
    except (OSError, InputError, *_stream_errors()):
        return None
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t")
    if head.startswith((b"<doc ", b"<doc\t", b"<doc>")):
        return "wiki"
    return "jsonl" if head.startswith(b"{") else None


def _supported(path: str) -> bool:
    try:
        input_format(path)
        return True
    except InputError:
        return False


def output_matcher(prefix: str) -> Callable[[str], bool]:
    """Whether a path is one of build_indexed's own outputs for ``--output-prefix prefix``: ``NAME.manifest.json``
    (and its temporary), the shards ``NAME_00000.bin/.idx`` and side-cars ``NAME_00000.spans.*`` beside it, and
    anything under ``NAME.work/``.

    An output folder inside an input folder must not feed the next run: the manifest and the work folder's piece
    records are ``.json`` (read as JSON lines), side-cars are ``.spans.json``, and they change while the run goes.
    """
    root = os.path.realpath(os.path.dirname(prefix) or ".")
    name = os.path.basename(prefix)
    # shards .bin/.idx, side-cars .spans.json/.spans.npy/.spans.ptr.npy and their temporaries; not NAME_00000.jsonl,
    # which may well be an input beside the output
    own = re.compile(re.escape(name) + r"(\.manifest\.json(\.tmp)?|_\d{5,}\.(bin|idx|spans\..*))$")
    work = os.path.join(root, name + ".work")

    def is_output(path: str) -> bool:
        real = os.path.realpath(path)
        if real == work or real.startswith(work + os.sep):
            return True
        return os.path.dirname(real) == root and own.match(os.path.basename(real)) is not None

    return is_output


def expand_inputs(specs: list[str], skipped: Counter | None = None, on_skip: SkipHook | None = None, *,
                  output_prefix: str | None = None, excluded: list[str] | None = None) -> list[str]:
    """Files, directories (recursively, sorted, hidden entries skipped, symlinked folders followed) and globs -> a
    list of files, in order.

    Duplicates are kept once (first occurrence), by their real path: ``big ./big/part00.txt``, a folder and its
    subfolder, or a symlink and its target name a file once (its first spelling). A symlink to a folder already
    being walked (a cycle) is not followed again. A spec that names an existing path is that path, even when it
    holds glob characters (``wiki[2020].jsonl``); otherwise it is a glob. A spec that matches nothing raises
    InputError naming it, and so does a folder that holds no .txt/.jsonl file. Files inside a directory that are
    not .txt/.jsonl are counted as ``unsupported_file``; an explicitly named one is an error. With
    ``output_prefix``, the files of that output (``output_matcher``) are never inputs: found in a directory or by a
    glob they are left out and appended to ``excluded`` (not counted in ``skipped``, which goes into the manifest: a
    rerun would otherwise record other counts than the first run); named explicitly they are an error.
    """
    out: list[str] = []
    seen: set[str] = set()  # real paths of every file met so far, inputs and unsupported ones
    is_output = output_matcher(output_prefix) if output_prefix is not None else (lambda path: False)

    def add(path: str) -> None:
        key = path if path == PYDOCS else os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            out.append(path)

    def left_out(path: str) -> bool:
        if not is_output(path):
            return False
        if excluded is not None:
            excluded.append(path)
        return True

    def add_dir(root: str) -> int:
        """Walk ``root``; returns how many input files it holds (met before or not). Its unsupported files are
        reported in one line (a count and the first names): a WikiExtractor or HF folder holds thousands."""
        found = 0
        unsupported: list[str] = []
        walked = {os.path.realpath(root)}  # this walk's folders: a symlink back to one of them is a cycle

        def follow(dirpath: str, d: str) -> bool:
            path = os.path.join(dirpath, d)
            if d.startswith(".") or left_out(path):
                return False
            real = os.path.realpath(path)
            if real in walked:
                return False
            walked.add(real)
            return True

        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if follow(dirpath, d))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = os.path.join(dirpath, name)
                if left_out(path):
                    continue
                if _supported(path):
                    found += 1
                    add(path)
                elif os.path.realpath(path) not in seen:
                    seen.add(os.path.realpath(path))
                    unsupported.append(path)
        if unsupported:
            if skipped is not None:
                skipped["unsupported_file"] += len(unsupported)
            if on_skip is not None:
                first = ", ".join(os.path.relpath(p, root) for p in unsupported[:3])
                on_skip("unsupported_file", f"{root}: {len(unsupported):,} file(s) of an unsupported type left out "
                        f"(e.g. {first}{', ...' if len(unsupported) > 3 else ''}); inputs are *.txt, *.jsonl and "
                        f"WikiExtractor <doc> files{convert_hint(unsupported)}")
        return found

    for spec in specs:
        if spec == PYDOCS:
            add(PYDOCS)
            continue
        if os.path.exists(spec):
            matches = [spec]
        elif any(ch in spec for ch in "*?["):
            matches = sorted(glob.glob(spec, recursive=True))
        else:
            matches = []
        if not matches:
            raise InputError(f"input {spec!r} matches no file or directory; check the path (and quote globs)")
        if spec == matches[0] and is_output(spec):
            raise InputError(f"input {spec!r} is an output of this command (--output-prefix {output_prefix}); "
                             f"remove it from --input")
        for path in matches:
            if path != spec and left_out(path):
                continue
            if os.path.isdir(path):
                if add_dir(path) == 0 and spec == path:
                    raise InputError(f"input directory {spec!r} holds no .txt, .jsonl or WikiExtractor files")
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
        # zstd's default limit is a 128 MiB window; `zstd --long=31` (and --ultra levels) write frames that need up
        # to 2 GiB, which the default refuses ("Frame requires too much memory"). The window is memory the frame's
        # writer chose; allow the format's maximum rather than dropping the file as truncated.
        self._new = zstandard.ZstdDecompressor(max_window_size=2**31).decompressobj
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
    if fmt == "wiki":  # the start of the next <doc ...> line
        while pos < size:
            raw, n = _read_line(fh, limit)
            if n == 0:
                break
            if raw is not None and raw.lstrip().startswith(b"<doc"):
                return pos
            pos += n
        return size
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



# ---------------------------------------------------------------------------------------------------- pydocs files

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
