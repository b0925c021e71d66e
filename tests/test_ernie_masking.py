"""ERNIE 1.0 knowledge masking: units masked whole, the stage schedule, selection rate and the 80/10/10 split."""
import math

import numpy as np
import pytest
from pydantic import ValidationError

from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig, knowledge_mask, select_units, unit_ids

MASK = 4
RANDOM_IDS = np.arange(10, 1000)


def _cfg(**kw):
    stages = kw.pop("stages", [{"level": "basic", "start_step": 0}])
    return KnowledgeMaskingConfig(stages=stages, **kw)


def _random_spans(rng, B, T, kind, max_len=4):
    """Non-overlapping spans of one kind, inside [1, T-1) (position 0 and T-1 are [CLS]/[SEP])."""
    rows = []
    for b in range(B):
        pos = 1
        while True:
            pos += int(rng.integers(0, 6))
            length = int(rng.integers(2, max_len + 1))
            if pos + length > T - 1:
                break
            rows.append((b, pos, pos + length, kind))
            pos += length
    return np.array(rows, np.int64).reshape(-1, 4)


def _batch(B=256, T=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 1000, size=(B, T))
    cand = np.ones((B, T), bool)
    cand[:, 0] = cand[:, -1] = False
    return ids, cand, np.ones((B, T), bool), rng


def test_stage_schedule_switches_at_configured_steps():
    cfg = _cfg(stages=[{"level": "basic", "start_step": 0}, {"level": "phrase", "start_step": 100},
                       {"level": "entity", "start_step": 250}])
    assert [cfg.level_at(s) for s in (0, 99, 100, 249, 250, 10**7)] == \
        ["basic", "basic", "phrase", "phrase", "entity", "entity"]
    with pytest.raises(ValidationError, match="start_step must be 0"):
        _cfg(stages=[{"level": "phrase", "start_step": 5}])
    with pytest.raises(ValidationError, match="must increase strictly"):
        _cfg(stages=[{"level": "basic", "start_step": 0}, {"level": "entity", "start_step": 0}])


def test_unit_ids_worked_example():
    # [CLS] 李 小 龙 在 北 京 [SEP], entity 李小龙 (1, 4), phrase 北京 (5, 7)
    ws = np.ones((1, 8), bool)
    cand = np.array([[0, 1, 1, 1, 1, 1, 1, 0]], bool)
    spans = np.array([[0, 1, 4, 0], [0, 5, 7, 1]])
    assert unit_ids(ws, cand, spans, "basic").tolist() == [[-1, 0, 1, 2, 3, 4, 5, -1]]
    assert unit_ids(ws, cand, spans, "phrase").tolist() == [[-1, 0, 1, 2, 3, 4, 4, -1]]
    assert unit_ids(ws, cand, spans, "entity").tolist() == [[-1, 0, 0, 0, 1, 2, 2, -1]]


@pytest.mark.parametrize("level", ["phrase", "entity"])
def test_phrase_and_entity_units_masked_whole(level):
    ids, cand, ws, rng = _batch()
    B, T = ids.shape
    spans = np.concatenate([_random_spans(rng, B, T, 0), _random_spans(rng, B, T, 1)])
    cfg = _cfg(max_predictions_per_seq=T)
    out = knowledge_mask(ids, cand, ws, spans, level, cfg, MASK, RANDOM_IDS, rng)
    sel = out["selected"]
    whole_kinds = {"phrase": (1,), "entity": (0, 1)}[level]
    partial = {0: 0, 1: 0}
    masked_spans = 0
    for b, s, e, k in spans.tolist():
        n = int(sel[b, s:e].sum())
        if k in whole_kinds:
            assert n in (0, e - s), f"{level}: span {(b, s, e, k)} partly masked ({n} of {e - s})"
            masked_spans += n > 0
        else:
            partial[k] += 0 < n < e - s
    assert masked_spans > B // 2  # spans really were chosen, not all skipped
    if level == "phrase":
        assert partial[0] > 0  # entities are not yet units at the phrase level: some are cut
    assert not sel[~cand].any()


