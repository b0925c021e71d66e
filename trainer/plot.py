"""``python -m trainer.plot RUN_DIR``: PNG loss and throughput curves from ``RUN_DIR/metrics.jsonl``.

Writes ``RUN_DIR/plots/loss.png`` (training loss, each objective's ``*_loss``, and held-out eval loss) and
``RUN_DIR/plots/throughput.png`` (tokens/s and, where recorded, MFU), and ``RUN_DIR/plots/downstream.png`` when the run
has downstream scores (``eval.downstream``: each task's fine-tuned score against the pretraining step). A step logged twice (the run was killed and
resumed) keeps its last record, which is the one the resumed run continued from.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_metrics(run_dir: Path) -> tuple[dict[int, dict], dict[int, dict]]:
    """(train records by step, eval records by step); malformed lines (a kill mid-write) are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory (run_dir of a config)?")
    train, evals = {}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("split") == "eval":
            evals[rec["step"]] = rec
        elif "split" not in rec:
            train[rec["step"]] = rec
    return dict(sorted(train.items())), dict(sorted(evals.items()))


def read_downstream(run_dir: Path) -> dict[str, dict[int, dict]]:
    """Downstream records (``"split": "downstream"``, written by fine-tuning children) by task, then pretraining
    step; a step fine-tuned twice (a resumed run) keeps its last record."""
    out: dict[str, dict[int, dict]] = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("split") == "downstream":
            out.setdefault(rec["task"], {})[rec["step"]] = rec
    return {task: dict(sorted(recs.items())) for task, recs in sorted(out.items())}


def plot(run_dir: str | Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")  # files only; no display on cluster nodes
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    train, evals = read_metrics(run_dir)
    if not train:
        raise ValueError(f"{run_dir}/metrics.jsonl has no training records yet")
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    steps = list(train)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [train[s]["loss"] for s in steps], label="train loss")
    for key in sorted({k for r in train.values() for k in r if k.endswith("_loss")}):
        xs = [s for s in steps if key in train[s]]
        ax.plot(xs, [train[s][key] for s in xs], label=key, alpha=0.7, linewidth=1)
    if evals:
        ax.plot(list(evals), [r["loss"] for r in evals.values()], "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(run_dir.name)
    ax.legend()
    ax.grid(alpha=0.3)
    loss_png = out_dir / "loss.png"
    fig.savefig(loss_png, dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [train[s].get("tokens_per_s", 0.0) for s in steps], label="tokens/s")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    mfu_steps = [s for s in steps if train[s].get("mfu") is not None]
    if mfu_steps:
        ax2 = ax.twinx()
        ax2.plot(mfu_steps, [100 * train[s]["mfu"] for s in mfu_steps], color="tab:orange", label="MFU %")
        ax2.set_ylabel("MFU %")
    ax.set_title(f"{run_dir.name}: throughput")
    ax.grid(alpha=0.3)
    fig.legend(loc="upper right")
    tput_png = out_dir / "throughput.png"
    fig.savefig(tput_png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    written = [loss_png, tput_png]

    downstream = read_downstream(run_dir)
    if downstream:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for task, recs in downstream.items():
            keys = sorted({k for r in recs.values() for k, v in r.items() if isinstance(v, float)})
            for key in keys:
                xs = [s for s in recs if key in recs[s]]
                ax.plot(xs, [100 * recs[s][key] for s in xs], "o-", label=key)
        ax.set_xlabel("pretraining step")
        ax.set_ylabel("dev score (x100, median over seeds)")
        ax.set_title(f"{run_dir.name}: downstream")
        ax.legend()
        ax.grid(alpha=0.3)
        down_png = out_dir / "downstream.png"
        fig.savefig(down_png, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(down_png)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="trainer.plot", description="PNG loss and throughput curves of a run")
    p.add_argument("run_dir")
    args = p.parse_args(argv)
    try:
        paths = plot(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
