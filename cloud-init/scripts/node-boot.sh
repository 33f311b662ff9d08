#!/usr/bin/env bash
# A node's boot (llama-rpc-boot.service, as root, on every boot): missing packages, the llama.cpp
# build for the role and, on the main node, the model. A re-run keeps a finished build and
# verified model parts: it resumes a failed boot, and takes seconds after a good one.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting LLAMA_ROLE
# Status, model, caches: for the service user and root only.
mkdir -p "$LLAMA_DATA_DIR"
chmod 0750 "$LLAMA_DATA_DIR"
service_user=""
if [[ -n "${LLAMA_SERVICE_USER:-}" && $EUID -eq 0 ]]; then
  service_user="$LLAMA_SERVICE_USER"
  # First: the status file takes its directory's owner (llama-rpc-status).
  chown "$service_user:" "$LLAMA_DATA_DIR"
fi
llama_rpc_status get boot_started_at >/dev/null ||
  status "boot_started_at:=$(date +%s.%N)"
status "role=$LLAMA_ROLE" "node_ip=${LLAMA_NODE_IP:-}" "llama_cpp_commit=${LLAMA_CPP_COMMIT:-}" last_error:=null

if [[ -n "${LLAMA_PACKAGES:-}" ]]; then
  "$LLAMA_RPC_BIN_DIR/install-packages.sh"
fi
"$LLAMA_RPC_BIN_DIR/build-llama.sh"
if [[ "$LLAMA_ROLE" == main ]]; then
  "$LLAMA_RPC_BIN_DIR/fetch-model.sh"
fi
# The services run unprivileged and write the data directory (status, tensor cache).
if [[ -n "$service_user" ]]; then
  chown -R "$service_user:" "$LLAMA_DATA_DIR"
fi
status phase=booted
log "node ready to start its service"
