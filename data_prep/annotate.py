"""ERNIE side-car spans: annotators (jieba, gazetteer:FILE, jsonl:FILE) and the span file aligned to the shards.

ERNIE 1.0's phrase- and entity-level masking needs, for every sequence in the shards, which token ranges form a
phrase or a named entity. They are computed once at data-prep time and stored beside each shard:

``PREFIX_00000.spans.npy``  int32 ``[M, 4]`` rows ``(sequence, token_start, token_end, kind)``, ``token_end``
                            exclusive, ``sequence`` the index of the sequence (sentence) inside the shard, exactly as
                            megatron-core's ``IndexedDataset(PREFIX_00000)[sequence]`` numbers them; ``kind`` 0 =
                            entity, 1 = phrase. Rows sorted by (sequence, token_start). Opened with ``mmap_mode="r"``.
``PREFIX_00000.spans.json`` ``{"format": "bertfamily-spans", "version": 1, "annotator": SPEC, "sequences": N,
                            "spans": M, "kinds": ["entity", "phrase"], "stats": {...}}``; written last, so its presence
                            marks a complete side-car.

Spans never cross a sequence boundary (a sample is built from whole sequences, so such a span could not be masked
whole anyway). Spans of one kind do not overlap; an entity and a phrase may.

Annotators map the text of one sequence to character spans; ``align_spans`` maps those to token spans through the
tokenizer's character offsets (Hugging Face ``tokenizers`` gives them), keeping only spans whose ends fall on token
boundaries (a gazetteer entry "York" must not match inside "Yorkshire"). The hook for ``build_indexed.py``:

    annotator = make_annotator("jieba")                          # once per process, from --annotate
    writer = SidecarWriter(shard_prefix, annotator, tokenizer_dir)  # beside each shard's IndexedDatasetBuilder
    writer.add_document(sentences, ids_per_sentence)             # with every document added to the shard
    writer.finalize()                                            # when the shard is finalized

Worker processes can do the expensive half themselves with ``DocumentAnnotator(annotator, tokenizer_dir)(sentences)``
and hand the arrays to ``SidecarWriter.add_document_spans``.

Corpora prepared without ``--annotate`` are annotated afterwards, from the shards alone:
``python -m data_prep.annotate PREFIX --annotate jieba`` rebuilds each sequence's text from its tokens (``##``, ``Ġ``
and ``▁`` conventions; no space between CJK characters) with exact token offsets, so no input is re-read. The text
is the tokenizer's normalised form (lower-cased for uncased tokenizers, which suits jieba and lower-cased
gazetteers; pass ``gazetteer-lower:FILE`` to lower-case the entries).

Multi-pattern matching for gazetteers uses ``pyahocorasick`` (Aho-Corasick, linear in the text for any number of
entries); Chinese segmentation and part-of-speech tags come from ``jieba`` with its bundled dictionary.
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

KINDS = ("entity", "phrase")
ENTITY, PHRASE = 0, 1
FORMAT = "bertfamily-spans"
VERSION = 1

# jieba part-of-speech tags that name things: people (nr, nrfg, nrt), places (ns), organisations (nt), other proper
# nouns (nz). Tags follow the ICTCLAS set jieba's dictionary is annotated with.
JIEBA_ENTITY_TAGS = frozenset({"nr", "nrfg", "nrt", "ns", "nt", "nz"})
# Words that chain into a noun phrase when adjacent ("谷歌/n 公司/n" -> "谷歌公司", "新/a 技术/n"): nouns and
# noun modifiers. Verbal nouns (vn) are left out: "公司/n 工作/vn" is a clause, not a unit. Anything else breaks a chain.
JIEBA_CHAIN_TAGS = frozenset({"n", "an", "ng", "nl", "b", "a"})

CharSpan = tuple[int, int, int]  # (char_start, char_end exclusive, kind)


class Annotator(Protocol):
    """Anything that maps one sequence's text to character spans; ``spec`` is recorded in the side-car header."""

    spec: str

    def __call__(self, text: str) -> list[CharSpan]: ...


