"""ModelConfig: every variant of the encoder (BERT, RoBERTa, ALBERT, ELECTRA, ERNIE) is a value of this one type;
``HeadSpec``: the heads an objective asks for, as data; ``generator_config``: ELECTRA's generator for a discriminator.

A preset (``presets.py``) is a row of these; the trainer's ``model`` section validates into one; the Hugging Face
export reads ``family`` to pick the target architecture. Nothing here imports torch, so config validation stays cheap.
"""
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Family = Literal["bert", "roberta", "albert", "electra", "ernie"]
Sharing = Literal["none", "all", "attention", "ffn"]
Activation = Literal["gelu", "gelu_new", "relu"]


class ModelConfig(BaseModel):
    """Shape and switches of one Transformer encoder (post-LayerNorm, learned absolute positions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(gt=0)
    """The tokenizer's vocabulary: ids 0 .. vocab_size-1 and the MLM logits' width (see pad_vocab_to for the rows
    stored)."""
    pad_vocab_to: int = Field(default=64, ge=1)
    """Store the word embedding (and the tied MLM decoder and its bias) with ``padded_vocab_size`` rows, vocab_size
    rounded up to a multiple of this: 30,522 -> 30,528 and 50,265 -> 50,304 give the decoder GEMM tensor-core-aligned
    shapes. The extra rows start at zero, are never looked up, and the logits are cut back to vocab_size before any
    loss, argmax or sampling, so they get no gradient and stay zero: training is the unpadded model's (to GEMM
    rounding). The Hugging Face export drops them; loading weights with other padding (an older checkpoint, an import)
    pads or trims them (trainer/models/vocab_padding.py). 1 = no padding."""
    hidden_size: int = Field(gt=0)
    """H: width of every Transformer layer."""
    num_layers: int = Field(gt=0)
    """L: layers applied (with sharing='all' one layer is stored and applied L times)."""
    num_heads: int = Field(gt=0)
    """A: attention heads; hidden_size must be divisible by it."""
    intermediate_size: int | None = None
    """Feed-forward width; None = 4 * hidden_size as in all five papers."""
    embedding_size: int | None = None
    """E: token embedding width; None = hidden_size. Smaller = ALBERT's factorized embedding (E -> H projection)."""
    max_position_embeddings: int = Field(default=512, gt=0)
    """Rows of the learned position table (RoBERTa: 514, because positions start at position_offset = 2)."""
    type_vocab_size: int = Field(default=2, ge=0)
    """Segment (token type) embedding rows; 0 = no segment embedding. RoBERTa keeps one row (all zeros ids)."""
    extra_embeddings: dict[str, int] = Field(default_factory=dict)
    """Further embedding tables added to the input, name -> rows: ERNIE 2.0 {'task': 3}, ERNIE DLM {'role': 4}.
    Ids arrive as ``extra_ids[name]``; a missing table's ids default to 0 (as Hugging Face does for task ids)."""
    segment_alternatives: list[str] = Field(default_factory=list)
    """Names in extra_embeddings embedded *in place of* the segment embedding when their ids are given, and skipped
    when not (ERNIE DLM: role embeddings replace segment embeddings, so each is trained only by its own batches)."""
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Hidden dropout (embeddings, attention output, feed-forward output); ALBERT v2 uses 0."""
    attention_dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout on attention probabilities."""
    layer_norm_eps: float = Field(default=1e-12, gt=0.0)
    """LayerNorm epsilon (BERT 1e-12, RoBERTa 1e-5)."""
    hidden_act: Activation = "gelu"
    """Feed-forward activation: 'gelu' (erf, BERT/RoBERTa/ELECTRA), 'gelu_new' (tanh approximation, ALBERT), 'relu'
    (ERNIE 1.0)."""
    sharing: Sharing = "none"
    """Cross-layer parameter sharing (ALBERT): none | all (one layer stored, applied L times) | attention | ffn."""
    pad_token_id: int = Field(default=0, ge=0)
    """Id of the padding token (RoBERTa: 1); its embedding row gets no gradient, as in Hugging Face."""
    position_offset: int = Field(default=0, ge=0)
    """First position id of a real token. RoBERTa: pad_token_id + 1 = 2 (fairseq's convention), so that exported
    position tables line up with Hugging Face's RobertaModel; padding then uses position pad_token_id, as there."""
    family: Family = "bert"
    """Which paper's architecture this is; chooses the Hugging Face export target and the heads a preset counts."""
    initializer_range: float = Field(default=0.02, gt=0.0)
    """Std of the truncated-free normal init of Linear and Embedding weights (all five papers use 0.02)."""
    generator_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    """ELECTRA only: generator hidden size as a fraction of this (discriminator) model's (paper: small 1/4,
    base 1/3, large 1/4). The ELECTRA objective may override it; see generator_config below."""
    activation_checkpointing: bool = False
    """Recompute each layer in backward (torch.utils.checkpoint): saves activation memory for ~30% more compute."""
    unpad: bool = False
    """Drop padding tokens before the layers: linear layers see only real tokens; attention runs variable-length
    (flash-attn or nested tensors on GPU, a padded fallback on CPU). Hidden states at padding positions are 0."""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile (inductor) of each layer's elementwise work: the feed-forward block (GEMM, activation, dropout,
    residual, LayerNorm) and the attention output block (projection, dropout, residual, LayerNorm); attention itself
    stays on its own kernels (flash / SDPA). auto: on for CUDA (not under ZeRO-3, whose parameter hooks dynamo
    would trace), off on the CPU; on: also on the CPU (inductor's C++ backend; compiling takes tens of seconds);
    off: eager. The compiled and eager layers share parameters and state-dict keys: checkpoints are the same."""

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_switch(cls, value):
        """YAML 1.1 reads a bare ``on`` / ``off`` (``--set model.compile=on``, as documented) as a boolean."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        for name in self.segment_alternatives:
            if name not in self.extra_embeddings:
                raise ValueError(f"segment_alternatives names {name!r}, which is not a key of extra_embeddings "
                                 f"{sorted(self.extra_embeddings)}: add it there with its table size")
        for name, rows in self.extra_embeddings.items():
            if rows <= 0:
                raise ValueError(f"extra_embeddings[{name!r}] = {rows}: a table needs at least one row")
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary (vocab_size "
                             f"{self.vocab_size})")
        return self

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word embedding and the tied decoder: vocab_size rounded up to a multiple of pad_vocab_to."""
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def emb_size(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def replace(self, **overrides) -> "ModelConfig":
        """A validated copy with some fields changed (``model_copy`` would skip validation)."""
        return ModelConfig(**{**self.model_dump(), **overrides})


# --- heads, as data (built by heads.py) ----------------------------------------------------------------------------

MLM, NSP, SOP, RTD = "mlm", "nsp", "sop", "rtd"
"""Head names that Hugging Face import gives the heads it finds, so objectives using them continue from a model."""


@dataclass(frozen=True)
class HeadSpec:
    """One head an objective needs: 'mlm' (vocabulary logits at given positions), 'sequence' (on [CLS], with BERT's
    pooler) or 'token' (per-token classifier)."""

    kind: Literal["mlm", "sequence", "token"]
    num_labels: int = 2
    """Output classes for 'sequence' and 'token' (NSP/SOP: 2, ELECTRA RTD: 1 logit); ignored for 'mlm'."""


# --- ELECTRA's generator -----------------------------------------------------------------------------------------

GENERATOR_HEADS = {MLM: HeadSpec("mlm")}
DISCRIMINATOR_HEADS = {RTD: HeadSpec("token", num_labels=1)}


def generator_config(disc: ModelConfig, fraction: float | None = None) -> ModelConfig:
    """The generator's ModelConfig for a discriminator: hidden and feed-forward scaled by ``fraction`` (default
    ``disc.generator_fraction``), heads = max(1, hidden // 64), the same layers, embedding width and vocabulary."""
    fraction = fraction if fraction is not None else disc.generator_fraction
    if fraction is None:
        raise ValueError("ELECTRA needs a generator size: set model.generator_fraction (paper: 0.25 small/large, "
                         "0.333 base) or pass the fraction explicitly")
    if fraction == 1.0:
        return disc.replace(generator_fraction=None)
    hidden = int(round(disc.hidden_size * fraction))
    return disc.replace(hidden_size=hidden, num_heads=max(1, hidden // 64),
                        intermediate_size=int(round(disc.ffn_size * fraction)), embedding_size=disc.emb_size,
                        generator_fraction=None)


def infer_generator_fraction(disc: ModelConfig, generator_hidden_size: int) -> float:
    """The fraction whose generator_config has this hidden size (used when reading weights without the fraction)."""
    return generator_hidden_size / disc.hidden_size
