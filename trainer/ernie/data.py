"""ERNIE samples over the prepared corpora: knowledge-masked rows (1.0), DLM rows, and ERNIE 2.0 multi-task rows.

Built on ``trainer.data.PretrainingDataset`` for everything that is not ERNIE-specific: the cached sample index
(``doc-sentences`` chunks: consecutive sentences of one document within ``max_seq_length``), the per-epoch order,
blending, and the per-sample generator ``sample_rng(seed, corpus, epoch, sample id)``. What a position builds depends
also on its optimizer step ``position // global_batch`` (the knowledge-masking level; the ERNIE 2.0 tasks of that
step; DLM or MLM), which is again a function of the position, so a sample stays a pure function of (seed, position)
and resumes exactly. All samples of one step share a task set, so every micro-batch has the same keys on every rank.
Steps whose rows come from other files (DLM dialogues, discourse and IR relevance pairs) take no corpus position: the
corpus stream counts corpus steps only (``locate_corpus``), so an epoch still reads every corpus sample once.
"""
from __future__ import annotations

import numpy as np
import torch

from trainer.data.dataset import PretrainingDataset, sample_rng
from trainer.ernie import tasks as T
from trainer.ernie.dlm import DialogueFile, dlm_sample
from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig, knowledge_mask_rows
from trainer.ernie.pairs import nsp_row
from trainer.ernie.sidecars import CorpusSpans  # noqa: F401  (re-exported: its old home)

IGNORE = -100
DLM_CORPUS_KEY = 0xDD  # corpus slot of sample_rng for DLM samples (real corpora are numbered from 0)
PAIR_CORPUS_KEY = 0xDE


def place_chunk_spans(spans: np.ndarray, start: int, offsets: np.ndarray, offset: int, budget: int) -> np.ndarray:
    """Spans of a chunk's sentences -> row positions: sentence s begins at ``offset + offsets[s - start]``
    (``offsets``: IndexedCorpus.offsets of the chunk); spans past the ``budget`` (tokens kept after truncation) are
    dropped whole. Returns [k, 3]."""
    if len(spans) == 0:
        return np.zeros((0, 3), np.int64)
    shift = offset + offsets[spans[:, 0] - start]
    placed = np.stack([spans[:, 1] + shift, spans[:, 2] + shift, spans[:, 3]], axis=1)
    return placed[placed[:, 1] <= offset + budget]


