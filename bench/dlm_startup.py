"""ERNIE 1.0 start-up with a jieba-annotated dialogue file: launch to exit of a 2-rank ``tiny_ernie`` run of one step,
this tree against an older commit (``--old-ref``, default 57228fc: every rank tokenized and annotated the dialogue
files itself at start), on the same data, in one script.

    python bench/dlm_startup.py [--old-ref 57228fc] [--dialogues 2000] [--out bench/out/dlm_startup]

Data (written under --out): the in-repo classical Chinese corpus (tests/data/zh_classical.txt, first 2,500 lines)
with a 3,000-token Chinese tokenizer and jieba side-cars, and generated topic dialogues over its characters
(tests/finetune_tasks.py ``topic_dialogues``: --dialogues for training, a quarter of that held out), the settings of
tests/test_ernie_train.py's ERNIE test. Runs, each a fresh ``torchrun --nproc_per_node 2``: old with its caches
empty, old again (its corpus caches built), new with an empty cache folder (rank 0 builds the dialogue cache with a
pool of data.index_workers processes), new again (the cache found).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def prepare(out: Path, dialogues: int) -> tuple[Path, int]:
    from data_prep import annotate, build_indexed, train_tokenizer
    from finetune_tasks import topic_dialogues

    prefix = out / "corpus" / "zh"
    if not (out / "done").exists():
        lines = (REPO / "tests" / "data" / "zh_classical.txt").read_text(encoding="utf-8").splitlines()[:2500]
        text = out / "zh.txt"
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        train_tokenizer.main(["--kind", "zh", "--input", str(text), "--output", str(out / "tok"), "--vocab-size",
                              "3000", "--quiet"])
        assert build_indexed.main(["--input", str(text), "--tokenizer", str(out / "tok"), "--output-prefix",
                                   str(prefix)]) == 0
        annotate.annotate_corpus(prefix, "jieba", progress=False)
        for name, n, seed in (("dialogues", dialogues, 7), ("dialogues_valid", dialogues // 4, 8)):
            rows = topic_dialogues(text.read_text(encoding="utf-8"), n, seed=seed)
            (out / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                               encoding="utf-8")
        (out / "done").write_text("")
    vocab = json.loads((out / "tok" / "bertfamily_tokenizer.json").read_text())["vocab_size"]
    return prefix, vocab


def launch(repo: Path, out: Path, prefix: Path, vocab: int, cache: Path) -> float:
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = [f"run_dir={run_dir}", f"data.corpora=[{{prefix: {prefix}}}]", f"model.vocab_size={vocab}",
            f"objective.options.dlm.path={out / 'dialogues.jsonl'}",
            f"objective.options.dlm.valid_path={out / 'dialogues_valid.jsonl'}", "objective.options.dlm.every=2",
            "objective.options.dlm.annotate=jieba", "train.steps=1", "train.eval_every=1000",
            f"data.valid_corpora=[{{prefix: {prefix}}}]", f"data.cache_dir={cache}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "trainer.pretrain", "--config", "tiny_ernie", *(x for s in sets for x in ("--set", s))]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{repo}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old-ref", default="57228fc")
    p.add_argument("--dialogues", type=int, default=2000)
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "dlm_startup"))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prefix, vocab = prepare(out, a.dialogues)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = Path(tmp) / "old.tar"
        subprocess.run(["git", "archive", "-o", str(archive), a.old_ref], cwd=REPO, check=True)
        with tarfile.open(archive) as t:
            t.extractall(old)
        for name in ("cache_old", "cache_new"):
            shutil.rmtree(out / name, ignore_errors=True)
        times = {"old": launch(old, out, prefix, vocab, out / "cache_old"),
                 "old_again": launch(old, out, prefix, vocab, out / "cache_old"),
                 "new_cold": launch(REPO, out, prefix, vocab, out / "cache_new"),
                 "new_warm": launch(REPO, out, prefix, vocab, out / "cache_new")}
    for k, v in times.items():
        print(f"{k:10s} {v:6.1f} s")
    print(f"new_cold / old_again {times['new_cold'] / times['old_again']:.2f}x, "
          f"new_warm / old_again {times['new_warm'] / times['old_again']:.2f}x")
    (out / "results.json").write_text(json.dumps(times, indent=1))


if __name__ == "__main__":
    main()
