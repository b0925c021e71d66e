"""ERNIE 2.0 capitalization prediction on real batches: only a share of the rows is lower-cased (the rest stay cased,
as fine-tuning input is), MLM labels keep their case, and no capitalization label is one the input shows.

The corpus is generated: every sentence starts with a capital, "Paris"/"paris" both occur (a lower-case twin), and
"Zorbex" occurs only capitalized (no twin: it stays "Zorbex" in a lower-cased row, so its label would be readable)."""
import json

import numpy as np
import pytest

WORDS = "apple banana cherry grape lime melon dog egg fig hat ink jam kiwi lamp moon paris".split()
TASKS = [{"name": "mlm", "iterations": 100, "level": "token", "stage": 0},
         {"name": "capitalization", "iterations": 30, "level": "token", "stage": 1}]


def _text(n_docs=60):
    rng = np.random.default_rng(0)
    docs = []
    for d in range(n_docs):
        sents = []
        for _ in range(4):
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), 6)]
            if rng.random() < 0.5:
                words[int(rng.integers(1, 6))] = "Zorbex"
            if rng.random() < 0.5:
                words[int(rng.integers(1, 6))] = "Paris"
            sents.append(" ".join(words).capitalize().replace("zorbex", "Zorbex") + ".")
        docs.append("\n".join(sents))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("ernie_cap")
    (tmp / "train.txt").write_text(_text())
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(tmp / "train.txt"), "--output", str(tmp / "tok"),
                          "--vocab-size", "200", "--cased", "--quiet"])
    assert build_indexed.main(["--input", str(tmp / "train.txt"), "--tokenizer", str(tmp / "tok"),
                               "--output-prefix", str(tmp / "train" / "c")]) == 0
    return tmp, load_tokenizer(tmp / "tok")


def _dataset(tmp, tok, *sets):
    from trainer.config import load_config
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    cfg = load_config("tiny_ernie2", [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
                                      f"data.cache_dir={tmp / 'cache'}", "train.steps=1",
                                      f"objective.options.continual.tasks={json.dumps(TASKS)}", *sets])
    return build_dataset(cfg, tok, get_objective(cfg.objective))


def test_half_the_rows_stay_cased_mlm_labels_keep_case_and_no_label_is_readable(corpus):
    from trainer.ernie import tasks as T

    tmp, tok = corpus
    ds, plan = _dataset(tmp, tok)
    lower_id, capital = T.capitalization_tables(tok.tokens)
    revealing = T.case_revealing(tok.tokens)
    twin = capital & (lower_id != np.arange(len(lower_id)))  # capitalized with a lower-case spelling: "Paris"
    assert twin[tok.encode("Paris")].any() and revealing[tok.encode("Zorbex")].all()
    G = ds.global_batch
    cap_steps = [s for s in range(plan.total_steps) if plan.tasks_at(s) == ["mlm", "capitalization"]]
    mlm_only = [s for s in range(plan.total_steps) if plan.tasks_at(s) == ["mlm"]]
    rows = [r for s in cap_steps[:25] for r in ds.__getitems__([s * G + i for i in range(G)])]
    before = [r for s in mlm_only[:5] for r in ds.__getitems__([s * G + i for i in range(G)])]
    assert len(rows) == 25 * G == 400

    lowered, cap_label_share = [], []
    for r in rows:
        ids, labels, pos = r["input_ids"], r["capitalization_labels"], r["mlm_positions"]
        unmasked = np.ones(len(ids), bool)
        unmasked[pos] = False
        is_lowered = not twin[ids[unmasked]].any()
        lowered.append(is_lowered)
        labelled = labels != -100
        # labels only on lower-cased rows; a cased row has none (its case is in the input)
        assert labelled.any() == is_lowered
        # no label on a token whose input shows its case (positions the MLM replaced show another token)
        assert not (labelled & unmasked & revealing[ids]).any()
        # Zorbex (no twin) is never labelled where it stands unmasked
        assert not (labelled & unmasked & np.isin(ids, tok.encode("Zorbex"))).any()
        cap_label_share.append(capital[r["mlm_labels"]].mean())
    share = np.mean(lowered)
    assert abs(share - 0.5) < 0.1, share  # the recipe default lowercase share 0.5 (old code: every row, 1.0)
    step0 = np.mean([capital[r["mlm_labels"]].mean() for r in before])
    on_lowered = np.mean([c for c, low in zip(cap_label_share, lowered) if low])
    # MLM labels as written: as many capitalized labels on lower-cased rows as on the cased rows of stage 0
    assert step0 > 0.1 and abs(on_lowered - step0) < 0.35 * step0, (on_lowered, step0)


def test_lowercase_share_one_lowercases_every_row_and_labels_stay_cased(corpus):
    from trainer.ernie import tasks as T

    tmp, tok = corpus
    ds, plan = _dataset(tmp, tok, "objective.options.capitalization_lowercase_share=1.0")
    lower_id, capital = T.capitalization_tables(tok.tokens)
    twin = capital & (lower_id != np.arange(len(lower_id)))
    step = next(s for s in range(plan.total_steps) if "capitalization" in plan.tasks_at(s))
    rows = ds.__getitems__([step * ds.global_batch + i for i in range(ds.global_batch)])
    for r in rows:
        unmasked = np.ones(len(r["input_ids"]), bool)
        unmasked[r["mlm_positions"]] = False
        assert not twin[r["input_ids"][unmasked]].any()
    assert np.mean([capital[r["mlm_labels"]].mean() for r in rows]) > 0.1
