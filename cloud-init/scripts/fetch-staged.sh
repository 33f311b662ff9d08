# shellcheck shell=bash
# A staged model part's download, sourced by fetch-model.sh when a URL is s3://, gs:// or az://
# (a node gets this file only then): the object store read with rclone, many ranged reads at
# once, with the node's own identity. It uses fetch-model.sh's settings, helpers and scratch
# directory.
# shellcheck disable=SC2154  # scratch: fetch-model.sh's

# store_remote URL: points rclone's remote "store" at URL's object store, read with the node's
# own identity (environment variables, no config file), and sets store_path to the object on
# it; not in $(...), which would lose the exports. S3: MODEL_STORE_REGION (or the S3 API at
# MODEL_STORE_ENDPOINT). Cloud Storage: the VM's service account from the metadata server
# (env_auth; the distributions' rclone 1.60 has no such option and falls back to it without a
# token). Blob Storage, az://ACCOUNT/CONTAINER/KEY: the VM's managed identity (use_msi, which
# 1.60 has; its env_auth came later).
store_remote() {
  local url="$1" rest
  case "$url" in
  s3://*)
    export RCLONE_CONFIG_STORE_TYPE=s3 RCLONE_CONFIG_STORE_ENV_AUTH=true
    export RCLONE_CONFIG_STORE_REGION="$MODEL_STORE_REGION"
    if [[ -n "${MODEL_STORE_ENDPOINT:-}" ]]; then # another S3 API: path-style requests
      export RCLONE_CONFIG_STORE_PROVIDER=Other RCLONE_CONFIG_STORE_ENDPOINT="$MODEL_STORE_ENDPOINT"
    else
      export RCLONE_CONFIG_STORE_PROVIDER=AWS
    fi
    store_path="store:${url#s3://}"
    ;;
  gs://*)
    export RCLONE_CONFIG_STORE_TYPE="google cloud storage" RCLONE_CONFIG_STORE_ENV_AUTH=true
    store_path="store:${url#gs://}"
    ;;
  az://*)
    rest="${url#az://}"
    export RCLONE_CONFIG_STORE_TYPE=azureblob RCLONE_CONFIG_STORE_USE_MSI=true
    export RCLONE_CONFIG_STORE_ACCOUNT="${rest%%/*}"
    store_path="store:${rest#*/}"
    ;;
  *) return 1 ;;
  esac
}

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
