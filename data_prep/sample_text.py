"""The text ``train_tokenizer.py --limit-bytes`` trains on: a sample spread over the whole of every input, each input
getting a share of the budget proportional to its text size.

Why: a tokenizer's vocabulary is what its training text holds. Taking the head of each input (as before) gave a zh
tokenizer 0 Han tokens from a file of English followed by Chinese, gave a gzipped input a share of its compressed
size (28 % instead of 50 % beside a plain input of the same text) and left most of the budget unused on folders of
many small files (each stopped at its first line longer than its tiny share).

How (deterministic: the same inputs and budget give the same sample):

- Shares follow the text size: a plain file's size on disk; a compressed file's uncompressed size, estimated from
  its first ``PROBE_BYTES`` of decompressed text (exact when the whole stream fits in the probe); pydocs' module
  sources.
- A plain file (and builtin:pydocs, in module indices) is read in ``n`` evenly spaced windows, each starting at a
  line start, each taking whole lines until it has its part of the file's share (a window that runs into the next
  one hands what it lacks on to the windows after it).
- A compressed stream cannot be seeked: it is read through, and the documents that start in each of ``n`` evenly
  spaced blocks of its (estimated) uncompressed bytes give that block's part. That costs a full decompression.
- An input that gives less than its share (small files whose first line is longer than the share, a JSON-lines
  file whose text is smaller than the file, an estimate too high) hands the rest on to the next input, so the budget
  is filled and many small files are sampled at an even stride rather than all skipped.
- ``--limit-bytes`` stays a hard cap on the UTF-8 text taken.
"""
from __future__ import annotations

import bz2
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

from data_prep import sources

WINDOW_MIN = 4 << 10
WINDOW_MAX = 1 << 20
MIN_WINDOWS = 64
"""Windows per sampled input: at least 64 when the share allows windows of 4 KiB, at most 1 MiB each."""
PROBE_BYTES = 16 << 20
"""Decompressed bytes read from the head of a compressed input to estimate its uncompressed size."""
_PROBE_CHUNK = 16 << 10


@dataclass
class InputShare:
    path: str
    kind: str
    """"plain", "compressed" or "pydocs" (how the input is sampled, and the groups of the summary)"""
    size: int
    """text bytes (estimated for compressed inputs; modules' source bytes for pydocs)"""
    budget: int | None = None
    taken: int = 0
    lines: int = 0
    documents: int = 0
    complete: bool = True
    """read in full (False: sampled, or cut at the budget)"""


def input_kind(path: str) -> str:
    if path == sources.PYDOCS:
        return "pydocs"
    return "plain" if sources.is_splittable(path) else "compressed"


