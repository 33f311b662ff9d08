#!/usr/bin/env bash
# Wait, with a bounded back-off, until every worker's RPC port answers. Records which workers
# answered; gives up with an error after WORKER_WAIT_SECONDS.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting RPC_WORKERS
IFS=',' read -r -a workers <<<"$RPC_WORKERS"
WORKER_WAIT_SECONDS="${WORKER_WAIT_SECONDS:-900}"
require_count WORKER_WAIT_SECONDS
status phase=waiting-for-workers

started=$EPOCHREALTIME
deadline="$(deadline_in "$WORKER_WAIT_SECONDS")"
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
  status "workers_answered:=$(llama_rpc_status json-list "${answered[@]}")" \
    "workers_missing:=$(llama_rpc_status json-list "${missing[@]}")"
  if [[ ${#missing[@]} -eq 0 ]]; then
    status "wait_seconds:=$(llama_rpc_status elapsed "$started")"
    log "all ${#workers[@]} workers answer"
    exit 0
  fi
  left="$(seconds_left "$deadline")"
  if ((left <= 0)); then
    fail "workers did not answer within ${WORKER_WAIT_SECONDS}s: ${missing[*]} (check that they booted and that the RPC port is open from this node)"
  fi
  log "waiting for ${missing[*]} (next try in ${delay}s)"
  sleep "$((delay < left ? delay : left))"
  delay=$((delay * 2 > 15 ? 15 : delay * 2))
done
