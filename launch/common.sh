# The shared preamble of the launch scripts (sourced, not run): venv, DeepSpeed's op cache,
# ranks and threads per node, the hostfile, a free port, the environment every rank gets,
# and an ssh probe that shows ssh's own error. Functions only, plus the variables below.
#
#   TSM_DS_ROOT   the repository (this file's parent folder); every host needs it at the same path
#   TSM_DS_VENV   the venv (default $TSM_DS_ROOT/.venv), same path on every host
# Settable by the user (see README "Cluster"): NPROC, MASTER_ADDR, MASTER_PORT, SSH_PORT,
# TSM_DS_ENV_FILE (NAME=VALUE lines for every rank), TSM_DS_FORWARD_ENV ("VAR1 VAR2": more
# variables to forward), NO_SSH_CHECK=1, TSM_DS_DIST_TIMEOUT.

TSM_DS_ROOT=${TSM_DS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TSM_DS_VENV=${TSM_DS_VENV:-$TSM_DS_ROOT/.venv}

tsm_die() { echo "launch: $*" >&2; exit 2; }
tsm_log() { echo "launch: $*" >&2; }

# venv on PATH (its ninja: DeepSpeed's op cache is not rebuilt), the op cache in the venv,
# DS_ACCELERATOR=cpu when this node has no CUDA device
tsm_setup_env() {
  [ -x "$TSM_DS_VENV/bin/python" ] || tsm_die "no venv at $TSM_DS_VENV: run 'bash launch/setup.sh' first (on every host, or on a shared filesystem)"
  export PATH="$TSM_DS_VENV/bin:$PATH"
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$TSM_DS_VENV/torch_extensions}
  if [ -z "${DS_ACCELERATOR:-}" ] && ! "$TSM_DS_VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    export DS_ACCELERATOR=cpu
  fi
}

# build DeepSpeed's CPU comm op once on this node, in one process (20 s to 2 min the first time);
# the ranks then load it from the cache (they also take a lock around it: tsm_ds.engine.dist)
tsm_prebuild_op() {
  [ "${DS_ACCELERATOR:-}" = cpu ] || return 0
  [ -e "$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/deepspeed_shm_comm.so" ] && return 0   # built (the ranks check again)
  "$TSM_DS_VENV/bin/python" -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 \
    || tsm_log "warning: prebuilding DeepSpeed's CPU comm op failed; the ranks will try again"
}

# ranks on this node: NPROC, else the GPUs of the allocation (SLURM), else the visible GPUs, else 1 (CPU)
tsm_ranks_per_node() {
  if [ -n "${NPROC:-}" ]; then echo "$NPROC"; return; fi
  if [ "${DS_ACCELERATOR:-}" = cpu ]; then echo 1; return; fi
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then echo "$SLURM_GPUS_ON_NODE"; return; fi
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .; return; fi
  local n; n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  echo "${n:-1}" | awk '{print ($1 > 0 ? $1 : 1)}'
}

# threads per rank = cores of this node (of the allocation under SLURM) / ranks on it
tsm_set_threads() {
  local ranks=$1 cores
  cores=${SLURM_CPUS_ON_NODE:-$(nproc)}
  if [ -z "${OMP_NUM_THREADS:-}" ]; then
    export OMP_NUM_THREADS=$(( cores / ranks > 0 ? cores / ranks : 1 ))
  fi
  tsm_log "$ranks rank(s) on $(hostname), $cores cores: OMP_NUM_THREADS=$OMP_NUM_THREADS"
}

# host names of a DeepSpeed hostfile, in order (comments and blank lines skipped)
tsm_hostfile_hosts() {
  [ -f "$1" ] || tsm_die "hostfile $1 not found (one line per host: '<host> slots=<ranks>')"
  sed -e 's/#.*//' "$1" | awk 'NF { print $1 }'
}

tsm_ssh() {   # ssh as the launcher uses it (batch mode: never a password prompt)
  local host=$1; shift
  ssh -o BatchMode=yes -o ConnectTimeout=10 ${SSH_PORT:+-p "$SSH_PORT"} "$host" "$@"
}

# every host of the hostfile answers ssh without a prompt; otherwise stop with ssh's own words
# (DeepSpeed's launcher says only "host=X was not reachable via ssh", and only for the first host)
tsm_check_ssh() {
  local hostfile=$1 host err failed=0
  for host in $(tsm_hostfile_hosts "$hostfile"); do
    if ! err=$(tsm_ssh "$host" true 2>&1 </dev/null); then
      tsm_log "ssh $host failed: ${err:-exit status $?}"
      case "$err" in
        *"Host key verification failed"*|*"host key"*)
          tsm_log "  fix: add its host key: ssh-keyscan ${SSH_PORT:+-p $SSH_PORT }$host >> ~/.ssh/known_hosts (check the fingerprint)";;
        *"Permission denied"*)
          tsm_log "  fix: passwordless login: ssh-copy-id ${SSH_PORT:+-p $SSH_PORT }$host";;
        *"Connection refused"*|*"timed out"*|*"No route"*|*"Could not resolve"*)
          tsm_log "  fix: the host is down, sshd is not running there, or the name/port is wrong (SSH_PORT=${SSH_PORT:-22})";;
      esac
      failed=1
    fi
  done
  [ "$failed" = 0 ] || tsm_die "not every host of $hostfile is reachable by ssh (NO_SSH_CHECK=1 skips this check)"
}

