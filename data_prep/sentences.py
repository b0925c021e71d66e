"""English and Chinese sentence splitting for ``build_indexed.py --split-sentences``.

The rule, applied to each input line (a line is never joined with the next one):

- Chinese: a sentence ends after ``。！？`` (full-width; repeated or mixed, e.g. ``！？``) or an ellipsis ``…``/``……``,
  together with any closing quotes or brackets right after it (``”’」』）》``). No space is needed after it.
- English: a sentence ends after ``.``, ``!`` or ``?`` (repeats such as ``?!`` or ``...`` stay together), with any
  closing quotes or brackets (``" ' ” ’ ) ]``), when whitespace follows and the next word starts like a sentence (an
  uppercase letter, a digit, an opening quote or bracket, or a CJK character) — except after a known abbreviation
  (``Mr. Dr. e.g. i.e. etc. vs. St. Fig. No.`` ..., see ``ABBREVIATIONS``) or a single-letter initial / dotted
  acronym (``J. R. R. Tolkien``, ``U.S. Army``).
- The sentence-ending punctuation stays with its sentence; surrounding whitespace is stripped; nothing is dropped
  (joining the sentences with single spaces gives back the line up to whitespace).

Known limits of the rule (the price of a regex): an acronym or abbreviation that really ends a sentence ("... in
the U.S. The next day") does not split; a lowercase sentence start ("... ended. and then") does not split.

Why our own: NLTK's punkt (what Megatron uses) needs a model download and is English-only, and the rule-based
libraries on PyPI (pysbd) cost ~100x more per sentence than a compiled regex, which would dominate data prep.
"""
from __future__ import annotations

import re

ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al fig figs no nos vol vols pp ed eds inc ltd co corp dept
    univ gen col lt sgt capt cmdr adm gov sen rep rev hon jan feb mar apr jun jul aug sep sept oct nov dec approx
    est ca op art ch sec""".split()
)

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
# Chinese end: full-width stops or an ellipsis, then closing marks; the cut is after them.
_ZH_END = r"(?:[。！？]+|…+)[”’」』）》\"']*"
# English end: ASCII stops, closing marks, whitespace, then a sentence-like start (looked ahead, not consumed).
# Linear time: the lookbehind lets a match start only at the first stop of a run. Without it, a run of n stops followed
# by no sentence start was tried from each of its stops, each try backtracking over the rest of the run: O(n^2) (16k
# dots 2.7 s; a 1 MB dotted line hours). From the first stop alone, the one try gives back at most the run: O(n).
# (No possessive quantifiers: Python 3.10, setup.py's floor, refuses them; and they measured slower here.)
# (The lookbehind is written after the first stop, ``[.!?](?<![.!?][.!?])``: the same test, but a pattern that begins
# with a character class lets ``re`` skip ahead to the next stop instead of trying every position: 1.4x faster on
# ordinary text.)
_EN_END = r"[.!?](?<![.!?][.!?])[.!?]*[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9" + _CJK + r"])"
# ASCII ! or ? followed directly by a CJK character also ends a sentence (mixed text: "好!下一句"); linear likewise.
_MIXED_END = r"[!?](?<![!?][!?])[!?]*(?=[" + _CJK + r"])"
_BOUNDARY = re.compile(f"{_ZH_END}|{_EN_END}|{_MIXED_END}")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.")


_WORD_BEFORE = re.compile(r"[A-Za-z][A-Za-z.]*$")


def _word_before(text: str, end: int) -> str | None:
    """The word that ends at ``end``: letters and dots, starting with a letter (what ``_WORD_BEFORE`` finds in
    ``text[:end]``). Searched in a window before ``end``, widened while the word found starts at the window's edge with
    a word character before it: a search from 0 (as before) tried every start of the line, so a line of n sentences
    cost O(n^2) (a 220 kB line of short sentences: 80 s)."""
    window = 32
    stop = end - 1 if end and text[end - 1] == "\n" else end  # (`$` also matches before a final newline)
    while True:
        lo = max(0, end - window)
        match = _WORD_BEFORE.search(text, lo, end)
        # A match starting before lo would need word characters all the way from before lo to where this one starts
        # (or to the end, if none was found): only then can the window be too narrow.
        edge = match.start() if match else stop
        if lo == 0 or text[lo - 1] not in _WORD_CHARS or not _WORD_CHARS.issuperset(text[lo:edge]):
            return match.group(0) if match else None
        window *= 4


def _is_abbreviation(text: str, dot_at: int) -> bool:
    """Whether the '.' at ``dot_at`` ends an abbreviation or an initial rather than a sentence."""
    word = _word_before(text, dot_at)
    if word is None:
        return False
    if len(word) == 1 and word.isupper():
        return True  # an initial: "J. Smith"
    if "." in word and all(len(part) <= 2 for part in word.split(".")):
        return True  # a dotted acronym: "U.S", "e.g", "Ph.D"
    return word.lower() in ABBREVIATIONS


def split_sentences(line: str) -> list[str]:
    """The sentences of one line, in order, stripped; ``[]`` for a blank line."""
    pieces: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(line):
        end = match.end()
        if match.group(0)[0] == "." and match.group(0).rstrip("\"'”’)]") == "." and _is_abbreviation(line, match.start()):
            continue
        piece = line[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    rest = line[start:].strip()
    if rest:
        pieces.append(rest)
    return pieces
