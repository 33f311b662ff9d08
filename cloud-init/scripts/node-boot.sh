#!/usr/bin/env bash
# First boot of a node (cloud-init runcmd): build llama.cpp for the role and, on the main node,
# download the model. The role's service starts afterwards and on every boot.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting LLAMA_ROLE
mkdir -p "$LLAMA_DATA_DIR"
python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-status" --file "$LLAMA_STATUS_FILE" get boot_started_at >/dev/null ||
  status "boot_started_at:=$(date +%s.%N)"
status "role=$LLAMA_ROLE" "node_ip=${LLAMA_NODE_IP:-}" "llama_cpp_commit=${LLAMA_CPP_COMMIT:-}" last_error:=null

"$LLAMA_RPC_BIN_DIR/build-llama.sh"
if [[ "$LLAMA_ROLE" == main ]]; then
  "$LLAMA_RPC_BIN_DIR/fetch-model.sh"
fi
# The services run unprivileged and write the data directory (status, tensor cache).
if [[ -n "${LLAMA_SERVICE_USER:-}" && $EUID -eq 0 ]]; then
  chown -R "$LLAMA_SERVICE_USER:" "$LLAMA_DATA_DIR"
fi
status phase=booted
log "node ready to start its service"
