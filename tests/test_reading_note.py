"""What the loader says at start about the data a run reads (trainer/data/dataset.py ``reading_note``): each
training corpus's samples per epoch and how many times the run reads it, ERNIE's corpus steps only, and a blend
period that rounds the weights."""
from __future__ import annotations

import numpy as np

from test_samples import write_shards


def test_the_loader_says_how_many_times_the_run_reads_each_corpus_and_warns_on_a_tiny_one(tmp_path, capsys):
    """At start rank 0 says each training corpus's samples per epoch and how many times train.steps x the global
    batch reads it, counted on the blend's own pattern, with a warning past 200 epochs: a production launch on a
    wrong data.corpora (a 19-token debug corpus) trained 3 steps, or days, with nothing in the log to show it (found
    by review). A held-out loader says nothing; nor does rank 1."""
    from types import SimpleNamespace

    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset
    from trainer.data.loader import Collator, build_dataloader

    big = write_shards([[[5 + d % 50, 6, 7, 8], [9, 10, 11]] for d in range(300)], tmp_path / "big", 100)
    small = write_shards([[[5, 6, 7], [8, 9]] for _ in range(6)], tmp_path / "small", 100)
    tok = SimpleNamespace(pad_id=0, cls_id=1, sep_id=2, mask_id=3, vocab_size=100, special_ids=[0, 1, 2, 3])
    collator = Collator(0, 16, 20)
    cfg = DataConfig(corpora=[{"prefix": str(big), "weight": 3}, {"prefix": str(small), "weight": 1}],
                     format="doc-sentences", max_seq_length=16, cache_dir=str(tmp_path / "cache"), num_workers=0,
                     blend_period=1000, valid_corpora=[{"prefix": str(small)}])
    dataset = PretrainingDataset(cfg, tok, seed=1)
    sizes = [len(b.index) for b in dataset.builders]
    total = 5500  # five whole blend periods and half of a sixth
    counts = np.bincount([dataset.blend(g)[0] for g in range(total)], minlength=2)  # the positions themselves
    build_dataloader(dataset, collator, 0, 10, 10, 0, 1, total_samples=total, num_workers=0)
    out = capsys.readouterr().out.splitlines()
    want = [counts[c] / sizes[c] for c in (0, 1)]
    assert want[0] < 200 < want[1], want
    assert out[0] == (f"data: {big}: {sizes[0]:,} samples per epoch (doc-sentences, rows of up to 16 tokens, blend "
                      f"weight 0.75); 5,500 samples in all (train.steps x train.global_batch_size) read it "
                      f"{want[0]:,.2f} times"), out
    assert out[1].startswith(f"data: {small}: {sizes[1]:,} samples per epoch") and f"read it {want[1]:,.2f} times" \
        in out[1], out
    assert out[2].startswith(f"warning: {small} is read {want[1]:,.0f} times, more than 200"), out
    assert len(out) == 3, out
    build_dataloader(dataset, collator, 0, 10, 5, 1, 2, total_samples=total, num_workers=0)  # rank 1
    valid = PretrainingDataset(cfg, tok, seed=1, split="valid")
    build_dataloader(valid, collator, 0, 10, 10, 0, 1, total_samples=total, num_workers=0)  # an evaluation's
    assert capsys.readouterr().out == ""


def test_the_reading_note_of_an_ernie_dataset_counts_only_the_steps_that_read_the_corpus():
    """ERNIE's DLM steps (every k-th) take no corpus sample: the note counted them (ernie_base's dlm.every 4 said
    1.33x the epochs it reads; found by the diff review). A dataset's corpus_samples is what positions [0, n) read,
    checked here against the steps it calls corpus steps."""
    from trainer.ernie.data import ErnieCorpusBase

    class Every4(ErnieCorpusBase):  # the DLM schedule of KnowledgeMaskedDataset, without building one
        def __init__(self):
            self.global_batch = 8

        def corpus_steps_before(self, step):
            return step - step // 4

    ds = Every4()
    assert ds.corpus_samples(0) == 0
    assert ds.corpus_samples(8 * 100) == 8 * 75  # 25 of 100 steps are DLM steps
    assert ds.corpus_samples(8 * 3 + 5) == 8 * 3  # step 3 (the 4th) is a DLM step: its 5 positions read nothing
    assert ds.corpus_samples(8 * 4 + 5) == 8 * 3 + 5


def test_a_short_blend_period_that_rounds_the_weights_is_warned_about(tmp_path, capsys):
    """data.blend_period=7 with weights 0.5/0.3/0.2 gives 3/2/2 slots (0.43/0.29/0.29: the third corpus gets 43 % more
    than asked), and the note printed the weights as asked (found by the mixtures review). The default period's
    shares are the weights to 1e-6: no warning."""
    from types import SimpleNamespace

    from trainer.data.config import DataConfig
    from trainer.data.dataset import PretrainingDataset

    prefixes = [write_shards([[[5 + d % 50, 6, 7], [9, 10]] for d in range(40)], tmp_path / f"c{i}", 100)
                for i in range(3)]
    tok = SimpleNamespace(pad_id=0, cls_id=1, sep_id=2, mask_id=3, vocab_size=100, special_ids=[0, 1, 2, 3])

    def note(period):
        cfg = DataConfig(corpora=[{"prefix": str(p), "weight": w} for p, w in zip(prefixes, (0.5, 0.3, 0.2))],
                         format="doc-sentences", max_seq_length=16, cache_dir=str(tmp_path / "cache"), num_workers=0,
                         blend_period=period)
        return PretrainingDataset(cfg, tok, seed=1).reading_note(1000)

    warn = [line for line in note(7) if line.startswith("warning: data.blend_period=7 rounds")]
    assert len(warn) == 1 and f"{prefixes[0]} gets 0.4286 of the samples for its weight 0.5" in warn[0] \
        and f"{prefixes[2]} gets 0.2857" in warn[0], warn
    assert not any(line.startswith("warning: data.blend_period") for line in note(1_000_000))