class ErnieCorpusBase(PretrainingDataset):
    """PretrainingDataset with ``doc-sentences`` chunks, ERNIE's masking, and the step of every position."""

    def __init__(self, cfg, tokenizer, seed: int, split: str, km: KnowledgeMaskingConfig, global_batch: int,
                 spans: bool, pairs: bool = False):
        if pairs and cfg.format != "segment-pair":
            raise ValueError(f"objective.options.nsp: true builds sentence-pair rows from data.format: segment-pair "
                             f"(BERT's NSP pairs), not {cfg.format}; set data.format: segment-pair")
        if not pairs and (cfg.format != "doc-sentences" or cfg.pack_doc_sentences):
            raise ValueError("ERNIE samples are built from data.format: doc-sentences with "
                             "data.pack_doc_sentences: false (one document's consecutive sentences per row); "
                             "ERNIE 1.0 with objective.options.nsp: true reads data.format: segment-pair")
        super().__init__(cfg, tokenizer, seed, split)
        self.km, self.global_batch = km, int(global_batch)
        # held-out rows are masked at the last stage's level at every evaluation: one fixed yardstick
        self.fixed_level = None if split == "train" else km.stages[-1].level
        self.tok = tokenizer
        self.word_start = np.asarray(tokenizer.word_start, bool)
        self.special = np.asarray(tokenizer.special_ids, np.int64)
        special = np.zeros(tokenizer.vocab_size, bool)
        special[self.special] = True
        self.random_ids = np.flatnonzero(~special)
        self.is_special = special  # table lookup per token: cheaper than np.isin per sample
        self.spans = [CorpusSpans(c) for c in self.corpora] if spans else None

    def level_at(self, step: int) -> str:
        return self.fixed_level or self.km.level_at(step)

    def corpus_steps_before(self, step: int) -> int:
        """Steps before ``step`` whose rows come from the corpus (the subclasses' special steps, DLM or labelled
        pairs, read other files and take no corpus samples)."""
        return step

    def locate_corpus(self, position: int) -> tuple[int, int, int]:
        """(corpus, epoch, sample id) of a corpus row at a global position: the corpus stream counts corpus steps
        only, so a special step skips no corpus samples and an epoch still covers every sample once."""
        step, slot = divmod(int(position), self.global_batch)
        return self.locate(self.corpus_steps_before(step) * self.global_batch + slot)

    def chunk(self, c: int, sample_id: int) -> tuple[int, int]:
        start, end, _ = (int(x) for x in self.builders[c].index.sample_chunks(sample_id)[0])
        return start, end

    def pending(self, ids, spans, level: str, rng, label_ids=None) -> dict:
        """A row whose knowledge masking is still to do (``finish`` does it, for one row or a whole batch).
        ``label_ids``: the ids the MLM labels are read from when they differ from the input (the cased row of a
        lower-cased one)."""
        return {"_mask": (np.asarray(ids, np.int64), np.asarray(spans, np.int64).reshape(-1, 3), level, rng,
                          label_ids)}

    def finish(self, rows: list[dict]) -> list[dict]:
        """Knowledge-mask the pending rows, all rows of one level in one vectorised pass, each with its own
        generator (``knowledge_mask_rows``: equal to masking each alone), so a DataLoader batch costs about one call."""
        todo: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            if "_mask" in row:
                todo.setdefault(row["_mask"][2], []).append(i)
        for level, idx in todo.items():
            parts = [rows[i].pop("_mask") for i in idx]
            masked = knowledge_mask_rows([p[0] for p in parts], [p[1] for p in parts], level, self.km,
                                         self.tok.mask_id, self.random_ids, [p[3] for p in parts], self.is_special,
                                         self.word_start)
            for i, m, p in zip(idx, masked, parts):
                if p[4] is not None:  # the label is the token as written (cased), whatever the input shows
                    m["mlm_labels"] = np.asarray(p[4], np.int64)[m["mlm_positions"]]
                rows[i].update(m)
        return rows

    def __getitem__(self, position: int) -> dict:
        return self.finish([self.build_row(position)])[0]

    def __getitems__(self, positions: list[int]) -> list[dict]:
        return self.finish([self.build_row(p) for p in positions])

    def chunk_ids(self, c: int, start: int, end: int, level: str) -> tuple[np.ndarray, np.ndarray]:
        """[CLS] sentences [start, end) [SEP], truncated to the sequence length, and the side-car spans of its
        phrases/entities in row positions (none at the basic level) -> (ids, spans [k, 3])."""
        toks = self.corpora[c].read(start, end, limit=self.cfg.max_seq_length - 2)
        ids = np.concatenate([[self.tok.cls_id], toks, [self.tok.sep_id]]).astype(np.int64)
        spans = np.zeros((0, 3), np.int64)
        if self.spans is not None and level != "basic":
            spans = place_chunk_spans(self.spans[c].range(start, end), start, self.corpora[c].offsets(start, end), 1,
                                      len(toks))
        return ids, spans

    def corpus_row(self, c: int, sample_id: int, level: str, rng) -> tuple[dict, int, int]:
        """[CLS] sentences [SEP] of the sample's chunk, to be knowledge-masked at ``level``."""
        start, end = self.chunk(c, sample_id)
        ids, spans = self.chunk_ids(c, start, end, level)
        row = self.pending(ids, spans, level, rng)
        row["token_type_ids"] = np.zeros(len(ids), np.int64)
        return row, start, end

    def corpus_samples(self, total_samples: int) -> int:
        """Corpus samples read by the first ``total_samples`` positions: the steps that read no corpus (DLM,
        labelled pairs: ``corpus_steps_before``) take none (the reading note at start counts what the corpus gives)."""
        steps, rest = divmod(int(total_samples), self.global_batch)
        return self.corpus_steps_before(steps) * self.global_batch + (rest if self.corpus_steps_before(steps + 1)
                                                                       > self.corpus_steps_before(steps) else 0)


