#!/bin/bash
# BERT-base (110M) in two phases, as NVIDIA trains it: sequences of 128 for the first 90 % of the steps, then 512,
# phase 2 starting from phase 1's final weights. `sbatch slurm/bert_base.sh` runs both phases in one job.
#
# Batch arithmetic (trainer/recipes/bert_base_phase1.yaml and _phase2.yaml: NVIDIA's LAMB recipe):
#     phase 1 (seq 128, 7,038 steps): nodes x GPUs per node x micro x accumulation = 8 x 8 x 64 x 16 = 65,536;
#     phase 2 (seq 512, 1,563 steps):                                               8 x 8 x 16 x 32 = 32,768.
# The trainer computes the accumulation from each recipe's global and micro batch and the world size, so another
# node count works as long as both global batches divide evenly (4 nodes -> accumulation 32 and 64). On 8 x 8 A100
# phase 1 takes ~1.5 days and phase 2 ~0.7 days: the 48 h limit checkpoints and requeues once, and the requeued job
# picks up where it stopped (in phase 1 or phase 2). The original one-phase BERT recipe (256 x 512, 1M steps;
# 1 node x 8 x 32 = 256): PHASE1_CONFIG=bert_base PHASE2_CONFIG=none sbatch --nodes=1 slurm/bert_base.sh.
# Restart logic: phase 1 runs until RUN_DIR/phase1/status.json says "completed" (a requeued job resumes it with
# --resume auto); then phase 2 starts in RUN_DIR/phase2 from phase 1's latest checkpoint (weights only: a new
# optimizer and schedule), and resumes from its own checkpoints after a requeue.
#
# Overrides: environment variables (see slurm/common.sh; PHASE1_CONFIG, PHASE2_CONFIG here) and sbatch flags:
#   DATA_PREFIX=data/wiki_books RUN_DIR=runs/bert-b sbatch --nodes=8 slurm/bert_base.sh
#SBATCH --job-name=bert-base
#SBATCH --nodes=8
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

# --resume (a roll-back) goes to the phase whose folder holds the checkpoint (phase 2's: RUN_DIR/phase2/...; anything
# else: phase 1); the other phase gets the job's other arguments and continues (--resume auto). Both phases got it
# before, and phase 2 "resumed" a phase-1 checkpoint past its own train.steps and completed without training.
BF_PHASE1_RESUME=() BF_PHASE2_RESUME=()
bf_split_resume "$@"
if [ -n "$BF_RESUME" ] && [ "$BF_RESUME" != auto ]; then
    case "$(realpath -m "$BF_RESUME")/" in
        "$(realpath -m "$RUN_DIR/phase2")"/*) BF_PHASE2_RESUME=(--resume "$BF_RESUME") ;;
        *) BF_PHASE1_RESUME=(--resume "$BF_RESUME") ;;
    esac
fi
set -- ${BF_OTHER_ARGS[@]+"${BF_OTHER_ARGS[@]}"}

BF_RUN_DIR=$RUN_DIR/phase1 BF_LOG_DIR=""
if [ "$(bf_run_status)" = completed ]; then
    bf_log "phase 1 already completed ($(bf_latest_checkpoint)); going on with phase 2"
    [ ${#BF_PHASE1_RESUME[@]} -eq 0 ] || bf_log "warning: phase 1 is completed: ${BF_PHASE1_RESUME[*]} is not applied \
(a completed phase 1 is not launched again: roll it back with trainer/pretrain.py --config $PHASE1_CONFIG \
--set run_dir=$RUN_DIR/phase1 ${BF_PHASE1_RESUME[*]} yourself, then submit this job again)"
    # the fine-tunings phase 1 left: the job that completed it was requeued (phase 2 preempted) before its end, where
    # they run (bf_finish -> bf_downstream)
    BF_DONE_RUN_DIRS+=("$RUN_DIR/phase1")
else
    # Phase 2's config is checked now, at the job's world size, as bf_train checks phase 1's: otherwise a typo in it
    # (or EXTRA_SETS valid for phase 1 only) failed after phase 1's ~1.5 days on 64 GPUs. checkpoint.init_from is set
    # to null here: phase 1's checkpoint does not exist yet, and the launch below sets it. Costs one --check (~1 s).
    if [ "$PHASE2_CONFIG" != none ]; then
        bf_sets "$RUN_DIR/phase2"
        WORLD_SIZE=$((BF_NNODES * BF_NPROC)) python "${TRAIN_SCRIPT:-trainer/pretrain.py}" --config "$PHASE2_CONFIG" \
            "${BF_SETS[@]}" "$@" --set checkpoint.init_from=null --check >/dev/null \
            || { bf_stopped && bf_check_launch; bf_die "phase 2's config $PHASE2_CONFIG ${BF_SETS[*]} $* is invalid \
(message above); nothing was launched, phase 1 included"; }
    fi
    bf_log "phase 1: $PHASE1_CONFIG"
    bf_train "$PHASE1_CONFIG" "$RUN_DIR/phase1" "$@" ${BF_PHASE1_RESUME[@]+"${BF_PHASE1_RESUME[@]}"}
    bf_check_launch
fi
if [ "$PHASE2_CONFIG" = none ]; then bf_finish; fi
PHASE1_CKPT=$(bf_latest_checkpoint)
[ -d "$PHASE1_CKPT" ] || bf_die "phase 1 completed but left no checkpoint in $RUN_DIR/phase1/checkpoints"

bf_log "phase 2: $PHASE2_CONFIG, initialised from $PHASE1_CKPT"
# an assignment, so a failure stops the job (a command substitution inside an argument fails silently: a common.sh of
# another version than this template, without bf_yaml_string, gave checkpoint.init_from= and phase 2 trained from
# random weights; found by review)
PHASE1_INIT=$(bf_yaml_string "$PHASE1_CKPT") || bf_die "slurm/common.sh in $BERTFAMILY_HOME does not match this job \
script (no bf_yaml_string): submit again with the checkout's own slurm/bert_base.sh"
bf_train "$PHASE2_CONFIG" "$RUN_DIR/phase2" --set "checkpoint.init_from=$PHASE1_INIT" "$@" \
    ${BF_PHASE2_RESUME[@]+"${BF_PHASE2_RESUME[@]}"}
bf_finish
