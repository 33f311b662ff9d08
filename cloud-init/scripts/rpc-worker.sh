#!/usr/bin/env bash
# A worker node's service: ggml-rpc-server on this node's private address with every core. Marks
# the node serving once the port answers. No tensor cache (--cache): writing each tensor to the
# disk made a first load 1.83 times slower here (bench/results/load.json), and reading it back
# from a cloud disk (125 MiB/s by default) is slower than the main node sending it again.
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

status phase=starting
run_until_ready ggml-rpc-server start_seconds START_TIMEOUT_SECONDS port_answers "$LLAMA_NODE_IP" "$RPC_PORT" -- \
  "$(llama_bin_dir)/ggml-rpc-server" \
  --host "$LLAMA_NODE_IP" \
  --port "$RPC_PORT" \
  --threads "$(node_threads)"
