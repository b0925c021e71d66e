"""slurm/common.sh's choice of torchrun options, which differ by torch release (no Slurm needed).

The templates used to pass ``--shutdown-timeout`` unconditionally: torch 2.11's torchrun (the lent GPU machines'
torch, and a common one on clusters) rejects it, so every launch failed at once ("unrecognized arguments"); five
Slurm tests failed that way in a torch 2.11 venv. The fake torchruns below print only a help text: they prove our
reading of it, not what torchrun does with the options; the Slurm tests run the real one. The later tests also fake
srun, scontrol, hostname and python (``common``): the fakes prove our side of the seam (the commands and arguments
common.sh builds and how it reads their replies), not what Slurm, a node's resolver or the trainer do with them
(tests/test_slurm_*.py run those on the local cluster)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def torchrun_options(tmp_path, help_text=None):
    """(exit status, stdout, stderr) of bf_torchrun_options with a torchrun printing ``help_text`` (None: the real
    one beside this interpreter), called twice (a multi-phase job launches several times), options one per line."""
    path = str(Path(sys.executable).parent)
    if help_text is not None:
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "torchrun").write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}\nEOF\n")
        (fake / "torchrun").chmod(0o755)
        path = str(fake)
    script = ('set -euo pipefail; source slurm/common.sh; bf_torchrun_options; bf_torchrun_options; '
              'printf "%s\\n" "${BF_TORCHRUN_OPTS[@]}"')
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PATH=os.pathsep.join([path, "/usr/bin", "/bin"]), SAVE_TIMEOUT="300"))
    return proc.returncode, proc.stdout, proc.stderr


def test_the_options_read_from_this_torchrun_launch_it(tmp_path):
    """The real torchrun beside this interpreter: torch 2.13's gets both options, 2.11's (no --shutdown-timeout) the
    signals alone and a warning; either way torchrun starts a one-rank run with them (an option it did not know
    would end it at once with "unrecognized arguments", as on torch 2.11 before)."""
    import torch

    code, out, err = torchrun_options(tmp_path)
    assert code == 0, err
    options = [line for line in out.splitlines() if not line.startswith("bertfamily")]
    assert options[0] == "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13):
        assert options[1:] == ["--shutdown-timeout=300"] and "warning" not in out, out
    else:
        assert options[1:] == [] and "no --shutdown-timeout" in out, out
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=1", "--no-python", *options, "true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_torchrun_without_shutdown_timeout_launches_and_the_log_says_saves_get_30_s(tmp_path):
    code, out, err = torchrun_options(tmp_path, "usage: torchrun [--signals-to-handle SIGNALS_TO_HANDLE]\n"
                                                "                [--virtual-local-rank]")
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("bertfamily")]
    assert [line for line in out.splitlines() if line not in warnings] == [
        "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]
    # once, although asked twice: the help is read once per job
    assert len(warnings) == 1 and "30 s" in warnings[0] and "SAVE_TIMEOUT=300" in warnings[0], out


def test_a_torchrun_that_cannot_pass_usr1_on_is_refused_naming_the_option(tmp_path):
    code, out, err = torchrun_options(tmp_path, "usage: torchrun [--nnodes NNODES] [--max-restarts MAX_RESTARTS]")
    assert code == 1 and out == ""
    assert "has no --signals-to-handle" in err and "USR1" in err, err


@pytest.mark.parametrize("option", ["--signals-to-handle", "--shutdown-timeout"])
def test_the_templates_launch_torchrun_with_the_options_read_from_it(option):
    """Neither option is written into the srun line itself any more (that is what broke on torch 2.11)."""
    launch = (REPO / "slurm" / "common.sh").read_text().split("srun --nodes=", 1)[1].split("BF_SRUN_PID=", 1)[0]
    assert option not in launch and '"${BF_TORCHRUN_OPTS[@]}"' in launch


def common(tmp_path, script, env=None, fakes=None, cwd=REPO):
    """Run ``script`` after sourcing slurm/common.sh, with fake commands (name -> sh body) first on PATH. The fakes
    prove what common.sh asks of srun/scontrol/python, not what Slurm does with it: the Slurm tests run the real
    templates on a 2-node cluster, whose nodes have no GPUs, one CPU each and readable node records."""
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    for name, body in (fakes or {}).items():
        (fake / name).write_text("#!/bin/bash\n" + body + "\n")
        (fake / name).chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTFAMILY_", "EXTRA_SETS",
                                                                     "DATA_PREFIX", "GPUS_PER_NODE"))}
    full_env = dict(base, PATH=os.pathsep.join([str(fake), str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
                    **(env or {}))
    return subprocess.run(["bash", "-c", f"set -uo pipefail; source {REPO}/slurm/common.sh; {script}"], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=full_env)


def test_extra_sets_over_several_lines_and_a_data_prefix_with_any_character_reach_the_trainer(tmp_path):
    """A multi-line EXTRA_SETS kept only its first line (read stops at a newline: a run trained with the recipe's
    values, silently); a DATA_PREFIX holding a comma or ' #' was pasted into YAML unquoted and named another path."""
    from trainer.config import apply_override
    prefix = tmp_path / "corpora, v2 #1" / "en[web]"
    prefix.parent.mkdir()
    (tmp_path / "corpora, v2 #1" / "en[web].manifest.json").write_text("{}")
    proc = common(tmp_path, 'bf_sets runs/x; printf "%s\\n" "${BF_SETS[@]}"',
                  env={"EXTRA_SETS": "\n  train.micro_batch_size=2\n\ttrain.steps=7 optim.betas=[0.9,0.98]\n",
                       "DATA_PREFIX": str(prefix)})
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert args[0::2] == ["--set"] * 5
    raw: dict = {}
    for kv in args[1::2]:
        apply_override(raw, kv)
    assert raw["run_dir"] == "runs/x" and raw["data"]["corpora"] == [{"prefix": str(prefix)}]
    assert raw["train"] == {"micro_batch_size": 2, "steps": 7} and raw["optim"]["betas"] == [0.9, 0.98]


def test_a_run_dir_holding_a_yaml_comment_or_quotes_reaches_the_trainer_whole(tmp_path):
    """RUN_DIR='.../exp #2' was passed unquoted: YAML read ' #2' as a comment, and the job resumed and trained the run
    in '.../exp', another run's folder, with no error (found by review on the two-node harness). bert_base.sh's
    phase-2 init_from path is quoted the same way."""
    from trainer.config import apply_override
    run_dir = tmp_path / 'exp #2, "b": [c]' / "run"
    proc = common(tmp_path, 'bf_sets "$RD"; printf "%s\\n" "${BF_SETS[@]}"; bf_yaml_string "$RD"',
                  env={"RD": str(run_dir)})
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    raw: dict = {}
    apply_override(raw, args[1])
    assert args[0] == "--set" and raw["run_dir"] == str(run_dir)
    apply_override(raw, "checkpoint.init_from=" + args[-1])
    assert raw["checkpoint"]["init_from"] == str(run_dir)
    assert "PHASE1_INIT=$(bf_yaml_string \"$PHASE1_CKPT\")" in (REPO / "slurm" / "bert_base.sh").read_text()


def test_the_training_step_asks_for_its_gpus_the_smallest_nodes_cpus_and_passes_the_environment(tmp_path):
    """On a node with GPUs (Slurm's variables faked): the step asks srun for the ranks' GPUs (a --gres=gpu:4 job's
    step inherited the template's --gpus-per-node=8 and was refused), for the smallest node's CPUs ("4(x1),2": the
    batch node's 4 was refused on the 2-CPU node) and --export=ALL (an --export=NONE job's tasks started without the
    venv). 'scontrol show node' refused (PrivateData=nodes): the batch host's name is the rendezvous. A relative
    BERTFAMILY_HOME finds its venv."""
    home = tmp_path / "my repo"
    for sub in ("trainer", "data_prep", ".venv/bin"):
        (home / sub).mkdir(parents=True)
    (home / ".venv/bin/activate").write_text("export BF_TEST_VENV=active\n")
    (home / "trainer/pretrain.py").write_text("")
    fakes = {
        "scontrol": 'if [ "$1 $2" = "show hostnames" ]; then printf "n1\\nn2\\n"; exit 0; fi\n'
                    'echo "slurm_load_node error: Access/permission denied" >&2; exit 1',
        "torchrun": 'echo "usage: torchrun [--signals-to-handle S] [--shutdown-timeout T]"',
        "hostname": "echo batchhost",
        "python": "exit 0",
        "srun": 'printf "%s\\n" "$@" > "$BF_SRUN_ARGS"; echo "BF_TEST_VENV=${BF_TEST_VENV:-}" >> "$BF_SRUN_ARGS"',
    }
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_CPUS_PER_NODE": "4(x1),2", "SLURM_GPUS_ON_NODE": "2",
           "BERTFAMILY_HOME": "my repo", "BUILD_INDEX": "0", "BF_SRUN_ARGS": str(tmp_path / "srun_args")}
    proc = common(tmp_path, 'bf_setup; echo "home=$BERTFAMILY_HOME addr=$BF_MASTER_ADDR nproc=$BF_NPROC"; '
                            'bf_train tiny_roberta runs/x; echo "rc=$BF_RC"', env=env, fakes=fakes, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"home={home} addr=batchhost nproc=2" in proc.stdout and "PrivateData=nodes" in proc.stdout
    srun = (tmp_path / "srun_args").read_text().splitlines()
    launch = srun[: srun.index("bash")]
    assert {"--gpus-per-node=2", "--cpus-per-task=2", "--export=ALL", "--nodes=2"} <= set(launch), launch
    assert "--nproc-per-node=2" in srun and "--master-addr=batchhost" in srun and "BF_TEST_VENV=active" in srun
    assert "rc=0" in proc.stdout
    no_gpus = common(tmp_path, 'bf_setup; bf_train tiny_roberta runs/x',
                     env={**env, "SLURM_GPUS_ON_NODE": "0"}, fakes=fakes, cwd=tmp_path)
    assert no_gpus.returncode == 0, no_gpus.stderr
    assert not any(a.startswith("--gpus") for a in (tmp_path / "srun_args").read_text().splitlines())


def test_a_stop_signal_that_ends_the_config_check_is_a_stop_not_a_failure(tmp_path):
    """Slurm's SIGTERM reaches every process of the job: the config check (or the cache build) it killed used to be
    reported as "config ... is invalid" with exit 1; it is a stop (75: requeue), and nothing is launched."""
    home = tmp_path / "repo"
    for sub in ("trainer", "data_prep"):
        (home / sub).mkdir(parents=True)
    (home / "trainer/pretrain.py").write_text("")
    fakes = {"scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo n1; else echo "NodeName=n1 NodeAddr=10.0.0.1"; fi',
             "torchrun": "exit 0", "python": 'kill -TERM "$PPID"; sleep 0.2; exit 143', "srun": "touch srun_ran"}
    env = {"SLURM_JOB_ID": "78", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "BERTFAMILY_HOME": str(home),
           "BERTFAMILY_VENV": "none"}
    proc = common(tmp_path, 'bf_setup; bf_train tiny_roberta runs/x; echo "rc=$BF_RC"', env=env, fakes=fakes,
                  cwd=tmp_path)
    assert proc.returncode == 0 and "rc=75" in proc.stdout, proc.stdout + proc.stderr
    assert "invalid" not in proc.stderr and "stopped by SIGTERM" in proc.stdout
    assert not (home / "srun_ran").exists()


def test_the_checkpoint_the_jobs_name_is_the_newest_complete_one_not_what_latest_says(tmp_path):
    """bert_base.sh starts phase 2 from bf_latest_checkpoint, and the job log names it after every launch: it read
    `latest`, which a kill between a save's completion and the move of `latest` leaves naming the checkpoint before
    (while --resume auto takes the newest complete one). An incomplete folder (no bertfamily.json) is never named."""
    root = tmp_path / "run" / "checkpoints"
    for step, complete in ((4, True), (8, True), (12, False), (100, False)):
        (root / f"global_step{step}").mkdir(parents=True)
        if complete:
            (root / f"global_step{step}" / "bertfamily.json").write_text("{}")
    (root / "latest").write_text("global_step4")
    (root / "abandoned-20261205T000000-x" / "global_step20").mkdir(parents=True)
    proc = common(tmp_path, f'BF_RUN_DIR="{tmp_path / "run"}"; bf_latest_checkpoint')
    assert proc.returncode == 0 and proc.stdout.strip() == str(root / "global_step8"), proc.stdout + proc.stderr
    proc = common(tmp_path, f'BF_RUN_DIR="{tmp_path / "empty"}"; bf_latest_checkpoint')
    assert proc.stdout.strip() == "none"


def test_a_requeued_bert_base_job_runs_the_fine_tunings_a_completed_phase_1_left(tmp_path):
    """A job that completes phase 1 and is preempted in phase 2 requeues before its end, where the fine-tunings the
    completed trainings left are run (bf_downstream). The requeued job skips the completed phase 1, and ran only phase
    2's: phase 1's queued fine-tunings were never run. Both run folders are handed to
    `python -m trainer.finetune.downstream` now (which does nothing for a folder with none left)."""
    run = tmp_path / "runs" / "b"
    ckpt = run / "phase1" / "checkpoints" / "global_step8"
    ckpt.mkdir(parents=True)
    (ckpt / "bertfamily.json").write_text("{}")
    (run / "phase1" / "status.json").write_text('{"status": "completed", "step": 8}')
    for phase in ("phase1", "phase2"):
        (run / phase / "downstream").mkdir(parents=True)
        (run / phase / "downstream" / "queue.json").write_text("[]")
    real = sys.executable
    fakes = {"scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo n1; else echo "NodeName=n1 '
                         'NodeAddr=10.0.0.1"; fi',
             "torchrun": 'echo "usage: torchrun [--signals-to-handle S] [--shutdown-timeout T]"',
             "python": 'if [ "$1 $2" = "-m trainer.finetune.downstream" ]; then echo "$3" >> "$BF_DOWNSTREAM"; '
                       'exit 0; fi\n'
                       f'case "$1" in -|-c) exec "{real}" "$@";; esac\nexit 0',
             "srun": f'echo \'{{"status": "completed", "step": 4}}\' > "{run}/phase2/status.json"'}
    env = {"SLURM_JOB_ID": "79", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "SLURM_RESTART_COUNT": "1",
           "BERTFAMILY_HOME": str(REPO), "BERTFAMILY_VENV": "none", "BUILD_INDEX": "0", "RUN_DIR": str(run),
           "BF_DOWNSTREAM": str(tmp_path / "downstream_runs")}
    proc = common(tmp_path, f'bash {REPO}/slurm/bert_base.sh', env=env, fakes=fakes, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "phase 1 already completed" in proc.stdout
    assert (tmp_path / "downstream_runs").read_text().split() == [str(run / "phase1"), str(run / "phase2")]


def test_a_relative_data_prefix_submitted_from_elsewhere_says_it_is_read_from_the_checkout(tmp_path):
    """sbatch from another folder with BERTFAMILY_HOME set: the job runs in the checkout, so DATA_PREFIX=data/pydocs
    (present where sbatch ran) was not found, and the error did not say relative to which folder (review F8). The
    error now names both; a relative RUN_DIR gets the same note in the log (bf_train, run by the Slurm tests)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    (elsewhere / "data" / "pydocs.manifest.json").write_text("{}")
    proc = common(tmp_path, 'bf_setup_env; bf_sets runs/x; echo reached', cwd=elsewhere,
                  env={"SLURM_JOB_ID": "1", "SLURM_SUBMIT_DIR": str(elsewhere), "BERTFAMILY_HOME": str(REPO),
                       "BERTFAMILY_VENV": "none", "DATA_PREFIX": "data/pydocs"})
    assert proc.returncode == 1 and "reached" not in proc.stdout
    line, = [x for x in proc.stderr.splitlines() if "DATA_PREFIX=data/pydocs" in x]
    assert f"reads it from BERTFAMILY_HOME={REPO}" in line and f"not from {elsewhere}, where sbatch ran" in line, line
    assert "give an absolute path" in line
    note = common(tmp_path, 'bf_setup_env; bf_relative_note runs/x; echo; bf_relative_note /abs/x; echo end',
                  cwd=elsewhere, env={"SLURM_JOB_ID": "1", "SLURM_SUBMIT_DIR": str(elsewhere),
                                      "BERTFAMILY_HOME": str(REPO), "BERTFAMILY_VENV": "none"})
    assert note.stdout.splitlines()[-2:] == [f" (runs/x is relative: the job reads it from BERTFAMILY_HOME={REPO}, "
                                             f"where it runs, not from {elsewhere}, where sbatch ran; give an "
                                             "absolute path)", "end"], note.stdout
