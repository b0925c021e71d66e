"""ERNIE's evaluation says when one evaluation (train.eval_batches x the global batch) reads more samples than its
held-out data holds: the generic path's note (trainer.pretrain.eval_repeat_note) with what each part of ERNIE's
evaluation set reads. Reviewer exp13: the held-out corpus and dialogues were cycled without a word."""
from __future__ import annotations

import json

from test_build_index_ernie import _sets, corpus  # noqa: F401  (fixture)


def test_ernie_evaluation_notes_a_held_out_set_smaller_than_one_evaluation(corpus, tmp_path, capsys):  # noqa: F811
    from trainer.config import load_config
    from trainer.ernie.components import ernie_components
    from trainer.objectives import get_objective

    tmp, _ = corpus
    # 4 evaluation steps x 16 positions: 2 corpus steps (32 rows) over the held-out corpus's few samples and 2 DLM
    # steps (32 rows) over its 3 dialogues
    cfg = load_config("tiny_ernie", _sets(tmp, tmp_path / "cache", "train.eval_batches=4"))
    comps = ernie_components(cfg, 0, 1, "cpu", get_objective(cfg.objective))
    out = capsys.readouterr().out
    assert "note: each evaluation reads 64 samples (train.eval_batches=4 x train.global_batch_size=16)" in out
    assert "32 held-out corpus rows from the 2 samples of data.valid_corpora" in out
    assert "32 DLM rows from the 3 dialogues of objective.options.dlm.valid_path" in out
    assert comps.eval_batches is not None
    # one evaluation within what the held-out data holds: no note (1 step of 2 corpus rows)
    cfg = load_config("tiny_ernie", _sets(tmp, tmp_path / "cache", "train.eval_batches=1",
                                          "train.global_batch_size=2", "train.micro_batch_size=1"))
    ernie_components(cfg, 0, 1, "cpu", get_objective(cfg.objective))
    assert "note: each evaluation" not in capsys.readouterr().out


def test_ernie2_evaluation_notes_labelled_pairs_and_held_out_rows_read_again(corpus, tmp_path, capsys):  # noqa: F811
    from trainer.config import load_config
    from trainer.ernie.components import ernie_components
    from trainer.objectives import get_objective

    tmp, _ = corpus
    pairs = tmp_path / "discourse.jsonl"
    pairs.write_text("".join(json.dumps({"text_a": a, "text_b": b, "label": y}) + "\n"
                             for a, b, y in (("Apple lime", "Dog egg", "and"), ("Fig hat", "Jam moon", "but"))))
    tasks = [{"name": "mlm", "iterations": 2, "level": "token", "stage": 0},
             {"name": "discourse", "iterations": 2, "level": "sentence", "stage": 0}]
    cfg = load_config("tiny_ernie2", [
        f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]", f"data.valid_corpora=[{{prefix: {tmp / 'valid' / 'c'}}}]",
        f"data.cache_dir={tmp_path / 'cache'}", "train.steps=2",
        f"objective.options.continual.tasks={json.dumps(tasks)}",
        f"objective.options.discourse={{path: {pairs}, labels: [and, but]}}", "train.eval_every=1",
        "train.eval_batches=2", f"run_dir={tmp_path / 'run'}"])
    ernie_components(cfg, 0, 1, "cpu", get_objective(cfg.objective))
    out = capsys.readouterr().out
    # its evaluation (discourse rows, then plain rows) reads the 2 pairs and the 2 held-out samples 8 times over
    assert "note: each evaluation reads 32 samples" in out and "holds 4:" in out
    assert ("16 held-out corpus rows from the 2 samples of data.valid_corpora; 16 discourse rows from the 2 "
            "labelled pairs of objective.options.discourse.path") in out
