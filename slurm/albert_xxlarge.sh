#!/bin/bash
# ALBERT-xxlarge (235M parameters, H=4096, 12 shared layers) pretraining with LAMB: `sbatch slurm/albert_xxlarge.sh`.
#
# Batch arithmetic (trainer/recipes/albert_xxlarge.yaml): the paper's 4,096 sequences of 512 tokens per step are
#     nodes x GPUs per node x micro batch x gradient accumulation = 16 x 8 x 4 x 8 = 4,096.
# ALBERT shares one layer's weights but computes all 12 at H=4096, so it costs more per token than BERT-large:
# hence the recipe's micro batch of 4 at seq 512 in bf16 (raise it with activation checkpointing,
# EXTRA_SETS="model.activation_checkpointing=true train.micro_batch_size=8"). Other node counts: 8 nodes ->
# accumulation 16, 32 nodes -> 4. LAMB (lr 0.00176, 3,125 warmup steps, 125K steps) keeps its per-parameter trust
# ratios under ZeRO (trainer/optim/lamb.py), so the ZeRO stage can change freely.
# Time: ~125K steps at ~2.5 s/step on 16 x 8 A100 is ~3.6 days; the 48 h limit checkpoints and requeues.
#
# Overrides: environment variables (see slurm/common.sh) and sbatch flags, e.g.
#   DATA_PREFIX=data/albert_corpus EXTRA_SETS="optim.lr=1e-3" sbatch --nodes=32 slurm/albert_xxlarge.sh
#SBATCH --job-name=albert-xxlarge
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
CONFIG=${CONFIG:-albert_xxlarge}
RUN_DIR=${RUN_DIR:-runs/albert_xxlarge}
COMMON=${BERTFAMILY_HOME:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh
[ -f "$COMMON" ] || { echo "error: $COMMON not found: run sbatch from the repository root or set BERTFAMILY_HOME" >&2; exit 1; }
# shellcheck source=slurm/common.sh
. "$COMMON"
bf_setup
bf_train "$CONFIG" "$RUN_DIR" "$@"
bf_finish
