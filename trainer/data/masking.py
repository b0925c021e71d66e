"""Masked-LM corruption of one sample: which tokens are predicted, and what the model sees in their place.

Every strategy is the same three vectorised steps over one sample (no Python loop over tokens):

1. *Units*: the non-special tokens grouped into units: single tokens (``token``) or words (``whole-word``,
   ``ngram``, ``span``; a word starts where the tokenizer's ``word_start`` table says so, or after a special token).
2. *Tiles*: the unit sequence is cut into consecutive tiles whose lengths (in units) are drawn i.i.d. from the
   strategy's distribution: always 1 (token, whole-word), p(n) ∝ 1/n for n <= max_ngram (ALBERT: 6/11, 3/11, 2/11
   for n = 1, 2, 3), or geometric(p) clipped at max_span (SpanBERT).
3. *Selection*: tiles are scanned in a random order, each taken if it fits what is left of the budget
   ``min(max_predictions_per_seq, max(1, round(rate * non_special_tokens)))`` and skipped otherwise.

Tiling instead of ALBERT's "draw an n-gram at a random start, reject it if it overlaps" gives non-overlapping
n-grams in O(L) numpy without a rejection loop, and the tile lengths follow p(n) exactly; like ALBERT's loop, the
selection step skips a tile that no longer fits and goes on (so it slightly favours short tiles near the budget, and
fills the budget whenever enough short tiles remain). N-grams
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
        return self.mask_batch([tokens], [rng])[0]

    def draws(self, rng: np.random.Generator, num_tokens: int) -> np.ndarray:
        """All the randomness masking a sample of ``num_tokens`` tokens uses: [k, num_tokens] uniforms."""
        return rng.random((4 if len(self.tile_lengths) > 1 else 3, num_tokens))

    def mask_batch(self, rows: list[np.ndarray], rngs: list[np.random.Generator] | None = None,
                   draws: list[np.ndarray] | None = None) -> list[MaskedSample]:
        """Mask B samples in one vectorised pass over their concatenation; sample i's result depends only on its
        tokens and its generator ``rngs[i]`` (or its ``draws(rng, len)``, taken earlier), so batching never changes
        a sample. Per sample: one generator call; everything else is ~30 numpy calls per *batch*."""
        cfg = self.cfg
        lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        flat = np.concatenate(rows).astype(np.int64, copy=False) if len(rows) > 1 else np.asarray(rows[0], np.int64)
        B, N = len(rows), len(flat)
        starts = np.zeros(B, np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        sample_of = np.repeat(np.arange(B), lens)
        # per-sample draws: one generator call per sample (k uniforms per token, always the same size for a sample)
        multi = len(self.tile_lengths) > 1
        if draws is None:
            draws = [self.draws(g, n) for g, n in zip(rngs, lens)]
        u = np.concatenate(draws, axis=1) if len(draws) > 1 else draws[0]
        u_order, u_act = u[0], u[1]
        u_rand = (u[2] * len(self.random_pool)).astype(np.int64)  # uniform index into the random pool
        u_len = u[3] if multi else None

        # 1. units
        candidate = ~self.is_special[flat]
        if self.word_start is None:
            unit_start = candidate
        else:
            after_special = np.ones(N, dtype=bool)
            after_special[1:] = ~candidate[:-1]
            after_special[starts] = True
            unit_start = candidate & (self.word_start[flat] | after_special)
        cand_pos = np.flatnonzero(candidate)
        unit_ids = np.cumsum(unit_start) - 1
        unit_of_cand = unit_ids[cand_pos]
        num_units = int(unit_start.sum())
        if num_units == 0:  # no sample has a maskable token
            return [MaskedSample(np.asarray(r).astype(np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
                    for r in rows]
        unit_tokens = np.bincount(unit_of_cand, minlength=num_units)
        unit_pos = np.flatnonzero(unit_start)  # first token of each unit
        unit_sample = sample_of[unit_pos]
        units_per_sample = np.bincount(unit_sample, minlength=B)
        first_unit = np.zeros(B, np.int64)
        np.cumsum(units_per_sample[:-1], out=first_unit[1:])
        local_unit = np.arange(num_units) - first_unit[unit_sample]

        # 2. tiles (consecutive units; lengths from the strategy's distribution, drawn per tile index)
        if multi:
            lengths = self.draw_tile_lengths(u_len[starts[unit_sample] + local_unit])
            tile_start = tile_starts(lengths, unit_sample, first_unit, units_per_sample)
        else:
            tile_start = np.ones(num_units, dtype=bool)
        tile_of_unit = np.cumsum(tile_start) - 1
        num_tiles = int(tile_start.sum())
        tile_tokens = np.bincount(tile_of_unit, weights=unit_tokens, minlength=num_tiles).astype(np.int64)
        tile_sample = unit_sample[tile_start]
        tiles_per_sample = np.bincount(tile_sample, minlength=B)
        first_tile = np.zeros(B, np.int64)
        np.cumsum(tiles_per_sample[:-1], out=first_tile[1:])
        local_tile = np.arange(num_tiles) - first_tile[tile_sample]

        # 3. selection: tiles in random order (per-sample scores), each taken if it fits what is left of its sample's
        # budget, else skipped (BERT's whole-word and ALBERT's n-gram loops ``continue`` past a candidate that does
        # not fit; stopping at the first one predicted 7.7 % fewer tokens for albert_xxlarge, measured by review)
        cand_per_sample = np.bincount(sample_of[cand_pos], minlength=B)
        budget = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.round(cfg.rate * cand_per_sample)))
        score = tile_sample + u_order[starts[tile_sample] + local_tile] * 0.5  # sort by sample, then score
        order = np.argsort(score, kind="stable")
        tile_selected = np.zeros(num_tiles, dtype=bool)
        tile_selected[order[greedy_fit(tile_tokens[order], tile_sample[order], budget.astype(np.int64))]] = True
        selected = np.zeros(N, dtype=bool)
        selected[cand_pos] = tile_selected[tile_of_unit[unit_of_cand]]

        # 80/10/10, decided per selected token from its sample's draws at that token's position
        pos = np.flatnonzero(selected)
        labels = flat[pos]
        corrupted = flat.copy()
        act = u_act[pos]
        to_mask = act < cfg.mask_prob
        to_random = (act >= cfg.mask_prob) & (act < cfg.mask_prob + cfg.random_prob)
        corrupted[pos[to_mask]] = self.mask_id
        corrupted[pos[to_random]] = self.random_pool[u_rand[pos[to_random]]]

        counts = np.bincount(sample_of[pos], minlength=B)
        cuts = np.cumsum(counts)[:-1]
        local_pos = pos - starts[sample_of[pos]]
        return [MaskedSample(c, p, lab) for c, p, lab in zip(np.split(corrupted, np.cumsum(lens)[:-1]),
                                                               np.split(local_pos, cuts), np.split(labels, cuts))]

    def draw_tile_lengths(self, u: np.ndarray) -> np.ndarray:
        """Tile lengths (in units) from uniform draws, by inverse CDF of the strategy's distribution."""
        return self.tile_lengths[np.searchsorted(self.tile_cdf, u, side="right")]


