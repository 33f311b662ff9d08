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

# microseconds_now: the wall clock in microseconds, for deadlines. ($SECONDS counts whole seconds
# from the shell's start, so a deadline built on it can come up to a second early.)
microseconds_now() {
  printf '%s' "${EPOCHREALTIME//[.,]/}"
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

# run_until_ready NAME SECONDS_KEY TIMEOUT_SETTING PROBE... -- COMMAND...: start COMMAND, mark
# the node serving once PROBE succeeds (recording the wait as SECONDS_KEY), and exit with
# COMMAND's status so the service manager restarts it on failure. COMMAND that is not ready
# within TIMEOUT_SETTING's seconds (a hung load) is stopped, and the node fails. A function
# on_ready, if the caller defines one, runs just before the node is marked serving; it
# reports, and its failure stops nothing.
run_until_ready() {
  local name="$1" seconds_key="$2" timeout_setting="$3"
  shift 3
  require_count "$timeout_setting"
  local timeout="${!timeout_setting}"
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
  local deadline=$(($(microseconds_now) + timeout * 1000000))
  until "${probe[@]}"; do
    if ! kill -0 "$child" 2>/dev/null; then
      local code=0
      wait "$child" || code=$?
      fail "$name exited with status $code before it was ready"
    fi
    if (($(microseconds_now) >= deadline)); then
      stop_child "$child"
      fail "$name did not finish loading within ${timeout}s ($timeout_setting) and was stopped; if it is only slow, raise $timeout_setting"
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

# stop_child PID: SIGTERM, then SIGKILL after 10 s.
stop_child() {
  local pid="$1" tries
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((tries = 0; tries < 20; tries++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# elapsed_since EPOCHREALTIME: seconds since then, with millisecond precision.
elapsed_since() {
  python3 -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 3))' "$1"
}

# model_name URL: a model part's file name: the URL's last path segment, without query or
# fragment (as infra/boot.py's model_file_name).
model_name() {
  local path="${1%%[?#]*}"
  printf '%s' "${path##*/}"
}

# model_file URL: where a model part is saved.
model_file() {
  printf '%s/%s' "${MODEL_DIR:-$LLAMA_DATA_DIR/models}" "$(model_name "$1")"
}

# json_words WORD...: the words as a JSON list, for list-valued status fields.
json_words() {
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
}

# node_threads: threads for llama.cpp, every core unless LLAMA_THREADS says otherwise.
node_threads() {
  printf '%s' "${LLAMA_THREADS:-$(cpu_count)}"
}

