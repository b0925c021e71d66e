"""Masked-LM corruption of one sample: which tokens are predicted, and what the model sees in their place.

Every strategy is the same three vectorised steps over one sample (no Python loop over tokens):

1. *Units*: the non-special tokens grouped into units: single tokens (``token``) or words (``whole-word``,
   ``ngram``, ``span``; a word starts where the tokenizer's ``word_start`` table says so, or after a special token).
2. *Tiles*: the unit sequence is cut into consecutive tiles whose lengths (in units) are drawn i.i.d. from the
   strategy's distribution: always 1 (token, whole-word), p(n) ∝ 1/n for n <= max_ngram (ALBERT: 6/11, 3/11, 2/11
   for n = 1, 2, 3), or geometric(p) clipped at max_span (SpanBERT).
3. *Selection*: tiles are taken in a random order while the running token count stays within the budget
   ``min(max_predictions_per_seq, max(1, round(rate * non_special_tokens)))``.

Tiling instead of ALBERT's "draw an n-gram at a random start, reject it if it overlaps" gives non-overlapping
n-grams in O(L) numpy without a rejection loop, and the tile lengths follow p(n) exactly; like ALBERT's loop, the
selection step slightly favours short tiles near the budget (a long tile is the one that no longer fits). N-grams
may span a [SEP] (their units skip it; the special token itself is never selected), as in ALBERT.

Of the selected tokens, ``mask_prob`` become [MASK], ``random_prob`` a uniformly random non-special token, the
rest stay unchanged (BERT's 80/10/10), decided per token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import MaskingConfig


@dataclass
class MaskedSample:
    input_ids: np.ndarray  # [L] corrupted ids
    positions: np.ndarray  # [k] sorted positions of the predicted tokens
    labels: np.ndarray  # [k] their original ids


class Masker:
    """Corrupts token arrays according to a ``MaskingConfig`` and a tokenizer's special ids and word starts."""

    def __init__(self, cfg: MaskingConfig, vocab_size: int, mask_id: int, special_ids, word_start=None):
        self.cfg = cfg
        self.mask_id = int(mask_id)
        self.vocab_size = int(vocab_size)
        self.is_special = np.zeros(self.vocab_size, dtype=bool)
        self.is_special[np.asarray(list(special_ids), dtype=np.int64)] = True
        self.random_pool = np.flatnonzero(~self.is_special)  # random replacements are never special tokens
        if cfg.strategy == "token":
            self.word_start = None
        else:
            if word_start is None:
                raise ValueError(f"masking.strategy={cfg.strategy!r} needs the tokenizer's word_start table")
            self.word_start = np.asarray(word_start, dtype=bool)
            if len(self.word_start) < self.vocab_size:
                raise ValueError(f"word_start has {len(self.word_start)} entries for a vocabulary of {vocab_size}")
        self.tile_lengths, self.tile_probs = tile_distribution(cfg)
        self.tile_cdf = np.cumsum(self.tile_probs)[:-1]

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator) -> MaskedSample:
        tokens = np.asarray(tokens)
        candidate = ~self.is_special[tokens]
        num_candidates = int(candidate.sum())
        budget = min(self.cfg.max_predictions_per_seq, max(1, int(round(self.cfg.rate * num_candidates))))
        selected = self.select(tokens, candidate, budget, rng) if num_candidates else np.zeros(len(tokens), bool)
        positions = np.flatnonzero(selected)
        labels = tokens[positions]
        corrupted = tokens.copy()
        r = rng.random(len(positions))
        to_mask = r < self.cfg.mask_prob
        to_random = (r >= self.cfg.mask_prob) & (r < self.cfg.mask_prob + self.cfg.random_prob)
        corrupted[positions[to_mask]] = self.mask_id
        corrupted[positions[to_random]] = self.random_pool[rng.integers(0, len(self.random_pool),
                                                                         int(to_random.sum()))]
        return MaskedSample(corrupted, positions, labels)

    def select(self, tokens: np.ndarray, candidate: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        """Boolean [L]: the tokens chosen for prediction (steps 1-3 of the module docstring)."""
        if self.word_start is None:
            unit_start = candidate
        else:
            after_special = np.concatenate([[True], ~candidate[:-1]])
            unit_start = candidate & (self.word_start[tokens] | after_special)
        cand_pos = np.flatnonzero(candidate)
        unit_of_cand = np.cumsum(unit_start)[cand_pos] - 1  # unit id of each candidate token
        num_units = int(unit_of_cand[-1]) + 1
        unit_tokens = np.bincount(unit_of_cand, minlength=num_units)

        tile_of_unit, tile_tokens = self.tiles(unit_tokens, rng)
        order = rng.permutation(len(tile_tokens))
        fits = np.cumsum(tile_tokens[order]) <= budget
        tile_selected = np.zeros(len(tile_tokens), dtype=bool)
        tile_selected[order[fits]] = True

        selected = np.zeros(len(tokens), dtype=bool)
        selected[cand_pos] = tile_selected[tile_of_unit[unit_of_cand]]
        return selected

    def tiles(self, unit_tokens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(tile id of each unit, tokens per tile) for a random tiling of the units."""
        num_units = len(unit_tokens)
        if len(self.tile_lengths) == 1:  # every tile is one unit
            return np.arange(num_units), unit_tokens
        # inverse-CDF draw: ~4x cheaper than Generator.choice(p=...) on short arrays
        lengths = self.tile_lengths[np.searchsorted(self.tile_cdf, rng.random(num_units), side="right")]
        ends = np.cumsum(lengths)
        num_tiles = int(np.searchsorted(ends, num_units, side="left")) + 1
        tile_of_unit = np.repeat(np.arange(num_tiles), lengths[:num_tiles])[:num_units]
        return tile_of_unit, np.bincount(tile_of_unit, weights=unit_tokens, minlength=num_tiles).astype(np.int64)


def tile_distribution(cfg: MaskingConfig) -> tuple[np.ndarray, np.ndarray]:
    """Tile lengths (in units) and their probabilities for a strategy."""
    if cfg.strategy in ("token", "whole-word"):
        return np.array([1]), np.array([1.0])
    if cfg.strategy == "ngram":
        n = np.arange(1, cfg.max_ngram + 1)
        p = 1.0 / n
    else:  # span: geometric(p) on 1, 2, ... clipped at max_span (SpanBERT's renormalised truncation)
        n = np.arange(1, cfg.max_span + 1)
        p = cfg.span_p * (1 - cfg.span_p) ** (n - 1)
    return n, p / p.sum()
