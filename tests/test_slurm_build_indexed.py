"""slurm/build_indexed.sh on the local two-node cluster: mpi4py ranks on both nodes (srun --mpi=pmix) write the same
shards and manifest, byte for byte, as a single-machine run of data_prep/build_indexed.py."""
import json
import os
from pathlib import Path

import pytest

from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.multiproc]
REPO = Path(__file__).resolve().parents[1]
# Several pieces of work (so both ranks get some) and several shards per piece, on a ~500 KB slice of the corpus.
SPLIT = ("--chunk-size-mb", "0.1", "--shard-size-mb", "0.05")
SLICE_LINES = 10_000


def output_files(prefix: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(prefix.parent.iterdir()) if p.name.startswith(prefix.name)}


@pytest.fixture(scope="module")
def corpus_slice(en_corpus, tmp_path_factory) -> Path:
    """The corpus's first documents (cut at a blank line, a document boundary)."""
    lines = en_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:SLICE_LINES]
    while lines and lines[-1].strip():
        lines.pop()
    out = tmp_path_factory.mktemp("corpus") / "en_slice.txt"
    out.write_text("".join(lines), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def wordpiece(en_corpus, tmp_path_factory) -> Path:
    from data_prep import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "wp"
    assert train_tokenizer.main(["--kind", "wordpiece", "--input", str(en_corpus), "--output", str(out),
                                 "--vocab-size", "2000", "--quiet"]) == 0
    return out


def test_build_indexed_over_two_nodes_equals_a_single_machine_run(slurm_cluster, corpus_slice, wordpiece, tmp_path):
    from data_prep import build_indexed

    single = tmp_path / "single" / "corpus"
    assert build_indexed.main(["--input", str(corpus_slice), "--tokenizer", str(wordpiece), "--output-prefix",
                               str(single), "--workers", "1", *SPLIT]) == 0

    on_slurm = tmp_path / "slurm" / "corpus"
    log = tmp_path / "prep.out"
    job = slurm_cluster.sbatch(REPO / "slurm" / "build_indexed.sh", "--nodes=2", f"--output={log}", cwd=REPO,
                               env={"WORKERS": "1"}, args=("--input", str(corpus_slice), "--tokenizer", str(wordpiece),
                                                           "--output-prefix", str(on_slurm), *SPLIT))
    info = slurm_cluster.wait_job(job, 240)
    out = log.read_text()
    assert info["JobState"] == "COMPLETED", out
    # One MPI job of two ranks, one per node (rank 0 reports the world it found).
    assert "x 2 ranks" in out, out

    a, b = output_files(single), output_files(on_slurm)
    assert len(a) > 4, sorted(a)  # manifest + several .bin/.idx pairs
    assert sorted(a) == sorted(b)
    assert a == b
    manifest = json.loads(b["corpus.manifest.json"])
    assert len(manifest["shards"]) >= 2 and manifest["totals"]["documents"] > 0

