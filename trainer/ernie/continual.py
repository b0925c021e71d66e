"""ERNIE 2.0 continual multi-task learning: which tasks every optimizer step trains, fixed before training starts.

The paper gives every task N training iterations and lets the framework spread them over the stages: a task
introduced in stage s of S trains in stages s..S, N/(S-s+1) iterations in each (remainder to the earliest), so new
tasks are added while earlier ones keep training. Two baselines are options: ``all-at-once`` (one stage with every
task) and ``sequential`` (stage k trains task k alone, forgetting allowed).

A step may combine one sentence-level task (its batch format: reordering, distance, discourse, IR or plain MLM
samples) with several token-level tasks (MLM, capitalization, token-document relation label the same tokens).
Within a stage of L steps, where L = max(sum of the sentence-level tasks' iterations, largest token-level task's
iterations), each task's iterations are spread evenly (iteration i of a task with n lands near (i + 0.5)/n of the
stage), with at most one sentence-level task per step. Every task thus gets exactly its N, and a step's task set is a
pure function of the step number (``ContinualPlan.tasks_at``), so data built for global position g (step g // G)
stays reproducible and resumes exactly.

The plan is an array of task bitmasks, one int64 per step (8 MB for a million steps), built once in O(steps).
"""
from __future__ import annotations

import numpy as np

from trainer.ernie.config import ContinualConfig, Mode, TaskSpec  # noqa: F401  (re-exported)

def _spread(counts: list[int], length: int) -> np.ndarray:
    """Evenly interleave tasks with ``counts`` iterations into ``length`` slots -> task index per slot (-1 = idle).

    Iteration i of a task with n iterations is placed at fractional time (i + 0.5) / n; slots are filled in that
    order, e.g. counts [2, 1] into 3 slots -> [0, 1, 0]."""
    if sum(counts) == 0:
        return np.full(length, -1, np.int64)
    times = np.concatenate([(np.arange(n) + 0.5) / n for n in counts if n])
    owner = np.concatenate([np.full(n, t) for t, n in enumerate(counts) if n])
    owner = owner[np.argsort(times, kind="stable")]
    # place the C iterations at evenly spaced slots of the stage: slot floor((j + 0.5) * L / C)
    slots = np.floor((np.arange(len(owner)) + 0.5) * length / len(owner)).astype(np.int64)
    out = np.full(length, -1, np.int64)
    out[slots] = owner
    return out


def _token_rows(n: int, length: int) -> np.ndarray:
    """Bool [length]: n evenly spread steps of a token-level task (n <= length)."""
    out = np.zeros(length, bool)
    out[np.floor((np.arange(n) + 0.5) * length / n).astype(np.int64)] = True
    return out


class ContinualPlan:
    """The step -> tasks table of a ``ContinualConfig``. ``plan.tasks_at(step)`` -> task names of that step."""

    def __init__(self, cfg: ContinualConfig):
        self.cfg = cfg
        self.names = [t.name for t in cfg.tasks]
        if len(self.names) > 63:
            raise ValueError("continual: at most 63 tasks (one bit each in an int64 mask)")
        K = len(cfg.tasks)
        if cfg.mode == "all-at-once":
            intro, last = [0] * K, [0] * K
        elif cfg.mode == "sequential":
            intro, last = list(range(K)), list(range(K))
        else:
            intro = [cfg._stage(i) for i in range(K)]
            last = [max(intro)] * K
        S = max(last) + 1
        # per-stage iterations of each task: N spread over its stages, remainder to the earliest
        per_stage = np.zeros((S, K), np.int64)
        for k, t in enumerate(cfg.tasks):
            n_stages = last[k] - intro[k] + 1
            base, extra = divmod(t.iterations, n_stages)
            per_stage[intro[k]:last[k] + 1, k] = base
            per_stage[intro[k]:intro[k] + extra, k] += 1
        sentence = np.array([t.level == "sentence" for t in cfg.tasks])
        masks, bounds = [], [0]
        for s in range(S):
            n = per_stage[s]
            L = int(max(n[sentence].sum() if sentence.any() else 0, n[~sentence].max() if (~sentence).any() else 0))
            mask = np.zeros(L, np.int64)
            sent_idx = np.flatnonzero(sentence)
            slot_owner = _spread([int(n[k]) for k in sent_idx], L)
            has = slot_owner >= 0
            mask[has] |= np.left_shift(1, sent_idx[slot_owner[has]])
            for k in np.flatnonzero(~sentence):
                if n[k]:
                    mask[_token_rows(int(n[k]), L)] |= 1 << int(k)
            masks.append(mask)
            bounds.append(bounds[-1] + L)
        self.per_stage = per_stage
        self.stage_bounds = np.array(bounds)
        self.masks = np.concatenate(masks) if masks else np.zeros(0, np.int64)

    @property
    def total_steps(self) -> int:
        return len(self.masks)

    def stage_at(self, step: int) -> int:
        return int(np.searchsorted(self.stage_bounds, step, side="right")) - 1

    def tasks_at(self, step: int) -> list[str]:
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} is outside the continual plan's {self.total_steps} steps; "
                             "set train.steps to plan.total_steps or add iterations")
        m = int(self.masks[step])
        return [name for k, name in enumerate(self.names) if m >> k & 1]

    def iterations(self) -> dict[str, int]:
        """Steps each task trains in, counted from the plan (equals each task's N)."""
        return {name: int(((self.masks >> k) & 1).sum()) for k, name in enumerate(self.names)}

    def describe(self) -> str:
        """One line per stage: its steps and each task's iterations in it (printed at start-up)."""
        lines = []
        for s in range(len(self.stage_bounds) - 1):
            parts = ", ".join(f"{self.names[k]} {int(n)}" for k, n in enumerate(self.per_stage[s]) if n)
            lines.append(f"stage {s}: steps [{self.stage_bounds[s]}, {self.stage_bounds[s + 1]}): {parts}")
        return "\n".join(lines)


class EvalPlan:
    """The evaluation counterpart of ``ContinualPlan``: held-out batch ``a`` is one batch format, cycling through the
    sentence-level tasks (each alone) and plain rows carrying every token-level task. So ``F`` (the number of
    formats) consecutive evaluation batches measure every task, including tasks not introduced yet (which shows what
    a stage adds, and in ``sequential`` mode what is forgotten).

    A sentence task is measured on its rows as built for it alone, the way most of its training steps build them:
    the token-level tasks change a row they label (capitalization lower-cases it, MLM masks it), so a sentence task
    measured on such rows was measured on input it rarely trains on (tiny_ernie2, sentence distance: held-out loss
    0.95 with the token tasks on its rows against 0.67 in training, on the same generated language)."""

    def __init__(self, cfg: ContinualConfig):
        self.names = [t.name for t in cfg.tasks]
        token = [t.name for t in cfg.tasks if t.level == "token"]
        sentence = [t.name for t in cfg.tasks if t.level == "sentence"]
        self.formats = [[s] for s in sentence] + ([token] if token else [])

    def tasks_at(self, step: int) -> list[str]:
        return self.formats[step % len(self.formats)]
