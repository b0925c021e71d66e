"""ERNIE 1.0 sentence-pair rows for next-sentence prediction: BERT's ``segment-pair`` rows, with their side-car spans.

The released ERNIE 1.0 was trained on ``[CLS] A [SEP] B [SEP]`` pairs with the masked-LM loss plus a next-sentence
loss (PaddlePaddle/ERNIE ``reader/pretraining.py`` pairs a sample's A with another sample's segment for its negatives,
one per positive; ``model/ernie_v1.py`` sums ``mask_lm_loss`` and ``next_sent_loss``), knowledge-masking both
segments. The row here is exactly the one ``trainer.data.formats.SampleBuilder`` builds for ``data.format:
segment-pair`` (the same sample index, negatives decided there at ``data.nsp_negative_prob``, the same generator
draws: pivot or other-document start, then BERT's truncation), so a corpus prepared for BERT's NSP feeds ERNIE's. What
ERNIE adds is where each segment's sentences landed in the row, so the phrase / entity spans of both segments are
masked as units; a span cut by the truncation is dropped (its remaining tokens are masked as basic units).
"""
from __future__ import annotations

import numpy as np

from trainer.data.formats import SampleBuilder


def place_segment_spans(spans: np.ndarray, start: int, offsets: np.ndarray, kept: np.ndarray, row_offset: int
                        ) -> np.ndarray:
    """Spans of a segment's sentences (``start`` = its first sentence; ``offsets`` = IndexedCorpus.offsets of them)
    -> row positions [k, 3], when the truncation kept segment tokens ``kept`` (consecutive) and the segment begins at
    ``row_offset`` in the row. Spans not wholly kept are dropped."""
    if len(kept) == 0 or len(spans) == 0:
        return np.zeros((0, 3), np.int64)
    lo, hi = int(kept[0]), int(kept[-1]) + 1
    shift = offsets[spans[:, 0] - start]  # segment coordinates of each span's sentence
    first, last = spans[:, 1] + shift, spans[:, 2] + shift
    keep = (first >= lo) & (last <= hi)
    return np.stack([first[keep], last[keep], spans[keep, 3]], axis=1) + np.array([row_offset - lo] * 2 + [0])


def nsp_row(builder: SampleBuilder, spans, sample_id: int, rng: np.random.Generator, cls_id: int, sep_id: int
            ) -> dict:
    """(input_ids, token_type_ids, sentence_label, spans [k, 3]) of a ``segment-pair`` sample: the tokens, types and
    label ``builder(sample_id, rng)`` gives (label 1 = B from another document), with the generator left where it
    leaves it. ``spans``: the corpus's ``CorpusSpans`` (None: no side-car spans, the basic level)."""
    corpus = builder.corpus
    start, end, target = (int(x) for x in builder.index.sample_chunks(sample_id)[0])
    rng.random()  # SampleBuilder._pair's negative draw: made for every pair format, unused for NSP formats
    negative = target < 0
    if negative:  # A is the whole chunk, B sentences of another document (SampleBuilder._pair, NSP negatives)
        a_range = (start, end)
        a = corpus.read(start, end)
        b_range = builder.other_document_range(start, max(1, abs(target) - len(a)), rng)
        b = corpus.read(*b_range)
    else:
        pivot = int(rng.integers(start + 1, end))
        a_range, b_range = (start, pivot), (pivot, end)
        a, b = corpus.read(*a_range), corpus.read(*b_range)
    # BERT's truncation through SampleBuilder's own code, applied to positions: the kept positions of each side
    ka, kb = builder._truncate(np.arange(len(a)), np.arange(len(b)), rng)
    ids = np.concatenate([[cls_id], a[ka], [sep_id], b[kb], [sep_id]]).astype(np.int64)
    types = np.zeros(len(ids), np.int64)
    types[len(ka) + 2:] = 1
    placed = np.zeros((0, 3), np.int64)
    if spans is not None:
        parts = [place_segment_spans(spans.range(*r), r[0], corpus.offsets(*r), k, off)
                 for r, k, off in ((a_range, ka, 1), (b_range, kb, len(ka) + 2)) if r[1] > r[0]]
        placed = np.concatenate(parts) if parts else placed
    return {"input_ids": ids, "token_type_ids": types, "sentence_label": int(negative), "spans": placed}
