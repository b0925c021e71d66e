"""The ``data`` section of the run config: corpora, sample format, masking, loader. Defaults are BERT's."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MaskingConfig(BaseModel):
    """Which tokens are predicted and how they are corrupted (BERT 15 % with 80/10/10 by default)."""

    model_config = ConfigDict(extra="forbid")

    strategy: Literal["token", "whole-word", "ngram", "span"] = "token"
    """token: BERT; whole-word: all pieces of a word together; ngram: ALBERT (n <= max_ngram, p(n) ∝ 1/n); span:
    SpanBERT (geometric lengths in words, p=span_p, clipped at max_span)"""
    rate: float = Field(0.15, gt=0.0, lt=1.0)
    """fraction of (non-special) tokens selected for prediction"""
    mask_prob: float = Field(0.8, ge=0.0, le=1.0)
    """of the selected tokens, the fraction replaced by [MASK]"""
    random_prob: float = Field(0.1, ge=0.0, le=1.0)
    """of the selected tokens, the fraction replaced by a random non-special token (the rest stay unchanged)"""
    max_predictions_per_seq: int = Field(20, ge=1)
    """cap on predicted tokens per sample (BERT: 20 at seq 128, 80 at seq 512); also the width P of mlm_positions"""
    max_ngram: int = Field(3, ge=1, le=10)
    span_p: float = Field(0.2, gt=0.0, lt=1.0)
    max_span: int = Field(10, ge=1)
    dynamic: bool = True
    """True: a fresh pattern each time a sample is seen (RoBERTa); False: static, as BERT's offline data"""
    dupe_factor: int = Field(1, ge=1, lt=2**24)
    """static masking only: number of distinct patterns per sample, cycled over epochs (BERT's dupe_factor)"""

    @model_validator(mode="after")
    def _split_sums_to_at_most_one(self):
        if self.mask_prob + self.random_prob > 1.0 + 1e-9:
            raise ValueError(
                f"masking.mask_prob ({self.mask_prob}) + masking.random_prob ({self.random_prob}) exceeds 1")
        return self


class CorpusSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefix: str
    """PREFIX of PREFIX.manifest.json written by data_prep/build_indexed.py"""
    weight: float = Field(1.0, gt=0.0)
    """relative share of training samples drawn from this corpus (blending)"""


class DataConfig(BaseModel):
    """Where samples come from and how they are built. ``corpora`` may list several prepared corpora, blended."""

    model_config = ConfigDict(extra="forbid")

    corpora: list[CorpusSpec] = Field(min_length=1)
    valid_corpora: list[CorpusSpec] = Field(default_factory=list)
    """held-out corpora for evaluation (same format and masking)"""
    valid_split: float = 0.0
    """share of the documents of ``corpora`` held out for evaluation, in [0, 0.5) (Megatron's ``split``; e.g. 0.005):
    whole documents chosen by a keyed hash of (shard name, document number), the same at any world size and across
    resumes (trainer/data/heldout.py); training never reads them and evaluation reads them instead of
    ``valid_corpora``. 0: no split, every document trains"""
    format: Literal["segment-pair", "sentence-pair", "full-sentences", "doc-sentences", "sop-pair"] = "segment-pair"
    max_seq_length: int = Field(128, ge=8)
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0)
    """probability that a sample's target length is drawn uniformly in [2, max] instead of max (BERT)"""
    nsp_negative_prob: float = Field(0.5, ge=0.0, le=1.0)
    """pair formats: probability of a negative (NSP: B from another document; SOP: A and B swapped). NSP decides
    it per chunk in the sample index, so that a negative's unused sentences start the next chunk as in BERT's
    create_pretraining_data (changing it builds a new index); SOP draws it per sample and epoch"""
    pack_doc_sentences: bool = False
    """doc-sentences: pack short samples (document ends) together into one row up to max_seq_length, with
    ``pack_ids [B, T]`` (1, 2, ... per packed sample, 0 = padding) so tokens per batch stay close to full-sentences
    with fixed micro-batch shapes (RoBERTa grows its batch instead, which fixed shapes cannot). The encoder attends
    only within equal pack ids and restarts positions (DESIGN.md "Batches"); the objectives pass them on."""
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    pad_to: Literal["batch", "max"] = "batch"
    """pad each batch to its longest row, or always to max_seq_length (fixed shapes, e.g. for compiled graphs)"""
    num_workers: int = Field(2, ge=0)
    """loader worker processes per rank for the training batches, started once and kept for the run; evaluation
    builds its few batches in the rank itself (no fork in the middle of a run)"""
    prefetch_factor: int = Field(4, ge=1)
    cache_dir: str | None = None
    """where the derived arrays (corpus offsets, sample index) are cached, as memory-mapped files shared by every rank
    of a node; default: an ``index_cache`` folder beside the first manifest. Must be shared by all nodes (or
    prebuilt on each): only global rank 0 builds, the other ranks wait for its file"""
    index_seed: int = Field(1234, ge=0, lt=2**63)
    """seed of the sample layout's randomness (short-sequence targets); separate from the training seed so that a
    new training seed reuses the index (the order of samples follows the training seed)"""
    index_workers: int = Field(0, ge=0)
    """threads building a missing sample index at training start (0: the CPUs this process may use, e.g. its Slurm allocation, at most 16); the
    offline builder takes --workers instead"""
    index_memory_gb: float = Field(2.0, gt=0)
    """memory a sample-index build may hold in flight: it caps the threads (``index_workers``, --workers), and a
    shard too large for it is walked in pieces (trainer/data/sample_index.py ``_run``); the offline builder takes
    --memory-gb instead"""
    index_wait_timeout: float = Field(3600.0, gt=0)
    """seconds the ranks other than 0 wait for rank 0 to finish a missing index before failing with its path"""
    require_prebuilt_index: bool = False
    """fail at once, printing the command that builds it, when an index is missing instead of building it at start
    (`python -m trainer.data.build_index --config RECIPE`, which the Slurm templates run before launching)"""
    blend_period: int = Field(1_000_000, ge=1)
    """blending pattern length: weights are met exactly within each period of this many samples"""

    @model_validator(mode="after")
    def _one_held_out_source(self):
        if not 0.0 <= self.valid_split < 0.5:
            raise ValueError(f"data.valid_split={self.valid_split}: the share of documents held out for evaluation "
                             "must be at least 0 and below 0.5 (e.g. 0.005); 0 turns the split off")
        if self.valid_split > 0 and self.valid_corpora:
            raise ValueError(f"data.valid_split={self.valid_split} and data.valid_corpora both name an evaluation "
                             "set; set one of them (valid_split: 0, or valid_corpora: [])")
        return self
