# shellcheck shell=bash
# Shared launcher logic of the slurm/*.sh templates. Sourced by them, never run on its own.
#
# What a template does with it:
#     source "${BERTFAMILY_HOME:-$SLURM_SUBMIT_DIR}/slurm/common.sh"
#     bf_setup                              # repo, venv, nodes, rendezvous address, GPUs or CPU, signal traps
#     bf_train "$CONFIG" "$RUN_DIR" "$@"    # one torchrun per node via srun; checkpoint/requeue on signals
#     bf_finish                             # exit status, self-requeue, or a failure message that says what to do;
#                                           # after a completed training, the eval.downstream fine-tunings it left
# (bf_check_launch between launches of a multi-phase job returns only if the launch completed.)
#
# Every setting is an environment variable with a default, so `VAR=value sbatch slurm/x.sh` (sbatch exports the
# submitting environment) or `sbatch --export=ALL,VAR=value` overrides it; #SBATCH lines are overridden by sbatch
# flags (`sbatch --nodes=4 --time=2:00:00 slurm/x.sh`). Arguments after the script name go to the trainer
# (`sbatch slurm/x.sh --set optim.lr=2e-4`).
#
#   BERTFAMILY_HOME   the repository checkout (default: the folder sbatch was run from, $SLURM_SUBMIT_DIR)
#   BERTFAMILY_VENV   virtual environment to activate on every node (default: $BERTFAMILY_HOME/.venv if present;
#                     "none" to use the environment the job inherited, e.g. a module or conda env)
#   CONFIG            recipe name or YAML file (each template sets its own default)
#   TRAIN_SCRIPT      the entry point (default trainer/pretrain.py, which trains every model)
#   RUN_DIR           run folder: checkpoints, metrics.jsonl, TensorBoard, per-rank logs (each template's default is
#                     under runs/; relative paths are relative to BERTFAMILY_HOME, where the job runs, not to the
#                     folder sbatch was run from when BERTFAMILY_HOME is set). Set RUN_DIR rather than
#                     --set run_dir=...: the job script reads the run's status.json and checkpoints there.
#   DATA_PREFIX       one prepared corpus (PREFIX of PREFIX.manifest.json); replaces the recipe's data.corpora
#                     (relative: to BERTFAMILY_HOME, as RUN_DIR)
#   EXTRA_SETS        more overrides, whitespace-separated KEY=VALUE words, each passed as --set KEY=VALUE
#   GPUS_PER_NODE     ranks per node on GPU nodes (default: the GPUs Slurm gave the job, else nvidia-smi's count)
#   CPU_RANKS_PER_NODE ranks per node when a node has no GPU (default 1; CPU runs are for tests and debugging)
#   MASTER_PORT       rendezvous port on the first node (default derived from the job id and restart count)
#   RDZV_TIMEOUT      seconds the nodes wait for each other at the rendezvous before the job fails (default 900; a
#                     node that hangs before starting torchrun, or cannot reach the first node's MASTER_PORT, fails
#                     the job after this long instead of holding the allocation until the time limit)
#   SAVE_TIMEOUT      seconds torchrun lets ranks finish their preemption checkpoint before SIGKILL (default 540;
#                     keep it below the lead time of --signal=B:USR1@N and above the time one save takes). Needs a
#                     torchrun with --shutdown-timeout (torch 2.13 has it, 2.11 not): an older one waits a fixed 30 s,
#                     and the job log says so at start
#   BUILD_INDEX       1 (default): before each launch, build the run's data caches (corpus arrays, sample index) on
#                     the batch host with trainer.data.build_index, so no rank waits for them; skipped in seconds
#                     when they exist. 0: leave it to rank 0 at start (the other ranks wait, data.index_wait_timeout)
#   INDEX_WORKERS     threads for that build (default: the CPUs Slurm gave the batch host, at most 16; the build
#                     also caps them by its memory budget, INDEX_MEMORY_GB)
#   INDEX_MEMORY_GB   memory that build may hold in flight (default 2; a larger shard is walked in pieces)
#
# Why bash and not Python: this runs before any environment is activated, on the batch host, and must stay
# readable to the operators who edit it for their site.

