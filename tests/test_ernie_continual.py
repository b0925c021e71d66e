"""ERNIE 2.0 continual multi-task schedule: each task gets its N, earlier tasks keep training, the two baselines."""
import numpy as np
import pytest
from pydantic import ValidationError

from trainer.ernie.continual import ContinualConfig, ContinualPlan, _spread

TASKS = [
    {"name": "mlm", "iterations": 900, "level": "token"},
    {"name": "capitalization", "iterations": 500, "level": "token"},
    {"name": "sentence_reorder", "iterations": 400, "level": "sentence"},
    {"name": "sentence_distance", "iterations": 301, "level": "sentence"},
]


def _plan(mode="continual", tasks=TASKS):
    return ContinualPlan(ContinualConfig(mode=mode, tasks=tasks))


@pytest.mark.parametrize("mode", ["continual", "all-at-once", "sequential"])
def test_each_task_gets_exactly_its_iterations(mode):
    plan = _plan(mode)
    assert plan.iterations() == {t["name"]: t["iterations"] for t in TASKS}
    # at most one sentence-level task per step, and no empty step
    for step in range(plan.total_steps):
        names = plan.tasks_at(step)
        assert names and sum(n.startswith("sentence") for n in names) <= 1


def test_continual_introduces_tasks_one_per_stage_and_keeps_earlier_ones():
    plan = _plan()
    assert len(plan.stage_bounds) - 1 == 4
    seen_by_stage = []
    for s in range(4):
        steps = range(plan.stage_bounds[s], plan.stage_bounds[s + 1])
        seen_by_stage.append({n for step in steps for n in plan.tasks_at(step)})
    assert seen_by_stage == [{"mlm"}, {"mlm", "capitalization"},
                             {"mlm", "capitalization", "sentence_reorder"},
                             {"mlm", "capitalization", "sentence_reorder", "sentence_distance"}]
    # N spread over the stages a task is in: mlm 900 over 4 stages, capitalization 500 over 3 (167, 167, 166)
    assert plan.per_stage[:, 0].tolist() == [225, 225, 225, 225]
    assert plan.per_stage[:, 1].tolist() == [0, 167, 167, 166]
    assert plan.per_stage[:, 3].tolist() == [0, 0, 0, 301]
    # stage 3 has sentence tasks 200 + 301 > mlm's 225: 501 steps, a sentence task in every one
    assert plan.stage_bounds[4] - plan.stage_bounds[3] == 501
    print(plan.describe())


def test_tasks_spread_evenly_inside_a_stage():
    plan = _plan()
    s0, s1 = plan.stage_bounds[3], plan.stage_bounds[4]
    rows = np.array([["mlm" in plan.tasks_at(k), "sentence_reorder" in plan.tasks_at(k)] for k in range(s0, s1)])
    halves = np.array_split(rows, 2)
    for col in range(2):  # each half of the stage holds half of each task's iterations, +-1
        assert abs(halves[0][:, col].sum() - halves[1][:, col].sum()) <= 1
    assert _spread([2, 1], 3).tolist() == [0, 1, 0]
    assert _spread([1], 4).tolist().count(0) == 1


def test_sequential_trains_one_task_per_stage_and_all_at_once_one_stage():
    seq = _plan("sequential")
    for s, t in enumerate(TASKS):
        steps = range(seq.stage_bounds[s], seq.stage_bounds[s + 1])
        assert {n for k in steps for n in seq.tasks_at(k)} == {t["name"]}
        assert len(steps) == t["iterations"]
    flat = _plan("all-at-once")
    assert len(flat.stage_bounds) == 2
    assert flat.total_steps == max(900, 400 + 301)
    assert set(flat.tasks_at(0)) >= {"mlm", "capitalization"}


def test_explicit_stages_and_validation():
    tasks = [dict(TASKS[0], stage=0), dict(TASKS[1], stage=1), dict(TASKS[2], stage=1), dict(TASKS[3], stage=2)]
    plan = _plan(tasks=tasks)
    assert len(plan.stage_bounds) - 1 == 3 and plan.iterations()["sentence_reorder"] == 400
    assert plan.stage_at(0) == 0 and plan.stage_at(plan.total_steps - 1) == 2
    with pytest.raises(IndexError, match="outside the continual plan"):
        plan.tasks_at(plan.total_steps)
    with pytest.raises(ValidationError, match="leave a gap"):
        ContinualConfig(tasks=[dict(TASKS[0], stage=0), dict(TASKS[1], stage=2)])
    with pytest.raises(ValidationError, match="listed twice"):
        ContinualConfig(tasks=[TASKS[0], TASKS[0]])
    with pytest.raises(ValidationError, match="only meaningful with mode: continual"):
        ContinualConfig(mode="sequential", tasks=[dict(TASKS[0], stage=0)])
