"""ERNIE 2.0 task labelers on hand-checked examples."""
import json
import math
from collections import Counter
from itertools import permutations

import numpy as np
import pytest

from trainer.ernie import tasks


def test_capitalization_tables_and_labels_hand_checked():
    vocab = ["[PAD]", "[CLS]", "[SEP]", "Paris", "paris", "is", "Big", "##Ab", "##cd", "ĠLondon", "Ġlondon", "NASA"]
    lower_id, capital = tasks.capitalization_tables(vocab)
    assert lower_id.tolist() == [0, 1, 2, 4, 4, 5, 6, 7, 8, 10, 10, 11]
    assert capital.tolist() == [False, False, False, True, False, False, True, True, False, True, False, True]
    # [CLS] Paris is Big ##cd [SEP] [PAD]: "Big##cd" is one capitalized word -> both pieces 1
    ids = np.array([[1, 3, 5, 6, 8, 2, 0]])
    cand = np.array([[0, 1, 1, 1, 1, 0, 0]], bool)
    word_start = np.array([[1, 1, 1, 1, 0, 1, 1]], bool)
    lowered, labels = tasks.capitalization_labels(ids, cand, word_start, lower_id, capital)
    assert lowered.tolist() == [[1, 4, 5, 6, 8, 2, 0]]   # "Big" has no lower-case entry: kept
    assert labels.tolist() == [[-100, 1, 0, 1, 1, -100, -100]]
    # "Big" kept its case: its word's label is in the input, so with the revealing table it is unlabelled
    revealing = tasks.case_revealing(vocab)
    assert revealing.tolist() == [False, False, False, True, False, False, True, True, False, True, False, True]
    _, hidden = tasks.capitalization_labels(ids, cand, word_start, lower_id, capital, revealing)
    assert hidden.tolist() == [[-100, 1, 0, -100, -100, -100, -100]]
    # a word whose continuation piece keeps its case ("pa ##Ab", no "##ab") is unlabelled too; two rows at once
    ids2 = np.array([[1, 4, 7, 5, 2], [1, 3, 5, 11, 2]])
    cand2 = np.array([[0, 1, 1, 1, 0], [0, 1, 1, 1, 0]], bool)
    ws2 = np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]], bool)
    _, hidden2 = tasks.capitalization_labels(ids2, cand2, ws2, lower_id, capital, revealing)
    assert hidden2.tolist() == [[-100, -100, -100, 0, -100], [-100, 1, 0, -100, -100]]


def test_token_document_relation_hand_checked():
    seg = np.array([1, 7, 8, 9, 2])
    rest = np.array([9, 3, 7, 2])
    cand = np.array([0, 1, 1, 1, 0], bool)
    assert tasks.token_document_labels(seg, rest, cand).tolist() == [-100, 1, 0, 1, -100]


def test_permutation_classes_hand_checked_and_bijective():
    assert [tasks.permutation_class(p) for p in [(0,), (0, 1), (1, 0), (0, 1, 2), (0, 2, 1), (2, 1, 0)]] == \
        [0, 1, 2, 3, 4, 8]
    m = 4
    k = tasks.num_reorder_classes(m)
    assert k == 1 + 2 + 6 + 24
    seen = set()
    for n in range(1, m + 1):
        for p in permutations(range(n)):
            c = tasks.permutation_class(p)
            assert tasks.class_permutation(c, m) == p
            seen.add(c)
    assert seen == set(range(k))
    with pytest.raises(ValueError, match="not a permutation"):
        tasks.permutation_class((0, 2))


def test_reorder_samples_reach_every_class_and_decode_back():
    rng = np.random.default_rng(0)
    paragraph = [np.arange(10 * s, 10 * s + 4) for s in range(5)]  # 5 sentences of 4 tokens
    original = np.concatenate(paragraph)
    m = 3
    counts = Counter()
    for _ in range(3000):
        pieces, label = tasks.reorder_sample(paragraph, m, rng)
        perm = tasks.class_permutation(label, m)
        restored = [None] * len(perm)
        for shown, orig in enumerate(perm):
            restored[orig] = pieces[shown]
        assert np.array_equal(np.concatenate(restored), original)
        # with enough sentences, cuts fall on sentence boundaries
        assert all(len(p) % 4 == 0 for p in pieces)
        counts[label] += 1
    assert set(counts) == set(range(tasks.num_reorder_classes(m)))
    # one-sentence paragraph: cuts between tokens still allow every class
    labels = {tasks.reorder_sample([np.arange(6)], m, rng)[1] for _ in range(500)}
    assert labels == set(range(9))


