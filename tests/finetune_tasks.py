"""Small GLUE-layout tasks made from the repository's English corpus, and generated languages, for the learning tests.

- ``write_cola``: CoLA's layout (no header; source, label, original label, sentence): label 1 = a corpus line as
  written, 0 = the same words shuffled. A model that learned word order while pretraining has a head start.
- ``write_pairs``: a pair task in the layout of RTE, MRPC, MNLI, QNLI, WNLI or QQP: label "in order" = two consecutive
  lines of one document, the other label = the same two swapped (MNLI adds "other" = a line of another document).
- ``write_sts``: STS-B's layout, score = 5 x the share of words the two lines have in common (regression).
- ``write_sst``: SST-2's layout: label 1 when the line contains a question mark.
- ``ordered_documents``: a generated language whose only signal is sentence order (the SOP test).
- ``topic_language``/``write_topic_task``: a generated language of two topics, and SST-2's layout over it where the
  training sentences use one half of each topic's words and the held-out ones only the other half (below).
- ``ernie2_documents``, ``topic_dialogues``: generated languages for the ERNIE 2.0 tasks and ERNIE 1.0's DLM.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

STS_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
               "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")


def corpus_documents(corpus: Path, start: int = 0, stop: int | None = None) -> list[list[str]]:
    """Blank-line separated documents of lines [start, stop) of the corpus; tabs and runs of spaces collapsed."""
    lines = corpus.read_text(encoding="utf-8").splitlines()[start:stop]
    docs, cur = [], []
    for line in lines + [""]:
        text = " ".join(line.split())
        if text and text not in ("%", "--"):
            cur.append(text)
        elif cur:
            docs.append(cur)
            cur = []
    return docs


def _sentences(docs, min_words=5) -> list[str]:
    return [s for d in docs for s in d if len(s.split()) >= min_words]


def _split(items, n_train, n_dev):
    assert len(items) >= n_train + n_dev, f"only {len(items)} items for {n_train} + {n_dev}"
    return items[:n_train], items[n_train:n_train + n_dev]


def write_cola(docs, out: Path, n_train: int, n_dev: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for s in _sentences(docs, 6):
        if rng.random() < 0.5:
            rows.append((1, s))
        else:
            words = s.split()
            while words == s.split():
                rng.shuffle(words)
            rows.append((0, " ".join(words)))
    rng.shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(("train", "dev"), _split(rows, n_train, n_dev)):
        (out / f"{name}.tsv").write_text("".join(f"src\t{label}\t{'' if label else '*'}\t{s}\n" for label, s in part))
    return out


PAIR_LAYOUTS = {  # task: (header, labels (in order, swapped[, other]), row formatter)
    "rte": ("index\tsentence1\tsentence2\tlabel", ("entailment", "not_entailment"),
            lambda i, a, b, y: f"{i}\t{a}\t{b}\t{y}"),
    "qnli": ("index\tquestion\tsentence\tlabel", ("entailment", "not_entailment"),
             lambda i, a, b, y: f"{i}\t{a}\t{b}\t{y}"),
    "wnli": ("index\tsentence1\tsentence2\tlabel", ("1", "0"), lambda i, a, b, y: f"{i}\t{a}\t{b}\t{y}"),
    "mrpc": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", ("1", "0"),
             lambda i, a, b, y: f"{y}\t{i}\t{i + 1}\t{a}\t{b}"),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", ("1", "0"),
            lambda i, a, b, y: f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{y}"),
    "mnli": (MNLI_HEADER, ("entailment", "contradiction", "neutral"),
             lambda i, a, b, y: f"{i}\t{i}\t{i}\tfiction\t(a)\t(b)\t(a)\t(b)\t{a}\t{b}\t{y}\t{y}"),
}


def write_pairs(task: str, docs, out: Path, n_train: int, n_dev: int, seed: int = 0) -> Path:
    header, labels, fmt = PAIR_LAYOUTS[task]
    rng = random.Random(seed)
    pairs = [(d[i], d[i + 1], di) for di, d in enumerate(docs) for i in range(len(d) - 1)]
    rng.shuffle(pairs)
    rows = []
    for a, b, di in pairs:
        kind = rng.randrange(len(labels))
        if kind == 1:
            a, b = b, a
        elif kind == 2:
            other = docs[(di + 1 + rng.randrange(len(docs) - 1)) % len(docs)]
            b = rng.choice(other)
        rows.append((a, b, labels[kind]))
    out.mkdir(parents=True, exist_ok=True)
    train, dev = _split(rows, n_train, 2 * n_dev if task == "mnli" else n_dev)
    files = {"train.tsv": train}
    if task == "mnli":
        files.update({"dev_matched.tsv": dev[:n_dev], "dev_mismatched.tsv": dev[n_dev:]})
    else:
        files["dev.tsv"] = dev
    for name, part in files.items():
        (out / name).write_text(header + "\n" + "".join(fmt(i, a, b, y) + "\n" for i, (a, b, y) in enumerate(part)))
    return out


def write_sts(docs, out: Path, n_train: int, n_dev: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    sents = _sentences(docs, 4)
    rows = []
    for i in range(n_train + n_dev):
        a = rng.choice(sents)
        b = a if rng.random() < 0.3 else rng.choice(sents)
        wa, wb = set(a.lower().split()), set(b.lower().split())
        rows.append((a, b, 5.0 * len(wa & wb) / len(wa | wb)))
    out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(("train", "dev"), _split(rows, n_train, n_dev)):
        (out / f"{name}.tsv").write_text(STS_HEADER + "\n" + "".join(
            f"{i}\tmain-forums\tcorpus\t2026\t{i}\tnone\tnone\t{a}\t{b}\t{y:.3f}\n" for i, (a, b, y) in enumerate(part)))
    return out


def write_sst(docs, out: Path, n_train: int, n_dev: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    sents = _sentences(docs, 4)
    rng.shuffle(sents)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(("train", "dev"), _split(sents, n_train, n_dev)):
        (out / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{int('?' in s)}\n" for s in part))
    return out


def _pseudo_words(rng: random.Random, n: int, taken: set) -> list[str]:
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    out = []
    while len(out) < n:
        w = "".join(rng.choice(syllables) for _ in range(rng.choice((2, 3))))
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


def topic_language(seed: int = 0, topics: int = 2, topic_words: int = 16, function_words: int = 8):
    """A generated language: ``topics`` disjoint sets of content words and shared function words, all pseudo-words
    made of syllables (no surface cue tells one topic from the other). A sentence of a topic interleaves function
    words with 6-10 of its topic's words, drawn from all of them. -> (words per topic, function words)."""
    rng, taken = random.Random(seed), set()
    function = _pseudo_words(rng, function_words, taken)
    return [_pseudo_words(rng, topic_words, taken) for _ in range(topics)], function


