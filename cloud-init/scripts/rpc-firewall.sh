#!/usr/bin/env bash
# Host firewall on a worker, behind the cloud's own: the RPC port (no authentication) accepts
# connections only from RPC_ALLOWED_SOURCES (the main node) and from the node itself.
# Idempotent; other ports are left alone.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting RPC_ALLOWED_SOURCES
read -r -a sources <<<"$RPC_ALLOWED_SOURCES"
allowed="$(IFS=','; printf '%s' "${sources[*]}")"
nft -f - <<NFT || fail "could not apply the RPC firewall (nft); RPC_ALLOWED_SOURCES='$RPC_ALLOWED_SOURCES'"
table inet llama_rpc
delete table inet llama_rpc
table inet llama_rpc {
  chain input {
    type filter hook input priority filter; policy accept;
    iif "lo" accept
    tcp dport $RPC_PORT ip saddr { $allowed } accept
    tcp dport $RPC_PORT drop
  }
}
NFT
log "RPC port $RPC_PORT open only to $allowed"
