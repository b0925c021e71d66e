"""Input formats: how one sample's token row is built from its chunks (see sample_index.py), given its RNG.

=================  =================================================================  ==========================
format             row                                                                 sentence_label
=================  =================================================================  ==========================
segment-pair       [CLS] A [SEP] B [SEP]; A = first 1..k-1 sentences of the chunk,     1 if B is from another
                   B = the rest, or (negative) sentences of a different document       document (NSP)
sentence-pair      as segment-pair with one natural sentence each side                 same (NSP)
sop-pair           [CLS] A [SEP] B [SEP], two consecutive segments of one document     1 if A and B are swapped
full-sentences     [CLS] s1 s2 ... [SEP]; may cross documents, [SEP] at a document end none
doc-sentences      as full-sentences, never crossing a document; packed rows hold      none
                   several [CLS] ... [SEP] samples, ``pack_ids`` 1, 2, ... per sample
=================  =================================================================  ==========================

Pairs longer than the budget are trimmed as BERT's ``truncate_seq_pair`` does (always the longer side, each token
from the front or the back with probability 1/2), in closed form: the number of tokens cut from each side follows
from the two lengths, and the front/back split is one binomial draw.
"""
from __future__ import annotations

import numpy as np

from .corpus import IndexedCorpus
from .sample_index import NSP_FORMATS, SampleIndex, content_budget


