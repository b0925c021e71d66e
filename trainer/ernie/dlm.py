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

from data_prep.manifest import sha256_file
from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig, knowledge_mask

ROLES = {"Q": 0, "R": 1}


DIALOGUE_CACHE_VERSION = 1
PARALLEL_MIN_TURNS = 2048
"""Annotate in a pool of ``workers`` processes only from this many turns on (a spawned worker costs ~1-2 s to start)."""


def _read_dialogues(path: Path, min_turns: int) -> tuple[list[list[str]], list[list[int]], int]:
    """(turn texts, roles, skipped) of a dialogue jsonl; a malformed line stops with its file and line number."""
    texts: list[list[str]] = []
    roles: list[list[int]] = []
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
                roles.append([i % 2 for i in range(len(turns))])
                texts.append(list(turns))
            elif all(isinstance(t, dict) and t.get("role") in ROLES and isinstance(t.get("text"), str)
                     for t in turns):
                roles.append([ROLES[t["role"]] for t in turns])
                texts.append([t["text"] for t in turns])
            else:
                raise ValueError(f"{where}: turns must all be strings, or all {{\"role\": \"Q\"|\"R\", "
                                 "\"text\": ...}")
    if not texts:
        raise ValueError(f"{path}: no dialogue with at least {min_turns} turns")
    return texts, roles, skipped


