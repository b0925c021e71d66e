"""ERNIE span annotators: one sequence's text -> character spans (entity / phrase), and their alignment to tokens.

SPEC (``build_indexed.py --annotate``, ``python -m data_prep.annotate --annotate``): ``jieba[:OPTIONS]`` |
``gazetteer:FILE`` | ``gazetteer-lower:FILE`` | ``jsonl:FILE``, built by ``make_annotator``. jieba's OPTIONS are
comma-separated ``hmm=on|off`` (default on) and ``userdict=PATH`` (``jieba.load_userdict``: ``WORD [FREQ] [TAG]`` per
line), e.g. ``jieba:hmm=off,userdict=names.txt``. The spec is written into every side-car and compared as text on a
rerun, so another option re-annotates (an edited user dictionary under the same path does not: rerun
``python -m data_prep.annotate``).

``hmm=off``: jieba's HMM (a Viterbi pass over the characters no dictionary word covers) is what finds words outside its
dictionary, such as personal names and new terms; without it those characters come out one by one (no span). It is
also what makes traditional or classical Chinese 100-500x slower than simplified: posseg's Viterbi tries all ~256
tag states for a character it has no entry for. bench/annotate.py measures speed and span difference
(BENCHMARKS.md, "ERNIE annotation"). Converting traditional text with OpenCC t2s before build_indexed keeps the HMM
and its names; ``count_traditional`` (a set of common traditional-only characters) is the cheap check annotate.py
warns with. The spans they produce are stored in the
side-car format of data_prep/sidecar.py (kinds ``ENTITY`` = 0, ``PHRASE`` = 1 are defined there).

Annotators map the text of one sequence to character spans; ``align_spans`` maps those to token spans through the
tokenizer's character offsets (Hugging Face ``tokenizers`` gives them), keeping only spans whose ends fall on token
boundaries (a gazetteer entry "York" must not match inside "Yorkshire"). Worker processes do this expensive half
themselves with ``DocumentAnnotator(annotator, tokenizer_dir)(sentences)`` and hand the arrays to
``SidecarWriter.add_document_spans``.

Multi-pattern matching for gazetteers uses ``pyahocorasick`` (Aho-Corasick, linear in the text for any number of
entries); Chinese segmentation and part-of-speech tags come from ``jieba`` with its bundled dictionary.
"""
from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from data_prep.sidecar import ENTITY, KINDS, PHRASE

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

    def __init__(self, min_phrase_chars: int = 2, max_chain_words: int = 3, hmm: bool = True,
                 userdict: str | Path | None = None, spec: str = "jieba"):
        self.min_phrase_chars = min_phrase_chars
        self.max_chain_words = max_chain_words
        self.hmm = hmm
        self.userdict = None if userdict is None else Path(userdict)
        if self.userdict is not None and not self.userdict.is_file():
            raise FileNotFoundError(f"jieba user dictionary {self.userdict} not found (--annotate {spec})")
        self.spec = spec
        self._tok = None

    def _tokenizer(self):
        if self._tok is None:
            import jieba
            import jieba.posseg

            jieba.setLogLevel(logging.WARNING)
            tok = _keyed_jieba_tokenizer(jieba)
            if self.userdict is not None:  # jieba raises ValueError naming the file for a non-UTF-8 one
                tok.load_userdict(str(self.userdict))
            self._tok = jieba.posseg.POSTokenizer(tok)
        return self._tok

    def __call__(self, text: str) -> list[CharSpan]:
        words = []
        pos = 0
        for pair in self._tokenizer().cut(text, HMM=self.hmm):
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

        self.spec = f"gazetteer{'-lower' if lowercase else ''}:{path}"  # make_annotator(spec) rebuilds it
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


def _keyed_jieba_tokenizer(jieba):
    """A jieba tokenizer whose prefix-dictionary cache is named after what it is built from.

    jieba caches the prefix dictionary it builds from its word list (~1 s) in ``$TMPDIR/jieba.cache`` and, for its
    default dictionary, loads any file of that name without a check: a cache written by another jieba version, a
    patched dictionary or another user's process is trusted. Ours is in the project's cache folder, named after the
    dictionary's bytes, jieba's version and the Python version (the file is in ``marshal`` format). Hashing the 5 MB
    word list costs ~10 ms per process.
    """
    import sys

    from data_prep.cache_dir import key

    tok = jieba.Tokenizer()
    with tok.get_dict_file() as fh:
        words = fh.read()
    digest = key(jieba.__version__, f"{sys.version_info[0]}.{sys.version_info[1]}", words)
    tok.cache_file = str(jieba_cache_folder() / f"jieba-{digest}.cache")  # an absolute path: jieba takes it as is
    return tok


_JIEBA_FOLDER: list[Path] = []  # this process's answer of jieba_cache_folder


