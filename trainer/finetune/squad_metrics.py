"""SQuAD's and CMRC 2018's answer scores, and the SQuAD 2.0 null-answer threshold, as their official scripts compute.

English (SQuAD v1.1 / v2.0 ``evaluate`` scripts): answers are normalised (lower case, punctuation removed, the
articles a/an/the removed, whitespace folded); exact match compares the normalised strings, F1 the bags of their
words; an empty gold (v2.0 unanswerable) only matches an empty prediction. The score of a question is the maximum
over its gold answers. v1.1 (no ``is_impossible`` question) is scored by v1.1's own script, which differs on
answers that normalise to nothing: it keeps such golds (gold "the", prediction "a": exact match) and its F1 scores
two empty answers 0.

Chinese (CMRC 2018's script, used for DRCD too): text is cut into single CJK characters and the words of the runs
between them, its punctuation list removed; F1 uses the longest common *substring* of the two segment lists; exact
match compares the strings with that punctuation removed. The runs are split by nltk's Treebank word tokenizer
(``NLTKWordTokenizer``, what the script's ``word_tokenize`` applies to each sentence; it needs no downloaded data), so
``$``, ``%`` and brackets are words of their own as in the script ('20%' against '约20%' scores 0.8, not the 0.667 a
whitespace split gives). It differs from ``word_tokenize`` only where one run holds several sentences (punkt would
split a period off each, not only the last).

``best_threshold`` is the official v2.0 script's ``find_best_thresh``: questions sorted by their no-answer score
(null score - best span score), switching each from "no answer" to its best span in that order, the threshold
keeping the best total.
"""
from __future__ import annotations

import functools
import re
import string
from collections import Counter
from typing import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)
CJK = re.compile(r"[\u4e00-\u9fa5]")
# CMRC 2018's sp_char list, verbatim
CMRC_PUNCT = {"-", ":", "_", "*", "^", "/", "\\", "~", "`", "+", "=", "，", "。", "：", "？", "！", "“", "”", "；", "’",
              "《", "》", "……", "·", "、", "「", "」", "（", "）", "－", "～", "『", "』"}


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_en(gold: str, pred: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(pred))


def f1_en(gold: str, pred: str) -> float:
    g, p = _tokens(gold), _tokens(pred)
    if not g or not p:
        return float(g == p)
    same = sum((Counter(g) & Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


@functools.lru_cache(maxsize=1)
def _word_tokenizer():
    try:
        from nltk.tokenize import NLTKWordTokenizer
    except ImportError:
        raise ImportError("CMRC 2018 / DRCD scores need nltk (pip install -e '.[eval]', or pip install nltk)") from None
    return NLTKWordTokenizer()


def _words(run: str) -> list[str]:
    return _word_tokenizer().tokenize(run) if run.strip() else []


def mixed_segmentation(s: str) -> list[str]:
    """CMRC 2018's segments: each CJK character alone, the runs between them split into words as nltk does;
    punctuation dropped."""
    out, run = [], ""
    for ch in str(s).lower().strip():
        if ch in CMRC_PUNCT:
            continue
        if CJK.match(ch):
            out += _words(run)
            run = ""
            out.append(ch)
        else:
            run += ch
    return out + _words(run)


def _remove_punctuation(s: str) -> str:
    return "".join(ch for ch in str(s).lower().strip() if ch not in CMRC_PUNCT)


def _longest_common_substring(a: list[str], b: list[str]) -> int:
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                cur[j + 1] = prev[j] + 1
                best = max(best, cur[j + 1])
        prev = cur
    return best


def exact_zh(gold: str, pred: str) -> float:
    return float(_remove_punctuation(gold) == _remove_punctuation(pred))


def f1_zh(gold: str, pred: str) -> float:
    g, p = mixed_segmentation(gold), mixed_segmentation(pred)
    common = _longest_common_substring(g, p)
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


SCORERS = {"squad": (exact_en, f1_en), "cmrc": (exact_zh, f1_zh)}


def f1_v1(gold: str, pred: str) -> float:
    """SQuAD v1.1's ``f1_score``: no case for empty answers, so two that normalise to nothing score 0 (v2.0: 1)."""
    g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
    same = sum((Counter(g) & Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def score(golds: Sequence[str], pred: str, style: str = "squad", version2: bool = True) -> tuple[float, float]:
    """(exact, f1) of one prediction: the best over the gold answers ([''] for an unanswerable question). SQuAD
    v1.1 (``version2`` False) as its own script: every gold kept, even one that normalises to nothing (gold "the"
    and prediction "a" match exactly), and its F1; v2.0 drops such golds first."""
    if style == "squad" and not version2:
        golds = list(golds) or [""]
        return max(exact_en(g, pred) for g in golds), max(f1_v1(g, pred) for g in golds)
    exact, f1 = SCORERS[style]
    golds = [g for g in golds if (normalize_answer(g) if style == "squad" else _remove_punctuation(g))] or [""]
    return max(exact(g, pred) for g in golds), max(f1(g, pred) for g in golds)


def best_threshold(span_scores: dict[str, float], has_answer: dict[str, bool], span_nonempty: dict[str, bool],
                   null_margin: dict[str, float]) -> tuple[float, float]:
    """The official ``find_best_thresh``: (best mean score, threshold). ``span_scores``: each question's score (exact
    or F1) if its best span is answered; ``null_margin``: null score - best span score (answer when <= threshold)."""
    current = best = sum(1 for q in has_answer if not has_answer[q])
    threshold = 0.0
    for q in sorted(null_margin, key=lambda k: null_margin[k]):
        if has_answer[q]:
            current += span_scores[q]
        elif span_nonempty[q]:
            current -= 1
        if current > best:
            best, threshold = current, null_margin[q]
    return best / len(span_scores), threshold


def squad_scores(golds: dict[str, list[str]], spans: dict[str, str], null_margin: dict[str, float] | None,
                 style: str = "squad") -> dict[str, float]:
    """exact_match and f1 over all questions. v1 (``null_margin`` None): the best spans as predicted, scored by
    v1.1's rules (``score``). v2: the best
    spans with "no answer" wherever null_margin > the threshold that maximises each score on these questions (the
    official script's best_exact / best_f1, which BERT tunes on dev), plus the scores at threshold 0 and the
    thresholds themselves."""
    per = {q: score(golds[q], spans[q], style, version2=null_margin is not None) for q in golds}
    if null_margin is None:
        return {"f1": _mean(f for _, f in per.values()), "exact_match": _mean(e for e, _ in per.values())}
    has = {q: bool([g for g in golds[q] if g.strip()]) for q in golds}
    nonempty = {q: bool(spans[q].strip()) for q in golds}
    em, em_t = best_threshold({q: per[q][0] for q in golds}, has, nonempty, null_margin)
    f1, f1_t = best_threshold({q: per[q][1] for q in golds}, has, nonempty, null_margin)
    at0 = {q: per[q] if null_margin[q] <= 0 else (float(not has[q]), float(not has[q])) for q in golds}
    return {"f1": f1, "exact_match": em, "f1_threshold0": _mean(f for _, f in at0.values()),
            "exact_match_threshold0": _mean(e for e, _ in at0.values()), "f1_null_threshold": f1_t,
            "exact_match_null_threshold": em_t}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
