# shellcheck shell=bash
# The prebuilt llama.cpp, sourced by build-llama.sh when the node has LLAMA_PREBUILT (a node gets
# this file only then): the pinned commit with its patch set, built once for the nodes' CPU family
# (`lrc prebuild`), read from the stack's object store with the node's own identity (rclone, as a
# staged model is: store-remote.sh), checked by its sha256, unpacked where only root
# writes, and run once (--version) before it is used. Whatever fails, the node builds as it would
# without it, and says why.
# shellcheck disable=SC2154  # root, bin_dir, stamp, targets, patches: build-llama.sh's
# shellcheck disable=SC2034  # prebuilt_reason, prebuilt_sha256: build-llama.sh reads them
source "$LLAMA_RPC_BIN_DIR/store-remote.sh"

# The bundle's key under the store's prefix, as infra/boot/prebuilt.py's bundle_key writes it.
prebuilt_url() {
  printf '%s/llama.cpp/%s/%s/%s.tar.zst' "${LLAMA_PREBUILT%/}" "$LLAMA_CPP_COMMIT" "$patches" \
    "$LLAMA_PREBUILT_TARGET"
}

# The stamp of an installed bundle: the commit, the bundle (target and sha256), the patch set.
prebuilt_stamp() {
  printf '%s\n' "$LLAMA_CPP_COMMIT" "prebuilt $LLAMA_PREBUILT_TARGET sha256 $1" "patches $patches"
}

# prebuilt_installed: the bundle for this commit, set and target is there (a reboot, a re-run).
prebuilt_installed() {
  [[ -f "$stamp" ]] || return 1
  local lines target
  mapfile -t lines <"$stamp"
  [[ ${#lines[@]} -eq 3 && "${lines[0]}" == "$LLAMA_CPP_COMMIT" && "${lines[2]}" == "patches $patches" &&
    "${lines[1]}" == "prebuilt $LLAMA_PREBUILT_TARGET sha256 "* ]] || return 1
  for target in "${targets[@]}"; do
    [[ -x "$bin_dir/$target" ]] || return 1
  done
}

# binary_runs PATH: the program starts and says what it is (ggml-rpc-server has no --version).
binary_runs() {
  local flag=--version
  [[ "${1##*/}" != ggml-rpc-server ]] || flag=--help
  timeout 30 "$1" "$flag" >/dev/null 2>&1
}

# refuse REASON: say why the bundle is not used, and leave nothing of it (then return 1).
refuse() {
  prebuilt_reason="$1"
  rm -rf "$root/prebuilt"
}

# use_prebuilt: fetch, check and install the bundle; on any failure say why (prebuilt_reason)
# and return 1, leaving nothing of it behind.
use_prebuilt() {
  local url want got target path
  url="$(prebuilt_url)"
  [[ "$LLAMA_PREBUILT_TARGET" =~ ^[a-z0-9_]+-[a-z0-9_.-]+$ ]] ||
    { refuse "LLAMA_PREBUILT_TARGET '$LLAMA_PREBUILT_TARGET' is not a target name" && return 1; }
  [[ "$url" != s3://* || -n "${MODEL_STORE_REGION:-}" ]] ||
    { refuse "MODEL_STORE_REGION is empty: S3 needs the store's region" && return 1; }
  store_remote "$url" ||
    { refuse "LLAMA_PREBUILT '$LLAMA_PREBUILT' is not an s3://, gs:// or az:// URL" && return 1; }
  # Root's own directory beside the build's (never one the service user can write), made new.
  local work="$root/prebuilt" rclone=(rclone --config /dev/null --retries 3 --low-level-retries 3)
  rm -rf "$work"
  mkdir -m 0700 "$work" "$work/unpacked"
  # The checksum first: `lrc prebuild` puts it after the bundle. (rclone copies a missing object
  # as nothing, and says so with success.)
  if ! "${rclone[@]}" copyto "$store_path.sha256" "$work/bundle.sha256" 2>"$work/rclone.log" ||
    ! "${rclone[@]}" copyto "$store_path" "$work/bundle.tar.zst" 2>>"$work/rclone.log"; then
    refuse "none could be read at $url: $(grep -vE '^\s' "$work/rclone.log" | tail -n 1)"
    return 1
  fi
  [[ -f "$work/bundle.sha256" && -f "$work/bundle.tar.zst" ]] ||
    { refuse "none at $url (or its .sha256)" && return 1; }
  want="$(cut -d' ' -f1 <"$work/bundle.sha256")"
  got="$(sha256sum "$work/bundle.tar.zst" | cut -d' ' -f1)"
  [[ "$want" =~ ^[0-9a-f]{64}$ && "$got" == "$want" ]] ||
    { refuse "$url has sha256 $got, its .sha256 says '${want:0:64}'" && return 1; }
  # Owned by root whoever packed it; a member outside bin/ or not a plain file is refused below.
  tar --zstd -xf "$work/bundle.tar.zst" -C "$work/unpacked" --no-same-owner \
    --no-same-permissions bin 2>"$work/tar.log" ||
    { refuse "$url does not unpack: $(head -n 1 "$work/tar.log")" && return 1; }
  for target in "${targets[@]}"; do
    path="$work/unpacked/bin/$target"
    [[ -f "$path" && ! -L "$path" ]] || { refuse "$url holds no bin/$target" && return 1; }
    chmod 0755 "$path"
    binary_runs "$path" ||
      { refuse "its $target does not run on this node ($(uname -m))" && return 1; }
  done
  rm -rf "$bin_dir"
  mkdir -p "$(dirname "$bin_dir")"
  mv "$work/unpacked/bin" "$bin_dir"
  find "$bin_dir" -mindepth 1 ! -type f -exec rm -rf {} +
  prebuilt_stamp "$got" >"$stamp"
  prebuilt_sha256="$got"
  rm -rf "$work"
}