# a free TCP port: from SLURM_JOB_ID under SLURM (every node computes the same one), else one
# free here and, with a host given, checked free on that host (where rank 0 listens)
tsm_free_port() {
  local host=${1:-} port try
  if [ -n "${SLURM_JOB_ID:-}" ]; then echo $(( 20000 + SLURM_JOB_ID % 20000 )); return; fi
  for try in 1 2 3 4 5; do
    port=$("$TSM_DS_VENV/bin/python" -c "import socket; s=socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")
    if [ -z "$host" ] || tsm_ssh "$host" "$TSM_DS_VENV/bin/python -c \"import socket; socket.socket().bind(('', $port))\"" </dev/null 2>/dev/null; then
      echo "$port"; return
    fi
  done
  tsm_die "no free port found on $host in 5 tries: set MASTER_PORT"
}

# NAME=VALUE lines from a user's env file, checked (DeepSpeed 0.19.8 splits every line on '=':
# comments and blank lines crash it); prints the good lines, stops on a bad one naming file:line
tsm_read_env_file() {
  local f=$1 n=0 line
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line="${line#"${line%%[![:space:]]*}"}"
    case "$line" in ''|'#'*) continue;; esac
    [[ "$line" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || tsm_die "$f:$n: not a NAME=VALUE line: '$line' (comments must start the line with #)"
    echo "$line"
  done < "$f"
}

# the environment every rank gets, as NAME=VALUE lines (DeepSpeed's .deepspeed_env format):
# the user's files (~/.deepspeed_env, ./.deepspeed_env, $TSM_DS_ENV_FILE; later wins), then
# what the ranks need from this shell (PATH, op cache, accelerator, threads, interfaces, TSM_DS_*)
tsm_write_env_file() {
  local out=$1 f v
  : > "$out"
  for f in "$HOME/.deepspeed_env" "$PWD/.deepspeed_env" "${TSM_DS_ENV_FILE:-}"; do
    [ -n "$f" ] && [ -f "$f" ] && tsm_read_env_file "$f" >> "$out"
  done
  for v in PATH TORCH_EXTENSIONS_DIR DS_ACCELERATOR OMP_NUM_THREADS GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME \
           $(compgen -e | grep '^TSM_DS_' || true) ${TSM_DS_FORWARD_ENV:-}; do
    if [ -n "${!v:-}" ] && ! grep -q "^$v=" "$out"; then echo "$v=${!v}" >> "$out"; fi
  done
}

# export the lines of an env file into this shell (the --no_ssh / SLURM path: DeepSpeed reads
# .deepspeed_env only when it starts ranks over ssh)
tsm_source_env_file() {
  local line
  while IFS= read -r line; do export "${line?}"; done < <(tsm_read_env_file "$1")
}

# launcher options before the training flags: --hostfile --ssh_port --include --exclude
# --master_addr --master_port --num_nodes --num_gpus/--nproc --launcher; '--' ends them.
# Sets LAUNCH_OPTS (array, for deepspeed) and TRAIN_ARGS (array, for train.py).
tsm_parse_args() {
  LAUNCH_OPTS=(); TRAIN_ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --hostfile) HOSTFILE=$2; shift 2;;
      --ssh_port) SSH_PORT=$2; shift 2;;
      --master_addr) MASTER_ADDR=$2; shift 2;;
      --master_port) MASTER_PORT=$2; shift 2;;
      --num_gpus|--nproc) NPROC=$2; shift 2;;
      --include|--exclude|--num_nodes|--launcher) LAUNCH_OPTS+=("$1" "$2"); shift 2;;
      --) shift; break;;
      *) break;;
    esac
  done
  TRAIN_ARGS=("$@")
}

# training's --output-dir from TRAIN_ARGS (train.py's default: runs)
tsm_run_dir() {
  local i d=runs
  for ((i = 0; i < ${#TRAIN_ARGS[@]}; i++)); do
    case "${TRAIN_ARGS[i]}" in --output-dir) d=${TRAIN_ARGS[i+1]:-runs};; --output-dir=*) d=${TRAIN_ARGS[i]#*=};; esac
  done
  echo "$d"
}
