#!/usr/bin/env bash
# Worker-local loading, at boot: this node's own slice of the staged model (llama-rpc-slice),
# every tensor checked against the slice manifest's sha256. A main node: the header and its own
# layers into a sparse copy of each part, and the workers' keys for llama-server; a worker: its
# layers (and the output head, on the last) into its RPC server's cache. Root writes both, in
# directories the service user can read but not change.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting SLICE_MANIFEST
require_count SLICE_LAYERS
slice_dir="$LLAMA_DATA_DIR/slice"
[[ ! -L "$slice_dir" ]] || fail_final "$slice_dir is a symbolic link; refusing to write through it"
mkdir -p "$slice_dir"
if [[ -n "${LLAMA_SERVICE_USER:-}" && $EUID -eq 0 ]]; then
  chown "root:$LLAMA_SERVICE_USER" "$slice_dir" && chmod 2750 "$slice_dir"
fi
# Ranged reads in flight (of 16 MiB each): the planner's SLICE_STREAMS (infra/planner/local_load.py).
SLICE_STREAMS="${SLICE_STREAMS:-64}"
require_count SLICE_STREAMS
status phase=downloading
started="$(date +%s.%N)"
code=0
if [[ "$LLAMA_ROLE" == main ]]; then
  require_setting MODEL_URLS
  read -r -a urls <<<"$MODEL_URLS"
  args=()
  for url in "${urls[@]}"; do args+=(--source "$url" --out "$(model_file "$url")"); done
  mkdir -p "$(dirname "$(model_file "${urls[0]}")")"
  done_json="$(python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-slice" main --manifest "$SLICE_MANIFEST" \
    "${args[@]}" --layers "$SLICE_LAYERS" --streams "$SLICE_STREAMS" \
    --keys "$slice_dir/keys" --elsewhere "$slice_dir/elsewhere" 2>"$slice_dir/fetch.log")" || code=$?
else
  require_setting SLICE_SOURCES
  require_count SLICE_FIRST_LAYER
  read -r -a urls <<<"$SLICE_SOURCES"
  args=()
  for url in "${urls[@]}"; do args+=(--source "$url"); done
  output=()
  [[ "${SLICE_OUTPUT:-0}" != 1 ]] || output=(--output)
  done_json="$(python3 "$LLAMA_RPC_BIN_DIR/llama-rpc-slice" worker --manifest "$SLICE_MANIFEST" \
    "${args[@]}" --first-layer "$SLICE_FIRST_LAYER" --layers "$SLICE_LAYERS" "${output[@]}" \
    --streams "$SLICE_STREAMS" --cache-dir "$slice_dir/rpc" 2>"$slice_dir/fetch.log")" || code=$?
fi
if [[ $code -ne 0 ]]; then
  fail "slice download failed: $(tail -n 1 "$slice_dir/fetch.log")"
fi
status "slice:=$done_json" "slice_seconds:=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')"
log "slice in place: $done_json"
