#!/usr/bin/env bash
# Download the model (one GGUF, or every part of a split GGUF) in parallel, resumably, and check
# each part's sha256 when one is given. Parts already downloaded and checked are kept.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting MODEL_URLS
read -r -a urls <<<"$MODEL_URLS"
read -r -a sums <<<"${MODEL_SHA256:-}"
if [[ ${#sums[@]} -gt 0 && ${#sums[@]} -ne ${#urls[@]} ]]; then
  fail "MODEL_SHA256 has ${#sums[@]} checksums for ${#urls[@]} model URLs; give one per part, in order, or none"
fi
model_dir="${MODEL_DIR:-$LLAMA_DATA_DIR/models}"
mkdir -p "$model_dir"
errors="$(mktemp -d)"
trap 'rm -rf "$errors"' EXIT

# fetch_part INDEX URL [SHA256]: download one part; on failure write the reason to $errors/INDEX.
fetch_part() {
  local index="$1" url="$2" want="${3:-}"
  local dest verified
  dest="$(model_file "$url")"
  verified="$dest.verified"
  if [[ -f "$dest" && ( -z "$want" || "$(cat "$verified" 2>/dev/null)" == "$want" ) ]]; then
    log "have $(basename "$dest")"
    return 0
  fi
  log "downloading $url"
  # --continue-at - resumes a partial file; --speed-limit/--speed-time turn a stalled transfer
  # into an error instead of a hang.
  if ! curl --fail --location --silent --show-error --continue-at - \
    --retry 5 --retry-delay 2 --connect-timeout 20 --speed-limit 1024 --speed-time 60 \
    --output "$dest.partial" "$url" 2>"$errors/$index.curl"; then
    printf 'download of %s failed: %s' "$url" "$(tail -n 1 "$errors/$index.curl")" >"$errors/$index"
    return 1
  fi
  if [[ -n "$want" ]]; then
    local got
    got="$(sha256sum "$dest.partial" | cut -d ' ' -f 1)"
    if [[ "$got" != "$want" ]]; then
      rm -f "$dest.partial"
      printf 'checksum mismatch for %s: expected sha256 %s, got %s' "$url" "$want" "$got" >"$errors/$index"
      return 1
    fi
  fi
  mv "$dest.partial" "$dest"
  [[ -z "$want" ]] || printf '%s' "$want" >"$verified"
}

status phase=downloading "model_path=$(model_file "${urls[0]}")" "model_parts:=${#urls[@]}"
started=$EPOCHREALTIME
max_jobs="${DOWNLOAD_JOBS:-8}"
for i in "${!urls[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $max_jobs ]]; do
    wait -n || true
  done
  fetch_part "$i" "${urls[$i]}" "${sums[$i]:-}" &
done
wait || true

for i in "${!urls[@]}"; do
  if [[ -f "$errors/$i" ]]; then
    fail "$(cat "$errors/$i")"
  fi
done
bytes=0
for url in "${urls[@]}"; do
  bytes=$((bytes + $(stat -c %s "$(model_file "$url")")))
done
status "download_seconds:=$(elapsed_since "$started")" "model_bytes:=$bytes"
log "model ready: $(model_file "${urls[0]}") ($bytes bytes)"
