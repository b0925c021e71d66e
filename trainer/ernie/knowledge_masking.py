"""ERNIE 1.0 knowledge masking: basic-level -> phrase-level -> entity-level, every unit of a chosen span together.

A *unit* is what gets masked as one: at the basic level a word (a Han character for the `zh` tokenizer, a whole word
of WordPiece/BPE pieces elsewhere, from the tokenizer's ``word_start`` table), at the phrase level additionally every
phrase span of the side-car (``data_prep/annotate.py``) is one unit, at the entity level phrase and entity spans both
are (the stages are cumulative: a model that has learned phrases keeps seeing them while entities are added). The
stage is a function of the optimizer step, set in the recipe (``stages: [{level: basic, start_step: 0}, ...]``), and
a sample knows its step from its global position (``step = position // global_batch``), so a sample stays a pure
function of (seed, epoch, index).

Selection is vectorised over the whole ``[B, T]`` batch with no per-token Python loop: every unit draws a random key,
tokens are sorted by their unit's key (a unit's tokens end up adjacent), and the units are scanned in that order,
each taken when it fits what is left of the row's budget ``min(max_predictions, round(rate * candidates))`` and
skipped otherwise (``trainer.data.masking.greedy_fit``: "shuffle the units, take each that fits", the rule of BERT's
whole-word masking, which ``continue``s past a word that does not fit; stopping at the first one left 54 % of the rows
short of the budget, 2.2 % fewer predictions on phrase/entity units, measured by review on 2026-12-06). Selected tokens
are replaced 80/10/10 ([MASK] / random non-special token / kept) per token.

Written here rather than taken from ``trainer/data``'s strategies because those build units from the token ids
alone; knowledge units come from side-car spans, which need their own merge step (``unit_ids``).
"""
from __future__ import annotations

import numpy as np

from trainer.ernie.config import KnowledgeMaskingConfig, KnowledgeStage  # noqa: F401  (re-exported)
from trainer.data.masking import greedy_fit

LEVELS = ("basic", "phrase", "entity")
# Side-car kinds merged into units at each level (data_prep.annotate: 0 = entity, 1 = phrase).
LEVEL_KINDS = {"basic": (), "phrase": (1,), "entity": (0, 1)}


def unit_ids(word_start: np.ndarray, candidate: np.ndarray, spans: np.ndarray, level: str) -> np.ndarray:
    """Masking units of a batch: ``int64 [B, T]``, -1 where not a candidate, else an id unique within the row.

    ``word_start`` [B, T] bool (the tokenizer's table looked up at the ids), ``candidate`` [B, T] bool (real,
    non-special tokens), ``spans`` ``[k, 4]`` rows (row, start, end exclusive, kind) in batch coordinates. Example,
    one row ``[CLS] 李 小 龙 在 北 京 [SEP]`` with an entity span (1, 4): basic units 0 1 2 3 4 5 -> entity level
    ``-1 0 0 0 1 2 3 -1``.
    """
    B, T = word_start.shape
    is_start = word_start.astype(bool).copy()
    kinds = LEVEL_KINDS[level]
    if kinds and len(spans):
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
        keep = spans[:, 2] - spans[:, 1] > 1
        if len(kinds) == 1:  # (comparisons, not np.isin: this runs once per sample and isin costs ~40 us)
            keep &= spans[:, 3] == kinds[0]
        spans = spans[keep]
        # Difference array: +1 after each span's first token, -1 at its end; a positive running sum marks tokens
        # inside a span (not its first), which therefore continue the unit. Overlapping spans merge into one unit.
        row = spans[:, 0] * (T + 1)
        diff = (np.bincount(row + spans[:, 1] + 1, minlength=B * (T + 1))
                - np.bincount(row + spans[:, 2], minlength=B * (T + 1))).reshape(B, T + 1)
        inside = np.cumsum(diff[:, :T], axis=1) > 0
        is_start[spans[:, 0], spans[:, 1]] = True
        is_start &= ~inside
    # A candidate right after a non-candidate always opens a unit (a stray continuation piece after [SEP]).
    prev_cand = np.zeros_like(candidate)
    prev_cand[:, 1:] = candidate[:, :-1]
    is_start |= candidate & ~prev_cand
    is_start &= candidate
    ids = np.cumsum(is_start, axis=1) - 1
    return np.where(candidate, ids, -1)


def select_units(units: np.ndarray, budget: np.ndarray, rng: np.random.Generator | None,
                 keys: np.ndarray | None = None) -> np.ndarray:
    """Shuffle each row's units and take each that fits what is left of ``budget`` [B]. -> bool [B, T].

    Works on the flat list of candidate tokens: one sort by (row + the unit's random key in [0, 1)) groups rows,
    then units in random order, a unit's tokens adjacent in position order; ``greedy_fit`` scans the units' sizes in
    that order. Example, one row, units [0, 0, 1, 2] with keys [.7, .2, .5] and budget 2: order 1 | 2 | 0 0 ->
    units 1 and 2 taken (2 tokens), unit 0 (2 more) not; with keys [.1, .2, .5], unit 0 first (2 tokens), then
    1 and 2 skipped.
    About 15 numpy calls per batch whatever B is, so one row costs ~100 us and a 64-row batch barely more.
    """
    B, T = units.shape
    selected = np.zeros(B * T, bool)
    if keys is None:
        keys = rng.random((B, T + 1))  # one key per possible unit id (< T) of every row
    flat = np.flatnonzero(units.ravel() >= 0)
    if len(flat) == 0:
        return selected.reshape(B, T)
    row = flat // T
    unit = units.ravel()[flat]
    order = np.argsort(keys[row, unit] + row, kind="stable")
    r, u = row[order], unit[order]
    last = np.ones(len(order), bool)  # last token of its (row, unit) group in sorted order
    last[:-1] = (u[1:] != u[:-1]) | (r[1:] != r[:-1])
    group = np.cumsum(last) - last  # group index of every sorted token
    sizes = np.bincount(group, minlength=int(last.sum()))
    taken = greedy_fit(sizes, r[last], np.asarray(budget, np.int64))  # rows ascending: sorted by row first
    selected[flat[order[taken[group]]]] = True
    return selected.reshape(B, T)


