# shellcheck shell=bash
# Process supervision for the services (llama-server.sh, rpc-worker.sh). Sourced after lib.sh,
# never run.

# run_until_ready NAME SECONDS_KEY TIMEOUT_SETTING PROBE... -- COMMAND...: start COMMAND, mark
# the node serving once PROBE succeeds (recording the wait as SECONDS_KEY), and exit with
# COMMAND's status so the service manager restarts it on failure. COMMAND that is not ready
# within TIMEOUT_SETTING's seconds (a hung load) is stopped, and the node fails. A function
# on_ready, if the caller defines one, runs just before the node is marked serving, and
# while_loading every 10 s until then; they report, and their failure stops nothing.
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
  # Stopped: systemd signals every process of the unit, and llama-server, answering a request,
  # waits for it at the first SIGTERM and exits at the second, which stop_child sends. The log
  # filter reading this output may be gone first: a write then fails, and must not end the
  # script (SIGPIPE, which the child, started already, still takes as before).
  trap '' PIPE
  trap 'stop_child "$child"; exit 143' TERM INT
  local started=$EPOCHREALTIME
  local deadline polls=0
  deadline="$(deadline_in "$timeout")"
  until "${probe[@]}"; do
    if ! kill -0 "$child" 2>/dev/null; then
      local code=0
      wait "$child" || code=$?
      fail "$name exited with status $code before it was ready"
    fi
    if (($(seconds_left "$deadline") <= 0)); then
      stop_child "$child"
      fail "$name did not finish loading within ${timeout}s ($timeout_setting) and was stopped; if it is only slow, raise $timeout_setting"
    fi
    # Often for the first second, so that a quick start (ggml-rpc-server listens within
    # milliseconds) is timed as it happens; then every half second through a long load.
    if ((++polls <= 10)); then sleep 0.1; else sleep 0.5; fi
    if ((polls % 20 == 0)) && declare -F while_loading >/dev/null; then
      while_loading || true
    fi
  done
  if declare -F on_ready >/dev/null; then
    on_ready || log "warning: $name is ready, but on_ready failed"
  fi
  status phase=serving "$seconds_key:=$(llama_rpc_status elapsed "$started")" last_error:=null
  log "$name is ready"
  local code=0
  wait "$child" || code=$?
  log "$name exited with status $code"
  status phase=stopped "last_error=$name exited with status $code"
  exit "$code"
}

# stop_child PID: SIGTERM, again 0.2 s later, then SIGKILL after STOP_GRACE_SECONDS (10). systemd
# signals every process of the unit, and goes on signalling those that appear while it does: the
# child may get its SIGTERM at the same moment as this one (two that arrive together are one, and
# llama-server exits only at its second), and a sleep here may be signalled too, which must not
# end this before the SIGKILL.
stop_child() {
  local pid="$1" tries
  for ((tries = 0; tries < ${STOP_GRACE_SECONDS:-10} * 10; tries++)); do
    kill -0 "$pid" 2>/dev/null || break
    if ((tries == 0 || tries == 2)); then
      kill -TERM "$pid" 2>/dev/null || true
    fi
    sleep 0.1 || true
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
