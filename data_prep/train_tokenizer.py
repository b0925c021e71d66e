"""Train the tokenizers of the BERT family from the inputs build_indexed.py reads, into a folder that the trainer
(``data_prep.tokenizer.load_tokenizer``) and ``transformers.AutoTokenizer.from_pretrained`` both load offline.

    python data_prep/train_tokenizer.py --kind wordpiece|bbpe|unigram|zh --input SPEC [SPEC ...] --output DIR
        [--vocab-size N] [--lowercase | --cased] [--json-key text] [--limit-bytes 500M]
    python data_prep/train_tokenizer.py --from-pretrained HF_FOLDER --output DIR

``--from-pretrained`` trains nothing: it converts a released Hugging Face tokenizer (bert-base-uncased's vocab.txt,
roberta-large's vocab.json + merges.txt, albert's spiece.model) into this folder layout, so that a corpus for
continued pretraining is tokenized with the model's own vocabulary (``data_prep/import_tokenizer.py``).

Kinds (a row of ``KINDS`` each):

- ``wordpiece``: BERT. Hugging Face ``WordPieceTrainer`` with BERT's normalizer and pre-tokenizer, uncased by
  default (``--cased`` for bert-*-cased); 30,522 tokens; ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``.
- ``bbpe``: RoBERTa/GPT-2 byte-level BPE (``BpeTrainer`` over the 256-byte alphabet), cased, lossless
  (decode(encode(text)) == text); 50,265 tokens; ``<s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4``.
- ``unigram``: ALBERT. SentencePiece's own unigram trainer (``spiece.model`` kept), then converted to a fast
  tokenizer with ALBERT's pipeline (quotes, NFKD + accent stripping and lowercasing unless ``--cased``, the model's
  nmt_nfkc charsmap, Metaspace); 30,000 tokens; ``<pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4``.
- ``zh``: ERNIE 1.0 Chinese. BERT's Chinese handling (every CJK ideograph is pre-tokenized apart, so it is its own
  token) plus WordPiece for everything else; unlike ``wordpiece`` the initial alphabet is not capped, so every Han
  character of the corpus gets a token instead of [UNK]; 18,000 tokens (ERNIE 1.0's vocabulary size).

Each pipeline is exactly the one transformers' BertTokenizer / RobertaTokenizer / AlbertTokenizer rebuilds from the
vocabulary and tokenizer_config.json (transformers 5 rebuilds rather than reading tokenizer.json's normalizer), so
AutoTokenizer gives our ids. Trainers are fed from an iterator of lines: memory follows the number of distinct
words (HF trainers) or, for SentencePiece, which holds its text in memory (~22x), is capped at ``--spm-max-bytes``
of text (a sample spread over the inputs) and ``--spm-sentences`` lines, not the corpus size.

Reproducibility: every kind gives byte-identical folders (same fingerprint) for the same command and input.
HF's WordPieceTrainer alone does not (it numbers its "##" tokens in hash-map order and breaks ties between equally
frequent merges by those numbers: huggingface/tokenizers#1794, fix proposed in PR #2066), so wordpiece and zh train
in two passes that fix those numbers first (``data_prep/wordpiece_trainer.py``), and the result is renumbered in
sorted order.
Shards record the fingerprint of the folder they were built with; keep it.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

if __name__ == "__main__" and __package__ in (None, ""):
    # `python data_prep/train_tokenizer.py` puts data_prep/ on sys.path, not the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep import sample_text
from data_prep.cpus import usable_cpus
from data_prep.tokenizer import (HF_CONFIG, HF_SPECIAL_MAP, META_FILE, META_FORMAT, META_VERSION, ROLES, SPM_MODEL,
                                 TOKENIZER_JSON, fingerprint_folder, load_tokenizer)
from data_prep.wordpiece_trainer import train_wordpiece


@dataclass(frozen=True)
class Kind:
    default_vocab_size: int
    default_lowercase: bool
    hf_class: str
    specials: dict[str, str]
    """role -> token string"""
    id_order: tuple[str, ...]
    """roles in the order of their ids 0..4"""
    word_start_convention: str
    model_max_length: int = 512


_BERT_SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}
KINDS: dict[str, Kind] = {
    "wordpiece": Kind(30522, True, "BertTokenizerFast", _BERT_SPECIALS, ("pad", "unk", "cls", "sep", "mask"),
                      "##-continuation"),
    "zh": Kind(18000, True, "BertTokenizerFast", _BERT_SPECIALS, ("pad", "unk", "cls", "sep", "mask"),
               "##-continuation"),
    "bbpe": Kind(50265, False, "RobertaTokenizerFast",
                 {"cls": "<s>", "sep": "</s>", "mask": "<mask>", "pad": "<pad>", "unk": "<unk>"},
                 ("cls", "pad", "sep", "unk", "mask"), "Ġ-start"),
    "unigram": Kind(30000, True, "AlbertTokenizerFast",
                    {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "<pad>", "unk": "<unk>"},
                    ("pad", "unk", "cls", "sep", "mask"), "▁-start"),
}

# HF's BertWordPieceTokenizer default: rare characters of an English corpus become [UNK] instead of each costing a
# vocabulary slot. zh lifts the cap (every Han character must be a token).
WORDPIECE_ALPHABET_LIMIT = 1000
MIN_FREQUENCY = 2
SPM_MAX_SENTENCE_BYTES = 16384
# SentencePiece's unigram trainer peaks at ~21.5x the text it holds (review: 4,395 MB RSS for 200 MB of text); a
# line cap alone does not bound that (10M paragraph lines are 5-10 GB of text), so the text is capped in bytes too.
SPM_MEMORY_FACTOR = 22


def parse_size(text: str) -> int:
    """'500K', '10M', '2G', '12345' -> bytes (powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size like 500K, 10M, 2G or 12345")
    scale = 1024 ** " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * scale)


class LineFeed:
    """The lines of every document of the inputs, in order; counts what it read for the summary and the metadata.

    Reading goes through data_prep.sources, the same reader as build_indexed.py, so both see the same text
    (compression, jsonl keys, bad input counted by reason). With ``limit_bytes`` the text is a sample spread over the
    whole of every input, each input's share in proportion to its text size (uncompressed, estimated for compressed
    inputs), so a tokenizer trained on 2 GB of a Books + Wikipedia + CC-News blend, or of one file that holds
    English then Chinese, sees all of it (data_prep/sample_text.py says how). The sample is the same for the same
    inputs and flags."""

    def __init__(self, specs: list[str], json_key: str = "text", limit_bytes: int | None = None,
                 transform=None, progress: bool = True):
        from data_prep import sources  # imported here: the loader module must stay light, this CLI may be heavy

        self.skipped: Counter = Counter()
        self.first_skipped: dict[str, str] = {}
        """reason -> where the first one was (file:line and what), printed with the counts as build_indexed does"""
        self.paths = sources.expand_inputs(specs, skipped=self.skipped, on_skip=self._on_skip)
        self._sources = sources
        self.json_key = json_key
        self.limit_bytes = limit_bytes
        self.shares = sample_text.plan(self.paths, limit_bytes)
        self.transform = transform
        self.progress = progress

    def _on_skip(self, reason: str, where: str) -> None:
        self.first_skipped.setdefault(reason, where)

    def _read(self, path: str, start: int = 0, end: int | None = None):
        return self._sources.iter_documents(path, json_key=self.json_key, skipped=self.skipped,
                                            on_skip=self._on_skip, start=start, end=end)

    @property
    def bytes(self) -> int:
        return sample_text.stats(self.shares)[0]

    @property
    def lines(self) -> int:
        return sample_text.stats(self.shares)[1]

    @property
    def documents(self) -> int:
        """documents that gave at least one line (a document sampled in several windows counts once per window)"""
        return sample_text.stats(self.shares)[2]

    @property
    def truncated(self) -> bool:
        return sample_text.stats(self.shares)[3]

    def __iter__(self) -> Iterator[str]:
        from tqdm import tqdm

        for share in self.shares:  # a second pass (wordpiece's probe) counts anew
            share.taken = share.lines = share.documents = 0
            share.complete = True
        total = None if self.limit_bytes is None else min(self.limit_bytes, sum(s.size for s in self.shares))
        if total is None and self.progress:
            total = sum(self._sources.input_bytes(p) for p in self.paths)  # on disk: compressed inputs run past it
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading", disable=not self.progress, mininterval=1.0)
        try:
            for line in sample_text.Sampler(self.shares, self.limit_bytes, self._read):
                if self.progress:
                    bar.update(len(line.encode("utf-8")))
                yield self.transform(line) if self.transform else line
        finally:
            bar.close()


# ---------------------------------------------------------------------------------------------------------- trainers
def _ordered_specials(kind: Kind) -> list[str]:
    return [kind.specials[role] for role in kind.id_order]


def train_bbpe(lines: Iterable[str], vocab_size: int):
    """RoBERTa's byte-level BPE (as transformers' RobertaTokenizer builds it) trained with HF's BpeTrainer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    kind = KINDS["bbpe"]
    tok = Tokenizer(models.BPE(dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=MIN_FREQUENCY,
                                  special_tokens=_ordered_specials(kind),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    # RoBERTa's <mask> swallows the space before it, so "Paris is the <mask>." predicts "Ġcapital" (fill-mask).
    tok.add_special_tokens([AddedToken(kind.specials["mask"], lstrip=True, rstrip=False, normalized=False,
                                       special=True)])
    cls, sep = kind.specials["cls"], kind.specials["sep"]
    tok.post_processor = processors.RobertaProcessing((sep, tok.token_to_id(sep)), (cls, tok.token_to_id(cls)),
                                                      trim_offsets=True, add_prefix_space=False)
    return tok


def albert_normalizer_steps(lowercase: bool) -> list:
    """ALBERT's text normalization before the SentencePiece charsmap (transformers' AlbertTokenizer; accents are
    kept exactly when the text is cased)."""
    from tokenizers import normalizers

    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    return steps


def train_unigram(feed: LineFeed, vocab_size: int, lowercase: bool, max_sentences: int, threads: int):
    """SentencePiece unigram (ALBERT) -> (spiece.model bytes, fast tokenizer with ALBERT's pipeline).

    The trainer sees text already put through ALBERT's pre-charsmap normalization, so its pieces live in the space
    the encoder sees (lowercase, no accents); SentencePiece then applies nmt_nfkc itself, as the charsmap does."""
    import sentencepiece as spm
    from tokenizers import normalizers

    kind = KINDS["unigram"]
    pre = normalizers.Sequence(albert_normalizer_steps(lowercase))
    feed.transform = pre.normalize_str
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=spm_sentences(feed), model_writer=model, model_type="unigram", vocab_size=vocab_size,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=kind.specials["pad"], unk_piece=kind.specials["unk"],
        control_symbols=[kind.specials[r] for r in ("cls", "sep", "mask")],
        character_coverage=0.9995, normalization_rule_name="nmt_nfkc",
        # A corpus too small for the vocabulary gives fewer pieces (reported) instead of an abort.
        hard_vocab_limit=False,
        # SentencePiece holds its training sentences in memory: at most this many (reservoir sampling), of at most
        # --spm-max-bytes of text (main() caps the feed), so a 160 GB corpus costs a bounded, announced amount.
        input_sentence_size=max_sentences, shuffle_input_sentence=True, max_sentence_length=SPM_MAX_SENTENCE_BYTES,
        num_threads=threads, minloglevel=2)
    return model.getvalue(), unigram_from_spm(model.getvalue(), lowercase)


def spm_sentences(lines: Iterable[str], max_bytes: int = SPM_MAX_SENTENCE_BYTES) -> Iterator[str]:
    """SentencePiece drops a training sentence longer than max_sentence_length bytes (a paragraph-per-line corpus
    has many); cut such lines at a space into pieces it keeps, so their text still counts."""
    step = max_bytes // 4  # characters per piece: at most 4 UTF-8 bytes each
    for line in lines:
        if len(line) <= step or len(line.encode("utf-8")) <= max_bytes:
            yield line
            continue
        start = 0
        while start < len(line):
            end = min(start + step, len(line))
            if end < len(line):
                space = line.rfind(" ", start + step // 2, end)
                end = space if space > start else end
            yield line[start:end]
            start = end


def unigram_from_spm(model_bytes: bytes, lowercase: bool):
    """A fast tokenizer equal to the one transformers' AlbertTokenizer builds from this SentencePiece model."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    kind = KINDS["unigram"]
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_bytes)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
    steps = albert_normalizer_steps(lowercase)
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens([AddedToken(kind.specials[role], lstrip=(role == "mask"), rstrip=False, normalized=False,
                                       special=True) for role in kind.id_order])
    cls, sep = kind.specials["cls"], kind.specials["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    return tok


# ---------------------------------------------------------------------------------------------------------- writing
def hf_config(kind_name: str, lowercase: bool, tok) -> dict:
    """tokenizer_config.json: the family's class, its constructor options and the special tokens, as
    ``save_pretrained`` writes them (transformers 4 reads tokenizer.json, transformers 5 rebuilds from these)."""
    kind = KINDS[kind_name]
    config: dict = {"tokenizer_class": kind.hf_class, "model_max_length": kind.model_max_length,
                    "clean_up_tokenization_spaces": False}
    if kind.hf_class == "BertTokenizerFast":
        config.update(do_lower_case=lowercase, tokenize_chinese_chars=True, strip_accents=None)
    elif kind.hf_class == "AlbertTokenizerFast":
        config.update(do_lower_case=lowercase, keep_accents=not lowercase, remove_space=True,
                      bos_token=kind.specials["cls"], eos_token=kind.specials["sep"])
    elif kind.hf_class == "RobertaTokenizerFast":
        config.update(add_prefix_space=False, trim_offsets=True, errors="replace",
                      bos_token=kind.specials["cls"], eos_token=kind.specials["sep"])
    config.update({f"{role}_token": kind.specials[role] for role in ROLES})
    config["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "normalized": t.normalized,
                 "single_word": t.single_word, "special": t.special}
        for i, t in sorted(tok.get_added_tokens_decoder().items())}
    return config


