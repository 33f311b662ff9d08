#!/usr/bin/env bash
# Download the model (one GGUF, or every part of a split GGUF) in parallel, checking each part's
# sha256 when given. A part's check runs beside the next parts' downloads: DOWNLOAD_JOBS bounds
# the downloads alone, so the disk never waits for a check. Finished parts are kept, so a re-run
# fetches only what is missing. A staged part (s3://, gs://, az://) is read from the object store
# with rclone: many ranged reads at once, with the node's own identity.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting MODEL_URLS
read -r -a urls <<<"$MODEL_URLS"
read -r -a sums <<<"${MODEL_SHA256:-}"
read -r -a draft_urls <<<"${DRAFT_MODEL_URLS:-}"
read -r -a draft_sums <<<"${DRAFT_MODEL_SHA256:-}"
DOWNLOAD_JOBS="${DOWNLOAD_JOBS:-8}"
DOWNLOAD_ATTEMPTS="${DOWNLOAD_ATTEMPTS:-8}"
DOWNLOAD_RETRY_DELAY="${DOWNLOAD_RETRY_DELAY:-5}" # seconds, doubled after each attempt
STAGED_STREAMS="${STAGED_STREAMS:-16}"                # ranged reads at once, per staged part
STAGED_CUTOFF="${STAGED_CUTOFF:-64M}"                 # smaller objects are read in one stream
DOWNLOAD_PROGRESS_SECONDS="${DOWNLOAD_PROGRESS_SECONDS:-10}" # how often the status file hears
for setting in DOWNLOAD_JOBS DOWNLOAD_ATTEMPTS DOWNLOAD_RETRY_DELAY STAGED_STREAMS DOWNLOAD_PROGRESS_SECONDS; do
  require_count "$setting"
