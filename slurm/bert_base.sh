#!/bin/bash
# BERT-base (110M) in two phases, as NVIDIA trains it: sequences of 128 for the first 90 % of the steps, then 512,
# phase 2 starting from phase 1's final weights. `sbatch slurm/bert_base.sh` runs both phases in one job.
#
# Batch arithmetic (trainer/recipes/bert_base_phase1.yaml, bert_base_phase2.yaml; BERT's 256 sequences per step):
#     phase 1 (seq 128): nodes x GPUs per node x micro x accumulation = 4 x 8 x 32 x 1 = 1,024 ... see the recipe;
#     phase 2 (seq 512): 4 x 8 x 8 x 1 = 256.
# The trainer computes the accumulation from each recipe's global and micro batch and the world size, so another
# node count works as long as the global batch divides evenly (2 nodes -> accumulation doubles).
# Restart logic: phase 1 runs until RUN_DIR/phase1/status.json says "completed" (a requeued job resumes it with
# --resume auto); then phase 2 starts in RUN_DIR/phase2 from phase 1's latest checkpoint (weights only: a new
# optimizer and schedule), and resumes from its own checkpoints after a requeue.
#
# Overrides: environment variables (see slurm/common.sh; PHASE1_CONFIG, PHASE2_CONFIG here) and sbatch flags:
#   DATA_PREFIX=data/wiki_books RUN_DIR=runs/bert-b sbatch --nodes=8 slurm/bert_base.sh
#SBATCH --job-name=bert-base
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -uo pipefail
PHASE1_CONFIG=${PHASE1_CONFIG:-bert_base_phase1}
PHASE2_CONFIG=${PHASE2_CONFIG:-bert_base_phase2}
RUN_DIR=${RUN_DIR:-runs/bert_base}
COMMON=${BERTFAMILY_HOME:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh
[ -f "$COMMON" ] || { echo "error: $COMMON not found: run sbatch from the repository root or set BERTFAMILY_HOME" >&2; exit 1; }
# shellcheck source=slurm/common.sh
. "$COMMON"
bf_setup

BF_RUN_DIR=$RUN_DIR/phase1 BF_LOG_DIR=""
if [ "$(bf_run_status)" = completed ]; then
    bf_log "phase 1 already completed ($(bf_latest_checkpoint)); going on with phase 2"
else
    bf_log "phase 1: $PHASE1_CONFIG"
    bf_train "$PHASE1_CONFIG" "$RUN_DIR/phase1" "$@"
    bf_check_launch
fi
PHASE1_CKPT=$(bf_latest_checkpoint)
[ -d "$PHASE1_CKPT" ] || bf_die "phase 1 completed but left no checkpoint in $RUN_DIR/phase1/checkpoints"

bf_log "phase 2: $PHASE2_CONFIG, initialised from $PHASE1_CKPT"
bf_train "$PHASE2_CONFIG" "$RUN_DIR/phase2" --set "checkpoint.init_from=$PHASE1_CKPT" "$@"
bf_finish