def test_sentence_distance_hand_checked_and_sampled_labels_true():
    doc_bounds = np.array([0, 3, 5, 9])  # docs: [0,1,2] [3,4] [5,6,7,8]
    doc_of = np.repeat(np.arange(3), np.diff(doc_bounds))
    # the paper's classes: 0 adjacent in one document (either order), 1 same document not adjacent, 2 other document
    assert tasks.sentence_distance_label(0, 1, doc_of) == tasks.ADJACENT
    assert tasks.sentence_distance_label(1, 0, doc_of) == tasks.ADJACENT
    assert tasks.sentence_distance_label(0, 2, doc_of) == tasks.SAME_DOCUMENT
    assert tasks.sentence_distance_label(8, 5, doc_of) == tasks.SAME_DOCUMENT
    assert tasks.sentence_distance_label(2, 3, doc_of) == tasks.OTHER_DOCUMENT
    rng = np.random.default_rng(1)
    by_label, partners = Counter(), Counter()
    n = 6000
    for _ in range(n):
        i = int(rng.integers(0, 9))
        a, b, label = tasks.sentence_distance_pair(i, doc_bounds, rng)
        assert a == i and b != i and label == tasks.sentence_distance_label(a, b, doc_of)
        by_label[label] += 1
        partners[(a, b)] += 1
    # Expected class shares, by hand: every sentence has a neighbour; class 1 is impossible for 1 (doc [0,1,2]),
    # 3 and 4 (doc [3,4]): drawn 1 -> 2 for them. Sentences 0, 2, 5..8 (6/9): 1/3 each; 1, 3, 4 (3/9): 1/3 class 0,
    # 2/3 class 2. So p0 = 1/3, p1 = 6/9 x 1/3 = 2/9, p2 = 4/9; each count within 5 sd of n x p.
    for label, p in [(0, 1 / 3), (1, 2 / 9), (2, 4 / 9)]:
        assert abs(by_label[label] - n * p) < 5 * math.sqrt(n * p * (1 - p)), (label, by_label[label], n * p)
    # both orders of an adjacent pair are drawn: the middle sentence 6 pairs with 5 and 7 about equally often
    assert partners[(6, 5)] > 0.35 * (partners[(6, 5)] + partners[(6, 7)])
    assert partners[(6, 7)] > 0.35 * (partners[(6, 5)] + partners[(6, 7)])
    assert partners[(2, 1)] > 0 and partners[(0, 1)] > 0  # first and last sentences: their one neighbour
    with pytest.raises(ValueError, match="single one-sentence document"):
        tasks.sentence_distance_pair(0, np.array([0, 1]), rng)


def test_pair_task_file_and_pair_row(tmp_path):
    path = tmp_path / "ir.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"text_a": "ab", "text_b": "abc", "label": 0}, {"text_a": "c", "text_b": "a", "label": 2}]) + "\n")
    encode = lambda t: [ord(c) for c in t]  # noqa: E731 - a stand-in tokenizer: one id per character
    f = tasks.PairTaskFile(path, labels=[0, 1, 2], encode=encode)
    assert len(f) == 2 and f[1][2] == 2 and f[0][1].tolist() == [97, 98, 99]
    ids, types = tasks.pair_row(f[0][0], f[0][1], max_len=6, cls_id=1, sep_id=2)
    assert ids.tolist() == [1, 97, 2, 97, 98, 2] and types.tolist() == [0, 0, 0, 1, 1, 1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text_a": "x", "text_b": "y", "label": "causal"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: label 'causal'"):
        tasks.PairTaskFile(bad, labels=["contrast"], encode=encode)
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected"):
        tasks.PairTaskFile(bad, labels=["contrast"], encode=encode, keys=("query", "title"))


def test_task_ids_are_stable():
    # checkpoints store task embeddings by these ids: a literal table, so moving or renaming an entry fails here
    # (appending a new task means adding its line below)
    assert tasks.TASK_ID == {"mlm": 0, "capitalization": 1, "token_document": 2, "sentence_reorder": 3,
                             "sentence_distance": 4, "discourse": 5, "ir_relevance": 6, "dlm": 7}


class _Document:
    """One document of two sentences, as an IndexedCorpus shows it to the token-document task."""

    def __init__(self, sentences):
        self.sentences, self.doc_starts = sentences, np.array([0, len(sentences)])

    def document_of(self, i):
        return 0

    def read(self, start, end, limit=None):
        out = np.concatenate([np.zeros(0, np.int64)] + [np.asarray(s, np.int64) for s in self.sentences[start:end]])
        return out[:limit]


def test_token_document_labels_are_cased_when_capitalization_runs_in_the_same_step():
    from trainer.ernie.data import MultiTaskDataset
    vocab = ["[PAD]", "[CLS]", "[SEP]", "The", "the", "Paris", "paris", "is", "big"]
    ds = MultiTaskDataset.__new__(MultiTaskDataset)  # only the labelling tables: no corpus files needed
    ds.lower_id, ds.capital = tasks.capitalization_tables(vocab)
    ds.is_special = np.array([True, True, True] + [False] * 6)
    ds.word_start = np.ones(len(vocab), bool)
    ds.tokdoc_max = 4096
    ds.revealing = tasks.case_revealing(vocab)
    ds.lowercase_share = 1.0  # every row lower-cased
    # document "The Paris is big | Paris is the big"; the row is its first sentence
    ds.corpora = [_Document([[3, 5, 7, 8], [5, 7, 4, 8]])]
    row = np.array([1, 3, 5, 7, 8, 2])
    # by hand, against the other sentence (Paris is the big): The no, Paris yes, is yes, big yes
    want = [-100, 0, 1, 1, 1, -100]
    alone = ds._token_tasks(row, None, "basic", None, {"token_document"}, [(0, 0, 1)])
    both = ds._token_tasks(row, None, "basic", np.random.default_rng(0), {"capitalization", "token_document"},
                           [(0, 0, 1)])
    assert alone["token_document_labels"].tolist() == want
    assert both["token_document_labels"].tolist() == want
    assert both["input_ids"].tolist() == [1, 4, 6, 7, 8, 2]  # the model still reads the lower-cased row
    assert both["capitalization_labels"].tolist() == [-100, 1, 1, 0, 0, -100]