def _annotate_part(spec: str, tokenizer_dir: str, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
    """Token spans of ``texts`` (one pool task: picklable arguments, the annotator built in the worker)."""
    from data_prep.annotate import DocumentAnnotator, make_annotator

    return DocumentAnnotator(make_annotator(spec), tokenizer_dir)(texts, ids)


def _annotate(annotator, tokenizer_dir, flat: list[str], ids: list, workers: int) -> list[np.ndarray]:
    """Per-turn token spans; with ``workers`` > 1 and many turns, in a spawned pool (jieba's part-of-speech HMM runs
    at a few thousand characters per second on text outside its dictionary: one process would keep every rank of a
    job waiting for minutes on a large dialogue file)."""
    if isinstance(annotator, str):
        from data_prep.annotate import make_annotator

        annotator = make_annotator(annotator)
    if workers > 1 and len(flat) >= PARALLEL_MIN_TURNS:
        import multiprocessing as mp

        parts = min(len(flat), workers * 4)
        bounds = np.linspace(0, len(flat), parts + 1).astype(int)
        with mp.get_context("spawn").Pool(workers) as pool:
            jobs = [pool.apply_async(_annotate_part, (annotator.spec, str(tokenizer_dir), flat[a:b], ids[a:b]))
                    for a, b in zip(bounds[:-1], bounds[1:])]
            return [spans for job in jobs for spans in job.get()]
    from data_prep.annotate import DocumentAnnotator

    return DocumentAnnotator(annotator, tokenizer_dir)(flat, ids)


def _annotator_key(spec: str | None) -> dict | None:
    """The annotator's part of the cache key: its spec and, for gazetteer/jsonl specs, the content of its file."""
    if spec is None:
        return None
    _, _, arg = spec.partition(":")
    return {"spec": spec, "file": sha256_file(Path(arg)) if arg and Path(arg).is_file() else None}


class DialogueFile:
    """A dialogue jsonl tokenized (and annotated): ``turns[d][t]`` the token ids of turn t of dialogue d, ``roles[d]``
    its turns' roles, ``spans[d][t]`` [k, 3] token spans (entity/phrase, see data_prep/annotate.py; empty without
    an annotator).

    With a ``cache`` (``trainer.data.cache_file.CachePolicy``; the trainer passes ``data.cache_dir``'s), the
    tokenized file is a cache file keyed by the dialogue file's content, the tokenizer's fingerprint and the
    annotator (spec and file): the builder rank (global rank 0) tokenizes and annotates once, with ``workers``
    processes, and every rank and loader worker maps it (no private copy, nothing parsed again at the next launch).
    Without one, the same arrays are built in memory. ``annotator``: an annotator object (``data_prep.annotate``)
    or its spec string (``jieba``, ``gazetteer:FILE``, ...)."""

    def __init__(self, path: str | Path, tokenizer, annotator=None, tokenizer_dir: str | Path | None = None,
                 min_turns: int = 2, cache=None, workers: int = 1, key: str = "objective.options.dlm.path"):
        path = Path(path)
        if not path.is_file():  # ``key``: the config key that named it, for the message
            raise FileNotFoundError(f"dialogue file {path} not found ({key})")
        self.path = path
        spec = annotator if isinstance(annotator, str) or annotator is None else annotator.spec

        def build() -> tuple[dict[str, np.ndarray], dict]:
            texts, roles, skipped = _read_dialogues(path, min_turns)
            flat = [t for d in texts for t in d]
            ids = tokenizer.encode_batch(flat)
            if annotator is not None:
                flat_spans = _annotate(annotator, tokenizer_dir, flat, ids, workers)
            else:
                flat_spans = [np.zeros((0, 3), np.int32)] * len(flat)
            lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
            n_spans = np.fromiter((len(s) for s in flat_spans), np.int64, len(flat_spans))
            arrays = {
                "tokens": np.fromiter((i for x in ids for i in x), np.int32, int(lengths.sum())),
                "turn_bounds": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                "dialogue_bounds": np.concatenate([[0], np.cumsum([len(d) for d in texts])]).astype(np.int64),
                "roles": np.fromiter((r for rs in roles for r in rs), np.int8, len(flat)),
                "spans": (np.concatenate(flat_spans).astype(np.int32) if n_spans.sum()
                          else np.zeros((0, 3), np.int32)),
                "span_bounds": np.concatenate([[0], np.cumsum(n_spans)]).astype(np.int64),
            }
            return arrays, {"path": str(path), "skipped": skipped}

        if cache is None:
            arrays, meta = build()
        else:
            from trainer.data.cache_file import CacheWriter, code_hash, ensure, settings_hash

            import data_prep.annotators as annotators_module

            # the code that tokenizes, parses and annotates: an edit of either module keys a new file
            key = settings_hash({"version": DIALOGUE_CACHE_VERSION,
                                 "code": code_hash([__file__, annotators_module.__file__]),
                                 "file": sha256_file(path), "tokenizer": tokenizer.fingerprint,
                                 "annotator": _annotator_key(spec), "min_turns": min_turns})
            out = Path(cache.dir) / f"dialogues-{path.stem}-{key}.bfc"

            def write(target: Path) -> None:
                arrays, meta = build()
                layout = [(name, a.dtype.str, a.shape[1:]) for name, a in arrays.items()]
                with CacheWriter(target, "dialogues", key, layout) as w:
                    for name, a in arrays.items():
                        w.append(name, a)
                    w.commit(meta)

            arrays, meta = ensure(out, "dialogues", key, write, cache, f"the tokenized dialogues of {path}")
        self.skipped = int(meta["skipped"])
        self._tokens, self._turn_bounds = arrays["tokens"], arrays["turn_bounds"]
        self._dialogue_bounds, self._roles = arrays["dialogue_bounds"], arrays["roles"]
        self._spans, self._span_bounds = arrays["spans"], arrays["span_bounds"]
        self.turns = _PerDialogue(self, self._turn)
        self.spans = _PerDialogue(self, self._turn_spans)
        self.roles = _Roles(self)
        # role -> (dialogue, turn) of every turn, for drawing a fake turn of the same role
        n_turns = np.diff(self._dialogue_bounds)
        dialogue = np.repeat(np.arange(len(n_turns), dtype=np.int64), n_turns)
        pairs = np.stack([dialogue, np.arange(len(dialogue), dtype=np.int64) - self._dialogue_bounds[dialogue]], 1)
        self._by_role = {r: pairs[self._roles == r] for r in ROLES.values()}

    def _turn(self, k: int) -> np.ndarray:
        return self._tokens[self._turn_bounds[k]:self._turn_bounds[k + 1]]

    def _turn_spans(self, k: int) -> np.ndarray:
        return self._spans[self._span_bounds[k]:self._span_bounds[k + 1]]

    def __len__(self) -> int:
        return len(self._dialogue_bounds) - 1

    def random_turn(self, role: int, not_dialogue: int, rng: np.random.Generator) -> tuple[int, int]:
        pool = self._by_role[role]
        if len(pool) == 0 or (pool[:, 0] == not_dialogue).all():
            pool = np.concatenate(list(self._by_role.values()))
        for _ in range(16):  # almost always the first draw: other dialogues hold nearly all turns
            d, t = pool[int(rng.integers(0, len(pool)))]
            if d != not_dialogue:
                return int(d), int(t)
        raise ValueError("DLM needs at least two dialogues to draw fake turns from")


def dlm_dialogues(dlm, tokenizer, split: str, cache) -> DialogueFile | None:
    """The ``DialogueFile`` an ERNIE 1.0 run reads for ``split`` (``dlm``: ``objective.options.dlm``, an
    ``ErnieOptions.dlm``): ``dlm.path`` for training, ``dlm.valid_path`` for evaluation; None where it reads none.
    ``cache``: the run's ``CachePolicy`` (``data.cache_dir``). One function for the trainer (``build_dataset``, at
    start) and ``python -m trainer.data.build_index`` (ahead of the job), so both make the same cache file: what the
    one builds, the other finds (with ``data.require_prebuilt_index: true`` it must)."""
    path = None if dlm is None else dlm.path if split == "train" else dlm.valid_path
    if path is None:
        return None
    if dlm.annotate:
        from data_prep.annotate import make_annotator  # noqa: PLC0415

        make_annotator(dlm.annotate)  # a bad spec fails here, on every rank, before any waiting
    return DialogueFile(path, tokenizer, dlm.annotate, tokenizer.path if dlm.annotate else None, cache=cache,
                        workers=cache.workers,
                        key=f"objective.options.dlm.{'path' if split == 'train' else 'valid_path'}")


class _PerDialogue:
    """``x[d]``: the list of per-turn arrays of dialogue d (views of the mapped arrays)."""

    def __init__(self, owner: DialogueFile, per_turn):
        self._owner, self._per_turn = owner, per_turn

    def __len__(self) -> int:
        return len(self._owner)

    def __getitem__(self, d: int) -> list[np.ndarray]:
        b = self._owner._dialogue_bounds
        return [self._per_turn(k) for k in range(int(b[d]), int(b[d + 1]))]


class _Roles:
    """``roles[d]``: the roles of dialogue d's turns (Q = 0, R = 1)."""

    def __init__(self, owner: DialogueFile):
        self._owner = owner

    def __len__(self) -> int:
        return len(self._owner)

    def __getitem__(self, d: int) -> np.ndarray:
        b = self._owner._dialogue_bounds
        return self._owner._roles[b[d]:b[d + 1]]


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
