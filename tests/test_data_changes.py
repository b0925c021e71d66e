"""A resume that changes what data the run reads says so, with counts (trainer/data_changes.py): real launches of the
stand-in trainer (tests/test_trainer_standin.py, one process) whose data.corpora name three small prepared corpora
A/B/C: the notes come from the checkpoint's bertfamily.json and the manifests, as in a real run. The counts are checked
against the reviewer's method: the (corpus, epoch, sample id) each position reads before and after the resume."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from test_samples import write_shards  # noqa: F401  (helper)
from test_trainer_multiproc import make_config, run
from trainer.data.heldout import held_out_mask, shard_key
from trainer.data.order import Blend, EpochOrder

pytestmark = [pytest.mark.slow]

PERIOD = 100  # a short blend pattern: the measurement below walks a few of them
STOP = 4  # the first launch stops at step 4 of global batch 8: the resume position is 32
N = 1000  # samples per corpus assumed by the measurement: no corpus wraps into a second epoch within it


def _docs(k: int, count: int) -> list:
    return [[[10 + k, 11 + (d % 50)], [12 + k] * (1 + d % 5)] for d in range(count)]


def corpora_set(prefixes: dict, weights: tuple) -> str:
    items = ", ".join(f"{{prefix: '{prefixes[n]}', weight: {w}}}" for n, w in zip("ABC", weights))
    return f"data.corpora=[{items}]"


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """(tmp, prefixes, step-4 checkpoint) of a run over A/B/C with weights 0.5/0.3/0.2 and valid_split 0.2."""
    tmp = tmp_path_factory.mktemp("data_changes")
    prefixes = {n: str(write_shards(_docs(k, 60), tmp / "corpora" / n, 97, docs_per_shard=20))
                for k, n in enumerate("ABC")}
    cfg = make_config(tmp, "first", data={"corpora": [{"prefix": prefixes[n], "weight": w}
                                                      for n, w in zip("ABC", (0.5, 0.3, 0.2))],
                                          "max_seq_length": 16, "blend_period": PERIOD, "valid_split": 0.2})
    run(cfg, 1, "--set", f"train.stop_at_step={STOP}")
    return tmp, prefixes, cfg, tmp / "first" / "checkpoints" / f"global_step{STOP}"


def resume(tmp: Path, cfg: Path, step4: Path, name: str, *sets: str):
    args = ["--resume", str(step4), "--set", f"run_dir={tmp / name}"]
    for kv in sets:
        args += ["--set", kv]
    return run(cfg, 1, *args)


def data_notes(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("resume: data:")]


def test_the_checkpoint_records_each_corpus_fingerprint_and_an_unchanged_resume_says_nothing(first):
    tmp, prefixes, cfg, step4 = first
    state = json.loads((step4 / "bertfamily.json").read_text())
    assert [c["prefix"] for c in state["data_corpora"]] == [prefixes[n] for n in "ABC"]
    assert all(len(c["shards"]) == 3 and c["fingerprint"] and c["documents"] == 60 for c in state["data_corpora"])
    proc = resume(tmp, cfg, step4, "same")
    assert "resumed from" in proc.stdout and data_notes(proc.stdout) == [], proc.stdout[-3000:]
    assert "resume: data" not in proc.stdout + proc.stderr


def _reads(weights, positions) -> list[tuple[int, int, int]]:
    """(corpus, epoch, sample id) at each position, as PretrainingDataset.locate composes them (blend, then the
    corpus's order seeded by seed + 7919 x its index; the stand-in config's seed is 5)."""
    blend = Blend(list(weights), PERIOD)
    orders = [EpochOrder(N, 5 + 7919 * c) for c in range(3)]
    return [(c, *orders[c](local)) for c, local in map(blend, positions)]


def test_changed_weights_say_how_many_samples_are_read_again_and_skipped(first):
    """The reviewer's case: 0.5/0.3/0.2 -> 0.2/0.3/0.5 at position 32. Before: nothing said; A re-read its samples
    and C skipped part of its stream."""
    tmp, prefixes, cfg, step4 = first
    proc = resume(tmp, cfg, step4, "reweighted", corpora_set(prefixes, (0.2, 0.3, 0.5)))
    notes = data_notes(proc.stdout)
    P = STOP * 8
    before = _reads((0.5, 0.3, 0.2), range(P))
    after = _reads((0.2, 0.3, 0.5), range(P, P + 3 * PERIOD))
    replayed = [sum(r[0] == c and r in set(before) for r in after) for c in range(3)]
    new_blend = Blend([0.2, 0.3, 0.5], PERIOD)
    # where each corpus's stream stands at the first position after the resume that reads it
    first_local = [next(new_blend(g)[1] for g in range(P, P + PERIOD) if new_blend(g)[0] == c) for c in range(3)]
    order = [EpochOrder(N, 5 + 7919 * c) for c in range(3)]
    read = {r for r in before + after}
    skipped = [sum((c, *order[c](local)) not in read for local in range(first_local[c])) for c in range(3)]
    assert replayed[0] > 0 and skipped[2] > 0  # A re-reads, C skips (B, same weight, may move by a slot)
    for c, name in enumerate("ABC"):
        said = [n for n in notes if f"corpus {prefixes[name]}:" in n]
        assert not (replayed[c] and skipped[c])
        if replayed[c]:
            assert len(said) == 1 and f"{replayed[c]:,} samples already read will be read again" in said[0], notes
        elif skipped[c]:
            assert len(said) == 1 and f"{skipped[c]:,} samples of corpus {prefixes[name]} are skipped" in said[0], notes
        else:
            assert said == [], notes
    assert notes[0] == ("resume: data: blend weights 0.5/0.3/0.2 -> 0.2/0.3/0.5 at position 32 (per corpus below; "
                        "restore: --set data.corpora.0.weight=0.5 --set data.corpora.2.weight=0.2)")


def test_a_rebuilt_corpus_says_its_order_changed_and_warns_of_held_out_documents_it_may_have_trained_on(first):
    """B rebuilt with 40 more documents: its first two shards are the same bytes, its third has more documents and
    two shards are new. Before: resumed without a word (new order, held-out documents moved)."""
    tmp, prefixes, cfg, step4 = first
    folder = Path(prefixes["B"]).parent
    shutil.copytree(folder, tmp / "B_before")
    try:
        write_shards(_docs(1, 100), Path(prefixes["B"]), 97, docs_per_shard=20)  # in place, as a rebuild does
        proc = resume(tmp, cfg, step4, "after_rebuild")
    finally:  # the other tests read B as it was
        shutil.rmtree(folder)
        shutil.copytree(tmp / "B_before", folder)
    notes = data_notes(proc.stdout)
    assert len(notes) == 1 and f"corpus {prefixes['B']} was rebuilt" in notes[0], notes
    assert "shards 3 -> 5, of which 2 new or changed; documents 60 -> 100" in notes[0], notes[0]
    # held-out documents (valid_split 0.2) of the new shards 3 and 4, counted here from the shard names alone
    held = [int(held_out_mask(shard_key(f"B_{k:05d}"), 20, 0.2).sum()) for k in range(5)]
    assert f"warning: {held[3] + held[4]:,} of its {sum(held):,} held-out documents" in notes[0], notes[0]


def test_old_checkpoints_without_fingerprints_compare_their_config_only(first):
    """A checkpoint saved before the fingerprints resumes with nothing new said when the settings are the same; a
    reordered data.corpora is still noted (its epoch orders are redrawn)."""
    import test_trainer_standin  # noqa: F401  (registers the stand-in objective)
    from trainer.config import load_config
    from trainer.data_changes import data_change_notes

    tmp, prefixes, cfg, step4 = first
    state = json.loads((step4 / "bertfamily.json").read_text())
    del state["data_corpora"]
    same = load_config(str(cfg), [], world_size=1)
    assert data_change_notes(state, same) == []
    swapped = load_config(str(cfg), [f"data.corpora.0.prefix={prefixes['B']}", f"data.corpora.1.prefix={prefixes['A']}",
                                     "data.corpora.0.weight=0.3", "data.corpora.1.weight=0.5"], world_size=1)
    notes = data_change_notes(state, swapped)
    assert [n.split(" moves from ")[1][:35] for n in notes] == ["data.corpora.1 to data.corpora.0: i",
                                                                 "data.corpora.0 to data.corpora.1: i"], notes