class JiebaAnnotator:
    """Chinese: entities from jieba's POS tags, phrases from multi-character words and chains of content words.

    A phrase is a jieba word of at least ``min_phrase_chars`` characters that is not an entity, or a run of 2 to
    ``max_chain_words`` adjacent content words (which then replaces the single words inside it). jieba's own
    dictionary is loaded lazily (about 1 s, once per process).
    """

    spec = "jieba"

    def __init__(self, min_phrase_chars: int = 2, max_chain_words: int = 3):
        self.min_phrase_chars = min_phrase_chars
        self.max_chain_words = max_chain_words
        self._tok = None

    def _tokenizer(self):
        if self._tok is None:
            import jieba
            import jieba.posseg

            jieba.setLogLevel(logging.WARNING)
            self._tok = jieba.posseg.POSTokenizer(jieba.Tokenizer())
        return self._tok

    def __call__(self, text: str) -> list[CharSpan]:
        words = []
        pos = 0
        for pair in self._tokenizer().cut(text, HMM=True):
            words.append((pos, pos + len(pair.word), pair.flag, pair.word))
            pos += len(pair.word)
        spans: list[CharSpan] = []
        chain: list[tuple[int, int, str, str]] = []

        def close_chain():
            if len(chain) >= 2:
                spans.append((chain[0][0], chain[-1][1], PHRASE))
            elif chain and len(chain[0][3]) >= self.min_phrase_chars:
                spans.append((chain[0][0], chain[0][1], PHRASE))
            chain.clear()

        for start, end, flag, word in words:
            if flag in JIEBA_ENTITY_TAGS:
                close_chain()
                spans.append((start, end, ENTITY))
            elif flag in JIEBA_CHAIN_TAGS and not word.isspace():
                if len(chain) == self.max_chain_words:
                    close_chain()
                chain.append((start, end, flag, word))
            else:
                close_chain()
                if len(word) >= self.min_phrase_chars and not word.isspace() and word.isalnum():
                    spans.append((start, end, PHRASE))
        close_chain()
        spans.sort()
        return spans


class GazetteerAnnotator:
    """Entity and phrase lists matched over the text with Aho-Corasick, leftmost-longest, any language.

    FILE: UTF-8, one entry per line, ``TEXT`` or ``TEXT<TAB>entity|phrase`` (default entity); blank lines and lines
    starting with ``#`` are skipped. Matches that do not start and end on token boundaries are dropped later by
    ``align_spans``. Matching is case-sensitive (lower-case the list and pass ``lowercase=True`` otherwise).
    """

    def __init__(self, path: str | Path, lowercase: bool = False):
        import ahocorasick

        self.spec = f"gazetteer:{path}"
        self.lowercase = lowercase
        self._auto = ahocorasick.Automaton()
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"gazetteer file {path} not found (--annotate gazetteer:FILE)")
        count = 0
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip() or line.startswith("#"):
                    continue
                text, _, kind_name = line.partition("\t")
                kind_name = kind_name.strip() or "entity"
                if kind_name not in KINDS:
                    raise ValueError(f"{path}:{lineno}: kind {kind_name!r} is not one of {KINDS}; "
                                     "write TEXT<TAB>entity or TEXT<TAB>phrase")
                text = text.strip()
                if lowercase:
                    text = text.lower()
                self._auto.add_word(text, (len(text), KINDS.index(kind_name)))
                count += 1
        if count == 0:
            raise ValueError(f"gazetteer {path} has no entries")
        self.entries = count
        self._auto.make_automaton()

    def __call__(self, text: str) -> list[CharSpan]:
        if self.lowercase:
            text = text.lower()
        return [(end + 1 - length, end + 1, kind) for end, (length, kind) in self._auto.iter_long(text)]


