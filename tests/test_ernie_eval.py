"""ERNIE evaluation batches (held-out corpora, ERNIE 2.0's task rotation, ERNIE 1.0's held-out dialogues) and the
token-document labels of sentence-distance rows, on a small hand-written corpus whose answers are known."""
import json

import numpy as np
import pytest

from trainer.ernie.continual import ContinualConfig, EvalPlan

# two documents per corpus; every word is one token of the tokenizer trained on this text
TRAIN = """Apple banana cherry.
Grape cherry lime.
Melon apple lime.

Dog egg lime.
Fig egg hat.
Hat ink dog.

Jam kiwi lamp.
Lamp moon jam.
"""
VALID = """Kiwi moon apple.
Moon lime kiwi.

Egg fox ink.
Fox grape egg.
"""
TASKS = [{"name": "mlm", "iterations": 4, "level": "token", "stage": 0},
         {"name": "capitalization", "iterations": 4, "level": "token", "stage": 1},
         {"name": "token_document", "iterations": 4, "level": "token", "stage": 1},
         {"name": "sentence_reorder", "iterations": 4, "level": "sentence", "stage": 2},
         {"name": "sentence_distance", "iterations": 4, "level": "sentence", "stage": 2}]


def test_eval_plan_rotates_every_sentence_task_with_all_token_tasks():
    plan = EvalPlan(ContinualConfig(tasks=TASKS))
    token = ["mlm", "capitalization", "token_document"]
    assert plan.formats == [["sentence_reorder"], ["sentence_distance"], token]
    assert [plan.tasks_at(a) for a in range(6)] == plan.formats * 2
    only_token = EvalPlan(ContinualConfig(tasks=[{k: v for k, v in t.items() if k != "stage"} for t in TASKS[:2]],
                                          mode="all-at-once"))
    assert [only_token.tasks_at(a) for a in range(2)] == [["mlm", "capitalization"]] * 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("ernie_eval")
    (tmp / "train.txt").write_text(TRAIN)
    (tmp / "valid.txt").write_text(VALID)
    (tmp / "vocab.txt").write_text((TRAIN + "\n" + VALID + "\n") * 20)  # frequent enough to be whole-word tokens
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(tmp / "vocab.txt"),
                          "--output", str(tmp / "tok"), "--vocab-size", "200", "--cased", "--quiet"])
    for split in ("train", "valid"):
        assert build_indexed.main(["--input", str(tmp / f"{split}.txt"), "--tokenizer", str(tmp / "tok"),
                                   "--output-prefix", str(tmp / split / "c")]) == 0
    return tmp, load_tokenizer(tmp / "tok")


def _config(tmp, recipe, *sets):
    from trainer.config import load_config

    return load_config(recipe, [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
                                f"data.valid_corpora=[{{prefix: {tmp / 'valid' / 'c'}}}]",
                                f"data.cache_dir={tmp / 'cache'}", *sets])


def test_ernie2_held_out_batches_rotate_through_every_task(corpus):
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    tmp, tok = corpus
    cfg = _config(tmp, "tiny_ernie2", f"objective.options.continual.tasks={json.dumps(TASKS)}", "train.steps=1")
    objective = get_objective(cfg.objective)
    valid, plan = build_dataset(cfg, tok, objective, "valid", global_batch=2)
    assert plan.total_steps > 0 and isinstance(valid.plan, EvalPlan)
    words = {tok.decode([t]).strip().lower() for t in np.unique(valid.corpora[0].read(0, 4))}
    assert "kiwi" in words and "banana" not in words  # rows come from the held-out corpus
    for a in range(6):  # batch a = positions 2a, 2a + 1 (one evaluation step per micro-batch x ranks)
        rows = valid.__getitems__([2 * a, 2 * a + 1])
        kind = ["sentence_reorder_label", "sentence_distance_label", None][a % 3]
        token_keys = {"capitalization_labels", "token_document_labels", "mlm_positions"}
        for row in rows:
            # a sentence task's rows as built for it alone (cased, unmasked); plain rows carry every token task
            assert token_keys.isdisjoint(row.keys()) if kind else token_keys <= row.keys()
            assert [k for k in row if k.endswith("_label")] == ([kind] if kind else [])
        if kind:  # the cased held-out text itself: nothing lower-cased or masked
            for row in rows:
                assert tok.mask_id not in row["input_ids"].tolist()
                ids = row["input_ids"][~valid.is_special[row["input_ids"]]]
                assert any(tok.decode([int(t)]).strip()[:1].isupper() for t in ids)
    again = valid.__getitems__([2, 3])  # the same held-out batch at every evaluation
    first = valid.__getitems__([2, 3])
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(first, again) for k in x)