def topic_sentence(rng: random.Random, content: list[str], function: list[str]) -> str:
    words = []
    for _ in range(rng.randint(6, 10)):
        words += [rng.choice(function), rng.choice(content)]
    return " ".join(words[:rng.randint(len(words) - 1, len(words))]) + " ."


def topic_documents(n_docs: int, seed: int = 1, language_seed: int = 0, topics: int = 2) -> list[list[str]]:
    """Pretraining text: documents of 4-9 sentences of one topic each (of ``topics``), every topic word in use."""
    topics, function = topic_language(language_seed, topics=topics)
    rng = random.Random(seed)
    return [[topic_sentence(rng, topics[d % len(topics)], function) for _ in range(rng.randint(4, 9))]
            for d in range(n_docs)]


def write_topic_task(out: Path, n_train: int, n_dev: int, seed: int = 2, language_seed: int = 0) -> Path:
    """SST-2's layout, label = the sentence's topic. Training sentences use only the first half of each topic's words,
    held-out ones only the second half: fine-tuning never sees a held-out content word, so only what pretraining
    learned about those words (that they occur with the first half's words of their topic) can classify them; from
    random weights their embeddings carry nothing and held-out accuracy stays at chance."""
    topics, function = topic_language(language_seed)
    rng = random.Random(seed)
    half = [len(t) // 2 for t in topics]
    rows = {"train": [], "dev": []}
    for split, n in (("train", n_train), ("dev", n_dev)):
        for i in range(n):
            label = i % len(topics)
            words = topics[label][:half[label]] if split == "train" else topics[label][half[label]:]
            rows[split].append((topic_sentence(rng, words, function), label))
        rng.shuffle(rows[split])
    out.mkdir(parents=True, exist_ok=True)
    for split, part in rows.items():
        (out / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in part))
    return out