def greedy_fit(sizes: np.ndarray, sample: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """bool [T]: the tiles a greedy scan takes, per sample in the given order (``sample`` sorted): a tile is taken
    when it fits what is left of its sample's ``budget``, else skipped and the scan goes on.

    Vectorised in rounds over all samples at once: a round drops the tiles larger than what is left (they can never
    fit later), takes the prefix of the open tiles that fits and skips the first that does not; the tiles after it
    stay open for the next round. Every round takes at least one tile of each sample that has open tiles, so there
    are at most ``max(budget) + 1`` rounds (2-4 in practice); the result is the sequential scan's exactly."""
    B = len(budget)
    left = budget.copy()
    taken = np.zeros(len(sizes), dtype=bool)
    open_ = np.ones(len(sizes), dtype=bool)
    ends = np.searchsorted(sample, np.arange(B), side="right")  # one past each sample's last tile
    while True:
        open_ &= sizes <= left[sample]
        if not open_.any():
            return taken
        running = np.cumsum(np.where(open_, sizes, 0))
        before = np.zeros(B, np.int64)
        before[1:] = np.where(ends[:-1] > 0, running[np.maximum(ends[:-1] - 1, 0)], 0)
        fit = open_ & (running - before[sample] <= left[sample])
        taken |= fit
        over = np.flatnonzero(open_ & ~fit)
        _, first = np.unique(sample[over], return_index=True)  # each sample's first tile that does not fit
        open_[fit] = False
        open_[over[first]] = False
        left -= np.bincount(sample[fit], weights=sizes[fit], minlength=B).astype(np.int64)


def tile_starts(lengths: np.ndarray, unit_sample: np.ndarray, first_unit: np.ndarray,
                units_per_sample: np.ndarray) -> np.ndarray:
    """bool [U]: which units start a tile, when sample s's k-th tile has length ``lengths[first_unit[s] + k]``.

    Tile k of a sample starts at the sum of its first k lengths (a segmented cumulative sum); the first unit of
    every sample starts a tile, so tiles never cross samples. The last tile of a sample may be cut short."""
    num_units = len(lengths)
    cum = np.cumsum(lengths)
    base = np.where(first_unit > 0, cum[np.maximum(first_unit - 1, 0)], 0)
    local_end = cum - base[unit_sample]  # end of tile k of the sample (k = local index of this entry)
    start_local = local_end - lengths
    keep = start_local < units_per_sample[unit_sample]
    out = np.zeros(num_units, dtype=bool)
    out[(first_unit[unit_sample] + start_local)[keep]] = True
    return out


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
