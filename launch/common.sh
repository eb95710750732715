# The preamble of the launch scripts (sourced, not run): venv, DeepSpeed's op cache, ranks and
# threads per node, the hostfile, a free port, the environment every rank gets, the ssh probe.
# What Python already knows (threads per rank, the free port, the hostfile and the ssh advice,
# the CUDA check, the default recipe, exit statuses, the launcher options) is asked from
# tsm_ds.cli.launch_helper (torch-free, a fraction of a second); this file keeps what must be
# shell: exports, the env files, traps and the command lines.
#
#   TSM_DS_ROOT   the repository (this file's parent folder); every host needs it at the same path
#   TSM_DS_VENV   the venv (default $TSM_DS_ROOT/.venv), same path on every host
# Settable by the user (see docs/cluster.md): NPROC, MASTER_ADDR, MASTER_PORT, SSH_PORT,
# TSM_DS_ENV_FILE (NAME=VALUE lines for every rank), TSM_DS_FORWARD_ENV ("VAR1 VAR2": more
# variables to forward), NO_SSH_CHECK=1, TSM_DS_DIST_TIMEOUT.

TSM_DS_ROOT=${TSM_DS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TSM_DS_VENV=${TSM_DS_VENV:-$TSM_DS_ROOT/.venv}

tsm_die() { echo "launch: $*" >&2; exit 2; }
tsm_log() { echo "launch: $*" >&2; }

# a script's usage: its comment block after the shebang (up to the first #SBATCH or code line)
tsm_usage() { awk 'NR == 1 && /^#!/ { next } /^#SBATCH/ || !/^#/ { exit } { sub(/^# ?/, ""); print }' "$1"; }

# -h / --help among the arguments before '--' (after it they are train.py's)
tsm_help_requested() {
  local a
  for a in "$@"; do case "$a" in --) return 1;; -h|--help) return 0;; esac; done
  return 1
}

# python -m tsm_ds.cli.launch_helper QUERY ARGS: this checkout's helper with the venv's python
# (no torch import); a failed query has printed "launch: ..." and returns 2
tsm_helper() {
  [ -x "$TSM_DS_VENV/bin/python" ] || tsm_die "no venv at $TSM_DS_VENV: run 'bash launch/setup.sh' first (on every host, or on a shared filesystem), or set TSM_DS_VENV"
  PYTHONPATH="$TSM_DS_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$TSM_DS_VENV/bin/python" -m tsm_ds.cli.launch_helper "$@"
}

# venv on PATH (its ninja: DeepSpeed's op cache is not rebuilt), the op cache on this node's disk;
# TSM_NODE_ACCELERATOR: this node's accelerator (the helper's torch-free check), for this script
# only. DS_ACCELERATOR is NOT set: each rank decides on its own node (tsm_ds.engine.comm.dist), so a
# login node without GPUs cannot send "cpu" to GPU nodes; a DS_ACCELERATOR you export is forwarded
tsm_setup_env() {
  [ -x "$TSM_DS_VENV/bin/python" ] || tsm_die "no venv at $TSM_DS_VENV: run 'bash launch/setup.sh' first (on every host, or on a shared filesystem)"
  export PATH="$TSM_DS_VENV/bin:$PATH"
  # DeepSpeed's op cache on each node's own disk (built once per node; no build lock on a shared filesystem)
  if [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then TORCH_EXTENSIONS_DIR=$(tsm_helper ops-cache) || exit $?; fi
  export TORCH_EXTENSIONS_DIR
  TSM_NODE_ACCELERATOR=$(tsm_helper accelerator) || exit $?
}

# build DeepSpeed's CPU comm op once on this node, in one process (20 s to 2 min the first time);
# the ranks then load it from the cache (they also take a lock around it: tsm_ds.engine.comm.dist)
tsm_prebuild_op() {
  [ "${TSM_NODE_ACCELERATOR:-${DS_ACCELERATOR:-}}" = cpu ] || return 0
  [ -e "$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/deepspeed_shm_comm.so" ] && return 0   # built (the ranks check again)
  "$TSM_DS_VENV/bin/python" -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 \
    || tsm_log "warning: prebuilding DeepSpeed's CPU comm op failed; the ranks will try again"
}

# ranks on this node: NPROC, else $1 (default 1) CPU ranks, else the allocation's / visible GPUs
tsm_ranks_per_node() { tsm_helper ranks-per-node "${1:-1}"; }

# OMP_NUM_THREADS = cores of this node (of the allocation under SLURM) / ranks on it, unless set
tsm_set_threads() {
  local ranks=$1 out
  out=$(tsm_helper threads "$ranks") || exit $?
  set -- $out   # threads cores
  [ -n "${OMP_NUM_THREADS:-}" ] || export OMP_NUM_THREADS=$1
  tsm_log "$ranks rank(s) on $(hostname), $2 cores: OMP_NUM_THREADS=$OMP_NUM_THREADS"
}

# host names of a DeepSpeed hostfile, in order (a malformed or missing file stops with file:line)
tsm_hostfile_hosts() { tsm_helper hosts "$1"; }

# every host of the hostfile answers ssh without a prompt; otherwise stop with ssh's own words and
# the fix per host (DeepSpeed's launcher says only "host=X was not reachable via ssh", first host only)
tsm_check_ssh() { tsm_helper check-ssh "$1" "${SSH_PORT:-}" || exit $?; }

# a free TCP port: from SLURM_JOB_ID under SLURM (every node computes the same one), else one
# free here and, with a host given, checked free on that host (where rank 0 listens)
tsm_free_port() {
  if [ -n "${1:-}" ]; then tsm_helper port "$1" "${SSH_PORT:-}"; else tsm_helper port; fi
}

# the recipe without CONFIG / --deepspeed_config: training's own default for this accelerator
tsm_default_recipe() { tsm_helper default-recipe; }

# an exit status by name (preempted -> 75), and one line on what a status means
tsm_exit_code() { tsm_helper exit-code "$1"; }
tsm_explain_exit() { tsm_log "exit status $1: $(tsm_helper explain-exit "$1" 2>&1)"; }

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

# the script's arguments: its launcher options, then '--', then train.py's flags; an option the
# script does not accept stops here naming those it accepts. $1: single, multi or slurm.
# Sets HOSTFILE / SSH_PORT / MASTER_ADDR / MASTER_PORT / NPROC when given, LAUNCH_OPTS (array, for
# deepspeed) and TRAIN_ARGS (array, for train.py).
tsm_parse_args() {
  local kind=$1 out
  shift
  LAUNCH_OPTS=(); TRAIN_ARGS=()
  out=$(tsm_helper launch-args "$kind" "$@") || exit $?
  eval "$out"   # NAME='value' lines and two arrays, quoted by the helper (shlex.quote)
}

# training's --output-dir for TRAIN_ARGS (train.py's default: runs); bad training flags stop here
tsm_run_dir() { tsm_helper output-dir "${TRAIN_ARGS[@]}"; }
