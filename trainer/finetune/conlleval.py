"""Entity-level scores as CoNLL's ``conlleval`` script counts them, and the tag schemes (BIO, IOB1, BIOES).

An entity (chunk) is a maximal run of tags that conlleval's ``startOfChunk``/``endOfChunk`` rules group together; it
is correct only when the predicted chunk has the same type and both the same start and end as a gold chunk. So
``I-PER`` after ``O`` (or at a sentence start) starts a chunk, as in IOB1; ``I-LOC`` after ``I-PER`` ends one chunk
and starts another; BIOES's ``E-``/``S-`` close chunks. Precision, recall and F1 are micro-averaged over all chunks
(conlleval's "overall" line); token accuracy counts every token. Scores are fractions (conlleval prints percent).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

SCHEMES = {"bio": ("B", "I"), "iob1": ("B", "I"), "bioes": ("B", "I", "E", "S")}
"""The prefixes each scheme allows before ``-TYPE`` (``O`` is always allowed)."""


def split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '')."""
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def check_tag(tag: str, scheme: str) -> str | None:
    """None if ``tag`` belongs to ``scheme``, else why not."""
    if tag == "O":
        return None
    prefix, sep, kind = tag.partition("-")
    if not sep or not kind:
        return f"tag {tag!r} is neither O nor PREFIX-TYPE"
    if prefix not in SCHEMES[scheme]:
        return f"tag {tag!r} has prefix {prefix!r}, outside the {scheme.upper()} scheme ({', '.join(SCHEMES[scheme])})"
    return None


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag != "O" and prev_type != kind))


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag != "O" and prev_type != kind))


def chunks(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(start, end inclusive, type) of every chunk in one sentence's tags, by conlleval's rules."""
    out, start = set(), None
    prev_tag, prev_type = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        t, kind = split_tag(tag)
        if start is not None and _end_of_chunk(prev_tag, t, prev_type, kind):
            out.add((start, i - 1, prev_type))
            start = None
        if _start_of_chunk(prev_tag, t, prev_type, kind):
            start = i
        prev_tag, prev_type = t, kind
    return out


def evaluate(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], types: Sequence[str] = ()
             ) -> dict[str, float]:
    """precision, recall, f1 (micro over chunks), accuracy (tokens), and ``f1_<TYPE>`` per type: every one of
    ``types`` (0 when neither gold nor predictions hold it) and any other gold or predicted type. conlleval prints
    only the types it meets, so runs of one sweep would report different keys (a type in train but not in dev shows
    up only where a run predicts it)."""
    correct, found_gold, found_pred = Counter(), Counter(), Counter()
    right_tokens = total_tokens = 0
    for g, p in zip(gold, pred, strict=True):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags and {len(p)} predicted")
        gc, pc = chunks(g), chunks(p)
        for c in gc:
            found_gold[c[2]] += 1
        for c in pc:
            found_pred[c[2]] += 1
        for c in gc & pc:
            correct[c[2]] += 1
        right_tokens += sum(a == b for a, b in zip(g, p))
        total_tokens += len(g)

    def prf(c: int, fp: int, fg: int) -> tuple[float, float, float]:
        precision = c / fp if fp else 0.0
        recall = c / fg if fg else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1

    p, r, f = prf(sum(correct.values()), sum(found_pred.values()), sum(found_gold.values()))
    out = {"f1": f, "precision": p, "recall": r, "accuracy": right_tokens / total_tokens if total_tokens else 0.0}
    for kind in sorted(set(types) | set(found_gold) | set(found_pred)):
        out[f"f1_{kind}"] = prf(correct[kind], found_pred[kind], found_gold[kind])[2]
    return out