class JsonlAnnotator:
    """A user's own annotations (e.g. an NER model's output), one JSON object per sequence of the shards:

    ``{"text": "李小龙在北京", "spans": [[0, 3, "entity"], [4, 6, "entity"]]}`` with character offsets into ``text``
    (Python string indices, end exclusive). Sequences are matched by their exact text; a sequence without a record
    gets no spans and is counted in ``misses``.
    """

    def __init__(self, path: str | Path):
        self.spec = f"jsonl:{path}"
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"annotation file {path} not found (--annotate jsonl:FILE)")
        self._by_text: dict[str, list[CharSpan]] = {}
        self.misses = 0
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                    text, raw = rec["text"], rec["spans"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{where}: expected {{\"text\": ..., \"spans\": [[start, end, kind], ...]}} "
                                     f"({e})") from None
                spans = []
                for span in raw:
                    if (not isinstance(span, (list, tuple)) or len(span) != 3 or span[2] not in KINDS
                            or not 0 <= int(span[0]) < int(span[1]) <= len(text)):
                        raise ValueError(f"{where}: span {span!r} must be [start, end, kind] with "
                                         f"0 <= start < end <= len(text)={len(text)} and kind in {KINDS}")
                    spans.append((int(span[0]), int(span[1]), KINDS.index(span[2])))
                self._by_text[text] = sorted(spans)

    def __call__(self, text: str) -> list[CharSpan]:
        spans = self._by_text.get(text)
        if spans is None:
            self.misses += 1
            return []
        return spans


def make_annotator(spec: str) -> Annotator:
    """``jieba`` | ``gazetteer:FILE`` | ``jsonl:FILE`` (the value of ``build_indexed.py --annotate``)."""
    name, _, arg = spec.partition(":")
    if name == "jieba" and not arg:
        return JiebaAnnotator()
    if name == "gazetteer" and arg:
        return GazetteerAnnotator(arg)
    if name == "gazetteer-lower" and arg:
        return GazetteerAnnotator(arg, lowercase=True)
    if name == "jsonl" and arg:
        return JsonlAnnotator(arg)
    raise ValueError(f"--annotate {spec!r}: expected jieba, gazetteer:FILE, gazetteer-lower:FILE or jsonl:FILE")


def align_spans(char_spans: Sequence[CharSpan], offsets: np.ndarray) -> tuple[np.ndarray, int]:
    """Character spans -> token spans ``int32 [k, 3]`` (start, end exclusive, kind) through token char offsets.

    ``offsets`` is ``[n_tokens, 2]`` (char start, char end) as Hugging Face tokenizers report them. A span is kept
    only if its first char is a token's start and its last char a token's end, e.g. offsets [[0,1],[1,2],[3,7]]
    ("北京 York") keep char span (0, 2) -> tokens (0, 2) and drop (3, 5) ("Yo"). Returns (spans, dropped count).
    Single-token spans are kept: for whole-word tokenizers an entity may be one token, and it is still a unit.
    """
    if len(char_spans) == 0 or len(offsets) == 0:
        return np.zeros((0, 3), np.int32), len(char_spans)
    cs = np.asarray(char_spans, dtype=np.int64).reshape(-1, 3)
    starts, ends = offsets[:, 0], offsets[:, 1]
    ts = np.searchsorted(starts, cs[:, 0], side="left")
    te = np.searchsorted(ends, cs[:, 1], side="left")
    ts_c, te_c = np.minimum(ts, len(starts) - 1), np.minimum(te, len(ends) - 1)
    ok = (ts < len(starts)) & (te < len(ends)) & (starts[ts_c] == cs[:, 0]) & (ends[te_c] == cs[:, 1]) & (te_c >= ts_c)
    out = np.stack([ts_c[ok], te_c[ok] + 1, cs[ok, 2]], axis=1).astype(np.int32)
    return out, int((~ok).sum())


class DocumentAnnotator:
    """Sentences of one document -> per-sentence token spans, with offsets from the tokenizer folder's tokenizer.json.

    ``ids_per_sentence`` (what build_indexed wrote) is checked against our encoding: a mismatch means the side-car
    would point at the wrong tokens, so it stops with the sentence's text rather than writing garbage.
    """

    def __init__(self, annotator: Annotator, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(tokenizer_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: --tokenizer must be a folder written by train_tokenizer.py")
        self.annotator = annotator
        self._hf = HFTokenizer.from_file(str(path))
        self.stats: Counter = Counter()

    def __call__(self, sentences: Sequence[str], ids_per_sentence: Sequence[Sequence[int]] | None = None
                 ) -> list[np.ndarray]:
        encs = self._hf.encode_batch(list(sentences), add_special_tokens=False)
        out = []
        for i, (text, enc) in enumerate(zip(sentences, encs)):
            if ids_per_sentence is not None and list(ids_per_sentence[i]) != enc.ids:
                raise ValueError(f"annotate: the tokenizer's encoding of sentence {text[:60]!r} differs from the "
                                 "ids written to the shard; annotate with the same tokenizer folder as the shards")
            offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
            spans, dropped = align_spans(self.annotator(text), offsets)
            self.stats["misaligned"] += dropped
            self.stats["entity"] += int((spans[:, 2] == ENTITY).sum())
            self.stats["phrase"] += int((spans[:, 2] == PHRASE).sum())
            out.append(spans)
        return out


def _dedupe_kind_overlaps(spans: np.ndarray) -> np.ndarray:
    """Sort by (start, kind) and drop a span overlapping an earlier one of its kind (keeps the format's promise)."""
    if len(spans) < 2:
        return spans
    spans = spans[np.lexsort((-spans[:, 1], spans[:, 0], spans[:, 2]))]
    keep = np.ones(len(spans), bool)
    last_end = {ENTITY: -1, PHRASE: -1}
    for i, (s, e, k) in enumerate(spans.tolist()):  # k spans per sentence, a handful: a loop is cheapest here
        if s < last_end[k]:
            keep[i] = False
        else:
            last_end[k] = e
    spans = spans[keep]
    return spans[np.lexsort((spans[:, 2], spans[:, 0]))]


class SidecarWriter:
    """Writes ``SHARD.spans.npy`` and ``SHARD.spans.json`` atomically (temporary names, then ``os.replace``)."""

    def __init__(self, shard_prefix: str | Path, annotator: Annotator | None = None,
                 tokenizer_dir: str | Path | None = None, spec: str | None = None):
        self.prefix = str(shard_prefix)
        self.spec = spec or (annotator.spec if annotator is not None else "external")
        self._doc = DocumentAnnotator(annotator, tokenizer_dir) if annotator is not None else None
        self._chunks: list[np.ndarray] = []
        self._sequences = 0
        self.stats: Counter = Counter()

    def add_document(self, sentences: Sequence[str], ids_per_sentence: Sequence[Sequence[int]] | None = None):
        """The sentences of one document as build_indexed adds them; sentences with no tokens are skipped, as
        build_indexed skips them (they never become sequences)."""
        if self._doc is None:
            raise RuntimeError("SidecarWriter was made without an annotator; use add_document_spans")
        if ids_per_sentence is not None:
            keep = [i for i, ids in enumerate(ids_per_sentence) if len(ids)]
            sentences = [sentences[i] for i in keep]
            ids_per_sentence = [ids_per_sentence[i] for i in keep]
        self.add_document_spans(self._doc(sentences, ids_per_sentence))

    def add_document_spans(self, spans_per_sentence: Sequence[np.ndarray]):
        """One ``[k, 3]`` array (token_start, token_end, kind) per sequence, in the order they enter the shard."""
        for spans in spans_per_sentence:
            spans = _dedupe_kind_overlaps(np.asarray(spans, dtype=np.int32).reshape(-1, 3))
            if len(spans):
                seq = np.full((len(spans), 1), self._sequences, np.int32)
                self._chunks.append(np.concatenate([seq, spans], axis=1))
            self._sequences += 1

    def finalize(self) -> dict:
        arr = np.concatenate(self._chunks) if self._chunks else np.zeros((0, 4), np.int32)
        stats = dict(self.stats)
        if self._doc is not None:
            stats.update(self._doc.stats)
            misses = getattr(self._doc.annotator, "misses", None)
            if misses is not None:
                stats["unannotated_sequences"] = misses
        header = {"format": FORMAT, "version": VERSION, "annotator": self.spec, "sequences": self._sequences,
                  "spans": int(len(arr)), "kinds": list(KINDS), "stats": stats}
        npy, js = self.prefix + ".spans.npy", self.prefix + ".spans.json"
        with open(npy + ".tmp", "wb") as f:
            np.save(f, arr)
        os.replace(npy + ".tmp", npy)
        with open(js + ".tmp", "w", encoding="utf-8") as f:
            json.dump(header, f, indent=1, ensure_ascii=False)
        os.replace(js + ".tmp", js)
        return header


class SidecarReader:
    """Spans of one shard, memory-mapped. ``reader[seq]`` -> ``int32 [k, 3]`` (token_start, token_end, kind)."""

    def __init__(self, shard_prefix: str | Path, expect_sequences: int | None = None):
        self.prefix = str(shard_prefix)
        js = self.prefix + ".spans.json"
        if not os.path.exists(js):
            raise FileNotFoundError(f"{js} not found: build the shards with `build_indexed.py --annotate SPEC` "
                                    "(ERNIE phrase/entity masking needs them)")
        with open(js, encoding="utf-8") as f:
            self.header = json.load(f)
        if self.header.get("format") != FORMAT or self.header.get("version") != VERSION:
            raise ValueError(f"{js}: format {self.header.get('format')!r} v{self.header.get('version')} is not "
                             f"{FORMAT} v{VERSION}")
        self.sequences = int(self.header["sequences"])
        if expect_sequences is not None and expect_sequences != self.sequences:
            raise ValueError(f"{js} covers {self.sequences} sequences but the shard has {expect_sequences}: "
                             "the side-car belongs to another build; rebuild with --annotate")
        self.spans = np.load(self.prefix + ".spans.npy", mmap_mode="r")
        if self.spans.shape != (self.header["spans"], 4):
            raise ValueError(f"{self.prefix}.spans.npy has shape {self.spans.shape}, header says "
                             f"({self.header['spans']}, 4): the file is truncated or from another build")
        # Row pointer per sequence (CSR): 8 bytes per sequence, computed once at open from the sorted column.
        self._ptr = np.searchsorted(np.asarray(self.spans[:, 0]), np.arange(self.sequences + 1), side="left")

    def __len__(self) -> int:
        return self.sequences

    def __getitem__(self, seq: int) -> np.ndarray:
        return np.asarray(self.spans[self._ptr[seq]:self._ptr[seq + 1], 1:])

    def range(self, first: int, stop: int) -> np.ndarray:
        """All spans of sequences ``[first, stop)``, ``int32 [k, 4]`` with the sequence index in column 0."""
        return np.asarray(self.spans[self._ptr[first]:self._ptr[stop]])


def place_spans(spans_per_sequence: Sequence[np.ndarray], starts: Sequence[int], lengths: Sequence[int]
                ) -> np.ndarray:
    """Move per-sequence token spans into sample coordinates: sequence i was copied to ``[starts[i], starts[i] +
    lengths[i])`` of the sample (``lengths`` < the sequence's length when a sample truncates it). Spans cut by the
    truncation are dropped, not shortened: half an entity is not a knowledge unit. Returns ``int32 [k, 3]``."""
    out = []
    for spans, start, length in zip(spans_per_sequence, starts, lengths):
        spans = np.asarray(spans).reshape(-1, 3)
        spans = spans[spans[:, 1] <= length]
        if len(spans):
            out.append(spans + np.array([start, start, 0], dtype=spans.dtype))
    return np.concatenate(out).astype(np.int32) if out else np.zeros((0, 3), np.int32)


# --- annotating an existing corpus from its shards ----------------------------------------------------------------

def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F or 0xF900 <= o <= 0xFAFF


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character byte-level BPE uses for each byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class SequenceText:
    """Token ids of one sequence -> (text, offsets [n, 2]) rebuilt from the vocabulary, for annotating shards.

    WordPiece/zh: ``##x`` continues a word, other tokens start one (a space before it unless both it and the
    previous token are CJK); SentencePiece: ``▁`` starts a word; byte-level BPE: bytes decoded as UTF-8, ``Ġ`` = space.
    Example (zh): [北, 京, ##s, is] -> "北京s is", offsets [[0,1],[1,2],[2,3],[4,6]].
    """

    def __init__(self, tokenizer):
        self.kind = tokenizer.kind
        self.vocab = tokenizer.tokens
        self.special = set(int(i) for i in tokenizer.special_ids)
        self._bytes = _byte_decoder() if self.kind == "bbpe" else None

    def __call__(self, ids: Sequence[int]) -> tuple[str, np.ndarray]:
        if self._bytes is not None:
            return self._bbpe(ids)
        parts, offsets, pos, prev_cjk = [], [], 0, False
        for i in ids:
            tok = self.vocab[int(i)]
            if int(i) in self.special:
                piece, glue = tok, False
            elif self.kind == "unigram":
                glue = not tok.startswith("▁")
                piece = tok.lstrip("▁")
            else:
                glue = tok.startswith("##")
                piece = tok[2:] if glue else tok
            cjk = len(piece) == 1 and _is_cjk(piece)
            if parts and not glue and not (cjk and prev_cjk):
                parts.append(" ")
                pos += 1
            offsets.append((pos, pos + len(piece)))
            parts.append(piece)
            pos += len(piece)
            prev_cjk = cjk
        return "".join(parts), np.asarray(offsets, np.int64).reshape(-1, 2)

    def _bbpe(self, ids: Sequence[int]) -> tuple[str, np.ndarray]:
        raw, ends = bytearray(), []
        for i in ids:
            tok = self.vocab[int(i)]
            raw.extend(tok.encode() if int(i) in self.special else bytes(self._bytes.get(c, 63) for c in tok))
            ends.append(len(raw))
        # char offset of each byte boundary (a boundary inside a multi-byte character rounds down to it)
        text = raw.decode("utf-8", errors="replace")
        char_at = np.zeros(len(raw) + 1, np.int64)
        pos = 0
        for k, ch in enumerate(text):
            n = len(ch.encode("utf-8", errors="replace")) if ch != "\ufffd" else 1
            char_at[pos + 1:pos + n + 1] = k + 1
            pos += n
        starts = [0] + ends[:-1]
        offsets = np.stack([char_at[starts], char_at[ends]], axis=1) if ends else np.zeros((0, 2), np.int64)
        # a leading space (Ġ) belongs to no word: start the token after it
        for t, (a, b) in enumerate(offsets.tolist()):
            if a < b and text[a] == " ":
                offsets[t, 0] = a + 1
        return text, offsets


def annotate_shard(shard_prefix: str, spec: str, tokenizer_dir: str) -> dict:
    """Write one shard's side-car from its tokens; returns the header. Runs in a worker process (picklable args)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # slow import: only this path needs it

    from data_prep.tokenizer import load_tokenizer

    annotator = make_annotator(spec)
    to_text = SequenceText(load_tokenizer(tokenizer_dir))
    ds = IndexedDataset(shard_prefix)
    writer = SidecarWriter(shard_prefix, spec=spec)
    for k in range(len(ds)):
        text, offsets = to_text(ds[k])
        spans, dropped = align_spans(annotator(text), offsets)
        writer.stats["misaligned"] += dropped
        writer.stats["entity"] += int((spans[:, 2] == ENTITY).sum())
        writer.stats["phrase"] += int((spans[:, 2] == PHRASE).sum())
        writer.add_document_spans([spans])
    return writer.finalize()


def annotate_corpus(prefix: str | Path, spec: str, progress: bool = True, workers: int = 1) -> list[dict]:
    """Write the side-car of every shard of a prepared corpus (``PREFIX.manifest.json``); returns their headers.

    Shards are independent: ``workers`` processes take one shard at a time (each loads jieba's dictionary once,
    ~1 s). The annotator spec is checked here first, so a bad spec fails before any worker starts."""
    from tqdm import tqdm

    from data_prep.manifest import manifest_path, read_manifest

    manifest = read_manifest(prefix)
    make_annotator(spec)
    root = manifest_path(prefix).parent
    tok_dir = str(manifest["tokenizer"]["path"])
    shards = [str(root / shard["prefix"]) for shard in manifest["shards"]]
    bar = tqdm(total=len(shards), unit="shard", disable=not progress, desc="annotate")
    if workers <= 1 or len(shards) == 1:
        headers = []
        for shard in shards:
            headers.append(annotate_shard(shard, spec, tok_dir))
            bar.update(1)
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(min(workers, len(shards))) as pool:
            jobs = [pool.apply_async(annotate_shard, (shard, spec, tok_dir)) for shard in shards]
            headers = []
            for job in jobs:
                headers.append(job.get())
                bar.update(1)
    bar.close()
    return headers


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m data_prep.annotate",
                                description="Write ERNIE phrase/entity side-cars for a prepared corpus's shards.")
    p.add_argument("prefix", help="PREFIX of PREFIX.manifest.json (written by build_indexed.py)")
    p.add_argument("--annotate", required=True, metavar="SPEC",
                   help="jieba | gazetteer:FILE | gazetteer-lower:FILE | jsonl:FILE")
    p.add_argument("--workers", type=int, default=1, help="processes, one shard at a time each (default 1)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:
        headers = annotate_corpus(args.prefix, args.annotate, progress=not args.quiet, workers=args.workers)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    seqs = sum(h["sequences"] for h in headers)
    stats = Counter()
    for h in headers:
        stats.update(h["stats"])
    print(f"annotated {seqs:,} sequences in {len(headers)} shard(s): {stats['entity']:,} entities, "
          f"{stats['phrase']:,} phrases ({stats['misaligned']:,} matches off token boundaries dropped)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
