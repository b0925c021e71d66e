"""The pretraining dataset: global stream position -> one masked sample (numpy), a pure function of the seed.

``dataset[g]`` = blend -> (corpus c, its position) -> epoch order -> (epoch, sample id) -> chunks -> tokens ->
masking. The sample's generator is Philox keyed by ``(seed, corpus, view epoch, sample id)`` where the view epoch is
the epoch (dynamic masking) or ``epoch % dupe_factor`` (static masking: the same pattern for a sample every
``dupe_factor`` epochs, like BERT's offline ``dupe_factor`` copies); the dataset re-keys one Philox per sample
(~1-2 µs, a new generator costs ~8 µs). Nothing else is random, so any rank or worker builds any sample in O(1),
in any order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from data_prep.cpus import usable_cpus

from .cache_file import CachePolicy, launcher_rank
from .config import DataConfig
from .corpus import IndexedCorpus
from .formats import SampleBuilder
from .heldout import DocumentSplit
from .masking import Masker
from .order import Blend, EpochOrder
from .sample_index import load_or_build

BUILD_HINT = "python -m trainer.data.build_index --config RECIPE [--set KEY=VALUE ...]  (the run's recipe and overrides)"


def cache_policy(cfg: DataConfig, builder: bool | None = None, workers: int | None = None,
                 hint: str = BUILD_HINT, memory_gb: float | None = None) -> CachePolicy:
    """Where this data config's derived arrays live and who builds them (global rank 0 unless ``builder``)."""
    first = (cfg.corpora or cfg.valid_corpora)[0].prefix
    folder = Path(cfg.cache_dir) if cfg.cache_dir else Path(str(first)).parent / "index_cache"
    return CachePolicy(folder, builder=launcher_rank() == 0 if builder is None else builder,
                       timeout=cfg.index_wait_timeout, prebuilt_only=cfg.require_prebuilt_index,
                       workers=workers or cfg.index_workers or min(16, usable_cpus()), hint=hint,
                       memory=int((memory_gb or cfg.index_memory_gb) * 2**30))


def split_specs(cfg: DataConfig, split: str) -> tuple[list, str]:
    """(corpus specs, index role) of a split: training reads ``corpora`` (without the held-out documents when
    ``valid_split`` > 0); evaluation reads the held-out documents of ``corpora`` (``valid_split`` > 0) or
    ``valid_corpora``."""
    if split == "train":
        return cfg.corpora, "train"
    return (cfg.corpora, "heldout") if cfg.valid_split > 0 else (cfg.valid_corpora, "train")


def build_indexes(cfg: DataConfig, split: str, cache: CachePolicy) -> list[tuple[IndexedCorpus, object]]:
    """(corpus, sample index) of every corpus of a split, each opened or built under ``cache``."""
    specs, role = split_specs(cfg, split)
    out = []
    for spec in specs:
        corpus = IndexedCorpus(spec.prefix, cache)
        out.append((corpus, load_or_build(corpus, cfg.format, cfg.max_seq_length, cfg.short_seq_prob,
                                          cfg.index_seed, cfg.pack_doc_sentences, cache, cfg.nsp_negative_prob,
                                          cfg.valid_split, role)))
    return out


def _manifest_tokenizer(prefix) -> dict:
    """The manifest's ``tokenizer`` record (path, fingerprint, kind, vocab_size); {} when it has none."""
    from data_prep.manifest import read_manifest  # noqa: PLC0415

    return read_manifest(prefix).get("tokenizer") or {}


