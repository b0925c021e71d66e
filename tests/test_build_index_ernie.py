"""`python -m trainer.data.build_index` for the ERNIE objectives builds everything their ranks would build at start
(reviewer exp4/exp15: ERNIE 1.0's dialogue cache was left to rank 0, so data.require_prebuilt_index: true failed
asking for the command just run, and without it the other ranks waited out data.index_wait_timeout)."""
from __future__ import annotations

import json

import pytest

from test_ernie_eval import TRAIN, VALID

BASIC = "objective.options.knowledge_masking.stages=[{level: basic, start_step: 0}]"  # no side-cars in this corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small cased corpus, a held-out one, and training and held-out dialogues over the same words."""
    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("build_index_ernie")
    (tmp / "train.txt").write_text(TRAIN)
    (tmp / "valid.txt").write_text(VALID)
    (tmp / "vocab.txt").write_text((TRAIN + "\n" + VALID + "\n") * 20)
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(tmp / "vocab.txt"),
                          "--output", str(tmp / "tok"), "--vocab-size", "200", "--cased", "--quiet"])
    for split in ("train", "valid"):
        assert build_indexed.main(["--input", str(tmp / f"{split}.txt"), "--tokenizer", str(tmp / "tok"),
                                   "--output-prefix", str(tmp / split / "c")]) == 0
    (tmp / "dialogues.jsonl").write_text("".join(
        json.dumps({"turns": [f"{a} banana", "Cherry apple", f"Melon {b}"]}) + "\n"
        for a, b in (("Apple", "lime"), ("Grape", "egg"), ("Dog", "hat"), ("Fig", "ink"))))
    (tmp / "valid_dialogues.jsonl").write_text("".join(
        json.dumps({"turns": [f"{w} moon", "Kiwi lime", "Egg fox"]}) + "\n" for w in ("Jam", "Ink", "Hat")))
    return tmp, load_tokenizer(tmp / "tok")


def _sets(tmp, cache, *more) -> list[str]:
    return [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
            f"data.valid_corpora=[{{prefix: {tmp / 'valid' / 'c'}}}]", f"data.cache_dir={cache}",
            f"objective.options.dlm.path={tmp / 'dialogues.jsonl'}",
            f"objective.options.dlm.valid_path={tmp / 'valid_dialogues.jsonl'}", "objective.options.dlm.every=2",
            "train.steps=2", "train.eval_every=1", f"run_dir={cache.parent / 'run'}", BASIC, *more]


def _args(sets) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def test_build_index_prebuilds_the_dialogue_caches_so_ranks_requiring_a_prebuilt_index_start(corpus, tmp_path,
                                                                                              capsys):
    from trainer.config import load_config
    from trainer.data.build_index import main
    from trainer.ernie.components import ernie_components
    from trainer.objectives import get_objective

    tmp, _ = corpus
    cache = tmp_path / "cache"
    sets = _sets(tmp, cache)
    assert main(["--config", "tiny_ernie", *_args(sets), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    built = sorted(p.name for p in cache.glob("*.bfc"))
    # the run, every rank requiring the prebuilt files: train and evaluation data both open (before: "the tokenized
    # dialogues of .../dialogues.jsonl ... is missing and data.require_prebuilt_index is set: build it before the
    # job with python -m trainer.data.build_index ...", the command just run)
    cfg = load_config("tiny_ernie", [*sets, "data.require_prebuilt_index=true"])
    objective = get_objective(cfg.objective)
    comps = ernie_components(cfg, 0, 1, "cpu", objective)
    assert "train: objective.options.dlm.path:" in out and "4 dialogues tokenized" in out
    assert "valid: objective.options.dlm.valid_path:" in out and "3 dialogues tokenized" in out
    assert sum(name.startswith("dialogues-") for name in built) == 2  # the training and the held-out dialogues
    batch = next(comps.train_batches(0, 32))
    assert batch["input_ids"].shape[0] == cfg.train.micro_batch_size
    assert any("dlm_label" in b for b in comps.eval_batches())  # held-out DLM batches, from the prebuilt cache
    assert sorted(p.name for p in cache.glob("*.bfc")) == built  # the ranks built nothing
    # a second build_index finds everything (nothing rebuilt)
    stamps = {p: p.stat().st_mtime_ns for p in cache.glob("*.bfc")}
    assert main(["--config", "tiny_ernie", *_args(sets)]) == 0
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.bfc")} == stamps


def test_build_index_without_held_out_corpora_builds_only_the_training_dialogues(corpus, tmp_path, capsys):
    from trainer.data.build_index import main

    tmp, _ = corpus
    cache = tmp_path / "cache"
    sets = [s for s in _sets(tmp, cache) if not s.startswith("data.valid_corpora")]
    assert main(["--config", "tiny_ernie", *_args(sets)]) == 0
    assert "valid:" not in capsys.readouterr().out
    assert len(list(cache.glob("dialogues-*.bfc"))) == 1  # evaluation off: valid_path is not read, not built


def test_build_index_names_a_missing_dialogue_file_and_needed_side_cars(corpus, tmp_path, capsys):
    from trainer.data.build_index import main

    tmp, _ = corpus
    missing = [*_sets(tmp, tmp_path / "cache"), f"objective.options.dlm.path={tmp / 'nope.jsonl'}"]
    assert main(["--config", "tiny_ernie", *_args(missing)]) == 2  # a config refusal (trainer/config_checks.py)
    err = capsys.readouterr().err
    assert f"objective.options.dlm.path={tmp / 'nope.jsonl'}: no such file" in err
    # phrase masking on a corpus without side-cars: every rank would stop at start; build_index says so first
    phrase = [s for s in _sets(tmp, tmp_path / "cache") if s != BASIC]
    assert main(["--config", "tiny_ernie", *_args(phrase)]) == 1
    err = capsys.readouterr().err
    assert ".spans.json not found" in err and "--annotate" in err


def test_build_index_says_ernie2_pair_files_have_no_cache(corpus, tmp_path, capsys):
    from trainer.config import load_config
    from trainer.data.build_index import main
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    tmp, tok = corpus
    pairs = tmp / "discourse.jsonl"
    pairs.write_text("".join(json.dumps({"text_a": a, "text_b": b, "label": y}) + "\n"
                             for a, b, y in (("Apple lime", "Dog egg", "and"), ("Fig hat", "Jam moon", "but"))))
    tasks = [{"name": "mlm", "iterations": 2, "level": "token", "stage": 0},
             {"name": "discourse", "iterations": 2, "level": "sentence", "stage": 0}]
    cache = tmp_path / "cache"
    sets = [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]", f"data.cache_dir={cache}", "train.steps=2",
            f"objective.options.continual.tasks={json.dumps(tasks)}",
            f"objective.options.discourse={{path: {pairs}, labels: [and, but]}}"]
    assert main(["--config", "tiny_ernie2", *_args(sets)]) == 0
    assert "objective.options.discourse.path" in capsys.readouterr().out  # said: nothing to build for them
    cfg = load_config("tiny_ernie2", [*sets, "data.require_prebuilt_index=true"])
    dataset, _ = build_dataset(cfg, tok, get_objective(cfg.objective))  # every cache of the run is there
    assert len(dataset) > 0