def test_basic_level_masks_whole_words_and_hits_the_budget_exactly():
    ids, cand, _, rng = _batch(B=512)
    B, T = ids.shape
    # English-like: every third token continues a word (a '##' piece).
    ws = np.ones((B, T), bool)
    ws[:, 2::3] = False
    spans = _random_spans(rng, B, T, 0)  # ignored at the basic level
    cfg = _cfg(max_predictions_per_seq=T)
    sel = knowledge_mask(ids, cand, ws, spans, "basic", cfg, MASK, RANDOM_IDS, rng)["selected"]
    units = unit_ids(ws, cand, spans, "basic")
    for b in range(0, B, 7):
        for u in np.unique(units[b][units[b] >= 0]):
            assert len(set(sel[b][units[b] == u].tolist())) == 1
    budget = round(0.15 * (T - 2))
    counts = sel.sum(1)
    assert counts.max() <= budget and counts.min() >= budget - 1  # units of 1 or 2 tokens: short by < 2


def test_selection_rate_with_long_units_and_max_predictions_cap():
    ids, cand, ws, rng = _batch(B=1000, T=128)
    B, T = ids.shape
    spans = _random_spans(rng, B, T, 0, max_len=5)
    cfg = _cfg(rate=0.15, max_predictions_per_seq=T)
    counts = knowledge_mask(ids, cand, ws, spans, "entity", cfg, MASK, RANDOM_IDS, rng)["selected"].sum(1)
    budget = round(0.15 * (T - 2))
    # never above the budget, and short of it by less than the longest unit
    assert counts.max() <= budget and counts.min() >= budget - 4
    assert counts.mean() / (T - 2) == pytest.approx(0.15, abs=0.02)
    capped = _cfg(rate=0.15, max_predictions_per_seq=7)
    out = knowledge_mask(ids, cand, ws, spans, "entity", capped, MASK, RANDOM_IDS, rng)
    assert out["selected"].sum(1).max() <= 7 and out["mlm_positions"].shape == (B, 7)


def test_80_10_10_split_and_labels():
    ids, cand, ws, rng = _batch(B=2000)
    cfg = _cfg(max_predictions_per_seq=12)
    out = knowledge_mask(ids, cand, ws, np.zeros((0, 4)), "basic", cfg, MASK, RANDOM_IDS, rng)
    sel = out["selected"]
    n = int(sel.sum())
    masked = (out["input_ids"] == MASK) & sel
    changed = (out["input_ids"] != ids) & sel & ~masked
    kept = (out["input_ids"] == ids) & sel
    for observed, p in ((masked.sum(), 0.8), (changed.sum(), 0.1 * (1 - 1 / len(RANDOM_IDS))),
                        (kept.sum(), 0.1 + 0.1 / len(RANDOM_IDS))):
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(observed - n * p) < 5 * sigma, (observed, n * p)
    assert np.array_equal(out["input_ids"][~sel], ids[~sel])
    # positions/labels: the selected positions in order, padded with 0 / -100
    pos, lab = out["mlm_positions"], out["mlm_labels"]
    for b in range(0, len(ids), 97):
        want = np.flatnonzero(sel[b])
        k = len(want)
        assert pos[b, :k].tolist() == want.tolist() and lab[b, :k].tolist() == ids[b, want].tolist()
        assert (lab[b, k:] == -100).all() and (pos[b, k:] == 0).all()


def test_select_units_uniform_over_units():
    # One row, 10 single-token units, budget 1: every unit chosen about equally often.
    rng = np.random.default_rng(3)
    units = np.arange(10)[None, :].repeat(4000, 0)
    sel = select_units(units, np.ones(4000, np.int64), rng)
    assert (sel.sum(1) == 1).all()
    freq = sel.mean(0)
    assert np.all(np.abs(freq - 0.1) < 5 * math.sqrt(0.1 * 0.9 / 4000))


