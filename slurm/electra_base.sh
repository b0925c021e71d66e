#!/bin/bash
# ELECTRA-base (110M discriminator + a 1/3-width generator) pretraining: `sbatch slurm/electra_base.sh`.
#
# Batch arithmetic (trainer/recipes/electra_base.yaml): the paper's 256 sequences of 512 tokens per step are
#     nodes x GPUs per node x micro batch x gradient accumulation = 1 x 8 x 32 x 1 = 256.
# One node is the paper's scale (16 TPU chips); 766K steps at ~0.3 s/step on 8 A100s is ~2.7 days, so the 48 h
# limit checkpoints and requeues once. More nodes need no setting: the recipe's micro batch is a per-GPU ceiling,
# and the trainer takes the largest that divides each rank's share of 256 (2 nodes -> 16, 4 nodes -> 8) and says so
# at start. Generator and discriminator run in one forward
# (~1.3x BERT-base's memory per sequence). After training, export the discriminator with trainer/export_hf.py.
#
# Overrides: environment variables (see slurm/common.sh) and sbatch flags, e.g.
#   RUN_DIR=runs/electra-b DATA_PREFIX=data/owt sbatch slurm/electra_base.sh
#   sbatch --nodes=2 slurm/electra_base.sh
#SBATCH --job-name=electra-base
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -uo pipefail
CONFIG=${CONFIG:-electra_base}
RUN_DIR=${RUN_DIR:-runs/electra_base}
COMMON=${BERTFAMILY_HOME:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh
[ -f "$COMMON" ] || { echo "error: $COMMON not found: run sbatch from the repository root or set BERTFAMILY_HOME" >&2; exit 1; }
# shellcheck source=slurm/common.sh
. "$COMMON"
bf_setup
bf_train "$CONFIG" "$RUN_DIR" "$@"
bf_finish