class KnowledgeMaskedDataset(ErnieCorpusBase):
    """ERNIE 1.0: corpus rows knowledge-masked at the level of their step; every ``dlm.every``-th step a DLM batch."""

    def __init__(self, cfg, tokenizer, seed, split, km, global_batch, dialogues: DialogueFile | None = None,
                 dlm_every: int = 0, dlm_turns: int = 3, dlm_fake_prob: float = 0.5, nsp: bool = False):
        super().__init__(cfg, tokenizer, seed, split, km, global_batch,
                         spans=any(s.level != "basic" for s in km.stages), pairs=nsp)
        self.nsp = nsp
        self.dialogues, self.dlm_every = dialogues, dlm_every
        self.dlm_turns, self.dlm_fake_prob = dlm_turns, dlm_fake_prob

    def is_dlm_step(self, step: int) -> bool:
        return self.dialogues is not None and self.dlm_every > 0 and step % self.dlm_every == self.dlm_every - 1

    def corpus_steps_before(self, step: int) -> int:
        if self.dialogues is None or self.dlm_every <= 0:
            return step
        return step - step // self.dlm_every  # DLM steps k-1, 2k-1, ...: step // k of them before ``step``

    def build_row(self, position: int) -> dict:
        step = position // self.global_batch
        level = self.level_at(step)
        if self.is_dlm_step(step):
            rng = sample_rng(self.seed, DLM_CORPUS_KEY, 0, position)
            s = dlm_sample(self.dialogues, int(rng.integers(0, len(self.dialogues))), rng, self.cfg.max_seq_length,
                           self.tok.cls_id, self.tok.sep_id, self.dlm_turns, self.dlm_fake_prob)
            row = self.pending(s["input_ids"], s["spans"], level, rng)
            row.update(role_ids=s["role_ids"], dlm_label=s["dlm_label"])
            return row
        c, epoch, sample_id = self.locate_corpus(position)
        rng = sample_rng(self.seed, c, epoch, sample_id)
        if self.nsp:  # [CLS] A [SEP] B [SEP], masked across both segments (trainer/ernie/pairs.py)
            pair = nsp_row(self.builders[c], self.spans[c] if self.spans and level != "basic" else None, sample_id,
                           rng, self.tok.cls_id, self.tok.sep_id)
            row = self.pending(pair["input_ids"], pair["spans"], level, rng)
            row.update(token_type_ids=pair["token_type_ids"], sentence_label=pair["sentence_label"])
            return row
        row, _, _ = self.corpus_row(c, sample_id, level, rng)
        return row