def estimate_uncompressed(path: str) -> int:
    """Uncompressed bytes of a .gz/.bz2/.zst input, from the ratio over its first ``PROBE_BYTES`` of output (exact
    for a stream shorter than that). A corrupt head falls back to what was decoded, or to the size on disk."""
    disk = sources.input_bytes(path)
    name = path.lower()
    if name.endswith(".gz"):
        new = lambda: zlib.decompressobj(wbits=47)  # noqa: E731  (gzip or zlib header; one member each)
    elif name.endswith(".bz2"):
        new = bz2.BZ2Decompressor
    else:
        import zstandard

        new = zstandard.ZstdDecompressor(max_window_size=2**31).decompressobj
    out = consumed = 0
    try:
        with open(path, "rb") as fh:
            dec = new()
            while out < PROBE_BYTES:
                chunk = fh.read(_PROBE_CHUNK)
                if not chunk:
                    return out  # the whole stream: exact
                consumed += len(chunk)
                while chunk:
                    out += len(dec.decompress(chunk))
                    chunk = dec.unused_data if dec.eof else b""
                    if dec.eof:
                        dec = new()  # another gzip member / zstd frame / bz2 stream follows
    except (OSError, EOFError, ValueError, zlib.error, *sources._stream_errors()):
        pass  # the reading proper reports a corrupt stream (truncated_input) with its offset
    if not consumed or not out:
        return disk
    return max(out, out * disk // consumed)


def plan(paths: list[str], limit: int | None) -> list[InputShare]:
    """One InputShare per input; with a ``limit``, its size and its budget (``limit`` split in proportion to the
    sizes). Without one nothing is estimated: every input is read in full."""
    shares = [InputShare(path, input_kind(path), 0) for path in paths]
    if limit is not None:
        for s in shares:
            s.size = max(1, estimate_uncompressed(s.path) if s.kind == "compressed" else sources.input_bytes(s.path))
        total = sum(s.size for s in shares)
        for s in shares:
            s.budget = limit * s.size // total
    return shares


Reader = Callable[..., Iterator["sources.Document"]]


class Sampler:
    """Yields the sampled lines input by input; ``on_line(share, line, nbytes)`` sees each one taken."""

    def __init__(self, shares: list[InputShare], limit: int | None, read: Reader):
        self.shares = shares
        self.limit = limit
        self.read = read
        self.room = limit  # text bytes left under the hard cap

    def __iter__(self) -> Iterator[str]:
        carry = 0
        for share in self.shares:
            if share.budget is None:
                yield from self._take(share, self.read(share.path), None)
                continue
            budget = share.budget + carry
            if budget <= 0 or self.room == 0:
                share.complete = False  # an earlier input's last line overshot this one's share: its turn is next
            elif budget >= share.size:
                yield from self._take(share, self.read(share.path), budget)
                share.complete = share.complete and share.taken < budget
            elif share.kind == "compressed":
                yield from self._stream_windows(share, budget)
            else:
                yield from self._seek_windows(share, budget)
            carry = budget - share.taken

    def _take(self, share: InputShare, docs, goal: int | None) -> Iterator[str]:
        """Whole lines of ``docs`` until ``share.taken`` reaches ``goal`` (the last may pass it: a window's lines
        are whole; the windows after it get that much less)."""
        for doc in docs:
            used = False
            for line in doc.lines:
                if goal is not None and share.taken >= goal:
                    break
                size = len(line.encode("utf-8"))
                if self.room is not None:
                    if size > self.room:
                        share.complete = False
                        self.room = 0
                        break
                    self.room -= size
                share.taken += size
                share.lines += 1
                used = True
                yield line
            share.documents += used
            if (goal is not None and share.taken >= goal) or self.room == 0:
                return

    def _seek_windows(self, share: InputShare, budget: int) -> Iterator[str]:
        share.complete = False
        n = _window_count(budget)
        extent = len(sources._pydocs_files()) if share.kind == "pydocs" else sources.input_bytes(share.path)
        starts = _line_starts(share.path, share.kind, extent, n)
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else None
            goal = share.taken + (budget - share.taken) // (len(starts) - k)
            yield from self._take(share, self.read(share.path, start=start, end=end), goal)
            if self.room == 0:
                return

    def _stream_windows(self, share: InputShare, budget: int) -> Iterator[str]:
        share.complete = False
        n = _window_count(budget)
        k, goal = -1, 0
        for doc in self.read(share.path):
            while k + 1 < n and doc.offset >= share.size * (k + 1) // n:
                k += 1
                goal = share.taken + (budget - share.taken) // (n - k)
            if share.taken >= goal:
                if k + 1 >= n:
                    return
                continue
            yield from self._take(share, [doc], goal)
            if self.room == 0:
                return


def _window_count(budget: int) -> int:
    window = max(WINDOW_MIN, min(WINDOW_MAX, budget // MIN_WINDOWS))
    return max(1, -(-budget // window))


def _line_starts(path: str, kind: str, extent: int, n: int) -> list[int]:
    """``n`` evenly spaced offsets in ``[0, extent)``, each moved on to the start of a line (module indices for
    pydocs), without repeats. In WikiExtractor output, to the start of a ``<doc ...>`` line: a window starting
    inside a block would read its lines as text outside any block (dropped, counted as text_outside_doc)."""
    offsets = [extent * k // n for k in range(n)]
    if kind == "pydocs":
        return sorted(set(offsets))
    wiki = sources.input_format(path) == "wiki"
    out: list[int] = []
    with sources.open_binary(path) as fh:
        for c in offsets:
            pos = c
            if c > 0:
                fh.seek(c - 1)
                if fh.read(1) != b"\n":
                    _, skipped = sources._read_line(fh, sources.MAX_LINE_BYTES)
                    pos += skipped
                while wiki and pos < extent:
                    raw, size = sources._read_line(fh, sources.MAX_LINE_BYTES)
                    if size == 0 or (raw is not None and raw.lstrip().startswith(b"<doc")):
                        break
                    pos += size
            if pos < extent and (not out or pos > out[-1]):
                out.append(pos)
    return out or [0]


def describe(shares: list[InputShare], limit: int, flag: str = "--limit-bytes") -> list[str]:
    """One line per kind of input: text taken against the text there is, so a skewed sample shows."""
    lines = []
    for kind, what in (("plain", "plain input(s)"), ("compressed", "compressed input(s), sizes estimated "
                                                     "uncompressed; each decompressed in full to sample it"),
                       ("pydocs", "builtin:pydocs (module source bytes)")):
        group = [s for s in shares if s.kind == kind]
        if not group:
            continue
        taken, size = sum(s.taken for s in group), sum(s.size for s in group)
        lines.append(f"  {taken / 1e6:,.1f} MB of {'~' if kind != 'plain' else ''}{size / 1e6:,.1f} MB "
                     f"({100 * taken / size:.0f}%) from {len(group)} {what}")
    return [f"{flag} {limit:,}: sampled across each input, by share of text size:"] + lines


def stats(shares: list[InputShare]) -> tuple[int, int, int, bool]:
    """(bytes, lines, documents, truncated) over all inputs."""
    return (sum(s.taken for s in shares), sum(s.lines for s in shares), sum(s.documents for s in shares),
            not all(s.complete for s in shares))

