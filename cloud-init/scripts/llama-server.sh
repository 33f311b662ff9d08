#!/usr/bin/env bash
# The main node's service: wait for every worker, then serve the model through them with
# llama-server on this node's private address. Marks the node serving once /health answers.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting LLAMA_NODE_IP
require_setting MODEL_URLS
server_port="${SERVER_PORT:-8080}"
read -r -a urls <<<"$MODEL_URLS"
model="$(model_file "${urls[0]}")"
[[ -f "$model" ]] || fail "model file $model is missing; fetch-model.sh downloads it at first boot"

# No workers: the model fits on this node, which holds every layer itself (no RPC).
rpc_args=()
if [[ -n "${RPC_WORKERS:-}" ]]; then
  "$LLAMA_RPC_BIN_DIR/wait-workers.sh"
  rpc_args=(--rpc "$RPC_WORKERS")
fi

# Extra llama-server flags, word-split on purpose (for example "--parallel 2").
read -r -a extra_args <<<"${LLAMA_SERVER_ARGS:-}"
status phase=loading
# -ngl 99 offloads every layer to the RPC devices; without it a CPU-only main keeps them all.
# With no RPC devices it changes nothing.
run_until_ready llama-server load_seconds \
  curl --fail --silent --max-time 2 --output /dev/null "http://$LLAMA_NODE_IP:$server_port/health" -- \
  "$(llama_bin_dir)/llama-server" \
  --model "$model" \
  "${rpc_args[@]}" \
  --n-gpu-layers 99 \
  --host "$LLAMA_NODE_IP" \
  --port "$server_port" \
  --ctx-size "${CONTEXT_SIZE:-4096}" \
  --threads "$(node_threads)" \
  --metrics \
  "${extra_args[@]}"