bf_log() { echo "bertfamily [$(date -u +%H:%M:%S)] $*"; }
bf_die() { echo "bertfamily: error: $*" >&2; exit 1; }

# The status the trainer returns after saving on SIGTERM/SIGUSR1 (trainer/loop.py EXIT_REQUEUE; BSD EX_TEMPFAIL).
BF_EXIT_REQUEUE=75

# bf_setup_env: the repository as working directory and its venv active (data prep and training).
bf_setup_env() {
    [ -n "${SLURM_JOB_ID:-}" ] || bf_die "not inside a Slurm job: submit with sbatch (e.g. sbatch slurm/bert_base.sh)"
    BERTFAMILY_HOME=${BERTFAMILY_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
    [ -d "$BERTFAMILY_HOME/trainer" ] && [ -d "$BERTFAMILY_HOME/data_prep" ] || bf_die "BERTFAMILY_HOME=$BERTFAMILY_HOME \
is not a bertfamily checkout (no trainer/ and data_prep/): run sbatch from the repository root or set BERTFAMILY_HOME"
    # absolute before the cd: the default venv below is relative to it
    BERTFAMILY_HOME=$(cd "$BERTFAMILY_HOME" && pwd) || bf_die "cannot cd to $BERTFAMILY_HOME"
    BF_SUBMIT_DIR=${SLURM_SUBMIT_DIR:-$PWD}  # where sbatch ran; relative paths are read from BERTFAMILY_HOME
    cd "$BERTFAMILY_HOME" || bf_die "cannot cd to $BERTFAMILY_HOME"
    # The venv must be active in the job itself: a job that falls back to system Python finds no deepspeed, and one
    # that mixes ninja builds recompiles DeepSpeed's native ops (~1 min each) in every job.
    BERTFAMILY_VENV=${BERTFAMILY_VENV:-$BERTFAMILY_HOME/.venv}
    if [ "$BERTFAMILY_VENV" != none ]; then
        [ -f "$BERTFAMILY_VENV/bin/activate" ] || bf_die "no virtual environment at BERTFAMILY_VENV=$BERTFAMILY_VENV \
(run 'make venv' in $BERTFAMILY_HOME, or set BERTFAMILY_VENV=none to use the job's inherited environment)"
        # shellcheck disable=SC1091
        . "$BERTFAMILY_VENV/bin/activate"
    fi
    # UTF-8 mode whatever the node's locale: under GB18030 or latin-1, torch's inductor reads its templates with the
    # locale's codec and fails (data_prep/utf8_mode.py; every node's task inherits it through srun --export=ALL)
    export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONUTF8=1
}

# bf_torchrun_options: BF_TORCHRUN_OPTS, the signal options of this torch's torchrun, read from its --help (they
# differ by release). --signals-to-handle is required: without it torchrun does not pass the time-limit warning
# (USR1) on to the ranks, it dies of it, and no rank saves. --shutdown-timeout (how long torchrun waits for the ranks'
# save after passing a signal on, before SIGKILL) is used where it exists; an older torchrun waits a fixed 30 s, which
# the job log says, since a save that takes longer is cut (the previous complete checkpoint stays valid).
bf_torchrun_options() {
    [ -n "${BF_TORCHRUN_OPTS+x}" ] && return 0  # read once per job (a multi-phase job launches several times)
    local help
    help=$(torchrun --help 2>&1) || bf_die "torchrun --help failed: $(echo "$help" | tail -n 3)"
    [[ $help == *--signals-to-handle* ]] || bf_die "this torchrun ($(command -v torchrun)) has no --signals-to-handle: \
it would not pass the time-limit warning (USR1) on to the ranks, so no rank could save before the job ends; use a \
torch whose torchrun has it (2.11 and 2.13 do)"
    BF_TORCHRUN_OPTS=(--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1)
    if [[ $help == *--shutdown-timeout* ]]; then
        BF_TORCHRUN_OPTS+=(--shutdown-timeout="${SAVE_TIMEOUT:-540}")
    else
        bf_log "warning: this torchrun has no --shutdown-timeout (torch 2.13 has it): after a preemption signal it \
gives the ranks 30 s to save, not SAVE_TIMEOUT=${SAVE_TIMEOUT:-540} s; a longer save is cut and the job resumes from \
the checkpoint before"
    fi
}

# bf_setup: bf_setup_env, then the nodes, the rendezvous address, GPUs or CPU, and the signal traps.
bf_setup() {
    bf_setup_env
    command -v torchrun >/dev/null || bf_die "torchrun not found on PATH ($PATH): is torch installed in the venv?"

    BF_NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    BF_FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    # NodeAddr, not the node name: names do not resolve on every cluster (and on the test cluster both nodes are
    # 127.0.0.1 with different slurmd ports).
    BF_MASTER_ADDR=$(scontrol show node -o "$BF_FIRST_NODE" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
    if [ -z "$BF_MASTER_ADDR" ]; then
        # Sites with PrivateData=nodes refuse 'scontrol show node' to users. This shell runs on the job's first node
        # (Slurm starts the batch script there), so its own name is the rendezvous host.
        BF_MASTER_ADDR=$(hostname)
        bf_log "warning: 'scontrol show node $BF_FIRST_NODE' gave no NodeAddr (PrivateData=nodes?): rendezvous at this \
batch host's name, $BF_MASTER_ADDR"
    fi
    # A port per job and per restart, so a requeued job never meets its predecessor's socket in TIME_WAIT; in
    # 12000-31999, below Linux's ephemeral range (32768-60999), where the kernel hands ports to outgoing connections
    # (gloo's and NCCL's own, any client on the node) and a derived port was seen taken (EADDRINUSE) on a busy node.
    BF_MASTER_PORT=${MASTER_PORT:-$((12000 + (SLURM_JOB_ID % 2000) * 10 + ${SLURM_RESTART_COUNT:-0} % 10))}
    # torchrun's static rendezvous bounds both sides by it: the first node's store waits this long for the others to
    # connect, the others retry connecting this long. (torchrun would fail on a non-number only after every node
    # started; fail here instead.)
    BF_RDZV_TIMEOUT=${RDZV_TIMEOUT:-900}
    [[ $BF_RDZV_TIMEOUT =~ ^[1-9][0-9]*$ ]] || bf_die "RDZV_TIMEOUT=$BF_RDZV_TIMEOUT is not a whole number of seconds"

    local gpus=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
    if [ -z "$gpus" ]; then
        gpus=0
        if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
    fi
    if [ "$gpus" -gt 0 ]; then
        BF_NPROC=$gpus
        BF_BACKEND=nccl
        # A rank whose peer died gets an error from NCCL instead of blocking forever in a collective; the trainer's
        # deepspeed.timeout_minutes bounds how long that takes.
        export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
        export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    else
        BF_NPROC=${CPU_RANKS_PER_NODE:-1}
        BF_BACKEND=gloo
    fi

    # CPUs each node's task may ask for: the smallest node's share (SLURM_CPUS_ON_NODE is the batch node's alone; on a
    # partition mixing node generations a step asking every node for it is refused: "More processors requested than
    # permitted"). SLURM_JOB_CPUS_PER_NODE reads like "72(x2),36".
    BF_CPUS=$(bf_min_cpus "${SLURM_JOB_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}")
    # The training step asks for its GPUs itself: without it the step inherits the template's #SBATCH
    # --gpus-per-node=8, which a job submitted with --gres=gpu:4 cannot give ("Step requested gres_per_node=gpu:8 is
    # more than the job's"), and an exclusive job's batch shell counts every GPU of the node while a step gets only
    # those requested (two ranks would share each GPU).
    BF_STEP_GPUS=()
    if [ "$BF_BACKEND" = nccl ] && [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then BF_STEP_GPUS=(--gpus-per-node="$BF_NPROC"); fi

    BF_RESTART=${SLURM_RESTART_COUNT:-0}
    BF_JOB_TAG="job${SLURM_JOB_ID}-restart${BF_RESTART}"
    BF_RC=0
    BF_SIGNAL=""
    BF_DONE_RUN_DIRS=()  # run folders whose training completed in this job (bf_downstream)
    trap '_bf_on_signal USR1' USR1
    trap '_bf_on_signal TERM' TERM
    bf_log "job $SLURM_JOB_ID (restart $BF_RESTART) on $BF_NNODES node(s) [$SLURM_JOB_NODELIST]: $BF_NPROC rank(s) per" \
        "node, backend $BF_BACKEND, rendezvous $BF_MASTER_ADDR:$BF_MASTER_PORT ($BF_FIRST_NODE)"
}

# bf_min_cpus SPEC: the smallest count in a SLURM_JOB_CPUS_PER_NODE value ("72(x2),36" -> 36; "8" -> 8).
bf_min_cpus() {
    local min="" n
    local -a counts
    IFS=, read -r -a counts <<<"$1"
    for n in "${counts[@]}"; do
        n=${n%%(*}  # "72(x2)" -> 72
        [[ $n =~ ^[0-9]+$ ]] || continue
        if [ -z "$min" ] || [ "$n" -lt "$min" ]; then min=$n; fi
    done
    echo "${min:-1}"
}

# Two ways a job is told to stop, both ending with every rank saving at the next step boundary and exiting 75:
# - the time-limit warning (--signal=B:USR1@N) reaches only this shell: forward it to srun, which passes it to every
#   task; torchrun (--signals-to-handle) passes it on to its ranks and gives them SAVE_TIMEOUT seconds;
# - preemption, `scontrol requeue` and scancel make slurmd send SIGTERM to every process of the job at once (then
#   SIGKILL after the cluster's KillWait): nothing to forward. A second signal would interrupt torchrun's graceful
#   shutdown, so TERM is not forwarded.
# bash runs a trap only between commands, hence srun in the background and `wait` in a loop.
_bf_on_signal() {
    BF_SIGNAL=$1
    bf_log "received SIG$1: every rank checkpoints at its next step boundary and stops"
    if [ "$1" = USR1 ] && [ -n "${BF_SRUN_PID:-}" ]; then kill -USR1 "$BF_SRUN_PID" 2>/dev/null || true; fi
}

# bf_sets RUN_DIR: the --set arguments every launch gets (run folder, data prefix, EXTRA_SETS), in BF_SETS.
bf_yaml_string() {  # bf_yaml_string TEXT: TEXT as a YAML double-quoted string (as JSON escapes it)
    local quoted=${1//\\/\\\\}
    quoted=${quoted//\"/\\\"}
    printf '"%s"' "$quoted"
}

# bf_relative_note PATH: for a relative PATH when the job runs elsewhere than the folder sbatch ran in (BERTFAMILY_HOME
# set), the words saying where it is read from; else nothing.
bf_relative_note() {
    case "$1" in /*) return 0;; esac
    [ -n "${BF_SUBMIT_DIR:-}" ] && [ "$BF_SUBMIT_DIR" != "${BERTFAMILY_HOME:-}" ] || return 0
    printf '%s' " ($1 is relative: the job reads it from BERTFAMILY_HOME=$BERTFAMILY_HOME, where it runs, not from \
$BF_SUBMIT_DIR, where sbatch ran; give an absolute path)"
}

bf_sets() {
    # Paths as YAML double-quoted strings: a comma, ' #' (a YAML comment: "runs/exp #2" read as "runs/exp", another
    # run's folder), a colon or a bracket in the path stays in the path
    BF_SETS=(--set "run_dir=$(bf_yaml_string "$1")")
    if [ -n "${DATA_PREFIX:-}" ]; then
        [ -f "$DATA_PREFIX.manifest.json" ] || bf_die "DATA_PREFIX=$DATA_PREFIX: no $DATA_PREFIX.manifest.json\
$(bf_relative_note "$DATA_PREFIX") (prepare the corpus with slurm/build_indexed.sh or data_prep/build_indexed.py first)"
        BF_SETS+=(--set "data.corpora=[{prefix: $(bf_yaml_string "$DATA_PREFIX")}]")
    fi
    local kv words
    # split on whitespace, newlines included (a multi-line EXTRA_SETS), without globbing ("optim.betas=[0.9,0.98]");
    # read -d '' reads to the end and returns 1 there
    read -r -d '' -a words <<<"${EXTRA_SETS:-}" || true
    for kv in ${words[@]+"${words[@]}"}; do  # (the +-form: bash < 4.4 calls an empty array unbound under set -u)
        case "$kv" in *=*) ;; *) bf_die "EXTRA_SETS: '$kv' is not KEY=VALUE (e.g. EXTRA_SETS='optim.lr=2e-4')";; esac
        BF_SETS+=(--set "$kv")
    done
}

# bf_stopped: true (and BF_RC 75) when a stop signal arrived; a step it killed (the config check, the cache build)
# is then a stop, not a failure.
bf_stopped() {
    [ -n "$BF_SIGNAL" ] || return 1
    bf_log "stopped by SIG$BF_SIGNAL before training started; requeue to continue"
    BF_RC=$BF_EXIT_REQUEUE
}

# bf_split_resume ARGS...: the value of --resume among ARGS in BF_RESUME (empty without one), the other arguments in
# BF_OTHER_ARGS.
bf_split_resume() {
    BF_RESUME="" BF_OTHER_ARGS=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --resume) [ $# -ge 2 ] || bf_die "--resume needs a value: a checkpoint folder, none or auto"
                      BF_RESUME=$2; shift 2 ;;
            --resume=*) BF_RESUME=${1#--resume=}; shift ;;
            *) BF_OTHER_ARGS+=("$1"); shift ;;
        esac
    done
}

# bf_train CONFIG RUN_DIR [trainer args...]: one launch of trainer/pretrain.py over all nodes; sets BF_RC.
bf_train() {
    local config=$1 run_dir=$2 user_resume
    shift 2
    # --resume among the job's arguments (a roll-back, or a start from a checkpoint elsewhere) applies to the job's
    # first launch; launches after a requeue get the same arguments and continue (--resume auto) instead of rolling
    # back again (trainer/lineage.py). Kept from --check and build_index, which take no --resume.
    bf_split_resume "$@"
    user_resume=$BF_RESUME
    set -- ${BF_OTHER_ARGS[@]+"${BF_OTHER_ARGS[@]}"}
    [ -n "$config" ] || bf_die "CONFIG is empty: set a recipe name or YAML file"
    bf_sets "$run_dir"
    BF_TRAIN_SCRIPT=${TRAIN_SCRIPT:-trainer/pretrain.py}
    [ -f "$BF_TRAIN_SCRIPT" ] || bf_die "TRAIN_SCRIPT=$BF_TRAIN_SCRIPT does not exist in $BERTFAMILY_HOME"
    BF_RUN_DIR=$run_dir
    BF_LOG_DIR=$run_dir/logs/$BF_JOB_TAG
    mkdir -p "$BF_LOG_DIR" || bf_die "cannot create $BF_LOG_DIR"
    # Validate on the batch host before any node starts: a wrong key fails in seconds, naming the key.
    # WORLD_SIZE makes the check include the batch arithmetic (global = micro x accumulation x ranks).
    WORLD_SIZE=$((BF_NNODES * BF_NPROC)) python "$BF_TRAIN_SCRIPT" --config "$config" "${BF_SETS[@]}" "$@" --check \
        >"$BF_LOG_DIR/config.json" \
        || { bf_stopped && return 0; bf_die "config $config ${BF_SETS[*]} $* is invalid (message above); nothing \
was launched"; }
    bf_log "run $run_dir: config $config; per-rank logs in $BF_LOG_DIR/node*/$(bf_relative_note "$run_dir")"
    if [ -n "$BF_SIGNAL" ]; then BF_RC=$BF_EXIT_REQUEUE; return 0; fi  # told to stop before anything started
    # The data caches once, here, before any node starts: a 2B-sentence index takes minutes to build, which every GPU
    # of the job would otherwise spend waiting for rank 0. An existing, valid cache is only checked (seconds).
    if [ "${BUILD_INDEX:-1}" != 0 ]; then
        local cpus=${SLURM_CPUS_ON_NODE:-1}  # (runs on this node only)
        # a GPU node has 128-224 CPUs: 16 threads already read shards faster than a shared filesystem serves them
        python -m trainer.data.build_index --config "$config" "${BF_SETS[@]}" "$@" \
            --workers "${INDEX_WORKERS:-$(( cpus < 16 ? cpus : 16 ))}" --memory-gb "${INDEX_MEMORY_GB:-2}" \
            >"$BF_LOG_DIR/build_index.log" 2>&1 \
            || { bf_stopped && return 0; cat "$BF_LOG_DIR/build_index.log" >&2; bf_die "building the data caches of $config failed (message \
above, $BF_LOG_DIR/build_index.log); nothing was launched"; }
        bf_log "data caches ready ($(tail -n 1 "$BF_LOG_DIR/build_index.log"))"
        if [ -n "$BF_SIGNAL" ]; then BF_RC=$BF_EXIT_REQUEUE; return 0; fi
    fi

    # One task per node, each a torchrun for that node's ranks. --kill-on-bad-exit: the first node whose torchrun
    # fails (a rank died, rendezvous timed out) ends the whole step instead of leaving the others blocked in a
    # collective; --wait bounds how long the others may outlive a node that exited early. Console output (labelled
    # with the node index by srun and the rank by torchrun) goes to the job log; --tee also writes each rank's
    # stdout/stderr under $BF_LOG_DIR/node<N>/.
    # --cpus-per-task: the node's CPUs for the launcher, its ranks and their data-loader workers (Slurm 22.05's srun
    # no longer inherits the job's --cpus-per-task, and one CPU would starve the loaders).
    local resume=auto
    if [ -n "$user_resume" ] && [ "$user_resume" != auto ]; then
        if python -m trainer.lineage started "$(bf_checkpoint_root)" "$user_resume"; then
            bf_log "--resume $user_resume: job $SLURM_JOB_ID already started this run from it; this launch continues \
(--resume auto)"
        else
            resume=$user_resume
            bf_log "--resume $user_resume: this launch starts the run from it (later launches of job $SLURM_JOB_ID \
continue with --resume auto)"
        fi
    fi
    bf_torchrun_options
    touch "$BF_LOG_DIR/launched"
    BF_LAUNCH_START=$SECONDS
    # shellcheck disable=SC2016  # $SLURM_NODEID must expand on each node, not here
    # --export=ALL: a job submitted with --export=NONE (or SBATCH_EXPORT=NONE) makes srun pass no environment, and the
    # tasks would start without the venv this shell activated.
    srun --nodes="$BF_NNODES" --ntasks="$BF_NNODES" --ntasks-per-node=1 --cpus-per-task="$BF_CPUS" \
        ${BF_STEP_GPUS[@]+"${BF_STEP_GPUS[@]}"} --export=ALL --kill-on-bad-exit=1 --wait=60 --label \
        bash -c 'mkdir -p "$0/node$SLURM_NODEID" && exec torchrun --node-rank="$SLURM_NODEID" \
            --log-dir="$0/node$SLURM_NODEID" "$@"' "$BF_LOG_DIR" \
        --nnodes="$BF_NNODES" --nproc-per-node="$BF_NPROC" --rdzv-backend=static \
        --master-addr="$BF_MASTER_ADDR" --master-port="$BF_MASTER_PORT" --rdzv-conf="timeout=$BF_RDZV_TIMEOUT" \
        --max-restarts=0 --tee=3 "${BF_TORCHRUN_OPTS[@]}" \
        "$BF_TRAIN_SCRIPT" --config "$config" "${BF_SETS[@]}" "$@" --resume "$resume" &
    BF_SRUN_PID=$!
    while :; do
        wait "$BF_SRUN_PID"
        BF_RC=$?
        kill -0 "$BF_SRUN_PID" 2>/dev/null || break  # wait was only interrupted by a trap: keep waiting
    done
    BF_SRUN_PID=""
    BF_LAUNCH_SECONDS=$((SECONDS - BF_LAUNCH_START))
    return 0
}

# The trainer's own record of how the last launch ended (torchrun masks ranks' exit statuses). After a launch, a
# status.json older than that launch is ignored: it is a previous run's, and trusting its "preempted" would requeue a
# job that crashes before the trainer starts, forever.
bf_run_status() {
    local status=$BF_RUN_DIR/status.json
    if [ -n "${BF_LOG_DIR:-}" ] && [ -f "$BF_LOG_DIR/launched" ] && ! [ "$status" -nt "$BF_LOG_DIR/launched" ]; then
        return 0
    fi
    python - "$status" <<'EOF' 2>/dev/null
import json, sys
print(json.load(open(sys.argv[1])).get("status", ""))
EOF
}

# The checkpoint folder of the run: checkpoint.dir from the resolved config that bf_train saved, else
# RUN_DIR/checkpoints (the trainer's default).
bf_checkpoint_root() {
    local resolved=${BF_LOG_DIR:-/nonexistent}/config.json dir=""
    if [ -f "$resolved" ]; then
        dir=$(python -c 'import json, sys; print((json.load(open(sys.argv[1])).get("checkpoint") or {}).get("dir") or "")' \
            "$resolved" 2>/dev/null)
    fi
    echo "${dir:-$BF_RUN_DIR/checkpoints}"
}

# bf_latest_checkpoint: the newest complete checkpoint (a global_stepN folder holding bertfamily.json), as
# --resume auto chooses it (trainer/checkpoint.py find_latest), else "none". Not what `latest` names: a kill between a
# save's completion and the move of `latest` leaves it naming the checkpoint before.
bf_latest_checkpoint() {
    local root best="" best_step=-1 dir step
    root=$(bf_checkpoint_root)
    for dir in "$root"/global_step*; do
        step=${dir##*/global_step}
        [[ $step =~ ^[0-9]+$ ]] && [ -f "$dir/bertfamily.json" ] || continue
        if [ "$step" -gt "$best_step" ]; then best=$dir best_step=$step; fi
    done
    echo "${best:-none}"
}

# bf_check_launch: return 0 if the last bf_train completed; otherwise end the job the way the launch ended.
# Preempted or out of time: requeue (Slurm requeues by itself after `scontrol requeue` or a preemption; after our own
# USR1 the job asks for it). Failed: say where, what the last complete checkpoint is and how to resume, and exit
# non-zero so the job shows FAILED.
bf_check_launch() {
    local status
    status=$(bf_run_status)
    if [ "$BF_RC" -eq 0 ] && [ -z "$BF_SIGNAL" ]; then
        bf_log "launch finished (trainer status ${status:-unknown}); checkpoint: $(bf_latest_checkpoint)"
        local dir
        for dir in ${BF_DONE_RUN_DIRS[@]+"${BF_DONE_RUN_DIRS[@]}"}; do [ "$dir" = "$BF_RUN_DIR" ] && return 0; done
        BF_DONE_RUN_DIRS+=("$BF_RUN_DIR")
        return 0
    fi
    if [ "$BF_SIGNAL" = USR1 ] || { [ -z "$BF_SIGNAL" ] && [ "$status" = preempted ]; }; then
        bf_log "checkpoint saved ($(bf_latest_checkpoint)); requeueing job $SLURM_JOB_ID to resume with --resume auto"
        scontrol requeue "$SLURM_JOB_ID" || bf_die "scontrol requeue $SLURM_JOB_ID failed: resubmit the same command"
        exit 0
    fi
    if [ "$BF_SIGNAL" = TERM ]; then
        bf_log "stopped by SIGTERM (preemption, scontrol requeue or scancel); last complete checkpoint:" \
            "$(bf_latest_checkpoint); a requeued job resumes from it"
        exit "$BF_EXIT_REQUEUE"
    fi
    {
        echo "bertfamily: TRAINING FAILED: srun exit status $BF_RC (trainer status: ${status:-none})."
        case "$status" in
            nonfinite) echo "  The NaN/Inf guard stopped the run: the trainer's message above names the step, the" \
                            "losses and what to try (resuming unchanged will likely stop there again).";;
            disk_full) echo "  The checkpoint folder's filesystem is full: the partial checkpoint was removed and" \
                            "the last complete one (below) is intact. Free space (or lower checkpoint.keep_last)," \
                            "then submit the same command again.";;
            "")  # no rank of this launch got as far as writing status.json (not even "failed")
                if [ "${BF_LAUNCH_SECONDS:-0}" -ge "$BF_RDZV_TIMEOUT" ]; then
                    echo "  The rendezvous timed out: no rank started training and the launch ended after" \
                         "${BF_LAUNCH_SECONDS} s, past RDZV_TIMEOUT=$BF_RDZV_TIMEOUT s, so the nodes did not all join" \
                         "at $BF_MASTER_ADDR:$BF_MASTER_PORT ($BF_FIRST_NODE) in time (torchrun's 'Timed out ..." \
                         "K/N clients joined' above confirms it). A node hung before starting torchrun, or cannot" \
                         "reach that address and port (firewall, MASTER_PORT). srun reports the first node as" \
                         "'Exited' (it gave up waiting) and a node that never joined as 'Terminated': exclude that" \
                         "one on resubmission (sbatch --exclude=NODE)."
                else
                    echo "  No rank started training: a node's task or torchrun failed at start-up (bad venv, port" \
                         "in use, a rank killed during start-up), or the rendezvous timed out" \
                         "(RDZV_TIMEOUT=$BF_RDZV_TIMEOUT s); the first error above says which."
                fi;;
            *) echo "  A rank raised an error ('training failed' traceback above), a node or rank died, or the" \
                    "rendezvous timed out (RDZV_TIMEOUT=$BF_RDZV_TIMEOUT s).";;
        esac
        [ "$status" != "" ] || [ "${BF_LAUNCH_SECONDS:-0}" -lt "$BF_RDZV_TIMEOUT" ] \
            && echo "  The srun errors above name the first failing node; its ranks' output is in $BF_LOG_DIR/node<N>/."
        echo "  Last complete checkpoint: $(bf_latest_checkpoint)"
        echo "  To resume, submit the same command again (same RUN_DIR): the trainer restarts from it (--resume auto)."
    } >&2
    exit "$BF_RC"
}

# bf_downstream: the eval.downstream fine-tunings a completed training left (RUN_DIR/downstream/queue.json: queued,
# or started in runners) run here, in the batch script, until none is left. The runners the trainer started at its
# end lived in its job step: with proctrack/cgroup Slurm kills what is left in a step when the step (the trainer's
# srun) ends, so they most likely died; `python -m trainer.finetune.downstream` waits for those still alive and runs
# again what the dead ones left. A failed fine-tuning is said; the job still shows the training's status. Out of
# time here, queue.json keeps what is left: run the same command in a job of its own.
bf_downstream() {
    local dir
    for dir in ${BF_DONE_RUN_DIRS[@]+"${BF_DONE_RUN_DIRS[@]}"}; do
        [ -f "$dir/downstream/queue.json" ] || continue
        bf_log "downstream fine-tunings of $dir: python -m trainer.finetune.downstream $dir"
        python -m trainer.finetune.downstream "$dir" \
            || bf_log "warning: downstream fine-tunings of $dir did not all succeed (messages above; records with" \
                "\"split\": \"downstream_failed\" in $dir/metrics.jsonl)"
    done
}

# bf_finish: end the job after its last launch (and the downstream fine-tunings it left, bf_downstream).
bf_finish() {
    bf_check_launch
    bf_downstream
    bf_log "job $SLURM_JOB_ID done: $BF_RUN_DIR"
    exit 0
}
