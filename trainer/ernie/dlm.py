"""ERNIE 1.0's dialogue language model (DLM): multi-turn samples with role embeddings and real/fake turns.

Input: a dialogue jsonl, one dialogue per line, either ``{"turns": ["q", "r", "q", ...]}`` (roles alternate,
starting with a query) or ``{"turns": [{"role": "Q", "text": "..."}, {"role": "R", "text": "..."}, ...]}`` (any
pattern: QRQ, QQR, QRR, ...). A sample is a window of ``num_turns`` consecutive turns of one dialogue:

    [CLS] turn_1 [SEP] turn_2 [SEP] turn_3 [SEP]      role_ids: the turn's role (Q = 0, R = 1) on each of its tokens

With probability ``fake_prob`` one turn (uniformly chosen) is replaced by a turn of another dialogue with the same
role, and ``dlm_label`` is 1 (fake), else 0 (real). Role ids go to the encoder as ``extra_ids["role"]``, which the
model config lists in ``segment_alternatives``: the role table is used *in place of* the segment table, so DLM
batches train the role embeddings and never the segment embeddings, and MLM batches (no role ids) the reverse, as
the paper describes. Knowledge masking applies inside turns (spans from an annotator, placed per turn).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig, knowledge_mask

ROLES = {"Q": 0, "R": 1}


class DialogueFile:
    """Dialogues tokenized at load: ``turns[d]`` list of int arrays, ``roles[d]`` int array, ``spans[d][t]`` [k, 3]
    token spans (entity/phrase, see data_prep/annotate.py; empty without an annotator)."""

    def __init__(self, path: str | Path, tokenizer, annotator=None, tokenizer_dir: str | Path | None = None,
                 min_turns: int = 2):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"dialogue file {path} not found (objective.dlm.path)")
        texts: list[list[str]] = []
        self.roles: list[np.ndarray] = []
        skipped = 0
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    turns = json.loads(line)["turns"]
                    if not isinstance(turns, list):
                        raise TypeError("turns is not a list")
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{where}: expected {{\"turns\": [...]}} ({e})") from None
                if len(turns) < min_turns:
                    skipped += 1
                    continue
                if all(isinstance(t, str) for t in turns):
                    roles = [i % 2 for i in range(len(turns))]
                    text = list(turns)
                elif all(isinstance(t, dict) and t.get("role") in ROLES and isinstance(t.get("text"), str)
                         for t in turns):
                    roles = [ROLES[t["role"]] for t in turns]
                    text = [t["text"] for t in turns]
                else:
                    raise ValueError(f"{where}: turns must all be strings, or all {{\"role\": \"Q\"|\"R\", "
                                     "\"text\": ...}")
                texts.append(text)
                self.roles.append(np.asarray(roles, np.int64))
        if not texts:
            raise ValueError(f"{path}: no dialogue with at least {min_turns} turns")
        self.skipped = skipped
        flat = [t for d in texts for t in d]
        ids = tokenizer.encode_batch(flat)
        if annotator is not None:
            from data_prep.annotate import DocumentAnnotator

            flat_spans = DocumentAnnotator(annotator, tokenizer_dir)(flat, ids)
        else:
            flat_spans = [np.zeros((0, 3), np.int32)] * len(flat)
        self.turns, self.spans = [], []
        k = 0
        for d in texts:
            self.turns.append([np.asarray(x, np.int64) for x in ids[k:k + len(d)]])
            self.spans.append(flat_spans[k:k + len(d)])
            k += len(d)
        # role -> (dialogue, turn) of every turn, for drawing a fake turn of the same role
        self._by_role = {r: np.array([(d, t) for d, rs in enumerate(self.roles) for t, x in enumerate(rs) if x == r],
                                     np.int64).reshape(-1, 2) for r in ROLES.values()}

    def __len__(self) -> int:
        return len(self.turns)

    def random_turn(self, role: int, not_dialogue: int, rng: np.random.Generator) -> tuple[int, int]:
        pool = self._by_role[role]
        if len(pool) == 0 or (pool[:, 0] == not_dialogue).all():
            pool = np.concatenate(list(self._by_role.values()))
        for _ in range(16):  # almost always the first draw: other dialogues hold nearly all turns
            d, t = pool[int(rng.integers(0, len(pool)))]
            if d != not_dialogue:
                return int(d), int(t)
        raise ValueError("DLM needs at least two dialogues to draw fake turns from")


def _fit(lengths: list[int], budget: int) -> list[int]:
    """Trim the longest turn first until the lengths fit ``budget`` (BERT's truncate_seq_pair, for n turns)."""
    lengths = list(lengths)
    while sum(lengths) > budget:
        i = int(np.argmax(lengths))
        lengths[i] -= 1
    return lengths


def dlm_sample(dialogues: DialogueFile, index: int, rng: np.random.Generator, max_len: int, cls_id: int,
               sep_id: int, num_turns: int = 3, fake_prob: float = 0.5) -> dict:
    """One DLM sample from dialogue ``index``: input_ids, role_ids, spans [k, 3] in sample coordinates, dlm_label,
    and for inspection replaced_turn (-1 if real) and source (the (dialogue, turn) of each slot)."""
    d = index % len(dialogues)
    n = len(dialogues.turns[d])
    k = min(num_turns, n)
    first = int(rng.integers(0, n - k + 1))
    picked = [(d, t) for t in range(first, first + k)]
    roles = [int(dialogues.roles[d][t]) for _, t in picked]
    label, slot = 0, -1
    if len(dialogues) > 1 and rng.random() < fake_prob:
        slot = int(rng.integers(0, k))
        picked[slot] = dialogues.random_turn(roles[slot], d, rng)
        label = 1
    turns = [dialogues.turns[pd][pt] for pd, pt in picked]
    lengths = _fit([len(t) for t in turns], max_len - 1 - k)
    ids, role_ids, spans = [cls_id], [roles[0]], []
    for (pd, pt), turn, length, role in zip(picked, turns, lengths, roles):
        s = dialogues.spans[pd][pt]
        s = s[s[:, 1] <= length]
        spans.append(s + np.array([len(ids), len(ids), 0], dtype=s.dtype))
        ids.extend(turn[:length].tolist())
        ids.append(sep_id)
        role_ids.extend([role] * (length + 1))
    return {"input_ids": np.asarray(ids, np.int64), "role_ids": np.asarray(role_ids, np.int64),
            "spans": np.concatenate(spans).astype(np.int64), "dlm_label": label, "replaced_turn": slot,
            "source": picked}


def collate_masked(samples: Sequence[dict], pad_id: int, special_ids: Sequence[int], word_start: np.ndarray,
                   mask_cfg: KnowledgeMaskingConfig, level: str, mask_id: int, random_ids: np.ndarray,
                   rng: np.random.Generator, keys: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Pad samples (each with ``input_ids`` and ``spans``) to the longest, knowledge-mask them, and stack the
    other ``keys`` (name -> pad value: 0 for ids, -100 for labels): per-token arrays padded, per-sample scalars
    stacked. Returns the DESIGN.md batch as numpy arrays."""
    B = len(samples)
    T = max(len(s["input_ids"]) for s in samples)
    ids = np.full((B, T), pad_id, np.int64)
    attn = np.zeros((B, T), np.int64)
    for b, s in enumerate(samples):
        ids[b, :len(s["input_ids"])] = s["input_ids"]
        attn[b, :len(s["input_ids"])] = 1
    candidate = (attn == 1) & ~np.isin(ids, np.asarray(special_ids))
    rows = [np.concatenate([np.full((len(s["spans"]), 1), b), np.asarray(s["spans"]).reshape(-1, 3)], axis=1)
            for b, s in enumerate(samples)]
    spans = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)
    masked = knowledge_mask(ids, candidate, word_start[ids], spans, level, mask_cfg, mask_id, random_ids, rng)
    batch = {"input_ids": masked["input_ids"], "attention_mask": attn, "mlm_positions": masked["mlm_positions"],
             "mlm_labels": masked["mlm_labels"]}
    for key, pad in (keys or {}).items():
        first = samples[0][key]
        if np.ndim(first) == 0:
            batch[key] = np.asarray([s[key] for s in samples], np.int64)
        else:
            out = np.full((B, T), pad, np.int64)
            for b, s in enumerate(samples):
                out[b, :len(s[key])] = s[key]
            batch[key] = out
    return batch