def knowledge_mask(input_ids: np.ndarray, candidate: np.ndarray, word_start: np.ndarray, spans: np.ndarray,
                   level: str, cfg: KnowledgeMaskingConfig, mask_id: int, random_ids: np.ndarray,
                   rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Mask a batch ``[B, T]`` at ``level``; returns ``input_ids`` (corrupted copy), ``mlm_positions`` and
    ``mlm_labels`` ``[B, P]`` (P = max_predictions_per_seq, padded with 0 / -100) as DESIGN.md's batch contract,
    and ``selected`` [B, T] bool. ``random_ids``: the ids a random replacement draws from (non-special tokens)."""
    B, T = input_ids.shape
    keys = rng.random((B, T + 1))
    return _mask(input_ids, candidate, word_start, spans, level, cfg, mask_id, keys,
                 lambda: rng.random(input_ids.shape),
                 lambda to_rand: random_ids[rng.integers(0, len(random_ids), size=int(to_rand.sum()))])


def knowledge_mask_rows(rows: list[np.ndarray], spans: list[np.ndarray], level: str, cfg: KnowledgeMaskingConfig,
                        mask_id: int, random_ids: np.ndarray, rngs: list[np.random.Generator],
                        is_special: np.ndarray, word_start: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Mask several rows in one vectorised pass, row b with its own generator ``rngs[b]``: equal, row for row, to
    ``knowledge_mask`` of that row alone (same draws in the same order), so a sample stays a function of its own
    index while a DataLoader batch is masked at batch speed. ``spans[b]``: [k, 3] in row coordinates; ``is_special``
    and ``word_start`` are vocabulary tables. Returns per row ``input_ids`` [L], ``mlm_positions`` / ``mlm_labels``
    [k] (the real predictions only)."""
    B = len(rows)
    lengths = np.fromiter((len(r) for r in rows), np.int64, count=B)
    T = int(lengths.max()) if B else 0
    ids = np.zeros((B, T), np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
    real = np.arange(T)[None, :] < lengths[:, None]
    candidate = real & ~is_special[ids]
    span_rows = [np.concatenate([np.full((len(sp), 1), b), np.asarray(sp).reshape(-1, 3)], axis=1)
                 for b, sp in enumerate(spans) if len(sp)]
    flat_spans = np.concatenate(span_rows) if span_rows else np.zeros((0, 4), np.int64)
    keys = np.zeros((B, T + 1))
    for b in range(B):  # the draws each row makes alone, in the same order: keys, then uniforms, then random ids
        keys[b, :lengths[b] + 1] = rngs[b].random(int(lengths[b]) + 1)

    def uniforms():
        u = np.ones((B, T))
        for b in range(B):
            u[b, :lengths[b]] = rngs[b].random(int(lengths[b]))
        return u

    def replacements(to_rand):
        counts = to_rand.sum(axis=1)
        return np.concatenate([random_ids[rngs[b].integers(0, len(random_ids), size=int(counts[b]))]
                               for b in range(B)]) if B else np.zeros(0, np.int64)

    out = _mask(ids, candidate, word_start[ids], flat_spans, level, cfg, mask_id, keys, uniforms, replacements)
    result = []
    for b in range(B):
        keep = out["mlm_labels"][b] != -100
        result.append({"input_ids": out["input_ids"][b, :lengths[b]], "mlm_positions": out["mlm_positions"][b][keep],
                       "mlm_labels": out["mlm_labels"][b][keep]})
    return result


def _mask(input_ids, candidate, word_start, spans, level, cfg, mask_id, keys, uniforms, replacements) -> dict:
    units = unit_ids(word_start, candidate, spans, level)
    n_cand = candidate.sum(axis=1)
    budget = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.rint(cfg.rate * n_cand))).astype(np.int64)
    budget = np.where(n_cand > 0, budget, 0)
    selected = select_units(units, budget, None, keys)
    out = input_ids.copy()
    u = uniforms()
    to_mask = selected & (u < cfg.mask_prob)
    to_rand = selected & (u >= cfg.mask_prob) & (u < cfg.mask_prob + cfg.random_prob)
    out[to_mask] = mask_id
    out[to_rand] = replacements(to_rand)
    P = cfg.max_predictions_per_seq
    B, T = input_ids.shape
    order = np.argsort(~selected, axis=1, kind="stable")[:, :P]  # selected positions first, in position order
    if order.shape[1] < P:
        order = np.pad(order, ((0, 0), (0, P - order.shape[1])))
    rows = np.arange(B)[:, None]
    valid = selected[rows, order] if T else np.zeros((B, P), bool)
    positions = np.where(valid, order, 0)
    labels = np.where(valid, input_ids[rows, positions], -100)
    return {"input_ids": out, "mlm_positions": positions.astype(np.int64), "mlm_labels": labels.astype(np.int64),
            "selected": selected}
