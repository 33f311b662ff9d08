#!/usr/bin/env bash
# The main node's service: wait for every worker, then serve the model with llama-server on this
# node's private address (or on SERVER_LISTEN: 0.0.0.0 behind a balancer that delivers packets
# addressed to its own IP), its layers placed as planned, with Prometheus metrics on /metrics.
# Marks the node serving once /health answers on the node's address, with the placement
# llama-server reports in the status file.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=SCRIPTDIR/supervise.sh
source "$LLAMA_RPC_BIN_DIR/supervise.sh"

require_setting LLAMA_NODE_IP
require_setting MODEL_URLS
server_port="${SERVER_PORT:-8080}"
# How long the model may take to load before the node gives up on this start (and systemd tries
# again, later): a hung load must not leave the node "loading" for ever.
LOAD_TIMEOUT_SECONDS="${LOAD_TIMEOUT_SECONDS:-3600}"
context="${CONTEXT_SIZE:-4096}"
slots="${SLOTS:-1}"
read -r -a urls <<<"$MODEL_URLS"
model="$(model_file "${urls[0]}")"
[[ -f "$model" ]] || fail "model file $model is missing; fetch-model.sh downloads it at first boot"

# No workers: the model fits on this node, which holds every layer itself (no RPC).
rpc_args=()
if [[ -n "${RPC_WORKERS:-}" ]]; then
  require_setting LLAMA_GPU_LAYERS
  require_setting LLAMA_TENSOR_SPLIT
  "$LLAMA_RPC_BIN_DIR/wait-workers.sh"
  # The planned placement (infra/core/placement.py): the first n_layer + 1 - LLAMA_GPU_LAYERS layers
  # stay on this node's CPU, the rest go to the workers in LLAMA_TENSOR_SPLIT's counts.
  rpc_args=(--rpc "$RPC_WORKERS" --n-gpu-layers "$LLAMA_GPU_LAYERS" --tensor-split "$LLAMA_TENSOR_SPLIT")
fi
# Worker-local loading: the workers hold their own slices; this node's copy holds its own
# (fetch-slice.sh), the rest are holes, which the keys keep llama-server from reading, and the
# load touches pages as it goes instead of reading the whole file ahead (patches 0003, 0006, 0007).
if [[ -n "${SLICE_MANIFEST:-}" ]]; then
  export GGML_RPC_WEIGHT_KEYS="$LLAMA_DATA_DIR/slice/keys" LLAMA_WEIGHTS_ELSEWHERE="$LLAMA_DATA_DIR/slice/elsewhere"
  export LLAMA_MMAP_POPULATE=never
fi

# A draft model (DRAFT_MODEL_URLS): speculative decoding, the draft on this node's CPU alone
# (with --rpc the draft would follow the workers, a network hop per drafted token). llama-server
# ignores a draft without a --spec-type. p-min: the draft stops where it is unsure (at 0, which
# the pinned llama.cpp defaults to, its acceptance collapses: ggml-org/llama.cpp#25908).
draft_args=()
if [[ -n "${DRAFT_MODEL_URLS:-}" ]]; then
  read -r -a draft_urls <<<"$DRAFT_MODEL_URLS"
  draft="$(model_file "${draft_urls[0]}")"
  [[ -f "$draft" ]] || fail "draft model file $draft is missing; fetch-model.sh downloads it at first boot"
  for setting in DRAFT_MAX DRAFT_MIN; do require_count "$setting"; done
  require_setting DRAFT_P_MIN
  draft_args=(--spec-draft-model "$draft" --spec-type draft-simple --spec-draft-device none
    --spec-draft-n-max "$DRAFT_MAX" --spec-draft-n-min "$DRAFT_MIN" --spec-draft-p-min "$DRAFT_P_MIN")
fi

# llama-server logs where each layer went at debug level: llama-server-log keeps those lines in
# the load log and out of the journal, and reads the placement from it once the server is ready.
server_log=("$LLAMA_RPC_BIN_DIR/llama-server-log")
mkdir -p "$LLAMA_STATE_DIR" # node-boot.sh makes it on a node
load_log="$LLAMA_STATE_DIR/llama-server-load.log"
on_ready() {
  local placed
  if ! placed="$(python3 "${server_log[@]}" placement "$load_log" "${RPC_WORKERS:-}" --wait 30)"; then
    status placement:=null
    return 1
  fi
  status "placement:=$placed"
}

# The weights sent to the workers so far, against the planned bytes (`lrc wait` shows it).
while_loading() {
  [[ -n "${RPC_WORKERS:-}" && "${RPC_LOAD_BYTES:-0}" -gt 0 ]] || return 0
  ss -tinH state established | llama_rpc_status load-progress "$RPC_WORKERS" "$RPC_LOAD_BYTES"
}

# Extra llama-server flags (serverArgs, checked against an allow-list before anything is
# created), word-split on purpose (for example "--temp 0.7"), and the id clients send as "model".
read -r -a extra_args <<<"${LLAMA_SERVER_ARGS:-}"
[[ -z "${MODEL_ALIAS:-}" ]] || extra_args+=(--alias "$MODEL_ALIAS")
# The API key (apiKey), when the stack has one: the credential systemd hands this service, read
# by llama-server from its file (never the environment or the command line). Missing, the
# server does not start: an API meant to be keyed is never served open.
if [[ -n "${API_KEY_FILE:-}" ]]; then
  credential="${CREDENTIALS_DIRECTORY:-/nonexistent}/$(basename "$API_KEY_FILE")"
  [[ -r "$credential" ]] || fail "the API key credential $(basename "$API_KEY_FILE") is missing; root puts it in $API_KEY_FILE at boot"
  extra_args+=(--api-key-file "$credential")
fi
# llama-server applies ${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini before its arguments
# (common/arg.cpp, common_params_apply_system_config): a home this user can write (a pod's data
# volume) must not add options. Pointed where no service user can create a file.
export XDG_CONFIG_HOME=/nonexistent/llama-rpc
status phase=loading load_sent_bytes:=null
# --parallel with --ctx-size context x slots gives each request slot CONTEXT_SIZE tokens of its
# own. --fit off: the placement and the context are planned, llama.cpp must not change them.
run_until_ready llama-server load_seconds LOAD_TIMEOUT_SECONDS \
  curl --fail --silent --max-time 2 --output /dev/null "http://$LLAMA_NODE_IP:$server_port/health" -- \
  "$(llama_bin_dir)/llama-server" \
  --model "$model" \
  "${rpc_args[@]}" \
  "${draft_args[@]}" \
  --fit off \
  --host "${SERVER_LISTEN:-$LLAMA_NODE_IP}" \
  --port "$server_port" \
  --ctx-size "$((context * slots))" \
  --parallel "$slots" \
  --threads "$(node_threads)" \
  --metrics \
  --log-verbosity 5 \
  --log-prefix \
  "${extra_args[@]}" \
  > >(python3 "${server_log[@]}" filter "$load_log") 2>&1
