"""``data_prep.sentences.split_sentences`` against the splitter it replaced (2026-12-05), on the same text, in one
process: ordinary text (the English and Chinese test corpora) and the lines that made the old one quadratic (a long
run of stops with no sentence after it, a long line of short sentences). The old splitter is copied below as the
baseline (its regex tried every stop of a run, and each candidate searched the line from its start for the word
before the stop). Both must give the same sentences; the script says so per input.

    python bench/sentences.py
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep import sentences  # noqa: E402
from data_prep.pydocs_text import cached_text  # noqa: E402

# --- the baseline: data_prep/sentences.py as of 9e44c5a -----------------------------------------------------------
_OLD_EN_END = r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9" + sentences._CJK + r"])"
_OLD_MIXED_END = r"[!?]+(?=[" + sentences._CJK + r"])"
_OLD_BOUNDARY = re.compile(f"{sentences._ZH_END}|{_OLD_EN_END}|{_OLD_MIXED_END}")
_OLD_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")


def _old_is_abbreviation(text: str, dot_at: int) -> bool:
    match = _OLD_WORD_BEFORE.search(text, 0, dot_at)
    if match is None:
        return False
    word = match.group(1)
    if len(word) == 1 and word.isupper():
        return True
    if "." in word and all(len(part) <= 2 for part in word.split(".")):
        return True
    return word.lower() in sentences.ABBREVIATIONS


def old_split(line: str) -> list[str]:
    pieces, start = [], 0
    for match in _OLD_BOUNDARY.finditer(line):
        end = match.end()
        if match.group(0)[0] == "." and match.group(0).rstrip("\"'”’)]") == "." and \
                _old_is_abbreviation(line, match.start()):
            continue
        piece = line[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    rest = line[start:].strip()
    if rest:
        pieces.append(rest)
    return pieces


def best_of(fn, lines, reps):
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = [fn(line) for line in lines]
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    inputs = [
        ("English (Python's docstrings)", open(cached_text(), encoding="utf-8").read().splitlines(), 5),
        ("Chinese (tests/data/zh_classical.txt)",
         (repo / "tests" / "data" / "zh_classical.txt").read_text(encoding="utf-8").splitlines(), 5),
        ("4,000 dots, no sentence after", ["Contents" + "." * 4000 + " page 4"], 1),
        ("16,000 dots, no sentence after", ["Contents" + "." * 16000 + " page 4"], 1),
        ("one line of 2,000 short sentences", [" ".join(f"Item {i} is here." for i in range(2000))], 1),
        ("one line of 8,000 short sentences", [" ".join(f"Item {i} is here." for i in range(8000))], 1),
    ]
    same = True
    for name, lines, reps in inputs:
        t_old, out_old = best_of(old_split, lines, reps)
        t_new, out_new = best_of(sentences.split_sentences, lines, reps)
        same &= out_old == out_new
        mb = sum(len(line.encode()) + 1 for line in lines) / 1e6
        print(f"{name}: {mb:.2f} MB; before {t_old:.4f} s, now {t_new:.4f} s; now/before {t_new / t_old:.4g} "
              f"({t_old / t_new:.3g}x); "
              f"same sentences: {out_old == out_new}", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