class MultiTaskDataset(ErnieCorpusBase):
    """ERNIE 2.0: the row of a position is built for the tasks of its step (``ContinualPlan.tasks_at``)."""

    def __init__(self, cfg, tokenizer, seed, split, km, global_batch, plan, reorder_max_pieces: int = 3,
                 pair_files: dict | None = None, token_document_max_tokens: int = 4096,
                 lowercase_share: float = 0.5):
        super().__init__(cfg, tokenizer, seed, split, km, global_batch,
                         spans=any(s.level != "basic" for s in km.stages))
        self.plan, self.m = plan, reorder_max_pieces
        self.pair_files = pair_files or {}
        self.tokdoc_max = token_document_max_tokens
        self.lower_id = self.capital = self.revealing = None
        self.lowercase_share = float(lowercase_share)
        if "capitalization" in plan.names:
            self.lower_id, self.capital = T.capitalization_tables(tokenizer.tokens)
            self.revealing = T.case_revealing(tokenizer.tokens)
            if not self.capital.any() or (self.lower_id != np.arange(len(self.lower_id))).sum() == 0:
                raise ValueError("the capitalization task needs a cased tokenizer with both spellings of words "
                                 "(train it with --cased); this one has no upper/lower-case pairs")

    def corpus_steps_before(self, step: int) -> int:
        """Steps before ``step`` that are not labelled-pair steps (discourse, IR relevance): from a running count
        over the plan (8 bytes per step, built on first use in each process), or per cycle of ``EvalPlan``."""
        masks = getattr(self.plan, "masks", None)
        if masks is None:  # EvalPlan: its formats cycle
            pair = [self._sentence_task(set(f)) in PAIR_TASKS for f in self.plan.formats]
            whole, part = divmod(step, len(pair))
            return step - whole * sum(pair) - sum(pair[:part])
        if getattr(self, "_corpus_steps", None) is None:
            bits = sum(1 << k for k, n in enumerate(self.plan.names) if n in PAIR_TASKS)
            corpus_step = (np.asarray(masks, np.int64) & bits) == 0
            self._corpus_steps = np.concatenate([[0], np.cumsum(corpus_step, dtype=np.int64)])
        return int(self._corpus_steps[min(step, len(self._corpus_steps) - 1)])

    def _sentence_task(self, names: set) -> str | None:
        return next((n for n in self.plan.names if n in names and n in SENTENCE_TASKS), None)

    def build_row(self, position: int) -> dict:
        step = position // self.global_batch
        names = set(self.plan.tasks_at(step))
        level = self.level_at(step)
        sentence_task = self._sentence_task(names)
        if sentence_task in PAIR_TASKS:
            rng = sample_rng(self.seed, PAIR_CORPUS_KEY, 0, position)
            f = self.pair_files[sentence_task]
            a, b, label = f[int(rng.integers(0, len(f)))]
            ids, types = T.pair_row(a, b, self.cfg.max_seq_length, self.tok.cls_id, self.tok.sep_id)
            row = self._token_tasks(ids, np.zeros((0, 3), np.int64), level, rng, names, None)
            row["token_type_ids"] = types
            row[f"{sentence_task}_label"] = label
        else:
            c, epoch, sample_id = self.locate_corpus(position)
            rng = sample_rng(self.seed, c, epoch, sample_id)
            start, end = self.chunk(c, sample_id)
            if sentence_task == "sentence_reorder":
                ids, label = self._reorder_row(c, start, end, rng)
                row = self._token_tasks(ids, np.zeros((0, 3), np.int64), level, rng, names, [(c, start, end)])
                row["token_type_ids"] = np.zeros(len(ids), np.int64)
                row["sentence_reorder_label"] = label
            elif sentence_task == "sentence_distance":
                ids, types, label, (i, j) = self._distance_row(c, start, rng)
                # each sentence's tokens against the rest of its own document (B may come from another one)
                row = self._token_tasks(ids, np.zeros((0, 3), np.int64), level, rng, names,
                                        [(c, i, i + 1), (c, j, j + 1)], types)
                row["token_type_ids"] = types
                row["sentence_distance_label"] = label
            else:
                ids, spans = self.chunk_ids(c, start, end, level)
                row = self._token_tasks(ids, spans, level, rng, names, [(c, start, end)])
                row["token_type_ids"] = np.zeros(len(ids), np.int64)
        length = len(row["input_ids"]) if "input_ids" in row else len(row["_mask"][0])
        row["task_ids"] = np.full(length, T.TASK_ID[sentence_task or "mlm"], np.int64)
        return row

    def _token_tasks(self, ids, spans, level, rng, names, sources, segments=None) -> dict:
        cand = ~self.is_special[ids]
        out = {}
        # token-document labels compare the row's cased ids with the cased document, so they come before the
        # capitalization task lower-cases the row ("Paris" must match "Paris" elsewhere, not "paris")
        if "token_document" in names:
            out["token_document_labels"] = self._token_document(ids, cand, sources, segments)
        cased = None
        if "capitalization" in names:
            # A share of the rows is lower-cased and labelled; the rest stay cased (what fine-tuning reads) with no
            # labels, since their case is in the input. Words still showing case after lower-casing are unlabelled.
            if rng.random() < self.lowercase_share:
                cased = ids
                ids, labels = T.capitalization_labels(ids, cand, self.word_start[ids], self.lower_id, self.capital,
                                                      self.revealing)
            else:
                labels = np.full(len(ids), IGNORE, np.int64)
            out["capitalization_labels"] = labels
        if "mlm" in names:  # masking is the sample's last use of its generator: done later, batched
            out.update(self.pending(ids, spans, level, rng, cased))
        else:
            out["input_ids"] = ids
        return out

    def _token_document(self, ids, cand, sources, segments=None) -> np.ndarray:
        """Token-document labels of a row whose segment k (``segments == k``; all of it without ``segments``) holds
        sentences [start, end) of corpus c, ``sources[k] = (c, start, end)``: each token against the other
        sentences of its own segment's document, as its first ``tokdoc_max`` tokens: only those are read (a document
        can hold millions of tokens). No sources (labelled pairs from a user file): no labels."""
        labels = np.full(len(ids), IGNORE, np.int64)
        for k, (c, start, end) in enumerate(sources or ()):
            corpus = self.corpora[c]
            d = int(corpus.document_of(start))
            d0, d1 = int(corpus.doc_starts[d]), int(corpus.doc_starts[d + 1])
            before = corpus.read(d0, start, limit=self.tokdoc_max)
            rest = np.concatenate([before, corpus.read(end, d1, limit=self.tokdoc_max - len(before))])
            part = T.token_document_labels(ids, rest, cand)
            labels = part if segments is None else np.where(segments == k, part, labels)
        return labels

    def _reorder_row(self, c, start, end, rng) -> tuple[np.ndarray, int]:
        budget = self.cfg.max_seq_length - 1 - self.m  # [CLS] and one [SEP] per piece, at most m pieces
        kept, total = [], 0
        for k in range(start, end):  # each sentence read only as far as the budget still takes tokens
            if total >= budget:
                break
            kept.append(self.corpora[c].read(k, k + 1, limit=budget - total))
            total += len(kept[-1])
        pieces, label = T.reorder_sample(kept, self.m, rng)
        ids = [self.tok.cls_id]
        for p in pieces:
            ids.extend(p.tolist())
            ids.append(self.tok.sep_id)
        return np.asarray(ids, np.int64), label

    def _distance_row(self, c, start, rng):
        corpus = self.corpora[c]
        i, j, label = T.sentence_distance_pair(start, corpus.doc_starts, rng)
        # pair_row keeps at most max_seq_length - 3 tokens of either side, and truncating both to that first gives
        # the same row (its longer-side-first pops pass through that state), so no more is read
        keep = self.cfg.max_seq_length - 3
        ids, types = T.pair_row(corpus.read(i, i + 1, limit=keep), corpus.read(j, j + 1, limit=keep),
                                self.cfg.max_seq_length, self.tok.cls_id, self.tok.sep_id)
        return ids, types, label, (i, j)


