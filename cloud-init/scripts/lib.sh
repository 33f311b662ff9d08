# shellcheck shell=bash
# Shared helpers for the node boot scripts. Sourced, never run.
#
# Every setting comes from the node's environment file (written by cloud-init on a VM, by the
# local cluster on this machine), so the scripts run unchanged in both places.

set -euo pipefail

LLAMA_RPC_ENV_FILE="${LLAMA_RPC_ENV_FILE:-/etc/llama-rpc/node.env}"
if [[ -r "$LLAMA_RPC_ENV_FILE" ]]; then
  # shellcheck source=/dev/null
  source "$LLAMA_RPC_ENV_FILE"
fi

LLAMA_RPC_BIN_DIR="${LLAMA_RPC_BIN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
LLAMA_DATA_DIR="${LLAMA_DATA_DIR:-/var/lib/llama-rpc}"
LLAMA_STATUS_FILE="${LLAMA_STATUS_FILE:-$LLAMA_DATA_DIR/status.json}"
LLAMA_PREFIX="${LLAMA_PREFIX:-/opt/llama.cpp}"
RPC_PORT="${RPC_PORT:-50052}"

log() {
  printf '%s %s: %s\n' "$(date -u +%FT%TZ)" "$(basename "$0")" "$*" >&2
}

# status KEY=VALUE ... : merge string fields into the node's status file.
# status KEY:=JSON ...  : merge JSON fields (numbers, lists, null).
status() {
  python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-status" --file "$LLAMA_STATUS_FILE" set "$@"
}

# fail MESSAGE: record the error and the failed phase, then exit non-zero.
fail() {
  log "error: $*"
  status phase=failed "last_error=$*" || true
  exit 1
}

# require_setting NAME: stop with a clear error when a setting is empty.
require_setting() {
  local name="$1"
  [[ -n "${!name:-}" ]] || fail "setting $name is empty; set it in $LLAMA_RPC_ENV_FILE"
}

cpu_count() {
  nproc
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

# run_until_ready NAME SECONDS_KEY PROBE... -- COMMAND...: start COMMAND, mark the node serving
# once PROBE succeeds (recording the wait as SECONDS_KEY), and exit with COMMAND's status so the
# service manager restarts it on failure. A function on_ready, if the caller defines one, runs
# just before the node is marked serving; it reports, and its failure stops nothing.
run_until_ready() {
  local name="$1" seconds_key="$2"
  shift 2
  local -a probe=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    probe+=("$1")
    shift
  done
  shift
  "$@" &
  local child=$!
  trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM INT
  local started=$EPOCHREALTIME
  until "${probe[@]}"; do
    if ! kill -0 "$child" 2>/dev/null; then
      local code=0
      wait "$child" || code=$?
      fail "$name exited with status $code before it was ready"
    fi
    sleep 0.5
  done
  if declare -F on_ready >/dev/null; then
    on_ready || log "warning: $name is ready, but on_ready failed"
  fi
  status phase=serving "$seconds_key:=$(elapsed_since "$started")" last_error:=null
  log "$name is ready"
  local code=0
  wait "$child" || code=$?
  log "$name exited with status $code"
  status phase=stopped "last_error=$name exited with status $code"
  exit "$code"
}

# elapsed_since EPOCHREALTIME: seconds since then, with millisecond precision.
elapsed_since() {
  python3 -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 3))' "$1"
}

# model_file URL: the local file name of a model part (the URL's last path segment).
model_file() {
  local path="${1%%[?#]*}"
  printf '%s/%s' "${MODEL_DIR:-$LLAMA_DATA_DIR/models}" "${path##*/}"
}

# json_words WORD...: the words as a JSON list, for list-valued status fields.
json_words() {
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
}

# node_threads: threads for llama.cpp, every core unless LLAMA_THREADS says otherwise.
node_threads() {
  printf '%s' "${LLAMA_THREADS:-$(cpu_count)}"
}