def ordered_documents(n_docs: int, seed: int = 3, language_seed: int = 0) -> list[list[str]]:
    """A generated language whose only signal is sentence order: sentence i of a document opens with the i-th of 10
    ordinal pseudo-words, then 5-8 filler words drawn uniformly from 60 (no topic, no other cue). Two segments of
    a document are in order exactly when the first one's ordinals come before the second one's: what SOP predicts."""
    lang = random.Random(language_seed + 100)
    taken: set = set()
    ordinals, filler = _pseudo_words(lang, 10, taken), _pseudo_words(lang, 60, taken)
    rng = random.Random(seed)
    return [[" ".join([ordinals[i]] + [rng.choice(filler) for _ in range(rng.randint(5, 8))]) + " ."
             for i in range(rng.randint(4, 10))] for _ in range(n_docs)]


def ernie2_documents(n_docs: int, seed: int = 5, language_seed: int = 0, topics: int = 6,
                     topic_words: int = 16) -> list[list[str]]:
    """A generated cased language with a signal for each of ERNIE 2.0's tasks, for the tiny_ernie2 test.

    Each document has one of ``topics`` topics (disjoint sets of ``topic_words`` content words and 3 capitalized
    names; 8 function words are shared) and 4-10 sentences; sentence i opens with the i-th of 10 ordinal words
    (capitalized, as every sentence's first word), then 5-8 pairs of a function word and a content word of the topic
    (a name instead in one pair of five). What each task can learn from it:

    - capitalization: names are always capitalized, and so is every sentence's first word; nothing else is.
    - token-document: function words recur in every document, a sentence's ordinal in none of its other sentences,
      content words by chance.
    - sentence reordering: the ordinals give the original order.
    - sentence distance: adjacent sentences have consecutive ordinals (0); sentences of two documents have different
      topics five times in six (2); the rest are class 1.
    """
    lang, taken = random.Random(language_seed + 200), set()
    ordinals = [w.capitalize() for w in _pseudo_words(lang, 10, taken)]
    function = _pseudo_words(lang, 8, taken)
    content = [_pseudo_words(lang, topic_words, taken) for _ in range(topics)]
    names = [[w.capitalize() for w in _pseudo_words(lang, 3, taken)] for _ in range(topics)]
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        t = rng.randrange(topics)
        doc = []
        for i in range(rng.randint(4, 10)):
            words = [ordinals[i]]
            for _ in range(rng.randint(5, 8)):
                words += [rng.choice(function), rng.choice(names[t] if rng.random() < 0.2 else content[t])]
            doc.append(" ".join(words) + " .")
        docs.append(doc)
    return docs


def topic_dialogues(text: str, n_dialogues: int, seed: int = 7, topics: int = 8, topic_chars: int = 12,
                    turns: int = 4) -> list[dict]:
    """Dialogues for ERNIE 1.0's DLM test (``{"turns": [...]}`` rows) in a generated language over ``text``'s most
    frequent CJK characters (so a tokenizer trained on ``text`` knows them all): ``topics`` disjoint sets of
    ``topic_chars`` characters and 8 shared function characters. Every turn of a dialogue uses its topic's
    characters, alternating with function characters (5-10 pairs). DLM replaces a turn by a turn of another dialogue:
    of another topic (detectable) with probability (topics - 1) / topics."""
    from collections import Counter

    counts = Counter(ch for ch in text if "\u4e00" <= ch <= "\u9fff")
    pool = [ch for ch, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:8 + topics * topic_chars]
    assert len(pool) == 8 + topics * topic_chars, f"text has only {len(pool)} distinct CJK characters"
    rng = random.Random(seed)
    lang = random.Random(0)
    lang.shuffle(pool)
    function, content = pool[:8], [pool[8 + t * topic_chars:8 + (t + 1) * topic_chars] for t in range(topics)]
    out = []
    for _ in range(n_dialogues):
        t = rng.randrange(topics)
        out.append({"turns": ["".join(rng.choice(function) + rng.choice(content[t]) for _ in range(rng.randint(5, 10)))
                              for _ in range(turns)]})
    return out