SENTENCE_TASKS = ("sentence_reorder", "sentence_distance", "discourse", "ir_relevance")
PAIR_TASKS = ("discourse", "ir_relevance")  # rows from a labelled pair file, not the corpus
SCALAR_KEYS = ("dlm_label", "sentence_label", "sentence_reorder_label", "sentence_distance_label", "discourse_label",
               "ir_relevance_label")
PAD = {"token_type_ids": 0, "role_ids": 0, "task_ids": 0, "capitalization_labels": IGNORE,
       "token_document_labels": IGNORE}


class ErnieCollator:
    """numpy rows -> the DESIGN.md batch (int32 on the host, int8 attention mask, with its ``packing``; the loop widens
    them to int64 on the device, as trainer.data.loader's Collator): padded ``input_ids`` / ``attention_mask``,
    ``mlm_positions``
    and ``mlm_labels`` padded to P, the ERNIE per-token keys (PAD) and per-sample labels (SCALAR_KEYS) present.
    Which keys a batch has depends only on its step, so it is the same on every rank: objectives pick their losses
    by key presence without a collective."""

    def __init__(self, pad_id: int, max_predictions: int):
        self.pad_id, self.P = int(pad_id), int(max_predictions)

    def __call__(self, samples: list[dict]) -> dict:
        B = len(samples)
        Tm = max(len(s["input_ids"]) for s in samples)
        batch = {"input_ids": np.full((B, Tm), self.pad_id, np.int32), "attention_mask": np.zeros((B, Tm), np.int8)}
        if "mlm_positions" in samples[0]:  # absent on ERNIE 2.0 steps without the MLM task
            batch["mlm_positions"] = np.zeros((B, self.P), np.int32)
            batch["mlm_labels"] = np.full((B, self.P), IGNORE, np.int32)
        for key, pad in PAD.items():
            if key in samples[0]:
                batch[key] = np.full((B, Tm), pad, np.int32)
        for b, s in enumerate(samples):  # B rows of numpy slices: the per-token work is in numpy
            n = len(s["input_ids"])
            batch["input_ids"][b, :n] = s["input_ids"]
            batch["attention_mask"][b, :n] = 1
            for key in PAD:
                if key in batch:
                    batch[key][b, :n] = s[key]
            if "mlm_positions" in s:
                k = len(s["mlm_positions"])
                batch["mlm_positions"][b, :k] = s["mlm_positions"]
                batch["mlm_labels"][b, :k] = s["mlm_labels"]
        for key in SCALAR_KEYS:
            if key in samples[0]:
                batch[key] = np.asarray([s[key] for s in samples], np.int64)
        from trainer.models.kernels import attach_packing
        return attach_packing({k: torch.from_numpy(v) for k, v in batch.items()})
