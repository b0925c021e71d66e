#!/bin/bash
# Data prep spread over nodes: one mpi4py rank per node, each tokenizing its share of the inputs with WORKERS
# processes; rank 0 writes the manifest. The shards and manifest are the same as a single-machine run's
# (data_prep/build_indexed.py assigns work by input, not by rank count).
#   sbatch slurm/build_indexed.sh --input 'corpus/*.jsonl.zst' --tokenizer tokenizers/bbpe --output-prefix data/owt
# Arguments go to data_prep/build_indexed.py unchanged (see its --help). The run is restartable: a requeued or
# resubmitted job skips finished shards and ends byte-identical to an uninterrupted run, hence --requeue.
#
# Relative paths in the arguments are read from the checkout (BERTFAMILY_HOME), where the job runs.
# Environment: BERTFAMILY_HOME, BERTFAMILY_VENV (as in slurm/common.sh); WORKERS (processes per rank, default the
# node's CPUs); RANKS_PER_NODE (default 1: a rank per node, processes inside it); SRUN_MPI (srun's --mpi plugin,
# default pmix: Open MPI 4 under Slurm 22.05 fails with pmi2).
#SBATCH --job-name=build-indexed
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=12:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -uo pipefail
COMMON=${BERTFAMILY_HOME:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh
[ -f "$COMMON" ] || { echo "error: $COMMON not found: run sbatch from the repository root or set BERTFAMILY_HOME" >&2; exit 1; }
# shellcheck source=slurm/common.sh
. "$COMMON"
bf_setup_env
[ $# -gt 0 ] || bf_die "no arguments: pass data_prep/build_indexed.py's, e.g. --input 'corpus/*.txt' --tokenizer DIR --output-prefix PREFIX"
RANKS_PER_NODE=${RANKS_PER_NODE:-1}
CPUS=$(bf_min_cpus "${SLURM_JOB_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}")  # the smallest node's (mixed partitions)
WORKERS=${WORKERS:-$(( CPUS / RANKS_PER_NODE > 0 ? CPUS / RANKS_PER_NODE : 1 ))}
NNODES=${SLURM_JOB_NUM_NODES:-1}
bf_log "job $SLURM_JOB_ID: data prep on $NNODES node(s) x $RANKS_PER_NODE rank(s), $WORKERS worker(s) per rank"
[ "$BF_SUBMIT_DIR" = "$BERTFAMILY_HOME" ] || bf_log "relative --input/--tokenizer/--output-prefix paths are read \
from BERTFAMILY_HOME=$BERTFAMILY_HOME, where the job runs, not from $BF_SUBMIT_DIR, where sbatch ran"
srun --mpi="${SRUN_MPI:-pmix}" --nodes="$NNODES" --ntasks=$((NNODES * RANKS_PER_NODE)) \
    --ntasks-per-node="$RANKS_PER_NODE" --cpus-per-task="$(( CPUS / RANKS_PER_NODE > 0 ? CPUS / RANKS_PER_NODE : 1 ))" \
    --export=ALL --kill-on-bad-exit=1 --label \
    python data_prep/build_indexed.py --workers "$WORKERS" "$@"
rc=$?
if [ $rc -ne 0 ]; then
    echo "bertfamily: DATA PREP FAILED (srun exit status $rc): see the rank errors above. Finished shards are kept;" \
        "submit the same command again to continue where it stopped." >&2
    exit $rc
fi
bf_log "data prep done"
