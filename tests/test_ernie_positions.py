"""ERNIE's special steps (DLM, discourse, IR relevance) read their own files and take no corpus samples: the corpus
rows of an epoch's worth of corpus steps are every sample once (issue 21 item 10). Before, those steps consumed the
positions of their step, so with dlm.every = k a 1/k share of every epoch was never read."""
import json
from collections import Counter

import pytest

# twelve one-line documents, each one sample of doc-sentences at max_seq_length 64
WORDS = "apple banana cherry grape lime melon dog egg fig hat ink jam kiwi lamp moon".split()
DOCS = [" ".join(WORDS[(d + i) % len(WORDS)].capitalize() if i == 0 else WORDS[(d + i) % len(WORDS)]
                 for i in range(5)) + "." for d in range(12)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("ernie_positions")
    (tmp / "train.txt").write_text("\n\n".join(DOCS) + "\n")
    (tmp / "vocab.txt").write_text(("\n".join(DOCS) + "\n") * 20)
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(tmp / "vocab.txt"), "--output", str(tmp / "tok"),
                          "--vocab-size", "200", "--cased", "--quiet"])
    assert build_indexed.main(["--input", str(tmp / "train.txt"), "--tokenizer", str(tmp / "tok"),
                               "--output-prefix", str(tmp / "train" / "c")]) == 0
    with open(tmp / "dialogues.jsonl", "w") as f:
        for d in range(6):
            f.write(json.dumps({"turns": [DOCS[(d + t) % 12] for t in range(4)]}) + "\n")
    with open(tmp / "pairs.jsonl", "w") as f:
        for d in range(6):
            f.write(json.dumps({"text_a": DOCS[d], "text_b": DOCS[d + 1], "label": d % 2}) + "\n")
    return tmp, load_tokenizer(tmp / "tok")


def _corpus_reads(dataset, positions):
    """(epoch, sample id) of every corpus row built at these positions, in order (DLM / pair rows read none)."""
    reads = []
    locate = dataset.locate

    def recording(position):
        found = locate(position)
        reads.append(found[1:])
        return found

    dataset.locate = recording
    for p in positions:
        dataset[p]
    return reads


def _assert_each_epoch_reads_every_sample_once(reads, n):
    assert len(reads) >= 2 * n
    for e in range(len(reads) // n):
        epoch = reads[e * n:(e + 1) * n]
        assert Counter(ep for ep, _ in epoch) == {e: n}, epoch
        assert sorted(s for _, s in epoch) == list(range(n))


@pytest.mark.parametrize("every", [2, 3])
def test_dlm_steps_skip_no_corpus_samples(corpus, every):
    from trainer.config import load_config
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    tmp, tok = corpus
    G = 4
    cfg = load_config("tiny_ernie", [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
                                     f"data.cache_dir={tmp / 'cache'}", f"train.global_batch_size={G}",
                                     "train.micro_batch_size=4", "objective.options.knowledge_masking.stages="
                                     "[{level: basic, start_step: 0}]",
                                     f"objective.options.dlm={{path: {tmp / 'dialogues.jsonl'}, every: {every}}}"])
    dataset, _ = build_dataset(cfg, tok, get_objective(cfg.objective))
    n = len(dataset)
    assert n == 12 and dataset.dialogues is not None
    steps = 2 * n // G * every // (every - 1) + every  # two epochs of corpus steps, and the DLM steps between
    reads = _corpus_reads(dataset, range(steps * G))
    dlm = sum(dataset.is_dlm_step(s) for s in range(steps))
    assert len(reads) == (steps - dlm) * G and dlm >= 2
    _assert_each_epoch_reads_every_sample_once(reads, n)


def test_discourse_steps_skip_no_corpus_samples(corpus):
    from trainer.config import load_config
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    tmp, tok = corpus
    G = 2
    tasks = [{"name": "mlm", "iterations": 24, "level": "token"},
             {"name": "discourse", "iterations": 12, "level": "sentence"}]
    cfg = load_config("tiny_ernie2", [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
                                      f"data.cache_dir={tmp / 'cache'}", f"train.global_batch_size={G}",
                                      "train.micro_batch_size=2", "train.steps=24",
                                      "objective.options.continual.mode=all-at-once",
                                      f"objective.options.continual.tasks={json.dumps(tasks)}",
                                      f"objective.options.discourse={{path: {tmp / 'pairs.jsonl'}, labels: [0, 1]}}"])
    dataset, plan = build_dataset(cfg, tok, get_objective(cfg.objective))
    n = len(dataset)
    assert plan.total_steps == 24 and plan.iterations()["discourse"] == 12
    reads = _corpus_reads(dataset, range(plan.total_steps * G))
    assert len(reads) == 12 * G == 2 * n
    _assert_each_epoch_reads_every_sample_once(reads, n)