def test_select_units_skips_a_unit_that_does_not_fit_and_goes_on():
    """Phrase/entity units of 1-8 tokens over 510 positions, budget 76: a unit that no longer fits is skipped and
    the scan goes on (BERT's whole-word rule), so every row fills its budget exactly; stopping at the first misfit
    left about half the rows short (review of 2026-12-06)."""
    rng = np.random.default_rng(0)
    B, T = 200, 510
    units = np.full((B, T), -1, np.int64)
    for b in range(B):
        pos, u = 0, 0
        while pos < T:
            n = int(rng.integers(1, 9))
            units[b, pos:pos + n] = u
            pos, u = pos + n, u + 1
    sel = select_units(units, np.full(B, 76, np.int64), rng)
    assert (sel.sum(1) == 76).all(), np.mean(sel.sum(1) == 76)
    for b in range(B):  # units whole
        chosen = set(units[b][sel[b]].tolist())
        assert sel[b][np.isin(units[b], list(chosen))].all()


def test_entities_from_jieba_masked_whole_on_chinese_corpus(tmp_path, zh_corpus):
    from test_annotate import _zh_tokenizer_dir
    from tokenizers import Tokenizer

    from data_prep import annotate

    tok_dir = _zh_tokenizer_dir(tmp_path, zh_corpus)
    hf = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    sents = [l for l in zh_corpus.read_text(encoding="utf-8").splitlines()[:3000] if len(l) > 12][:300]
    doc = annotate.DocumentAnnotator(annotate.make_annotator("jieba"), tok_dir)
    per_sent = doc(sents)
    T = 2 + max(len(hf.encode(s, add_special_tokens=False).ids) for s in sents)
    B = len(sents)
    ids = np.zeros((B, T), np.int64)
    cand = np.zeros((B, T), bool)
    rows = []
    for b, (s, spans) in enumerate(zip(sents, per_sent)):
        enc = hf.encode(s, add_special_tokens=False).ids
        ids[b, 0], ids[b, 1:1 + len(enc)], ids[b, 1 + len(enc)] = 2, enc, 3
        cand[b, 1:1 + len(enc)] = True
        placed = annotate.place_spans([spans], [1], [len(enc)])
        rows.append(np.concatenate([np.full((len(placed), 1), b), placed], axis=1))
    spans = np.concatenate(rows)
    assert (spans[:, 3] == 0).sum() > 30
    rng = np.random.default_rng(0)
    sel = knowledge_mask(ids, cand, np.ones_like(cand), spans, "entity", _cfg(max_predictions_per_seq=T), MASK,
                         RANDOM_IDS, rng)["selected"]
    whole = 0
    for b, s, e, k in spans.tolist():
        n = int(sel[b, s:e].sum())
        assert n in (0, e - s)
        whole += n == e - s and e - s > 1
    assert whole > 10


def test_rows_masked_together_equal_rows_masked_alone():
    """knowledge_mask_rows (the DataLoader batch path) gives each row exactly what masking it alone gives."""
    from trainer.ernie.knowledge_masking import knowledge_mask_rows

    rng = np.random.default_rng(5)
    V = 1000
    is_special = np.zeros(V, bool)
    is_special[:5] = True
    ws = rng.random(V) < 0.7
    rows, spans = [], []
    for b in range(24):
        L = int(rng.integers(3, 60))
        rows.append(np.r_[2, rng.integers(5, V, L - 2), 3])
        s = _random_spans(rng, 1, L, int(b % 2), max_len=4)[:, 1:] if L > 8 else np.zeros((0, 3), np.int64)
        spans.append(s)
    cfg = _cfg(max_predictions_per_seq=12)
    for level in ("basic", "phrase", "entity"):
        together = knowledge_mask_rows(rows, spans, level, cfg, MASK, RANDOM_IDS,
                                       [np.random.default_rng(100 + b) for b in range(24)], is_special, ws)
        for b, (r, s) in enumerate(zip(rows, spans)):
            ids = r[None]
            sp = np.concatenate([np.zeros((len(s), 1), np.int64), s], axis=1)
            alone = knowledge_mask(ids, ~is_special[ids], ws[ids], sp, level, cfg, MASK, RANDOM_IDS,
                                   np.random.default_rng(100 + b))
            keep = alone["mlm_labels"][0] != -100
            assert np.array_equal(together[b]["input_ids"], alone["input_ids"][0])
            assert np.array_equal(together[b]["mlm_positions"], alone["mlm_positions"][0][keep])
            assert np.array_equal(together[b]["mlm_labels"], alone["mlm_labels"][0][keep])
