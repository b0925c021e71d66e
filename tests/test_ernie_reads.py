"""ERNIE rows read at most the tokens they use (issue 25 item 2): the token-document task read its sample's whole
document (``corpus.read(d0, start)`` and ``corpus.read(end, d1)``, then kept 4,096 tokens), the other tasks whole
sentences they then truncated; a ``.txt`` document can be 64 MiB and a ``.jsonl`` one is never cut."""
import json

import numpy as np
import pytest

WORDS = "apple banana cherry grape lime melon dog egg fig hat ink jam kiwi lamp moon".split()


def _sentence(k: int, n: int = 6) -> str:
    return " ".join(WORDS[(k * 7 + i) % len(WORDS)] for i in range(n)).capitalize() + "."


LONG = [_sentence(k) for k in range(120)]  # one document of ~840 tokens: 14 samples at max_seq_length 64
BIG = [_sentence(3, 300)] + [_sentence(k) for k in range(3)]  # a 300-word sentence, alone longer than a row
SHORT = [[_sentence(d + k) for k in range(3)] for d in range(6)]
DOCS = [LONG, BIG] + SHORT


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("ernie_reads")
    (tmp / "train.txt").write_text("\n\n".join("\n".join(d) for d in DOCS) + "\n")
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(tmp / "train.txt"), "--output", str(tmp / "tok"),
                          "--vocab-size", "200", "--cased", "--quiet"])
    assert build_indexed.main(["--input", str(tmp / "train.txt"), "--tokenizer", str(tmp / "tok"),
                               "--output-prefix", str(tmp / "train" / "c")]) == 0
    return tmp, load_tokenizer(tmp / "tok")


def _dataset(corpus, tokdoc_max: int):
    from trainer.config import load_config
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    tmp, tok = corpus
    tasks = [{"name": "mlm", "iterations": 12, "level": "token"},
             {"name": "token_document", "iterations": 12, "level": "token"},
             {"name": "sentence_reorder", "iterations": 4, "level": "sentence"},
             {"name": "sentence_distance", "iterations": 4, "level": "sentence"}]
    cfg = load_config("tiny_ernie2", [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
                                      f"data.cache_dir={tmp / 'cache'}", "train.global_batch_size=4",
                                      "train.micro_batch_size=4", "train.steps=12",
                                      "objective.options.continual.mode=all-at-once",
                                      f"objective.options.continual.tasks={json.dumps(tasks)}",
                                      f"objective.options.token_document_max_tokens={tokdoc_max}"])
    dataset, plan = build_dataset(cfg, tok, get_objective(cfg.objective))
    return dataset, plan


def _count_reads(corpus_obj) -> list[int]:
    """Tokens returned by every ``read`` of the corpus (what a read copies out of the .bin map)."""
    counts, read = [], corpus_obj.read

    def counting(*args, **kwargs):
        out = read(*args, **kwargs)
        counts.append(len(out))
        return out

    corpus_obj.read = counting
    return counts


def test_every_ernie2_task_reads_at_most_the_tokens_it_uses(corpus):
    tokdoc_max = 32
    dataset, plan = _dataset(corpus, tokdoc_max)
    c = dataset.corpora[0]
    long_tokens = int(c.offsets(0, len(LONG))[-1])
    big_tokens = len(c.read(len(LONG), len(LONG) + 1))
    assert long_tokens > 700 and big_tokens > 250  # the document and the sentence much longer than what a row uses
    counts = _count_reads(c)
    L = dataset.cfg.max_seq_length
    seen = set()
    for position in range(plan.total_steps * dataset.global_batch):
        del counts[:]
        row = dataset[position]
        seen.add(int(row["task_ids"][0]))
        # a row reads its own tokens (<= L per segment, 2 segments at most) and tokdoc_max per segment's document;
        # on the old code a token-document row in LONG read ~800 tokens, one with the big sentence ~300
        assert sum(counts) <= 2 * L + 2 * tokdoc_max, (position, counts)
    assert seen == {0, 3, 4}  # plain (MLM + token-document) rows, reordering and distance rows all built


def test_token_document_labels_are_those_of_the_whole_document_cut_to_the_limit(corpus):
    from trainer.ernie import tasks as T

    for tokdoc_max in (4096, 32):  # every document within the limit, and LONG / BIG past it
        dataset, _ = _dataset(corpus, tokdoc_max)
        c = dataset.corpora[0]
        for start in range(c.num_sentences):
            d = int(c.document_of(start))
            d0, d1 = int(c.doc_starts[d]), int(c.doc_starts[d + 1])
            end = min(start + 2, d1)
            ids = np.concatenate([[dataset.tok.cls_id], c.read(start, end)[:62], [dataset.tok.sep_id]])
            cand = ~dataset.is_special[ids]
            # the old code's reading, verbatim: the whole rest of the document, then cut
            rest = np.concatenate([c.read(d0, start), c.read(end, d1)])[:tokdoc_max]
            want = T.token_document_labels(ids, rest, cand)
            got = dataset._token_document(ids, cand, [(0, start, end)])
            assert got.tolist() == want.tolist(), (tokdoc_max, start)
