#!/bin/bash
# RoBERTa-large (355M parameters) pretraining: `sbatch slurm/roberta_large.sh` from the repository root.
#
# Batch arithmetic (trainer/recipes/roberta_large.yaml): the paper's 8,192 sequences of 512 tokens per step are
#     nodes x GPUs per node x micro batch x gradient accumulation = 16 x 8 x 16 x 4 = 8,192.
# The trainer computes the accumulation from the recipe's global and micro batch and the world size, so other node
# counts work unchanged as long as 8,192 divides evenly: 8 nodes -> accumulation 8, 32 nodes -> 2, 64 nodes -> 1.
# A micro batch of 16 x 512 fits an 80 GB GPU in bf16 with ZeRO-1 (the recipe's zero1_bf16.json); on 40 GB GPUs halve it
# (EXTRA_SETS=train.micro_batch_size=8; accumulation doubles).
# Time: 500K steps at ~1.2 s/step on 16 x 8 A100 is ~7 days: the 48 h limit ends each job with a checkpoint
# (USR1 ten minutes before the limit) and the job requeues itself, so one sbatch runs to the end.
#
# Overrides: environment variables (see slurm/common.sh) and sbatch flags, e.g.
#   RUN_DIR=runs/rl-try2 DATA_PREFIX=data/roberta_corpus sbatch --nodes=8 --time=12:00:00 slurm/roberta_large.sh
#   sbatch slurm/roberta_large.sh --set optim.lr=3e-4            # arguments go to trainer/pretrain.py
#SBATCH --job-name=roberta-large
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -uo pipefail
CONFIG=${CONFIG:-roberta_large}
RUN_DIR=${RUN_DIR:-runs/roberta_large}
COMMON=${BERTFAMILY_HOME:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh
[ -f "$COMMON" ] || { echo "error: $COMMON not found: run sbatch from the repository root or set BERTFAMILY_HOME" >&2; exit 1; }
# shellcheck source=slurm/common.sh
. "$COMMON"
bf_setup
bf_train "$CONFIG" "$RUN_DIR" "$@"
bf_finish
