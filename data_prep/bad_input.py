"""build_indexed's checks of how its input is read: did the run read most of its input, or only a fraction of it
(``check``, before the manifest), and are large compressed inputs going to serialise the run (``one_piece_note``, at
start)?

Every bad record is counted by reason (data_prep/sources.py), but a count in a summary is easy to miss: a folder
mixing ``text`` and ``content`` keys builds half its records, 2,000 unsupported files beside one .txt build a
1-document corpus, and both exit 0. ``check`` refuses to finish such a run: when the records skipped for bad input
(``BAD_REASONS``: wrong key, invalid JSON or UTF-8, unsupported files, ...; not empty documents, which are no loss,
nor per-record content quirks such as lone_surrogate or line_too_long) number at least ``MIN_BAD`` and pass
``--max-bad-share`` of the records read (documents written + bad ones; bad lines and files count as records, a
deliberately rough unit), it returns the message naming the counts by reason, the inputs that lost most and what
to do. The finished pieces stay in the work folder, so rerunning with a fixed --json-key rebuilds, and rerunning
with a higher --max-bad-share (the share is not part of the run's identity) only finalizes.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from data_prep import sources
from data_prep.prep_work import record_name

BAD_REASONS = ("invalid_utf8", "nul_bytes", "invalid_json", "missing_json_key", "json_value_not_string",
               "not_json_lines", "unsupported_file", "text_outside_doc")
DEFAULT_MAX_BAD_SHARE = 0.01
MIN_BAD = 10  # below this many, a small corpus (a test, a sample) with one stray bad line is not refused

_FIX = {
    "missing_json_key": "the records hold their text under another key: look at one (head -c 300 FILE) and set "
                        "--json-key, or build the inputs with different keys in separate runs",
    "json_value_not_string": "--json-key names a field that is not text",
    "invalid_json": "the .jsonl files are not one JSON object per line",
    "not_json_lines": "convert JSON arrays / pretty-printed JSON with jq -c '.[]' FILE > FILE.jsonl",
    "unsupported_file": "files of an unsupported type were left out: convert them to .txt / .jsonl, or name only "
                        "the inputs in --input",
    "invalid_utf8": "convert non-UTF-8 files (iconv -f GB18030 -t UTF-8)",
    "nul_bytes": "binary or UTF-16 files (iconv -f UTF-16 -t UTF-8)",
}


LINE_REASONS = ("invalid_utf8", "nul_bytes", "text_outside_doc")
"""Reasons counted per line of text: measured against the sequences written (a books corpus of 50 long documents
with 20 bad lines in 25,000 lost 0.08 % of its text, not the 28.6 % a count against documents said, and was
refused; review of 2026-12-06). A file in another encoding is stopped by sources.py's own per-file check."""


def check(workdir: Path, pieces, extra_skipped: Counter, max_share: float) -> str | None:
    """None when the bad share is within ``max_share``; else the error message (module docstring). Record-level
    reasons (a JSON record without the key, an unsupported file) are measured against the documents written,
    line-level ones (``LINE_REASONS``) against the sequences written. Pieces without a record are left to finalize,
    which names them."""
    bad, documents, sequences, by_input = Counter(), 0, 0, {}
    for reason in BAD_REASONS:
        bad[reason] += extra_skipped.get(reason, 0)
    for p in pieces:
        path = workdir / record_name(p.index)
        if not path.exists():
            continue
        rec = json.loads(path.read_text(encoding="utf-8"))
        documents += sum(s["documents"] for s in rec["shards"])
        sequences += sum(s.get("sentences", s["documents"]) for s in rec["shards"])
        mine = Counter({k: v for k, v in rec["skipped"].items() if k in BAD_REASONS})
        bad.update(mine)
        if "input_skipped" in rec:  # a group of small inputs (prep_work.plan_pieces): its record counts per file
            for path, counts in zip(p.paths, rec["input_skipped"]):
                by_input.setdefault(path, Counter()).update({k: v for k, v in counts.items() if k in BAD_REASONS})
        else:
            by_input.setdefault(p.path, Counter()).update(mine)
    n_bad = sum(bad.values())
    n_lines = sum(v for k, v in bad.items() if k in LINE_REASONS)
    n_records = n_bad - n_lines
    share_records = n_records / max(1, documents + n_records)
    share_lines = n_lines / max(1, sequences + n_lines)
    if n_bad < MIN_BAD or (share_records <= max_share and share_lines <= max_share):
        return None
    worst = sorted(((sum(c.values()), path, c) for path, c in by_input.items() if c), key=lambda t: -t[0])[:3]
    inputs = "; ".join(f"{path}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(c.items())) for _, path, c in worst)
    fixes = " ".join(f"{r}: {_FIX[r]}." for r in sorted(bad) if bad[r] and r in _FIX)
    return (f"error: bad input over --max-bad-share {max_share:g}: {n_records:,} records or files skipped against "
            f"{documents:,} documents written ({share_records:.1%}), {n_lines:,} lines against {sequences:,} "
            f"sequences written ({share_lines:.1%}): "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(bad.items()) if v)
            + (f". Most affected inputs: {inputs}" if inputs else "")
            + f". {fixes} The corpus is not finalized; {workdir} keeps the finished pieces: rerun after fixing the "
              f"inputs (with --overwrite if they changed), or with a higher --max-bad-share to accept the loss "
              f"(nothing is tokenized again).")


def one_piece_note(inputs: list[str], pieces: list, chunk_bytes: int, processes: int) -> str | None:
    """A warning when compressed inputs larger than a piece hold a large part of the input: a compressed stream cannot
    be cut at a byte offset, so each is one piece for one worker (no parallelism within it, its progress shows only
    at its end, a kill redoes it whole). A review measured 92.8 s instead of 47.8 s on 50 MB with 2 workers, and
    each of the Pile's ~15 GB shards would take 12-15 h on one worker."""
    if processes <= 1:
        return None
    per_input = Counter(p.path for p in pieces)
    big = [(path, sources.input_bytes(path)) for path in inputs
           if per_input[path] == 1 and sources.input_bytes(path) > 2 * chunk_bytes
           and not sources.is_splittable(path)]
    total = sum(sources.input_bytes(path) for path in inputs) or 1
    share = sum(size for _, size in big) / total
    if not big or share < 0.25:
        return None
    name, size = max(big, key=lambda x: x[1])
    return (f"warning: {len(big)} compressed input(s) ({share:.0%} of the input bytes; the largest {name}, "
            f"{size / 2**30:.1f} GiB on disk) are one piece each: each is read and tokenized by one of the "
            f"{processes} worker processes, and a kill redoes it whole. To use every worker, decompress them or cut "
            f"them into files of ~{max(1, chunk_bytes >> 20)} MB first, e.g. `zstd -dc BIG.jsonl.zst | split -C "
            f"{max(1, chunk_bytes >> 20)}M -d --additional-suffix=.jsonl - BIG_part_` (a .jsonl is cut at line ends)")
