# shellcheck shell=bash
# The rclone remote of an object store, by URL, read with the node's own identity: sourced by a
# staged model's download (fetch-staged.sh) and the prebuilt llama.cpp's fetch (fetch-llama.sh).
# shellcheck disable=SC2034  # store_path: its callers read it

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
