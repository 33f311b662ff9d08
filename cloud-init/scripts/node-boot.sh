#!/usr/bin/env bash
# A node's boot (llama-rpc-boot.service, as root, on every boot): missing packages, then the
# llama.cpp build for the role and, on the main node, the model, both at once. A re-run keeps a
# finished build and verified model parts: it resumes a failed boot, and takes seconds after a
# good one.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting LLAMA_ROLE
# Status and model, for root and the service user only. As root: the data directory is root's,
# readable by the service user's group and set-group-ID, so what root makes there (the status
# file, the models) is that group's to read, and the status file its to update; the service
# user can create, rename or link nothing where root writes. The services write their own
# files in LLAMA_STATE_DIR, which root leaves alone.
if [[ -L "$LLAMA_DATA_DIR" ]]; then
  echo "$LLAMA_DATA_DIR is a symbolic link; refusing to boot through it" >&2
  exit "$EXIT_FINAL"
fi
mkdir -p "$LLAMA_DATA_DIR"
if [[ -n "${LLAMA_SERVICE_USER:-}" && $EUID -eq 0 ]]; then
  chown "root:$LLAMA_SERVICE_USER" "$LLAMA_DATA_DIR"
  chmod 2750 "$LLAMA_DATA_DIR"
  install -d -o "$LLAMA_SERVICE_USER" -g "$LLAMA_SERVICE_USER" -m 0750 "$LLAMA_STATE_DIR"
  # Only root asks the cloud's metadata service (the node's credentials).
  nft -f "$METADATA_RULESET" || fail "could not apply $METADATA_RULESET (nft)"
else
  chmod 0750 "$LLAMA_DATA_DIR"
  mkdir -p "$LLAMA_STATE_DIR"
fi
llama_rpc_status get boot_started_at >/dev/null ||
  status "boot_started_at:=$(date +%s.%N)"
status "role=$LLAMA_ROLE" "node_ip=${LLAMA_NODE_IP:-}" "llama_cpp_commit=${LLAMA_CPP_COMMIT:-}" last_error:=null

# Boot files the user data could not hold (AWS), read once with the node's own role.
if [[ -n "${LLAMA_RPC_FILES_SOURCE:-}" && ! -f "$LLAMA_RPC_BIN_DIR/../.files-${LLAMA_RPC_FILES:-}" ]]; then
  code=0
  reason="$(python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-secret" files 2>&1)" || code=$?
  [[ $code -ne $EXIT_FINAL ]] || fail_final "$reason"
  [[ $code -eq 0 ]] || fail "${reason:-could not read the boot files from $LLAMA_RPC_FILES_SOURCE}"
fi
if [[ -n "${LLAMA_PACKAGES:-}" ]]; then
  "$LLAMA_RPC_BIN_DIR/install-packages.sh"
fi
# The main node downloads the model while llama.cpp builds: neither needs the other, and for a
# large model the download is the longer. Each records its own failure in the status file; a
# download keeps its finished parts when the build fails, for the retry.
fetch=""
if [[ -n "${SLICE_MANIFEST:-}" ]]; then
  # Worker-local loading: each node fetches its own slice of the model, the main node its
  # layers and the header (the workers' ranges stay holes), a worker its layers into its RPC
  # server's cache; what is in place from an earlier boot is kept.
  "$LLAMA_RPC_BIN_DIR/fetch-slice.sh" &
  fetch=$!
elif [[ "$LLAMA_ROLE" == main ]]; then
  # A model disk of its own (model-disk.sh) is mounted first; the build need not wait for it.
  if [[ -n "${MODEL_DISK_GB:-}" ]]; then
    { "$LLAMA_RPC_BIN_DIR/model-disk.sh" && "$LLAMA_RPC_BIN_DIR/fetch-model.sh"; } &
  else
    "$LLAMA_RPC_BIN_DIR/fetch-model.sh" &
  fi
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
# The API key, when the stack has one: read with the node's own identity at every boot into
# root's credential store in /run (memory, never the disk), for llama-server's unit alone.
if [[ -n "${API_KEY_SOURCE:-}" ]]; then
  if ! reason="$(python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-secret" 2>&1)"; then
    fail "${reason:-could not read the API key from $API_KEY_SOURCE}"
  fi
fi
status phase=booted
log "node ready to start its service"