def test_sentence_distance_rows_label_each_sentence_against_its_own_document(corpus):
    """Token-document relation on a distance row [CLS] A [SEP] B [SEP]: A's tokens against the rest of A's document,
    B's against the rest of B's (B may come from another document)."""
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective
    from trainer.ernie.tasks import pair_row

    tmp, tok = corpus
    cfg = _config(tmp, "tiny_ernie2", f"objective.options.continual.tasks={json.dumps(TASKS)}", "train.steps=1")
    train, _ = build_dataset(cfg, tok, get_objective(cfg.objective))
    corpus0 = train.corpora[0]
    # sentence 0 "Apple banana cherry." (document 0) paired with sentence 3 "Dog egg lime." (document 1)
    assert corpus0.document_of(0) != corpus0.document_of(3)
    ids, types = pair_row(corpus0.read(0, 1), corpus0.read(3, 4), 64, tok.cls_id, tok.sep_id)
    labels = train._token_document(ids, ~train.is_special[ids], [(0, 0, 1), (0, 3, 4)], types)
    got = [(tok.decode([int(t)]).strip(), int(l)) for t, l in zip(ids, labels) if l != -100]
    # cased ids: "Apple" is not "apple". In document 1, "egg" recurs and "lime" does not (it recurs in document 0,
    # which is what B's tokens were wrongly compared with before)
    assert got == [("Apple", 0), ("banana", 0), ("cherry", 1), (".", 1), ("Dog", 0), ("egg", 1), ("lime", 0), (".", 1)]


def test_ernie1_held_out_dlm_batches_come_from_the_held_out_dialogues(corpus, tmp_path):
    from trainer.ernie.components import build_dataset
    from trainer.objectives import get_objective

    tmp, tok = corpus
    seen, unseen = tmp_path / "seen.jsonl", tmp_path / "unseen.jsonl"
    seen.write_text("".join(json.dumps({"turns": ["Apple banana", "Cherry apple", "Melon lime"]}) + "\n"
                            for _ in range(3)))
    unseen.write_text("".join(json.dumps({"turns": [f"{w} moon", "Kiwi lime", "Egg fox"]}) + "\n"
                              for w in ("Jam", "Ink", "Hat")))
    basic = "objective.options.knowledge_masking.stages=[{level: basic, start_step: 0}]"  # no side-car here
    cfg = _config(tmp, "tiny_ernie", f"objective.options.dlm.path={seen}", "objective.options.dlm.every=2",
                  f"objective.options.dlm.valid_path={unseen}", "train.steps=1", basic)
    objective = get_objective(cfg.objective)
    valid, _ = build_dataset(cfg, tok, objective, "valid", global_batch=2)
    unseen_ids = {t for line in unseen.read_text().splitlines() for turn in json.loads(line)["turns"]
                  for t in tok.encode(turn)}
    for a in range(4):
        rows = valid.__getitems__([2 * a, 2 * a + 1])
        for row in rows:
            assert ("dlm_label" in row) == (a % 2 == 1)  # every 2nd evaluation batch is a DLM batch
            if "dlm_label" in row:
                original = row["input_ids"].copy()
                original[row["mlm_positions"]] = row["mlm_labels"]  # undo the masking (and random replacements)
                assert set(original[~train_special(tok, original)].tolist()) <= unseen_ids
    # without valid_path, evaluation has MLM batches only (the training dialogues are not held out)
    cfg = _config(tmp, "tiny_ernie", f"objective.options.dlm.path={seen}", "objective.options.dlm.every=2",
                  "train.steps=1", basic)
    valid, _ = build_dataset(cfg, tok, get_objective(cfg.objective), "valid", global_batch=2)
    assert not any("dlm_label" in r for a in range(4) for r in valid.__getitems__([2 * a, 2 * a + 1]))


def train_special(tok, ids):
    return np.isin(ids, np.asarray(tok.special_ids))


def test_ernie_evaluation_reads_the_same_samples_at_any_world_size(corpus):
    """Issue 25 item 6 for ERNIE: the evaluation set is eval_batches x global batch positions of the held-out data
    at any world size, each evaluation step of one kind on every rank. Before, a step was one micro-batch per rank,
    and a resume on another world size evaluated another set (the curve jumped). Collated as the trainer collates
    them, rank by rank, through ernie_components."""
    from trainer.ernie.components import ernie_components
    from trainer.objectives import get_objective

    tmp, tok = corpus
    cfg = _config(tmp, "tiny_ernie2", f"objective.options.continual.tasks={json.dumps(TASKS)}", "train.steps=1",
                  "train.global_batch_size=4", "train.micro_batch_size=1", "train.eval_batches=3")
    objective = get_objective(cfg.objective)

    def rows(world: int) -> tuple[list, list]:
        """(every evaluated row's tokens, sorted; the kinds of each rank's micro-batches in order)"""
        out, kinds = [], []
        for rank in range(world):
            batches = list(ernie_components(cfg, rank, world, "cpu", objective).eval_batches())
            assert len(batches) == 3 * 4 // world  # eval_batches x accumulation micro-batches of 1 row
            kinds.append([tuple(sorted(k for k in b if k.endswith("label") or k.endswith("labels"))) for b in batches])
            out += [tuple(r[m.bool()].tolist()) for b in batches for r, m in zip(b["input_ids"], b["attention_mask"])]
        return sorted(out), kinds

    one, kinds1 = rows(1)
    for world in (2, 4):
        got, kinds = rows(world)
        assert got == one, world
        # micro-batch i of every rank belongs to evaluation step i // accumulation, and a step has one kind
        assert all(k == kinds[0] for k in kinds) and kinds[0] == kinds1[0][::world], (world, kinds)
    assert len(set(kinds1[0])) == 3  # the three batch kinds of the rotation, one per evaluation step
