#!/usr/bin/env bash
# Host firewall on a worker, behind the cloud's own: the RPC port (no authentication) accepts
# connections only from RPC_ALLOWED_SOURCES (the main node) and from the node itself. With
# CLUSTER_CIDR set, a serving worker opens no connection beyond the cluster's network: the
# process most exposed to remote-code bugs cannot reach the internet. It runs when the worker
# service starts, after the boot (which needs the package mirrors and GitHub), and the table is
# gone after a reboot until the service starts again. Idempotent; other ports are left alone.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting RPC_ALLOWED_SOURCES
read -r -a sources <<<"$RPC_ALLOWED_SOURCES"
allowed="$(IFS=','; printf '%s' "${sources[*]}")"

# Link-local 169.254.0.0/16 holds every cloud's metadata, DNS and time services (AWS's DNS is
# also at the VPC's base + 2, inside CLUSTER_CIDR); PLATFORM_ADDRESSES are the cloud's own
# endpoints outside both (Azure's DNS and agent at 168.63.129.16); DHCP may rebind by broadcast.
# Replies to connections made to the node pass as established.
egress=""
if [[ -n "${CLUSTER_CIDR:-}" ]]; then
  destinations="$CLUSTER_CIDR, 169.254.0.0/16"
  for address in ${PLATFORM_ADDRESSES:-}; do
    destinations+=", $address"
  done
  destinations+=", 255.255.255.255"
  egress="
  chain output {
    type filter hook output priority filter; policy accept;
    oif \"lo\" accept
    ct state established,related accept
    ip daddr { $destinations } accept
    meta nfproto ipv6 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept
    ip6 daddr fe80::/10 accept
    counter reject
  }"
fi
nft -f - <<NFT || fail "could not apply the RPC firewall (nft); RPC_ALLOWED_SOURCES='$RPC_ALLOWED_SOURCES' CLUSTER_CIDR='${CLUSTER_CIDR:-}'"
table inet llama_rpc
delete table inet llama_rpc
table inet llama_rpc {
  chain input {
    type filter hook input priority filter; policy accept;
    iif "lo" accept
    tcp dport $RPC_PORT ip saddr { $allowed } accept
    tcp dport $RPC_PORT drop
  }$egress
}
NFT
log "RPC port $RPC_PORT open only to $allowed${CLUSTER_CIDR:+; egress only to $CLUSTER_CIDR}"