done
[[ $DOWNLOAD_JOBS -gt 0 ]] || DOWNLOAD_JOBS=1
[[ $DOWNLOAD_PROGRESS_SECONDS -gt 0 ]] || DOWNLOAD_PROGRESS_SECONDS=1
if [[ ${#sums[@]} -gt 0 && ${#sums[@]} -ne ${#urls[@]} ]]; then
  fail_final "MODEL_SHA256 has ${#sums[@]} checksums for ${#urls[@]} model URLs; give one per part, in order, or none"
fi
if [[ ${#draft_sums[@]} -gt 0 && ${#draft_sums[@]} -ne ${#draft_urls[@]} ]]; then
  fail_final "DRAFT_MODEL_SHA256 has ${#draft_sums[@]} checksums for ${#draft_urls[@]} draft model URLs; give one per part, in order, or none"
fi
# A draft model's parts come with the model's, each checked the same way (an empty checksum:
# none given).
if [[ ${#draft_urls[@]} -gt 0 ]]; then
  for i in "${!urls[@]}"; do sums[i]="${sums[i]:-}"; done
  for i in "${!draft_urls[@]}"; do
    urls+=("${draft_urls[i]}")
    sums+=("${draft_sums[i]:-}")
  done
fi

# A URL ending in '/' names no file, and two parts of one name would overwrite each other and
# still look complete.
declare -A url_of=()
for url in "${urls[@]}"; do
  name="$(model_name "$url")"
  if [[ -z "$name" || "$name" == . || "$name" == .. ]]; then
    fail_final "model URL '$url' does not end in a file name; give the URL of the GGUF file itself (of every part, for a split GGUF)"
  fi
  [[ -z "${url_of[$name]:-}" ]] ||
    fail_final "model URLs '${url_of[$name]}' and '$url' both save as '$name'; every part needs a file name of its own"
  url_of[$name]="$url"
  [[ "$url" != s3://* ]] || require_setting MODEL_STORE_REGION
done
# A staged part's download (rclone): a node has it only with a staged model.
if [[ " ${urls[*]}" =~ \ (s3|gs|az):// ]]; then
  source "$LLAMA_RPC_BIN_DIR/fetch-staged.sh"
fi

# A model that fits in memory downloads at the network's speed: the page cache may hold all of it
# dirty while the disk catches up behind (writeback starts at once, at 1 GiB). Unset (a model
# larger than memory), the kernel's limits hold and the disk sets the pace.
if [[ -n "${WRITEBACK_BYTES:-}" ]]; then
  require_count WRITEBACK_BYTES
  sysctl -q -w "vm.dirty_bytes=$WRITEBACK_BYTES" "vm.dirty_background_bytes=$((1 << 30))" ||
    log "could not raise the dirty-page limit (sysctl); the download goes at the disk's pace"
fi

mkdir -p "${MODEL_DIR:-$LLAMA_DATA_DIR/models}"
# A model larger than memory is loaded by page faults (patch 0003 maps it without MAP_POPULATE),
# each reading the file's read-ahead window around it: the kernel's 128 KiB keeps one small read
# in flight per faulting thread, and EBS counts every I/O under 256 KiB as one of the volume's
# IOPS ("Amazon EBS I/O characteristics", AWS EBS user guide). MODEL_READ_AHEAD_KB (the stack
# sets it then) raises it on the disk the model is on; the kernel forgets it at shutdown, so
# every boot sets it. blockdev counts 512-byte sectors; a disk that refuses loads, only slower.
if [[ -n "${MODEL_READ_AHEAD_KB:-}" ]]; then
  require_count MODEL_READ_AHEAD_KB
  disk="$(findmnt -n -o SOURCE --target "${MODEL_DIR:-$LLAMA_DATA_DIR/models}" || true)"
  if [[ -b "$disk" ]] && blockdev --setra $((MODEL_READ_AHEAD_KB * 2)) "$disk"; then
    status "model_read_ahead_kb:=$(($(blockdev --getra "$disk") / 2))"
    log "read-ahead of $disk (the model's disk) raised to $MODEL_READ_AHEAD_KB KiB"
  else
    log "could not raise the read-ahead of the model's disk (${disk:-none found}); the load reads it in small pieces"
  fi
fi
# A model disk kept from an earlier main node (model-disk.sh) may hold another model's parts;
# only this model's stay, so that it fits.
if [[ -n "${MODEL_DISK_GB:-}" ]]; then
  declare -A keep=()
  for url in "${urls[@]}"; do
    part="$(model_file "$url")"
    keep[$part]=1 keep[$part.verified]=1 keep[$part.partial]=1
  done
  for file in "${MODEL_DIR:-$LLAMA_DATA_DIR/models}"/*; do
    [[ -f "$file" && ! -L "$file" && -z "${keep[$file]:-}" ]] || continue
    log "removing $(basename "$file") from the model disk: not a part of this model"
    rm -f "$file"
  done
fi
scratch="$(mktemp -d)"
# Whatever stops this script, the status must not stay "downloading".
finish() {
  local code=$?
  [[ -z "${reporter:-}" ]] || kill "$reporter" 2>/dev/null || true
  rm -rf "$scratch"
  if [[ $code -ne 0 && -z "${FAILURE_RECORDED:-}" ]]; then
    status phase=failed "last_error=model download stopped unexpectedly (exit status $code)" || true
  fi
}
trap finish EXIT

size_of() { stat -c %s "$1" 2>/dev/null || printf 0; }
human() { numfmt --to=iec-i --suffix=B "$1"; }
# Python's hashlib is OpenSSL, which uses the CPU's SHA-256 instructions: 4 times coreutils'
# sha256sum (bench/results/load.json). python3 is on every node (cloud-init runs on it).
sha256_of() {
  python3 -c 'import hashlib, sys
with open(sys.argv[1], "rb") as f:
    print(hashlib.file_digest(f, "sha256").hexdigest(), end="")' "$1"
}
# part_error INDEX MESSAGE: why part INDEX failed, for the status file.
part_error() { printf '%s' "$2" >"$scratch/$1"; }

# have_part DEST [SHA256]: DEST is there and, given a checksum, verified (now, or by an earlier
# run: DEST.verified; a run stopped before writing that checks the file instead).
have_part() {
  [[ -f "$1" ]] || return 1
  [[ -z "$2" || "$(cat "$1.verified" 2>/dev/null)" == "$2" ]] && return 0
  if [[ "$(sha256_of "$1" || true)" == "$2" ]]; then
    printf '%s' "$2" >"$1.verified"
    return 0
  fi
  rm -f "$1" "$1.verified"
  return 1
}

# download INDEX URL PARTIAL: fetch URL into PARTIAL, resuming, in at most DOWNLOAD_ATTEMPTS
# tries. Returns 0, 1 (PARTIAL kept: a later run resumes it) or EXIT_FINAL (PARTIAL removed: a
# retry cannot help). curl's --retry covers timeouts and HTTP 408/429/5xx (honouring Retry-After);
# this loop what it does not: a body cut short or reset (curl 18, 56), DNS and connect failures.
download() {
  local index="$1" url="$2" partial="$3"
  local attempt code reply http length reason delay start need
  if [[ "$url" == s3://* || "$url" == gs://* || "$url" == az://* ]]; then
    download_staged "$@"
    return $?
  fi
  for ((attempt = 1; ; attempt++)); do
    start="$(size_of "$partial")"
    code=0
    # --globoff: [] and {} in a URL are characters, not a list of URLs. --proto-redir: a redirect
    # is followed to https only, never to plain http (or file://, or anything else).
    reply="$(curl --globoff --proto-redir =https --fail --location --silent --show-error --continue-at - \
      --retry 5 --connect-timeout 20 --speed-limit 1024 --speed-time 60 \
      --write-out '%{http_code} %header{content-length}' --dump-header "$scratch/$index.headers" \
      --output "$partial" "$url" 2>"$scratch/$index.curl")" || code=$?
    [[ $code -ne 0 ]] || return 0
    read -r http length <<<"$reply"
    reason="$(tail -n 1 "$scratch/$index.curl")"
    if [[ $code -eq 23 ]]; then # could not write the file
      need=""
      [[ ! "$length" =~ ^[0-9]+$ ]] || need=$((start + length))
      write_failed "$index" "$url" "$partial" "$need" "$reason"
      return $?
    elif [[ $code -eq 33 || "$code $http" == "22 416" ]]; then
      rm -f "$partial" # the remote file is not what the partial one began: start again
    elif [[ $code -eq 22 && "$http" == 4* && "$http" != 408 && "$http" != 429 ]]; then
      rm -f "$partial"
      part_error "$index" "download of $url failed: HTTP $http ($reason); check the model URL and that it needs no login"
      return "$EXIT_FINAL"
    elif [[ $code -eq 1 && "$reason" == *Protocol* && "$http" == 3* ]]; then
      rm -f "$partial"
      part_error "$index" "download of $url failed: it redirects to a URL that is not https, and nodes follow redirects to https only; give the https URL it should redirect to"
      return "$EXIT_FINAL"
    elif [[ " 1 3 37 " == *" $code "* ]]; then # unsupported, malformed, unreadable (file://)
      part_error "$index" "download of $url failed: $reason; check the model URL"
      return "$EXIT_FINAL"
    fi
    if [[ $attempt -ge $DOWNLOAD_ATTEMPTS ]]; then
      part_error "$index" "download of $url failed after $attempt attempts: $reason"
      return 1
    fi
    delay="$(backoff_seconds "$DOWNLOAD_RETRY_DELAY" "$attempt")"
    log "download of $url failed ($reason); attempt $((attempt + 1)) of $DOWNLOAD_ATTEMPTS in ${delay}s, from byte $(size_of "$partial")"
    sleep "$delay"
  done
}

# write_failed INDEX URL PARTIAL NEED REASON: curl could not write PARTIAL (NEED bytes in all,
# if known). A full disk is final, and the partial file goes: the status file needs the space,
# and the part will not fit this disk however often it resumes.
write_failed() {
  local index="$1" url="$2" partial="$3" need="$4" reason="$5" size free dir
  size="$(size_of "$partial")"
  dir="$(dirname "$partial")"
  free=$(($(df --output=avail -B1 "$dir" | tail -n 1) + size))
  if [[ $free -ge $((size + 1048576)) && $free -ge ${need:-0} ]]; then
    part_error "$index" "download of $url failed: could not write $partial: $reason"
    return 1
  fi
  rm -f "$partial"
  part_error "$index" "download of $url failed: the disk is full: ${need:+$(basename "$partial" .partial) needs $(human "$need") and }$dir has $(human "$free") free; give the node a larger data disk"
  return "$EXIT_FINAL"
}

# download_part INDEX URL [SHA256]: download one part unless it is already in place (and
# verified, given a checksum); returns as download does, with the reason for a failure in
# $scratch/INDEX. A part it downloaded is left as DEST.partial for check_part, and marked
# $scratch/INDEX.fetched.
download_part() {
  local index="$1" url="$2" want="${3:-}" dest
  dest="$(model_file "$url")"
  if have_part "$dest" "$want"; then
    log "have $(basename "$dest")"
    return 0
  fi
  log "downloading $url"
  touch "$scratch/$index.fetched"
  download "$index" "$url" "$dest.partial"
}

# check_part INDEX URL [SHA256]: check a downloaded part and move it into place; returns 0, 1 or
# EXIT_FINAL (a part that is not what its checksum says is removed: downloading it again gives
# the same bytes), with the reason for a failure in $scratch/INDEX.
check_part() {
  local index="$1" url="$2" want="${3:-}" dest got
  dest="$(model_file "$url")"
  if [[ -n "$want" ]]; then
    if ! got="$(sha256_of "$dest.partial")"; then
      part_error "$index" "download of $url failed: could not read $dest.partial to check its sha256"
      return 1
    fi
    if [[ "$got" != "$want" ]]; then
      rm -f "$dest.partial"
      part_error "$index" "checksum mismatch for $url: expected sha256 $want, got $got"
      return "$EXIT_FINAL"
    fi
    log "checked $(basename "$dest")"
  fi
  if ! mv "$dest.partial" "$dest" || { [[ -n "$want" ]] && ! printf '%s' "$want" >"$dest.verified"; }; then
    part_error "$index" "download of $url failed: could not move it into place as $dest"
    return 1
  fi
}

status phase=downloading "model_path=$(model_file "${urls[0]}")" "model_parts:=${#urls[@]}"
started=$EPOCHREALTIME
parts=()
for url in "${urls[@]}"; do parts+=("$(model_file "$url")"); done
progress() { llama_rpc_status download-progress "$scratch" "${parts[@]}" || true; }
# Bytes done and in all, in the status file while the parts come (`lrc wait` shows them). The
# pause holds none of this script's output: killing the reporter leaves its sleep running, which
# would keep a caller reading that output to its end waiting for the sleep.
while sleep "$DOWNLOAD_PROGRESS_SECONDS" >/dev/null 2>&1; do progress; done &
reporter=$!
# At most DOWNLOAD_JOBS downloads at once (what the node's memory holds, so that each part is
# checked from the page cache); a part's check starts as its download ends, as its own job, and
# the next download takes the freed place at once.
declare -A part_of=() # running download's process id -> its part
codes=()              # each part's exit status, once known
checks=()             # each checking part's process id
# reap_download: wait for any one download to end; start its part's check, or keep its failure.
reap_download() {
  local pid code=0 i
  wait -n -p pid "${!part_of[@]}" || code=$?
  i="${part_of[$pid]}"
  unset "part_of[$pid]"
  if [[ $code -ne 0 ]]; then
    codes[i]=$code
  elif [[ -e "$scratch/$i.fetched" ]]; then
    check_part "$i" "${urls[$i]}" "${sums[$i]:-}" &
    checks[i]=$!
  else
    codes[i]=0
  fi
}
for i in "${!urls[@]}"; do
  while [[ ${#part_of[@]} -ge $DOWNLOAD_JOBS ]]; do reap_download; done
  download_part "$i" "${urls[$i]}" "${sums[$i]:-}" &
  part_of[$!]=$i
done
while [[ ${#part_of[@]} -gt 0 ]]; do reap_download; done

# Each part's exit status decides: a part that failed without saying why still fails.
failures=()
exit_code=1
for i in "${!urls[@]}"; do
  code="${codes[i]:-0}"
  [[ -z "${checks[i]:-}" ]] || wait "${checks[i]}" || code=$?
  [[ $code -ne 0 ]] || continue
  [[ $code -ne $EXIT_FINAL ]] || exit_code=$EXIT_FINAL
  reason="$(cat "$scratch/$i" 2>/dev/null || true)"
  failures+=("${reason:-download of ${urls[$i]} failed (exit status $code; see the log)}")
done
kill "$reporter" 2>/dev/null || true
progress
if [[ ${#failures[@]} -gt 0 ]]; then
  message="$(printf '%s; ' "${failures[@]}")"
  fail_with "$exit_code" "${message%; }"
fi

bytes=0
for url in "${urls[@]}"; do
  bytes=$((bytes + $(size_of "$(model_file "$url")")))
done
if compgen -G "$scratch/*.fetched" >/dev/null; then
  status download_skipped:=false "download_seconds:=$(llama_rpc_status elapsed "$started")" \
    "model_bytes:=$bytes"
else # a re-run (every boot runs this): keep the first download's time
  status download_skipped:=true "model_bytes:=$bytes"
fi
log "model ready: $(model_file "${urls[0]}") ($bytes bytes)"
