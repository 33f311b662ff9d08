#!/usr/bin/env bash
# Wait, with a bounded back-off, until every worker's RPC port answers. Records which workers
# answered; gives up with an error after WORKER_WAIT_SECONDS.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting RPC_WORKERS
IFS=',' read -r -a workers <<<"$RPC_WORKERS"
deadline_seconds="${WORKER_WAIT_SECONDS:-900}"
status phase=waiting-for-workers

started=$EPOCHREALTIME
deadline=$(($(microseconds_now) + deadline_seconds * 1000000))
delay=1
while true; do
  answered=()
  missing=()
  for worker in "${workers[@]}"; do
    if port_answers "${worker%:*}" "${worker##*:}"; then
      answered+=("$worker")
    else
      missing+=("$worker")
    fi
  done
  status "workers_answered:=$(json_words "${answered[@]}")" "workers_missing:=$(json_words "${missing[@]}")"
  if [[ ${#missing[@]} -eq 0 ]]; then
    status "wait_seconds:=$(elapsed_since "$started")"
    log "all ${#workers[@]} workers answer"
    exit 0
  fi
  left=$(((deadline - $(microseconds_now) + 999999) / 1000000))
  if ((left <= 0)); then
    fail "workers did not answer within ${deadline_seconds}s: ${missing[*]} (check that they booted and that the RPC port is open from this node)"
  fi
  log "waiting for ${missing[*]} (next try in ${delay}s)"
  sleep "$((delay < left ? delay : left))"
  delay=$((delay * 2 > 15 ? 15 : delay * 2))
done
