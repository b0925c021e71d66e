"""slurm/bert_base.sh checks phase 2's config before phase 1 starts, at the job's world size: a typo in phase 2's
config, or EXTRA_SETS valid for phase 1 but not phase 2, failed only after phase 1 (~1.5 days on 64 A100s). The
template is run by bash with fake srun/scontrol/torchrun (as tests/test_slurm_common.py does); the --check steps run
the real trainer, so the refusals are the trainer's. The fakes prove what the template asks, not what Slurm does."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = sys.executable
FAKES = {"scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo n1; else echo "NodeName=n1 NodeAddr=10.0.0.1"; fi',
         "torchrun": 'echo "usage: torchrun [--signals-to-handle S] [--shutdown-timeout T]"',
         # the trainer's --check runs for real; trainer.* modules (downstream, lineage) are not this test's
         "python": f'case "$1" in -m) exit 0;; esac\nexec "{REAL}" "$@"',
         "srun": 'echo "$*" >> "$BF_SRUN_LOG"; exit 0'}
NUMS = "model.vocab_size=1024 model.pad_token_id=1"  # what `auto` reads from a corpus's tokenizer


def bert_base(tmp_path, **env):
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (fake / name).write_text("#!/bin/bash\n" + body + "\n")
        (fake / name).chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTFAMILY_", "EXTRA_SETS",
                                                                     "DATA_PREFIX", "GPUS_PER_NODE"))}
    full = dict(base, PATH=os.pathsep.join([str(fake), str(Path(REAL).parent), "/usr/bin", "/bin"]),
                SLURM_JOB_ID="81", SLURM_JOB_NODELIST="n1", SLURM_JOB_NUM_NODES="8", GPUS_PER_NODE="8",
                BERTFAMILY_HOME=str(REPO), BERTFAMILY_VENV="none", BUILD_INDEX="0", RUN_DIR=str(tmp_path / "run"),
                BF_SRUN_LOG=str(tmp_path / "srun.log"), **env)
    return subprocess.run(["bash", str(REPO / "slurm" / "bert_base.sh")], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=full)


def test_a_phase_2_config_typo_fails_before_phase_1_starts(tmp_path):
    phase2 = tmp_path / "phase2.yaml"
    phase2.write_text("base: bert_base_phase2\ntrain: {stepz: 1563}\n")
    proc = bert_base(tmp_path, PHASE2_CONFIG=str(phase2), EXTRA_SETS=NUMS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "train.stepz" in proc.stderr and "phase 2's config" in proc.stderr, proc.stderr
    assert "nothing was launched, phase 1 included" in proc.stderr
    assert not (tmp_path / "srun.log").exists() and "phase 1:" not in proc.stdout


def test_extra_sets_valid_for_phase_1_only_fail_before_phase_1(tmp_path):
    """A 256-row position table fits phase 1's sequences of 128, not phase 2's 512."""
    proc = bert_base(tmp_path, EXTRA_SETS=f"{NUMS} model.max_position_embeddings=256")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "data.max_seq_length=512 is longer than model.max_position_embeddings=256" in proc.stderr, proc.stderr
    assert "phase 2's config" in proc.stderr and not (tmp_path / "srun.log").exists(), proc.stderr


def test_phase_2_is_checked_at_the_jobs_world_size(tmp_path):
    """64 ranks (8 nodes x 8 GPUs): a phase-2 global batch they cannot share is refused before phase 1."""
    phase2 = tmp_path / "phase2.yaml"
    phase2.write_text("base: bert_base_phase2\ntrain: {global_batch_size: 32760}\n")
    proc = bert_base(tmp_path, PHASE2_CONFIG=str(phase2), EXTRA_SETS=NUMS)
    assert proc.returncode == 1 and "cannot be split evenly over 64 data-parallel ranks" in proc.stderr, proc.stderr
    assert not (tmp_path / "srun.log").exists()


def test_valid_configs_launch_phase_1_after_checking_both(tmp_path):
    proc = bert_base(tmp_path, EXTRA_SETS=NUMS)
    assert "phase 1: bert_base_phase1" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "srun.log").exists() and "phase 2's config" not in proc.stderr, proc.stderr