# Span, tagging and multiple-choice tasks over the generated topic language (issue 24). As in write_topic_task, the
# training examples use only the first half of each topic's content words and the held-out ones only the second half:
# fine-tuning never sees a held-out content word, so only what pretraining learned about it (which topic's words it
# occurs with) can solve them; from random weights held-out words are noise and scores stay near chance.
def _topic_words(split: str, topics: list[list[str]]) -> list[list[str]]:
    return [t[:len(t) // 2] if split == "train" else t[len(t) // 2:] for t in topics]


def _mixed_sentence(rng: random.Random, words: list[list[str]], function: list[str], n: int) -> tuple[list, list]:
    """n (function word, content word of a random topic) pairs -> (tokens, topic of each token or -1)."""
    toks, topic = [], []
    for _ in range(n):
        t = rng.randrange(len(words))
        toks += [rng.choice(function), rng.choice(words[t])]
        topic += [-1, t]
    return toks, topic


def write_topic_span(out: Path, n_train: int, n_dev: int, seed: int = 11, language_seed: int = 0,
                     topics: int = 2) -> Path:
    """SQuAD v1.1 layout: the context is 8-12 (function word, content word) pairs of topics 1.. and one content word
    of topic 0 at a random place; the question is a fixed function word; the answer is the topic-0 word."""
    words_all, function = topic_language(language_seed, topics=topics)
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, n, name in (("train", n_train, "train-v1.1.json"), ("dev", n_dev, "dev-v1.1.json")):
        words = _topic_words(split, words_all)
        paragraphs = []
        for i in range(n):
            toks, _ = _mixed_sentence(rng, words[1:], function, rng.randint(8, 12))
            at = 2 * rng.randrange(len(toks) // 2) + 1  # a content position
            answer = rng.choice(words[0])
            toks[at] = answer
            context = " ".join(toks) + " ."
            start = len(" ".join(toks[:at])) + 1
            assert context[start:start + len(answer)] == answer
            paragraphs.append({"context": context, "qas": [{"id": f"{split}{i}", "question": function[0],
                                                            "answers": [{"text": answer, "answer_start": start}]}]})
        (out / name).write_text(json.dumps({"version": "1.1", "data": [{"title": split, "paragraphs": paragraphs}]}))
    return out


def write_topic_ner(out: Path, n_train: int, n_dev: int, seed: int = 12, language_seed: int = 0,
                    topics: int = 2) -> Path:
    """CoNLL layout (token, POS-like filler, tag): content words are one-word entities typed by their topic (B-T0..),
    function words O; sentences of 5-8 pairs from random topics."""
    words_all, function = topic_language(language_seed, topics=topics)
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        words = _topic_words(split, words_all)
        lines = ["-DOCSTART- -X- O", ""]
        for _ in range(n):
            toks, topic = _mixed_sentence(rng, words, function, rng.randint(5, 8))
            lines += [f"{w} X {'O' if t < 0 else f'B-T{t}'}" for w, t in zip(toks, topic)] + [""]
        (out / f"{split}.txt").write_text("\n".join(lines))
    return out


def write_topic_choice(out: Path, n_train: int, n_dev: int, seed: int = 13, language_seed: int = 0,
                       topics: int = 2) -> Path:
    """SWAG layout: sent1 is a sentence of one topic; of the four endings one is a sentence of that topic (the
    answer), the other three sentences of other topics."""
    import csv
    words_all, function = topic_language(language_seed, topics=topics)
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, n, name in (("train", n_train, "train.csv"), ("dev", n_dev, "val.csv")):
        words = _topic_words(split, words_all)
        with (out / name).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0",
                        "ending1", "ending2", "ending3", "label"])
            for i in range(n):
                t, label = rng.randrange(topics), rng.randrange(4)
                others = [k for k in range(topics) if k != t]
                endings = [topic_sentence(rng, words[t if k == label else rng.choice(others)], function)
                           for k in range(4)]
                w.writerow([i, "gen", i, "", topic_sentence(rng, words[t], function), function[1], "gen", *endings,
                            label])
    return out
