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
# Linear time: a match starts only at the first stop of a run (the lookbehind) and takes the whole run and the closing
# marks atomically, never giving them back. Giving back could not help (a shorter run is followed by a stop, not by
# whitespace), but a plain ``+`` tried it, and from every stop of the run: a run of n stops followed by no sentence
# start cost O(n^2) (16k dots 2.7 s; a 1 MB dotted line hours). Atomic as ``(?=(?P<g>X))(?P=g)`` (a lookahead takes
# the longest X once, the backreference consumes exactly it) rather than the possessive ``X++``, which needs Python
# 3.11: on 3.10 (setup.py's floor) ``re`` refuses it ("multiple repeat") and every build_indexed run stopped.
_EN_END = (r"(?<![.!?])(?=(?P<en_stops>[.!?]+))(?P=en_stops)(?=(?P<en_close>[\"'”’)\]]*))(?P=en_close)"
           r"(?=\s+[\"'“‘(\[]?[A-Z0-9" + _CJK + r"])")
# ASCII ! or ? followed directly by a CJK character also ends a sentence (mixed text: "好!下一句"); linear likewise.
_MIXED_END = r"(?<![!?])(?=(?P<mixed_stops>[!?]+))(?P=mixed_stops)(?=[" + _CJK + r"])"
_BOUNDARY = re.compile(f"{_ZH_END}|{_EN_END}|{_MIXED_END}")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.")


def _word_before(text: str, end: int) -> str | None:
    """The word that ends at ``end``: letters and dots, starting with a letter (what the regex
    ``[A-Za-z][A-Za-z.]*$`` finds in ``text[:end]``), found by scanning back from ``end``. The regex search tried
    every start from 0, so a line of n sentences cost O(n^2) (a 220 kB line of short sentences: 80 s)."""
    if end and text[end - 1] == "\n":  # `$` also matched before a final newline
        end -= 1
    start = end
    while start and text[start - 1] in _WORD_CHARS:
        start -= 1
    while start < end and text[start] == ".":
        start += 1
    return text[start:end] if start < end else None


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