def write_folder(out: Path, kind_name: str, lowercase: bool, tok, requested: int, feed: LineFeed,
                 spm_model: bytes | None = None) -> dict:
    """Write every file of the folder (DESIGN.md "Tokenizer folder"); our metadata last, so a folder without it is
    recognisably unfinished."""
    kind = KINDS[kind_name]
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)
    tok.save(str(out / TOKENIZER_JSON))
    if spm_model is not None:
        (out / SPM_MODEL).write_bytes(spm_model)
    else:
        (out / SPM_MODEL).unlink(missing_ok=True)
    config = hf_config(kind_name, lowercase, tok)
    special_map = {f"{role}_token": kind.specials[role] for role in ROLES}
    if kind.hf_class != "BertTokenizerFast":
        special_map.update(bos_token=config["bos_token"], eos_token=config["eos_token"])
    _write_json(out / HF_CONFIG, config)
    _write_json(out / HF_SPECIAL_MAP, special_map)
    meta = {
        "format": META_FORMAT, "version": META_VERSION, "kind": kind_name, "lowercase": lowercase,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True), "requested_vocab_size": requested,
        "hf_tokenizer_class": kind.hf_class, "word_start_convention": kind.word_start_convention,
        "special_tokens": {role: {"token": kind.specials[role], "id": tok.token_to_id(kind.specials[role])}
                           for role in ROLES},
        "training": {"inputs": feed.paths, "documents": feed.documents, "lines": feed.lines, "bytes": feed.bytes,
                     "truncated_at_limit": feed.truncated, "skipped": dict(sorted(feed.skipped.items()))},
    }
    _write_json(out / META_FILE, meta)
    return meta


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train_tokenizer.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=sorted(KINDS), help="wordpiece (BERT), bbpe (RoBERTa), "
                   "unigram (ALBERT SentencePiece), zh (ERNIE Chinese); required unless --from-pretrained")
    p.add_argument("--input", nargs="+", metavar="SPEC",
                   help="files, directories, globs or builtin:pydocs (as build_indexed.py); required unless "
                        "--from-pretrained")
    p.add_argument("--from-pretrained", type=Path, default=None, metavar="HF_FOLDER",
                   help="convert this Hugging Face tokenizer folder (a released model's) instead of training one; "
                        "kind, case and special tokens are read from it")
    p.add_argument("--output", required=True, type=Path, help="tokenizer folder to write")
    p.add_argument("--vocab-size", type=int, default=None, help="default per kind: " +
                   ", ".join(f"{k} {v.default_vocab_size}" for k, v in KINDS.items()))
    case = p.add_mutually_exclusive_group()
    case.add_argument("--lowercase", dest="lowercase", action="store_true", default=None,
                      help="uncased (default for wordpiece, unigram, zh)")
    case.add_argument("--cased", dest="lowercase", action="store_false", help="keep case (bbpe is always cased)")
    p.add_argument("--json-key", default="text", help="field holding the text in .jsonl inputs (default: text)")
    p.add_argument("--limit-bytes", type=parse_size, default=None,
                   help="train on a sample of this much UTF-8 text, e.g. 2G, spread over the whole of every input "
                        "in proportion to its text size (default: all input)")
    p.add_argument("--spm-sentences", type=int, default=10_000_000,
                   help="unigram: lines SentencePiece samples into memory (default 10,000,000)")
    p.add_argument("--spm-max-bytes", type=parse_size, default=1 << 30,
                   help="unigram: at most this much text (a sample spread over the inputs, as --limit-bytes) goes to "
                        "SentencePiece, which holds it in memory, ~%dx: the default 1G needs ~22 GB" % SPM_MEMORY_FACTOR)
    p.add_argument("--threads", type=int, default=usable_cpus(),
                   help="unigram: SentencePiece threads (default: the CPUs this process may use, e.g. its Slurm allocation)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_pretrained is not None:
        return from_pretrained(args)
    if args.kind is None or args.input is None:
        raise SystemExit("error: --kind and --input are required (or --from-pretrained HF_FOLDER)")
    kind = KINDS[args.kind]
    vocab_size = args.vocab_size or kind.default_vocab_size
    if vocab_size < 16:
        raise SystemExit(f"error: --vocab-size {vocab_size} is too small (the special tokens alone take 5)")
    lowercase = kind.default_lowercase if args.lowercase is None else args.lowercase
    if args.kind == "bbpe" and lowercase:
        # transformers' RobertaTokenizer has no normalizer, so a lowercasing bbpe would not load identically there.
        raise SystemExit("error: --lowercase is not supported for --kind bbpe (byte-level BPE is cased and lossless, "
                         "as in RoBERTa); drop --lowercase")
    from data_prep.sources import InputError

    limit = args.limit_bytes
    if args.kind == "unigram":
        limit = args.spm_max_bytes if limit is None else min(limit, args.spm_max_bytes)
    try:
        feed = LineFeed(args.input, json_key=args.json_key, limit_bytes=limit,
                        progress=not args.quiet and sys.stderr.isatty())
        if args.kind == "unigram":
            text = min(limit, sum(share.size for share in feed.shares))
            print(f"unigram: SentencePiece holds its training text in memory: up to {text / 1e6:,.1f} MB of text, "
                  f"expect ~{SPM_MEMORY_FACTOR * text / 1e9:,.1f} GB of RAM (~{SPM_MEMORY_FACTOR}x; lower "
                  f"--spm-max-bytes or --limit-bytes to need less)", flush=True)
        spm_model = None
        if args.kind in ("wordpiece", "zh"):
            # the same lines again, read anew, for the first of the two passes that make training deterministic
            probe = LineFeed(args.input, json_key=args.json_key, limit_bytes=args.limit_bytes, progress=False)
            kind = KINDS[args.kind]
            tok = train_wordpiece(feed, kind, _ordered_specials(kind), vocab_size, lowercase,
                                  None if args.kind == "zh" else WORDPIECE_ALPHABET_LIMIT, MIN_FREQUENCY,
                                  probe_lines=probe)
        elif args.kind == "bbpe":
            tok = train_bbpe(feed, vocab_size)
        else:
            spm_model, tok = train_unigram(feed, vocab_size, lowercase, args.spm_sentences, args.threads)
    except InputError as err:
        raise SystemExit(f"error: {err}") from None
    except RuntimeError as err:  # SentencePiece reports its failures (e.g. no sentences) as RuntimeError
        if feed.lines:
            raise SystemExit(f"error: SentencePiece training failed: {err}") from None
    if feed.lines == 0:
        raise SystemExit(f"error: no text read from --input {' '.join(args.input)} "
                         f"(skipped: {feed.skipped or 'nothing'}); check the paths and --json-key")
    meta = write_folder(args.output, args.kind, lowercase, tok, vocab_size, feed, spm_model)
    loaded = load_tokenizer(args.output)  # the folder must load: fail here, not in a worker hours later
    actual = meta["vocab_size"]
    print(f"{args.kind} tokenizer: {actual:,} tokens ({'uncased' if lowercase else 'cased'}) from {feed.lines:,} lines, "
          f"{feed.documents:,} documents, {feed.bytes / 1e6:.1f} MB from {len(feed.paths)} input(s)"
          f"{' (a sample, below)' if feed.truncated else ''} -> {args.output}")
    if limit is not None and feed.truncated:
        flag = "--limit-bytes" if limit == args.limit_bytes else "--spm-max-bytes"
        print("\n".join(sample_text.describe(feed.shares, limit, flag)))
    print(f"fingerprint {fingerprint_folder(args.output)[:16]}, special ids "
          + " ".join(f"{kind.specials[r]}={getattr(loaded, r + '_id')}" for r in ROLES))
    if feed.skipped:
        print("skipped input, by reason (data_prep/sources.py lists them):")
        for reason, n in sorted(feed.skipped.items()):
            print(f"  {reason}: {n:,} (first: {feed.first_skipped.get(reason, '?')})")
    if actual < vocab_size:
        print(f"warning: the corpus is too small for --vocab-size {vocab_size:,}: the trainer found only {actual:,} "
              f"tokens; give it more text (or lower --vocab-size to {actual:,} to make this explicit)", file=sys.stderr)
    elif actual > vocab_size:
        print(f"warning: the vocabulary has {actual:,} tokens, more than --vocab-size {vocab_size:,}: the corpus has "
              f"more distinct characters than that and each one needs a token", file=sys.stderr)
    return 0


def from_pretrained(args) -> int:
    """``--from-pretrained``: the options that shape training do not apply and are refused rather than ignored."""
    from data_prep.import_tokenizer import TokenizerImportError, import_pretrained

    given = [f"--{n.replace('_', '-')}" for n in ("kind", "input", "vocab_size", "lowercase", "limit_bytes")
             if getattr(args, n) is not None]
    if given:
        raise SystemExit(f"error: {' '.join(given)} cannot be combined with --from-pretrained (the released "
                         "tokenizer decides its kind, vocabulary and case)")
    try:
        meta = import_pretrained(args.from_pretrained, args.output)
    except TokenizerImportError as err:
        raise SystemExit(f"error: {err}") from None
    print(f"{meta['kind']} tokenizer: {meta['vocab_size']:,} tokens ({'uncased' if meta['lowercase'] else 'cased'}) "
          f"imported from {args.from_pretrained} -> {args.output}")
    print(f"fingerprint {fingerprint_folder(args.output)[:16]}, special ids "
          + " ".join(f"{meta['special_tokens'][r]['token']}={meta['special_tokens'][r]['id']}" for r in ROLES))
    return 0


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    sys.exit(main())
