"""``builtin:pydocs`` written out as a plain-text corpus: one sentence per line, a blank line between documents.

    python -m data_prep.pydocs_text --output pydocs_en.txt     # write it where you say
    python -m data_prep.pydocs_text                            # print the cached copy's path (made if missing)

The documents are those of ``sources.iter_documents("builtin:pydocs")`` (one standard-library module each, every
docstring paragraph a line), each paragraph split into sentences by ``sentences.split_sentences``. The tests'
``en_corpus`` fixture and the benchmarks read this text (tests/conftest.py, bench/corpora.py): it is English prose
with code, numbers, mixed case and punctuation that every machine with Python has, so the repository vendors no
English text of unclear licence. The Python Software Foundation licence covers the standard library's docstrings.

Its content depends on the Python build (the standard library's files) and on the code that reads and splits it,
so the cached copy is named after a hash of both: the interpreter's version and build, the standard library's file
list with sizes, and the source of this module, sources.py, input_files.py and sentences.py. Any change to one of
them makes a new file; a stale copy is never read. Writing goes to a temporary name in the same folder and is
renamed into place, so concurrent test sessions never see a partial file (they may both write it: same bytes).
Cost: ~5 s of CPU to parse ~650 modules with ``ast`` once per key; reading the cached copy is free.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from data_prep import input_files, sentences, sources
from data_prep.cache_dir import cache_dir, key

_CODE = ("pydocs_text.py", "sources.py", "input_files.py", "sentences.py")


def content_key() -> str:
    """A hash of everything the text depends on (module docstring)."""
    here = Path(__file__).resolve().parent
    stdlib = "".join(f"{rel}\t{size}\n" for rel, _, size in input_files._pydocs_files())
    return key(sys.version, sys.implementation.cache_tag, sys.platform, stdlib,
               *(name.encode() + b"\0" + (here / name).read_bytes() for name in _CODE))


def write_text(out: Path) -> tuple[int, int]:
    """Write the corpus to ``out``; returns (documents, lines)."""
    docs = lines = 0
    with open(out, "w", encoding="utf-8") as fh:
        for doc in sources.iter_documents(sources.PYDOCS):
            sents = [s for para in doc.lines for s in sentences.split_sentences(para)]
            if not sents:
                continue
            fh.write(("\n" if docs else "") + "\n".join(sents) + "\n")
            docs += 1
            lines += len(sents)
    return docs, lines


def cached_text(folder: Path | None = None) -> Path:
    """The corpus file for this Python and this code, written on first use (atomically) and reused after."""
    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"pydocs_en-{content_key()}.txt"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=folder)
    os.close(fd)
    try:
        write_text(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=Path, help="write here (default: the cached copy, whose path is printed)")
    p.add_argument("--cache-dir", type=Path, help="cache folder (default: $BERTFAMILY_CACHE or ~/.cache/bertfamily)")
    args = p.parse_args(argv)
    if args.output is None:
        print(cached_text(args.cache_dir))
        return 0
    docs, lines = write_text(args.output)
    print(f"{args.output}: {docs} documents, {lines} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
