# shellcheck shell=bash
# A staged model part's download, sourced by fetch-model.sh when a URL is s3://, gs:// or az://
# (a node gets this file only then): the object store read with rclone, many ranged reads at
# once, with the node's own identity. It uses fetch-model.sh's settings, helpers and scratch
# directory.
# shellcheck disable=SC2154  # scratch: fetch-model.sh's

source "$LLAMA_RPC_BIN_DIR/store-remote.sh"

# download_staged INDEX URL PARTIAL: copy an object from the store with rclone, STAGED_STREAMS
# ranged reads at once. rclone cannot resume a copy: a failed attempt starts the part again.
# A missing object or bucket, or a denied read is final; anything else is retried, denials from
# Cloud Storage and Blob Storage too: a grant made with the stack takes minutes to reach them.
download_staged() {
  local index="$1" url="$2" partial="$3" remote store_path attempt code listing reason delay
  store_remote "$url"
  remote="$store_path"
  local rclone=(rclone --config /dev/null --retries 1 --low-level-retries 3)
  for ((attempt = 1; ; attempt++)); do
    code=0
    listing="$("${rclone[@]}" lsjson "$remote" 2>"$scratch/$index.rclone")" || code=$?
    if [[ $code -eq 0 && "$listing" != *'"Name"'* ]]; then
      part_error "$index" "download of $url failed: no such object in the store; copy the model there first, or fix the URL"
      return "$EXIT_FINAL"
    fi
    [[ $code -ne 0 ]] || "${rclone[@]}" copyto "$remote" "$partial" \
      --multi-thread-streams "$STAGED_STREAMS" --multi-thread-cutoff "$STAGED_CUTOFF" \
      --stats "${DOWNLOAD_PROGRESS_SECONDS}s" --stats-one-line --stats-log-level NOTICE \
      2>"$scratch/$index.rclone" || code=$?
    [[ $code -ne 0 ]] || return 0
    rm -f "$partial"
    reason="$(grep -vE '^\s|NOTICE' "$scratch/$index.rclone" | tail -n 1)"
    if [[ "$reason" == *AccessDenied* || "$reason" == *"status code: 403"* ]]; then
      part_error "$index" "download of $url failed: access denied; the node's identity needs read access to it (s3:GetObject and s3:ListBucket), and S3 answers so for a missing object too when listing is not allowed"
      return "$EXIT_FINAL"
    elif [[ "$reason" == *NoSuchBucket* || "$reason" == *"directory not found"* ]]; then
      part_error "$index" "download of $url failed: no such bucket or container; copy the model there first, or fix the URL"
      return "$EXIT_FINAL"
    fi
    if [[ $attempt -ge $DOWNLOAD_ATTEMPTS ]]; then
      part_error "$index" "download of $url failed after $attempt attempts: ${reason:-rclone exit status $code}"
      return 1
    fi
    delay="$(backoff_seconds "$DOWNLOAD_RETRY_DELAY" "$attempt")"
    log "download of $url failed ($reason); attempt $((attempt + 1)) of $DOWNLOAD_ATTEMPTS in ${delay}s"
    sleep "$delay"
  done
}
