"""build_indexed.py under `mpirun -np 2` (mpi4py ranks): the same bytes as one process."""
import os
import shutil
import subprocess
import sys

import pytest

from test_build_indexed import REPO, build, en_slice, en_tokenizer, output_files  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (apt-get install openmpi-bin)")
def test_two_mpi_ranks_write_what_one_process_writes(en_slice, en_tokenizer, tmp_path):
    args = ["--input", str(en_slice), "--tokenizer", en_tokenizer, "--split-sentences", "--chunk-size-mb", "0.1",
            "--shard-size-mb", "0.07"]
    single = tmp_path / "one" / "c"
    assert build([en_slice], en_tokenizer, single, *args[4:]) == 0
    ranks = tmp_path / "two" / "c"
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    run = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, "data_prep/build_indexed.py", *args,
                          "--output-prefix", str(ranks)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "x 2 ranks" in run.stdout  # it really ran as two ranks
    assert run.stdout.count("wrote ") == 1  # rank 0 alone finalizes and summarizes
    one, two = output_files(single), output_files(ranks)
    assert len(one) >= 10 and one == two
