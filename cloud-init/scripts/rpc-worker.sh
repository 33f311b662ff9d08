#!/usr/bin/env bash
# A worker node's service: ggml-rpc-server on this node's private address with every core. Marks
# the node serving once the port answers. Its tensor cache (--cache) only with worker-local
# loading, where it holds the slice this node fetched: as a cache of what the main node sends,
# writing each tensor to the disk made a first load 1.83 times slower here
# (bench/results/load.json).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=SCRIPTDIR/supervise.sh
source "$LLAMA_RPC_BIN_DIR/supervise.sh"

require_setting LLAMA_NODE_IP
case "$LLAMA_NODE_IP" in
  0.0.0.0 | :: | "*") fail "LLAMA_NODE_IP must be the node's private address; the RPC port has no authentication and must never listen on every interface" ;;
esac

# ggml-rpc-server listens within seconds; one that does not is stopped and started again.
START_TIMEOUT_SECONDS="${START_TIMEOUT_SECONDS:-300}"

# Worker-local loading: this node's slice (fetch-slice.sh) is the server's tensor cache, which
# root keeps and the server only reads; the main node sends each weight's key, not its bytes.
cache_args=()
if [[ -n "${SLICE_MANIFEST:-}" ]]; then
  export LLAMA_CACHE="$LLAMA_DATA_DIR/slice"
  cache_args=(--cache)
fi

status phase=starting
run_until_ready ggml-rpc-server start_seconds START_TIMEOUT_SECONDS port_answers "$LLAMA_NODE_IP" "$RPC_PORT" -- \
  "$(llama_bin_dir)/ggml-rpc-server" \
  --host "$LLAMA_NODE_IP" \
  --port "$RPC_PORT" \
  --threads "$(node_threads)" "${cache_args[@]}"
