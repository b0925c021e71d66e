"""ERNIE annotation under `mpirun -np 2`: every rank annotates its share of the shards (before, rank 0 alone did, so a
4-node job annotated on one node), and the side-cars and manifest are byte for byte a one-process run's."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_annotate_keys import _text, tok  # noqa: F401 (fixture)
from test_build_indexed import REPO, output_files

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def _mpirun(*cmd, ok: bool = True) -> subprocess.CompletedProcess:
    run = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, *cmd], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert (run.returncode == 0) == ok, run.stdout + run.stderr
    return run


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (apt-get install openmpi-bin)")
def test_two_ranks_annotate_their_shards_and_write_what_one_process_writes(tok, tmp_path):  # noqa: F811
    from data_prep import build_indexed
    from data_prep import manifest as mf

    src = tmp_path / "zh.txt"
    src.write_text(_text(False, 130), encoding="utf-8")
    args = ["--input", str(src), "--tokenizer", tok, "--chunk-size-mb", "0.004"]
    one = tmp_path / "one" / "zh"
    assert build_indexed.main([*args, "--output-prefix", str(one), "--annotate", "jieba"]) == 0
    n = len(mf.read_manifest(one)["shards"])
    assert n >= 3

    # build_indexed.py --annotate: tokenizing and annotating both spread over the ranks
    two = tmp_path / "two" / "zh"
    run = _mpirun("data_prep/build_indexed.py", *args, "--output-prefix", str(two), "--annotate", "jieba")
    assert "x 2 ranks" in run.stdout
    per_rank = re.search(r"annotated by 2 ranks: \[(\d+), (\d+)\]", run.stdout)
    assert per_rank and int(per_rank[1]) + int(per_rank[2]) == n and int(per_rank[2]) > 0, run.stdout
    assert output_files(two) == output_files(one)

    # (python -m data_prep.annotate under mpirun takes the same annotate_corpus path: its MPI start and the
    # gathered error are the last launch's; a launch of it that annotated every shard again, byte-identical, was
    # dropped to keep the suite under 12 minutes: ~15 s)

    # a rerun with --annotate keeps every complete side-car, on every rank
    kept = {p: p.stat().st_mtime_ns for p in Path(two).parent.glob("zh_*.spans.npy")}
    run = _mpirun("data_prep/build_indexed.py", *args, "--output-prefix", str(two), "--annotate", "jieba")
    assert f"{n} of {n} shard(s) already have a complete side-car" in run.stdout
    assert {p: p.stat().st_mtime_ns for p in kept} == kept

    # an error on rank 1 (its shard's .bin is not the manifest's) stops both ranks with the message, none waits
    bin1 = Path(f"{two}_00001.bin")
    data = bytearray(bin1.read_bytes())
    data[0] ^= 1
    bin1.write_bytes(bytes(data))
    run = _mpirun("-m", "data_prep.annotate", str(two), "--annotate", "jieba", "--quiet", ok=False)
    assert re.search(r"annotation failed on rank 1: ValueError: .*zh_00001\.bin has sha256 .*rebuild the corpus",
                     run.stdout + run.stderr), run.stdout + run.stderr
