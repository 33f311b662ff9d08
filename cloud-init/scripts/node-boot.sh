#!/usr/bin/env bash
# A node's boot (llama-rpc-boot.service, as root, on every boot): missing packages, then the
# llama.cpp build for the role and, on the main node, the model, both at once. A re-run keeps a
# finished build and verified model parts: it resumes a failed boot, and takes seconds after a
# good one.
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
# The main node downloads the model while llama.cpp builds: neither needs the other, and for a
# large model the download is the longer. Each records its own failure in the status file; a
# download keeps its finished parts when the build fails, for the retry.
fetch=""
if [[ "$LLAMA_ROLE" == main ]]; then
  "$LLAMA_RPC_BIN_DIR/fetch-model.sh" &
  fetch=$!
fi
build_code=0
"$LLAMA_RPC_BIN_DIR/build-llama.sh" || build_code=$?
fetch_code=0
[[ -z "$fetch" ]] || wait "$fetch" || fetch_code=$?
# The one still running when the other failed may have written its own phase since.
if [[ $build_code -ne 0 || $fetch_code -ne 0 ]]; then
  status phase=failed
fi
# A failure no retry can mend wins over one that a retry may.
for code in "$build_code" "$fetch_code"; do
  [[ $code -ne $EXIT_FINAL ]] || exit "$EXIT_FINAL"
done
[[ $build_code -eq 0 ]] || exit "$build_code"
[[ $fetch_code -eq 0 ]] || exit "$fetch_code"
# The services run unprivileged and write the data directory (status, tensor cache).
if [[ -n "$service_user" ]]; then
  chown -R "$service_user:" "$LLAMA_DATA_DIR"
fi
status phase=booted
log "node ready to start its service"