class SampleBuilder:
    def __init__(self, corpus: IndexedCorpus, index: SampleIndex, fmt: str, max_seq_length: int, cls_id: int,
                 sep_id: int, negative_prob: float = 0.5, held_out=None):
        self.corpus, self.index, self.fmt = corpus, index, fmt
        self.held_out = held_out  # a heldout.DocumentSplit: NSP negatives never take their B side from its documents
        self.max_seq_length = max_seq_length
        self.budget = content_budget(fmt, max_seq_length)
        self.cls, self.sep = np.int32(cls_id), np.int32(sep_id)
        self.negative_prob = negative_prob
        if fmt in ("segment-pair", "sentence-pair") and corpus.num_documents < 2:
            raise ValueError(f"{corpus.prefix}: NSP negatives come from another document, but it has only one")

    def __call__(self, sample_id: int, rng: np.random.Generator) -> dict:
        chunks = self.index.sample_chunks(sample_id)
        if self.fmt in ("full-sentences", "doc-sentences"):
            return self._single(chunks)
        start, end, target = (int(x) for x in chunks[0])
        return self._pair(start, end, target, rng)

    # -- single-segment formats --------------------------------------------------------------------------------------
    def _single(self, chunks: np.ndarray) -> dict:
        rows, packs = [], []
        for k, (start, end, _) in enumerate(chunks.tolist()):
            toks = self.corpus.read(start, end)
            if self.fmt == "full-sentences":
                # a separator after each document that ends inside the chunk (the final [SEP] closes the last one)
                starts = self.corpus.doc_starts
                lo, hi = np.searchsorted(starts, [start + 1, end], side="left")
                doc_ends = starts[lo:hi]  # sentence indices in (start, end) that begin a new document
                if len(doc_ends):
                    toks = np.insert(toks, self.corpus.offsets(start, end)[doc_ends - start], self.sep)
            toks = toks[:self.budget]
            rows.append(np.concatenate([[self.cls], toks, [self.sep]]).astype(np.int32))
            # int32: a packed sample is >= 2 tokens, so a row of T tokens holds up to T // 2 of them (256 at 512,
            # past int8); int32 costs 4 bytes per token of IPC, like the tokens themselves
            packs.append(np.full(len(toks) + 2, k + 1, np.int32))
        out = {"tokens": rows[0] if len(rows) == 1 else np.concatenate(rows)}
        out["token_types"] = np.zeros(len(out["tokens"]), np.int8)
        if self.fmt == "doc-sentences":
            out["pack_ids"] = packs[0] if len(packs) == 1 else np.concatenate(packs)
        return out

    # -- pair formats ------------------------------------------------------------------------------------------------
    def _pair(self, start: int, end: int, target: int, rng: np.random.Generator) -> dict:
        drawn = bool(rng.random() < self.negative_prob)  # drawn for every format: the generator's stream stays put
        if self.fmt in NSP_FORMATS:
            # decided in the index (a negative chunk is its A only, target < 0), as BERT decides when it writes its
            # instances, so that the sentences a negative leaves unused start the next chunk
            negative = target < 0
        else:
            negative = drawn
        target = abs(target)
        if negative and self.fmt in NSP_FORMATS:
            a = self.corpus.read(start, end)
            b = self._other_document(start, max(1, target - len(a)), rng)
            return self._row(*self._truncate(a, b, rng), negative)
        if self.fmt == "sentence-pair":
            pivot, end = start + 1, start + 2
        elif end - start == 1:  # sop-pair without swaps (Layout.single_segment): [CLS] A [SEP], ELECTRA's doc end
            a, _ = self._truncate(self.corpus.read(start, end), np.zeros(0, np.int32), rng)
            tokens = np.concatenate([[self.cls], a, [self.sep]]).astype(np.int32)
            return {"tokens": tokens, "token_types": np.zeros(len(tokens), np.int8), "sentence_label": 0}
        else:
            pivot = int(rng.integers(start + 1, end))  # A = [start, pivot), B = [pivot, end), both non-empty
        toks = self.corpus.read(start, end)
        cut = int(self.corpus.sentence_lengths(start, pivot).sum())
        a, b = toks[:cut], toks[cut:]
        if negative:  # sop-pair
            a, b = b, a
        return self._row(*self._truncate(a, b, rng), negative)

    def _row(self, a: np.ndarray, b: np.ndarray, negative: bool) -> dict:
        tokens = np.concatenate([[self.cls], a, [self.sep], b, [self.sep]]).astype(np.int32)
        types = np.zeros(len(tokens), np.int8)
        types[len(a) + 2:] = 1
        return {"tokens": tokens, "token_types": types, "sentence_label": int(negative)}

    def _other_document(self, sentence: int, want: int, rng: np.random.Generator) -> np.ndarray:
        """Tokens of sentences from a random start in a random *other* document, about ``want`` of them."""
        return self.corpus.read(*self.other_document_range(sentence, want, rng))

    def other_document_range(self, sentence: int, want: int, rng: np.random.Generator) -> tuple[int, int]:
        """The sentences [first, last) ``_other_document`` reads (ERNIE 1.0's NSP rows place side-car spans in them)."""
        num_docs = self.corpus.num_documents
        own = int(self.corpus.document_of(sentence))
        doc = int(rng.integers(0, num_docs - 1))
        doc += doc >= own  # uniform over the other documents
        tries = 0
        while self.held_out is not None and self.held_out.held_out(doc):  # training: uniform over the kept ones
            tries += 1  # < 2 draws on average (valid_split < 0.5); no draw at valid_split 0, so the stream is main's
            if tries > 1000:
                raise ValueError(f"{self.corpus.prefix}: no kept document for an NSP negative found in 1000 draws; "
                                 "data.valid_split holds out (nearly) every other document")
            doc = int(rng.integers(0, num_docs - 1))
            doc += doc >= own
        d0, d1 = int(self.corpus.doc_starts[doc]), int(self.corpus.doc_starts[doc + 1])
        if d1 == d0:  # an empty document: take the next non-empty sentence after it instead
            d0 = min(d0, self.corpus.num_sentences - 1)
            d1 = d0 + 1
        first = int(rng.integers(d0, d1))
        if self.fmt == "sentence-pair":
            last = first + 1
        else:
            last = self.corpus.end_reaching(first, want, d1)
        return first, last

    def _truncate(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        la, lb = len(a), len(b)
        excess = la + lb - self.budget
        if excess <= 0:
            return a, b
        # BERT trims the longer side one token at a time (B on ties) until the pair fits.
        if la > lb:
            cut_a = min(excess, la - lb)
            rest = excess - cut_a
            cut_a, cut_b = cut_a + rest // 2, (rest + 1) // 2
        else:
            cut_b = min(excess, lb - la)
            rest = excess - cut_b
            cut_a, cut_b = rest // 2, cut_b + (rest + 1) // 2
        front_a, front_b = rng.binomial([cut_a, cut_b], 0.5)
        return a[front_a:la - (cut_a - front_a)], b[front_b:lb - (cut_b - front_b)]