def jieba_cache_folder() -> Path:
    """Where jieba's keyed prefix-dictionary cache goes: ``cache_dir("jieba")``, or, when that cannot be created (a
    read-only HOME, no HOME and no passwd entry), a private temporary folder of this process, removed at exit, with
    one warning. The cache only saves ~1 s per process, so an unwritable cache must not stop a corpus build after its
    tokenization (``build_indexed.py`` asks once before the long work, so the warning comes first). Should even the
    temporary folder fail, jieba gets a path it cannot write: it builds the dictionary and logs that the dump failed.
    """
    if _JIEBA_FOLDER:
        return _JIEBA_FOLDER[0]
    import atexit
    import shutil
    import sys
    import tempfile

    from data_prep.cache_dir import cache_dir

    try:
        folder = cache_dir("jieba")
    except (OSError, RuntimeError) as err:  # RuntimeError: Path.home() without HOME and passwd entry
        try:
            folder = Path(tempfile.mkdtemp(prefix="bertfamily-jieba-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            where = f"a private temporary folder ({folder}), rebuilt by every process (~1 s each)"
        except OSError:
            folder = Path("/nonexistent-bertfamily-jieba-cache")
            where = "no cache (jieba rebuilds its dictionary in every process, ~1 s each)"
        print(f"warning: jieba's dictionary cache folder cannot be created ({err}); using {where}. Set "
              "BERTFAMILY_CACHE to a writable folder to keep it", file=sys.stderr, flush=True)
    _JIEBA_FOLDER.append(folder)
    return folder


# Common characters that exist only in traditional writing (their simplified forms differ: 們/们, 這/这, 國/国 ...);
# simplified text has almost none of them, running traditional text has them as ~10-20% of its CJK characters.
# A small fixed set, not a converter: it only has to tell which shards will be slow and phrase poorly under jieba.
TRADITIONAL_ONLY = frozenset(
    "們這個來時說會國對學為與發後經過現開關動進種產實將點還體從問應當長業機線見書東車馬門電話語讀寫聽買賣錢銀難歡樂"
    "歷義興華區級變頭無歲衛視覺親記設許論證識議讓財資質購費運連選邊達遠適鄉處號單師帶廣張彈態戰擊據數斷樣權歸氣漢"
    "滿熱獨畫盡監碼積穩約紅紙組細終結給統絕綜網總編練聯職萬葉蘭術衝裝觀計認討訓評試該請調談護豐貨貴賽趕軍輪輕農"
    "醫針鐘鐵間陽際隊險隨雙雜順題顏風飛飯館驗黨齊龍麼嗎媽愛裡邊價傳億優爺復稱築係")
_CJK = re.compile("[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\U00020000-\U0002fa1f]")
_TRADITIONAL = re.compile("[" + "".join(sorted(TRADITIONAL_ONLY)) + "]")


def count_traditional(text: str) -> tuple[int, int]:
    """(traditional-only characters, CJK characters) in ``text``: the check behind annotate.py's warning (two regex
    scans, ~1% of jieba's time on the same text)."""
    return len(_TRADITIONAL.findall(text)), len(_CJK.findall(text))


def _jieba_options(spec: str, arg: str) -> dict:
    """``hmm=on|off,userdict=PATH`` -> JiebaAnnotator keyword arguments; anything else is refused naming it."""
    out: dict = {}
    for item in arg.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if key == "hmm" and eq and value in ("on", "off"):
            out["hmm"] = value == "on"
        elif key == "userdict" and eq and value:
            out["userdict"] = value
        else:
            raise ValueError(f"--annotate {spec!r}: jieba option {item!r} is not hmm=on, hmm=off or userdict=PATH "
                             "(options are comma-separated, e.g. jieba:hmm=off,userdict=names.txt)")
    return out


def make_annotator(spec: str) -> Annotator:
    """``jieba[:hmm=on|off,userdict=PATH]`` | ``gazetteer:FILE`` | ``gazetteer-lower:FILE`` | ``jsonl:FILE`` (the
    value of ``build_indexed.py --annotate``)."""
    name, _, arg = spec.partition(":")
    if name == "jieba":
        return JiebaAnnotator(**(_jieba_options(spec, arg) if arg else {}), spec=spec)
    if name == "gazetteer" and arg:
        return GazetteerAnnotator(arg)
    if name == "gazetteer-lower" and arg:
        return GazetteerAnnotator(arg, lowercase=True)
    if name == "jsonl" and arg:
        return JsonlAnnotator(arg)
    raise ValueError(f"--annotate {spec!r}: expected jieba, gazetteer:FILE, gazetteer-lower:FILE or jsonl:FILE "
                     "(jieba takes options: jieba:hmm=off,userdict=PATH)")


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

