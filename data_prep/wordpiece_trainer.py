"""WordPiece training (``wordpiece`` and ``zh`` kinds of data_prep/train_tokenizer.py) that gives the same tokenizer
on every run.

Hugging Face's ``WordPieceTrainer`` does the training; this module wraps it because the trainer alone is not
deterministic: it numbers its "##x" tokens in hash-map order, breaks ties between equally frequent merges by those
numbers, and breaks count ties at its alphabet cut in hash order too (huggingface/tokenizers#1794; the fix proposed
in PR #2066 is not released). ``train_wordpiece`` fixes those inputs in a first pass, and the result is renumbered in
sorted order (``_canonical_wordpiece_vocab``).
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable


def train_wordpiece(lines: Iterable[str], kind, specials: list[str], vocab_size: int, lowercase: bool,
                    alphabet_limit: int | None, min_frequency: int, probe_lines: Iterable[str] | None = None):
    """BERT's pipeline (as transformers' BertTokenizer builds it) trained with HF's WordPieceTrainer. ``kind``: a
    ``train_tokenizer.Kind``; ``specials``: its special tokens in id order; ``alphabet_limit``: None = uncapped (zh).

    HF's trainer is not deterministic (huggingface/tokenizers#1794, fix proposed in PR #2066, not in 0.23): it gives
    the "##x" continuation tokens their ids in the iteration order of a randomly seeded hash map, and breaks ties
    between equally frequent merges by pair ids, so two runs on the same text pick different merges (measured on
    4,000 docstring lines at 3,000 tokens: 6-11 of 3,000 tokens differ between any two runs, and every seeded
    training run on such a tokenizer gives other numbers). Its ids for tokens that already exist when the words are
    split are stable, though: special tokens first, in the order given. So with ``probe_lines`` (the same lines
    again; each iteration reads them anew) a first pass learns the character alphabet and the set of "##x" tokens
    (a set, independent of hash order), and the real pass gets those "##x" as extra special tokens, in sorted order,
    and the alphabet as its initial alphabet: every id the merges compare is then fixed, and so is the vocabulary.
    Above ``alphabet_limit`` distinct characters the alphabet is the most frequent ones, counted here with
    ties broken by code point (HF breaks ties at its cut in hash order too: 1,200 CJK characters of equal count gave
    three different tokenizers in three runs).
    The extra special tokens are ordinary tokens of the result (the same ones the trainer would have made itself).
    Cost: the input is read and its words counted twice (the first pass makes no merges): 2.2-2.5 s of CPU against
    1.5 s for one pass on the 1.7 MB docstring corpus at 8,000 tokens (2026-12-03, machine under load); counting
    the characters in the first pass adds 0.15 CPU-s there (~12 MB/s, measured under load)."""
    from tokenizers import trainers

    cap = {} if alphabet_limit is None else {"limit_alphabet": alphabet_limit}
    extra, alphabet = [], []
    if probe_lines is not None:
        probe = _wordpiece_pipeline(kind, lowercase, None, specials)
        raw: Counter = Counter()

        def counted(lines):
            for line in lines:
                raw.update(line)
                yield line

        # no alphabet cap here: HF keeps the most frequent characters and breaks ties at the cut in hash order
        probe.train_from_iterator(counted(probe_lines), trainers.WordPieceTrainer(
            vocab_size=1, min_frequency=min_frequency, special_tokens=specials, continuing_subword_prefix="##",
            show_progress=False))
        found = probe.get_vocab(with_added_tokens=False)
        alphabet = sorted(t for t in found if len(t) == 1 and t not in specials)
        if cap and len(alphabet) > cap["limit_alphabet"]:
            alphabet = _top_characters(raw, probe.normalizer, set(alphabet), cap["limit_alphabet"])
        # given as the initial alphabet it is kept whole and nothing else is (HF ranks initial characters above
        # every counted one); "##x" exist for the kept characters only, as HF's trainer makes them
        kept = set(alphabet)
        extra = sorted(t for t in found if t.startswith("##") and len(t) == 3 and t[2] in kept)
    scratch = _wordpiece_pipeline(kind, lowercase, None, specials)
    scratch.train_from_iterator(lines, trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials + extra,
        continuing_subword_prefix="##", show_progress=False, initial_alphabet=alphabet, **cap))
    # a fresh tokenizer: the scratch one holds the extra "##x" as added special tokens, which would split text
    return _wordpiece_pipeline(kind, lowercase, _canonical_wordpiece_vocab(
        scratch.get_vocab(with_added_tokens=False), len(specials)), specials)


def _top_characters(raw: Counter, normalizer, known: set[str], limit: int) -> list[str]:
    """The ``limit`` most frequent of the ``known`` characters, ties broken by code point: HF's WordPieceTrainer
    counts each character of the normalized words (``raw`` counts the text before normalization; BERT's normalizer
    maps character by character, so each raw character's count goes to what it normalizes to, whitespace aside)."""
    counts: Counter = Counter()
    for ch, n in raw.items():
        for c in normalizer.normalize_str(ch):
            if not c.isspace():
                counts[c] += n
    ranked = sorted((c for c in counts if c in known), key=lambda c: (-counts[c], c))
    return sorted(ranked[:limit])


def _wordpiece_pipeline(kind, lowercase: bool, vocab: dict[str, int] | None, specials: list[str]):
    """BERT's normalizer, pre-tokenizer, decoder (and, given a vocabulary, its special tokens and [CLS]/[SEP]
    template) around a WordPiece model."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    unk = kind.specials["unk"]
    tok = Tokenizer(models.WordPiece(unk_token=unk) if vocab is None else
                    models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##"))
    # strip_accents=None follows `lowercase`, as in the original BERT (uncased strips accents, cased keeps them).
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    if vocab is None:
        return tok
    # as HF's train() adds the trainer's special tokens: whole, unnormalized, special
    tok.add_special_tokens([AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False,
                                       special=True) for t in specials])
    cls, sep = kind.specials["cls"], kind.specials["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    return tok


def _canonical_wordpiece_vocab(vocab: dict[str, int], n_special: int) -> dict[str, int]:
    """The same tokens with ids that do not depend on hash order. HF's WordPieceTrainer lays out the "##x"
    continuation alphabet in HashMap order and orders equally frequent merges arbitrarily, so two runs on the same
    text give the same set of tokens with different ids (and fingerprints). WordPiece matches greedily by string,
    never by id, so renumbering changes no tokenization: special tokens keep 0..n-1, then characters, "##"
    characters, and the merged tokens, each group sorted."""
    ordered = sorted(vocab, key=vocab.get)
    special, rest = ordered[:n_special], ordered[n_special:]
    chars = sorted(t for t in rest if len(t) == 1)
    cont = sorted(t for t in rest if len(t) == 3 and t.startswith("##"))
    picked = set(chars) | set(cont)
    merged = sorted(t for t in rest if t not in picked)
    return {token: i for i, token in enumerate(special + chars + cont + merged)}