def check_same_tokenizer(cfg: DataConfig) -> None:
    """Refuse corpora of one run prepared with different tokenizers (by the manifests' fingerprints, over the bytes
    that define the id mapping): a blend of them, or an evaluation set of another tokenizer, would feed ids that
    mean other words, and an equal vocabulary size does not show it. Every corpus the run reads is compared, the
    training corpora and the evaluation ones alike (one model, one embedding table)."""
    specs = [*split_specs(cfg, "train")[0], *split_specs(cfg, "valid")[0]]
    prefixes = dict.fromkeys(str(spec.prefix) for spec in specs)
    first = None
    for prefix in prefixes:
        tok = _manifest_tokenizer(prefix)
        if not tok.get("fingerprint"):
            continue  # a hand-made manifest without one: nothing to compare
        if first is None:
            first = (prefix, tok)
        elif tok["fingerprint"] != first[1]["fingerprint"]:
            (p0, t0), (p1, t1) = first, (prefix, tok)
            raise ValueError(
                f"{p0} and {p1} were prepared with different tokenizers: fingerprint {t0['fingerprint']} "
                f"({t0.get('path')}, vocab {t0.get('vocab_size')}) vs {t1['fingerprint']} ({t1.get('path')}, vocab "
                f"{t1.get('vocab_size')}); the run would mix token ids that mean different words. Prepare every "
                f"corpus of data.corpora and data.valid_corpora with one tokenizer (python -m "
                f"data_prep.build_indexed --tokenizer DIR ...), or leave the other one out")


BLEND_TOLERANCE = 0.01  # reading_note warns when a corpus's share of the blend is off its weight by more
MANY_EPOCHS = 200  # reading_note warns above this: the papers' recipes read their corpora ~40-80 times
MAX_EPOCHS = 1 << 24  # epochs a sample key can number (sample_key)


def sample_key(seed: int, corpus: int, epoch: int, sample_id: int) -> np.ndarray:
    """Philox's 128-bit key of one sample: seed (48 bits) and corpus (16) | epoch (24) and sample id (40)."""
    if sample_id >= 1 << 40 or epoch >= 1 << 24 or corpus >= 1 << 16 or not 0 <= seed < 1 << 48:
        raise OverflowError(f"sample key out of range: seed {seed}, corpus {corpus}, epoch {epoch}, "
                            f"sample {sample_id}")
    return np.array([(seed << 16) | corpus, (epoch << 40) | sample_id], dtype=np.uint64)


def sample_rng(seed: int, corpus: int, epoch: int, sample_id: int) -> np.random.Generator:
    """A fresh generator for one sample (~8 µs to create; the dataset re-keys one instead, see ``unmasked``)."""
    return np.random.Generator(np.random.Philox(key=sample_key(seed, corpus, epoch, sample_id)))


