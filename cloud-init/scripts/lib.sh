# shellcheck shell=bash
# Shared helpers for the node boot scripts. Sourced, never run: each script sets its own strict
# mode before it sources this, so a missing lib.sh stops it at once.
#
# Every setting comes from the node's environment file (written by cloud-init on a VM, by the
# local cluster on this machine), so the scripts run unchanged in both places.

LLAMA_RPC_ENV_FILE="${LLAMA_RPC_ENV_FILE:-/etc/llama-rpc/node.env}"
if [[ -r "$LLAMA_RPC_ENV_FILE" ]]; then
  # Exported, as systemd's EnvironmentFile= does: llama.cpp reads its switches from there.
  set -a
  # shellcheck source=/dev/null
  source "$LLAMA_RPC_ENV_FILE"
  set +a
fi

LLAMA_RPC_BIN_DIR="${LLAMA_RPC_BIN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
LLAMA_DATA_DIR="${LLAMA_DATA_DIR:-/var/lib/llama-rpc}"
LLAMA_STATUS_FILE="${LLAMA_STATUS_FILE:-$LLAMA_DATA_DIR/status.json}"
# What the services write for themselves (the load log): theirs, and nothing root writes or reads.
LLAMA_STATE_DIR="${LLAMA_STATE_DIR:-$LLAMA_DATA_DIR/service}"
METADATA_RULESET="${METADATA_RULESET:-/etc/llama-rpc/metadata.nft}"
LLAMA_PREFIX="${LLAMA_PREFIX:-/opt/llama.cpp}"
RPC_PORT="${RPC_PORT:-50052}"

# Builtins only: a service's stop signal that arrives while bash reads a command substitution
# runs its trap from inside bash's parser, which then fails on the command's next substitution
# (bash 5.2: "trap: unexpected EOF while looking for matching `)'", exit 2) instead of stopping.
log() {
  TZ=UTC printf '%(%FT%TZ)T %s: %s\n' -1 "${0##*/}" "$*" >&2
}

# llama_rpc_status COMMAND ...: the status tool, on this node's status file; it also does the
# arithmetic and JSON that status fields need (elapsed SINCE, json-list WORD...).
llama_rpc_status() {
  python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-status" --file "$LLAMA_STATUS_FILE" "$@"
}

# status KEY=VALUE ... : merge string fields into the node's status file.
# status KEY:=JSON ...  : merge JSON fields (numbers, lists, null).
status() {
  llama_rpc_status set "$@"
}

# The exit status of a failure that a retry cannot mend (EX_CONFIG): the boot unit does not
# restart on it (RestartPreventExitStatus=78).
EXIT_FINAL=78

# fail MESSAGE: record the error and the failed phase, then exit 1 (worth retrying).
fail() { fail_with 1 "$*"; }
# fail_final MESSAGE: the same, exit 78.
fail_final() { fail_with "$EXIT_FINAL" "$*"; }

fail_with() {
  local code="$1"
  shift
  log "error: $*"
  status phase=failed "last_error=$*" || true
  # shellcheck disable=SC2034  # read by the callers' EXIT traps (fetch-model.sh)
  FAILURE_RECORDED=1
  exit "$code"
}

# require_setting NAME: stop with a clear error when a setting is empty.
require_setting() {
  local name="$1"
  [[ -n "${!name:-}" ]] || fail_final "setting $name is empty; set it in $LLAMA_RPC_ENV_FILE"
}

# require_count NAME: stop when a setting is not a whole number.
require_count() {
  [[ "${!1:-}" =~ ^[0-9]+$ ]] ||
    fail_final "setting $1='${!1:-}' is not a whole number; set it in $LLAMA_RPC_ENV_FILE"
}

# backoff_seconds BASE ATTEMPT: the wait after failed attempt 1, 2, ...: BASE, doubling, <= 300.
backoff_seconds() {
  local base="$1" attempt="$2" delay
  delay=$((base << (attempt > 9 ? 9 : attempt - 1)))
  printf '%s' $((delay > 300 ? 300 : delay))
}

# deadline_in SECONDS: the wall clock SECONDS from now, in microseconds, for seconds_left.
# ($SECONDS counts whole seconds from the shell's start: a deadline built on it can come up to a
# second early.)
deadline_in() {
  printf '%s' $((${EPOCHREALTIME//[.,]/} + $1 * 1000000))
}

# seconds_left DEADLINE: whole seconds until DEADLINE, rounded up: 0 or less only once it is due.
seconds_left() {
  printf '%s' $((($1 - ${EPOCHREALTIME//[.,]/} + 999999) / 1000000))
}

# The pinned build lives under its commit, so nodes never mix builds (the RPC protocol
# requires the main node and every worker to run the same build).
llama_bin_dir() {
  printf '%s/%s/bin' "$LLAMA_PREFIX" "$LLAMA_CPP_COMMIT"
}

# port_answers HOST PORT: true when a TCP connection to HOST:PORT succeeds within 2 s.
port_answers() {
  # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# model_name URL: a model part's file name: the URL's last path segment, without query or
# fragment (as infra/models/parts.py's saved_name).
model_name() {
  local path="${1%%[?#]*}"
  printf '%s' "${path##*/}"
}

# model_file URL: where a model part is saved.
model_file() {
  printf '%s/%s' "${MODEL_DIR:-$LLAMA_DATA_DIR/models}" "$(model_name "$1")"
}

# node_threads: threads for llama.cpp, every core unless LLAMA_THREADS says otherwise.
node_threads() {
  printf '%s' "${LLAMA_THREADS:-$(nproc)}"
}

