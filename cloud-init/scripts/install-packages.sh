#!/usr/bin/env bash
# Install those of LLAMA_PACKAGES that are missing, on every boot: cloud-init's `packages` runs
# once, and a transient apt failure there would leave the node without a compiler for good.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGE_ATTEMPTS="${PACKAGE_ATTEMPTS:-5}"
RETRY_DELAY="${RETRY_DELAY:-10}" # seconds, doubled after each attempt
require_count PACKAGE_ATTEMPTS
require_count RETRY_DELAY
read -r -a wanted <<<"${LLAMA_PACKAGES:-}"

missing=()
for package in "${wanted[@]}"; do
  # shellcheck disable=SC2016  # a dpkg-query format
  [[ "$(dpkg-query -W -f '${db:Status-Status}' "$package" 2>/dev/null)" == installed ]] ||
    missing+=("$package")
done
[[ ${#missing[@]} -gt 0 ]] || exit 0

# DPkg::Lock::Timeout: wait for another apt (unattended-upgrades) rather than fail.
apt=(apt-get -q -o Acquire::Retries=5 -o DPkg::Lock::Timeout=300)
apt_log="$(mktemp)"
trap 'rm -f "$apt_log"' EXIT
for ((attempt = 1; ; attempt++)); do
  log "installing ${missing[*]} (attempt $attempt of $PACKAGE_ATTEMPTS)"
  if { "${apt[@]}" update && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y "${missing[@]}"; } >"$apt_log" 2>&1; then
    exit 0
  fi
  reason="$(grep -E '^(E|Err):' "$apt_log" | tail -n 1 || true)"
  reason="${reason:-$(tail -n 1 "$apt_log")}"
  [[ $attempt -lt $PACKAGE_ATTEMPTS ]] ||
    fail "could not install ${missing[*]} after $attempt attempts: $reason"
  delay="$(backoff_seconds "$RETRY_DELAY" "$attempt")"
  log "apt failed ($reason); trying again in ${delay}s"
  sleep "$delay"
done