class PretrainingDataset:
    """Map-style dataset over global stream positions (``len`` is the number of distinct samples per epoch)."""

    def __init__(self, cfg: DataConfig, tokenizer, seed: int, split: str = "train"):
        specs, role = split_specs(cfg, split)
        if not specs:
            raise ValueError(f"data.{'corpora' if split == 'train' else 'valid_corpora'} is empty (or set "
                             "data.valid_split to hold out part of data.corpora)")
        self.cfg, self.seed, self.split = cfg, int(seed), split
        self.pad_id = int(tokenizer.pad_id)
        vocab = int(tokenizer.vocab_size)
        for spec in specs:  # checked before anything is built
            corpus_vocab = int(_manifest_tokenizer(spec.prefix).get("vocab_size", 0)) or None
            if corpus_vocab and corpus_vocab != vocab:
                raise ValueError(f"{spec.prefix}: prepared with a vocabulary of {corpus_vocab}, but the "
                                 f"tokenizer has {vocab}; prepare it again with this tokenizer")
        check_same_tokenizer(cfg)
        # Every whole-corpus array below is a view of a mapped cache file (shared by the node's ranks, re-mapped by
        # workers after pickling); the index's layout depends on data.index_seed, the order on the training seed.
        built = build_indexes(cfg, split, cache_policy(cfg))
        self.corpora = [corpus for corpus, _ in built]
        self.builders, self.orders = [], []
        for c, (corpus, index) in enumerate(built):
            # training NSP negatives take their B side from kept documents only (heldout.py)
            kept = DocumentSplit(corpus, cfg.valid_split) if role == "train" and cfg.valid_split > 0 else None
            self.builders.append(SampleBuilder(corpus, index, cfg.format, cfg.max_seq_length, tokenizer.cls_id,
                                               tokenizer.sep_id, cfg.nsp_negative_prob, held_out=kept))
            # evaluation reads a shuffled order too: its first positions are a fixed sample of the whole split, not
            # the first documents of the first shard
            self.orders.append(EpochOrder(len(index), self.seed + 7919 * c, shuffle=True))
        self.blend = Blend([spec.weight for spec in specs], cfg.blend_period)
        self.masker = Masker(cfg.masking, vocab, tokenizer.mask_id, tokenizer.special_ids,
                             getattr(tokenizer, "word_start", None))
        self._philox = self._rng = None

    def __len__(self) -> int:
        return sum(len(b.index) for b in self.builders)

    def check_stream(self, total_samples: int) -> None:
        """Refuse, before any step, a run whose samples lie past the epochs a sample key can number (``MAX_EPOCHS``
        of each corpus); without this the first such batch raises OverflowError in a loader worker."""
        reps = int(total_samples) // self.blend.period + 1
        for c, builder in enumerate(self.builders):
            local = int(total_samples) if len(self.builders) == 1 else reps * int(self.blend.per_period[c])
            epochs = -(-local // len(builder.index))
            if epochs > MAX_EPOCHS:
                raise ValueError(
                    f"train.steps x train.global_batch_size = {int(total_samples):,} samples would read "
                    f"{self.corpora[c].prefix} ({len(builder.index):,} samples) {epochs:,} times, more than the {MAX_EPOCHS:,} epochs a "
                    "sample key numbers; lower train.steps or use a larger corpus")

    def corpus_samples(self, total_samples: int) -> int:
        """Corpus samples read by stream positions ``[0, total_samples)``: all of them here; ERNIE's datasets take
        none on their DLM and labelled-pair steps (trainer/ernie/data.py overrides this)."""
        return int(total_samples)

    def epochs_read(self, total_samples: int) -> list[float]:
        """How many times positions ``[0, total_samples)`` of the stream read each corpus (its samples per epoch)."""
        total_samples = self.corpus_samples(total_samples)
        if len(self.builders) == 1:
            return [int(total_samples) / len(self.builders[0].index)]
        reps, rest = divmod(int(total_samples), self.blend.period)
        # whole blend periods, then the slots of the last one (exact: the pattern is known)
        return [(reps * int(self.blend.per_period[c]) + int(np.count_nonzero(self.blend.corpus[:rest] == c)))
                / len(b.index) for c, b in enumerate(self.builders)]

    def reading_note(self, total_samples: int) -> list[str]:
        """What the run's ``total_samples`` (train.steps x the global batch) read of each training corpus, said at start:
        a wrong data.corpora (a sample or debug corpus on a production launch) otherwise trained for days with nothing
        in the log to show it (found by review). A warning when a corpus is read more than ``MANY_EPOCHS`` times."""
        lines, epochs = [], self.epochs_read(total_samples)
        read = self.corpus_samples(total_samples)
        which = ("train.steps x train.global_batch_size" if read == int(total_samples) else
                 "train.steps x train.global_batch_size, less the steps that read no corpus")
        for c, (builder, n) in enumerate(zip(self.builders, epochs)):
            share = f", blend weight {self.blend.weights[c]:.3g}" if len(self.builders) > 1 else ""
            lines.append(f"data: {self.corpora[c].prefix}: {len(builder.index):,} samples per epoch "
                         f"({self.cfg.format}, rows of up to {self.cfg.max_seq_length} tokens{share}); "
                         f"{read:,} samples in all ({which}) read it {n:,.2f} times")
            if n > MANY_EPOCHS:
                lines.append(f"warning: {self.corpora[c].prefix} is read {n:,.0f} times, more than {MANY_EPOCHS}: is "
                             "data.corpora the production corpus (not a sample or debug build)? RoBERTa read its "
                             "160 GB ~40 times, BERT its 16 GB ~40 times")
        if len(self.builders) > 1:  # the blend's slots per period round the weights: a short period misses them
            actual = self.blend.per_period / self.blend.period
            off = [c for c in range(len(self.builders))
                   if abs(actual[c] - self.blend.weights[c]) > BLEND_TOLERANCE * self.blend.weights[c]]
            if off:
                lines.append("warning: data.blend_period=" f"{self.blend.period:,} rounds the blend weights: "
                             + ", ".join(f"{self.corpora[c].prefix} gets {actual[c]:.4g} of the samples for its weight "
                                         f"{self.blend.weights[c]:.4g}" for c in off)
                             + "; raise data.blend_period (default 1,000,000) for the weights as given")
        return lines

    def locate(self, position: int) -> tuple[int, int, int]:
        """(corpus, epoch, sample id) read at a global stream position."""
        c, local = self.blend(position)
        epoch, sample_id = self.orders[c](local)
        return c, epoch, sample_id

    def __getitem__(self, position: int) -> dict:
        c, epoch, sample_id = self.locate(position)
        return self.build(c, epoch, sample_id)

    def __getitems__(self, positions: list[int]) -> list[dict]:
        """A batch of samples (the DataLoader calls this with a batch sampler): built one by one, masked in one
        vectorised pass; equal to ``[self[p] for p in positions]``."""
        if type(self).__getitem__ is not PretrainingDataset.__getitem__:  # a subclass builds its own samples
            return [self[p] for p in positions]
        samples, draws = [], []
        for p in positions:
            sample, rng = self.unmasked(*self.locate(p))
            samples.append(sample)
            draws.append(self.masker.draws(rng, len(sample["tokens"])))  # before rng is reset for the next sample
        masked = self.masker.mask_batch([s["tokens"] for s in samples], draws=draws)
        return [self._assemble(s, m) for s, m in zip(samples, masked)]

    def build(self, corpus: int, epoch: int, sample_id: int) -> dict:
        sample, rng = self.unmasked(corpus, epoch, sample_id)
        return self._assemble(sample, self.masker(sample["tokens"], rng))

    def unmasked(self, corpus: int, epoch: int, sample_id: int) -> tuple[dict, np.random.Generator]:
        """The sample's tokens and labels before masking, and its generator (positioned for the masking draws).

        The generator is this dataset's one Philox, re-keyed: the same stream as ``sample_rng(...)`` at ~1/6 of
        the cost of a new generator, valid until the next call (so take the masking draws before that)."""
        masking = self.cfg.masking
        view_epoch = epoch if masking.dynamic else epoch % masking.dupe_factor
        rng = self._rekey(sample_key(self.seed, corpus, view_epoch, sample_id))
        return self.builders[corpus](sample_id, rng), rng

    def _rekey(self, key: np.ndarray) -> np.random.Generator:
        if self._philox is None:
            self._philox = np.random.Philox(key=key)
            self._rng = np.random.Generator(self._philox)
        else:
            self._philox.state = {"bit_generator": "Philox", "state": {"counter": np.zeros(4, np.uint64), "key": key},
                                  "buffer": np.zeros(4, np.uint64), "buffer_pos": 4, "has_uint32": 0,
                                  "uinteger": 0}
        return self._rng

    @staticmethod
    def _assemble(sample: dict, masked) -> dict:
        out = {"input_ids": masked.input_ids, "token_type_ids": sample["token_types"],
               "mlm_positions": masked.positions.astype(np.int32), "mlm_labels": masked.labels.astype(np.int32)}
        if "sentence_label" in sample:
            out["sentence_label"] = sample["sentence_label"]
        if "pack_ids" in sample:
            out["pack_ids"] = sample["pack_ids"]
        return out
