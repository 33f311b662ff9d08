#!/usr/bin/env bash
# Fetch llama.cpp at the pinned commit and build only the targets this node's role needs, with
# every core. A node that already has the pinned binaries (a reboot, a re-run) builds nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_setting LLAMA_CPP_COMMIT
require_setting LLAMA_CPP_SOURCE
require_setting LLAMA_ROLE

[[ "$LLAMA_CPP_COMMIT" =~ ^[0-9a-f]{40}$ ]] ||
  fail_final "LLAMA_CPP_COMMIT '$LLAMA_CPP_COMMIT' is not a full 40-character commit hash; pin an exact llama.cpp commit"

case "$LLAMA_ROLE" in
  worker) targets=(ggml-rpc-server) ;;
  main) targets=(llama-server llama-cli llama-bench) ;;
  all) targets=(ggml-rpc-server llama-server llama-cli llama-bench) ;;
  *) fail_final "LLAMA_ROLE '$LLAMA_ROLE' is not one of worker, main, all" ;;
esac

root="$LLAMA_PREFIX/$LLAMA_CPP_COMMIT"
bin_dir="$(llama_bin_dir)"
build_dir="${LLAMA_BUILD_DIR:-$root/build}"
jobs="${LLAMA_BUILD_JOBS:-$(nproc)}"
# A node builds for its own CPU. LLAMA_CPU_ARCH (an -march, like armv9-a+sve2+bf16+i8mm) builds
# for the nodes' CPU family instead: the pods' image, built on another machine or under emulation.
cpu_args=(-DGGML_NATIVE=ON)
if [[ -n "${LLAMA_CPU_ARCH:-}" ]]; then
  [[ "$LLAMA_CPU_ARCH" =~ ^[a-z0-9][a-z0-9.+-]*$ ]] ||
    fail_final "LLAMA_CPU_ARCH '$LLAMA_CPU_ARCH' is not an -march value (like armv9-a+sve2)"
  cpu_args=(-DGGML_NATIVE=OFF "-DGGML_CPU_ARM_ARCH=$LLAMA_CPU_ARCH")
fi
# LLAMA_CROSS (a GNU triplet, like aarch64-linux-gnu) builds with that cross toolchain (Debian's
# crossbuild-essential-*) for a family's -march: the prebuilt binaries `lrc prebuild` makes.
if [[ -n "${LLAMA_CROSS:-}" ]]; then
  [[ "$LLAMA_CROSS" =~ ^[a-z0-9_]+-linux-gnu[a-z]*$ && -n "${LLAMA_CPU_ARCH:-}" ]] ||
    fail_final "LLAMA_CROSS '$LLAMA_CROSS' is not a GNU triplet (like aarch64-linux-gnu) with LLAMA_CPU_ARCH"
  cpu_args+=(
    -DCMAKE_SYSTEM_NAME=Linux "-DCMAKE_SYSTEM_PROCESSOR=${LLAMA_CROSS%%-*}"
    "-DCMAKE_C_COMPILER=$LLAMA_CROSS-gcc" "-DCMAKE_CXX_COMPILER=$LLAMA_CROSS-g++"
  )
fi
# -DLLAMA_USE_PREBUILT_UI=OFF: the server's web UI would otherwise be downloaded at build time.
cmake_args=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_RPC=ON
  "${cpu_args[@]}"
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
)
# GCC (12 here) miscompiles ggml's AMX tile configuration at -O3: its intrinsic says it reads 8
# of the config's 64 bytes, so the other stores are dropped and the first batched matrix
# product faults (ggml/src/ggml-cpu/amx/mmq.cpp, ggml_tile_config_init; llama.cpp issue 20824).
# Arm nodes never compile that code. An x86 machine whose -march=native enables AMX builds
# without it, keeping its other repacked kernels.
# (The defines are read whole: grep -q on a pipe can stop the compiler with SIGPIPE, and under
# pipefail that would read as "no AMX" now and then.)
native_defines=""
[[ -n "${LLAMA_CPU_ARCH:-}" ]] || native_defines="$(c++ -march=native -dM -E -x c++ /dev/null 2>/dev/null || true)"
if [[ "$native_defines" == *__AMX_INT8__* ]]; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake_args+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
fi
stamp="$bin_dir/.built"
GIT_FETCH_ATTEMPTS="${GIT_FETCH_ATTEMPTS:-5}"
RETRY_DELAY="${RETRY_DELAY:-10}" # seconds, doubled after each attempt
require_count GIT_FETCH_ATTEMPTS
require_count RETRY_DELAY
# The patch set for this commit (cloud-init/patches/COMMIT/*.patch, applied in name order): its
# digest is part of the stamp, so a changed set rebuilds. LLAMA_CPP_PATCHES is the digest the node
# expects ("none": build unpatched); unset, the files decide. A commit with no patch files builds
# unpatched, and says so. A patch that changes nothing this node's role builds comes as
# NAME.patch.sha256, its diff's hash: in the set (and its digest), not applied.
patch_dir="${LLAMA_CPP_PATCH_DIR:-$LLAMA_RPC_BIN_DIR/../patches}/$LLAMA_CPP_COMMIT"
find_patches() {
  patch_files=() found_patches=none
  local entries=() f hash lines=""
  if [[ -d "$patch_dir" ]]; then
    mapfile -t entries < <(find "$patch_dir" -maxdepth 1 -type f \( -name '*.patch' -o -name '*.patch.sha256' \) | LC_ALL=C sort)
  fi
  for f in "${entries[@]}"; do
    if [[ "$f" == *.sha256 ]]; then
      hash="$(<"$f")"
      [[ "$hash" =~ ^[0-9a-f]{64}$ ]] || fail_final "$f does not hold a sha256"
      f="${f%.sha256}"
    else
      # The diff alone: the text before it may change without a rebuild.
      hash="$(sed -n '/^--- /,$p' "$f" | sha256sum | cut -d' ' -f1)"
      patch_files+=("$f")
    fi
    lines+="$hash  ${f##*/}"$'\n'
  done
  if ((${#entries[@]})); then
    found_patches="$(printf '%s' "$lines" | sha256sum | cut -c1-16)"
  fi
}
find_patches
patches="${LLAMA_CPP_PATCHES:-$found_patches}"
stamp_text="$(printf '%s\n' "$LLAMA_CPP_COMMIT" "${cmake_args[*]}" "patches $patches")"

already_built() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" ]] || return 1
  local target
  for target in "${targets[@]}"; do
    [[ -x "$bin_dir/$target" ]] || return 1
  done
}

# fetch_commit: a shallow fetch of the pinned commit into $src. A commit or repository that is not
# there fails at once; anything else (DNS, a dropped connection) is tried GIT_FETCH_ATTEMPTS times.
fetch_commit() {
  local attempt delay reason
  for ((attempt = 1; ; attempt++)); do
    git -C "$src" fetch -q --depth 1 "$LLAMA_CPP_SOURCE" "$LLAMA_CPP_COMMIT" 2>"$root/fetch.log" && return 0
    reason="$(tail -n 1 "$root/fetch.log")"
    if grep -qiE "not our ref|unadvertised object|couldn't find remote ref|not a git repository|repository .* not found" "$root/fetch.log"; then
      fail_final "llama.cpp commit $LLAMA_CPP_COMMIT could not be fetched from $LLAMA_CPP_SOURCE: $reason; check llamaCppCommit names a commit that exists there"
    fi
    if [[ $attempt -ge $GIT_FETCH_ATTEMPTS ]]; then
      fail "llama.cpp commit $LLAMA_CPP_COMMIT could not be fetched from $LLAMA_CPP_SOURCE after $attempt attempts: $reason"
    fi
    delay="$(backoff_seconds "$RETRY_DELAY" "$attempt")"
    log "fetching llama.cpp failed ($reason); attempt $((attempt + 1)) of $GIT_FETCH_ATTEMPTS in ${delay}s"
    sleep "$delay"
  done
}

# The prebuilt binaries (LLAMA_PREBUILT: the store they are kept in; fetch-llama.sh) count as
# built when they are the bundle of this commit, set and target.
if [[ -n "${LLAMA_PREBUILT:-}" ]]; then
  source "$LLAMA_RPC_BIN_DIR/fetch-llama.sh"
else
  prebuilt_installed() { return 1; }
fi

if already_built || prebuilt_installed; then
  log "llama.cpp $LLAMA_CPP_COMMIT already built (${targets[*]}); nothing to do"
  status build_skipped:=true
  exit 0
fi

mkdir -p "$root"
# Nodes that share a prefix (the local cluster) take turns; on a VM there is only one builder.
exec 9>"$root/.build.lock"
flock 9
if already_built || prebuilt_installed; then
  status build_skipped:=true
  exit 0
fi

started=$EPOCHREALTIME
if [[ -n "${LLAMA_PREBUILT:-}" ]]; then
  status phase=building build_skipped:=false "prebuilt_url=$(prebuilt_url)"
  log "fetching prebuilt llama.cpp from $(prebuilt_url)"
  prebuilt_reason=""
  if use_prebuilt; then
    status build_source=prebuilt "prebuilt_sha256=$prebuilt_sha256" \
      "build_seconds:=$(llama_rpc_status elapsed "$started")"
    log "using prebuilt llama.cpp $(prebuilt_url) (sha256 $prebuilt_sha256): ${targets[*]} in $bin_dir, nothing built"
    exit 0
  fi
  log "no usable prebuilt llama.cpp: $prebuilt_reason; building it on this node"
  status "prebuilt_fallback=$prebuilt_reason"
fi

status phase=building build_skipped:=false build_source=built "build_targets=${targets[*]}"

# A plain directory (an unpacked release or sdist tree) is used as it is: whoever passes it
# vouches for its commit. Anything else (a URL, or a directory holding a git repository) is
# fetched at the exact commit, shallow, and checked.
if [[ -d "$LLAMA_CPP_SOURCE" && ! -e "$LLAMA_CPP_SOURCE/.git" ]]; then
  src="$LLAMA_CPP_SOURCE"
  [[ -f "$src/CMakeLists.txt" && -d "$src/tools/rpc" ]] ||
    fail_final "LLAMA_CPP_SOURCE '$src' is not a llama.cpp source tree (no CMakeLists.txt or tools/rpc)"
else
  src="$root/src"
  if [[ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$LLAMA_CPP_COMMIT" ]]; then
    log "fetching llama.cpp $LLAMA_CPP_COMMIT from $LLAMA_CPP_SOURCE"
    rm -rf "$src"
    git init -q "$src"
    fetch_commit
    git -C "$src" -c advice.detachedHead=false checkout -q FETCH_HEAD
  fi
  [[ "$(git -C "$src" rev-parse HEAD)" == "$LLAMA_CPP_COMMIT" ]] ||
    fail "fetched llama.cpp is not at $LLAMA_CPP_COMMIT"
  # A checkout an earlier build patched goes back to the commit first.
  git -C "$src" reset -q --hard && git -C "$src" clean -qfd
fi

if [[ "$patches" == none ]]; then
  log "no llama.cpp patches for $LLAMA_CPP_COMMIT: building it unpatched"
  status build_patches=none
else
  [[ "$found_patches" == "$patches" ]] ||
    fail_final "the llama.cpp patches in $patch_dir (set $found_patches) are not the set this node expects ($patches)"
  # Never patched in place: a plain tree is shared (and read-only on a local machine).
  if [[ "$src" != "$root/src" ]]; then
    rm -rf "$root/src"
    cp -a "$src/." "$root/src"
    src="$root/src"
    git init -q "$src" # its own root for git apply, whatever holds the prefix
  fi
  for f in "${patch_files[@]}"; do
    git -C "$src" apply "$f" 2>"$root/patch.log" ||
      fail_final "llama.cpp patch ${f##*/} does not apply to $LLAMA_CPP_COMMIT: $(head -n 1 "$root/patch.log")"
  done
  log "applied the llama.cpp patches (set $patches): ${patch_files[*]##*/}"
  status "build_patches=${patch_files[*]##*/}"
fi
# CMake keeps one source directory per build directory.
cached_source="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)"
if [[ -n "$cached_source" && "$cached_source" != "$(realpath "$src")" ]]; then
  rm -rf "$build_dir"
fi

log "building ${targets[*]} with $jobs jobs"
{
  cmake -S "$src" -B "$build_dir" "${cmake_args[@]}" &&
    cmake --build "$build_dir" --target "${targets[@]}" -j "$jobs"
} >"$root/build.log" 2>&1 ||
  fail "llama.cpp build failed (${targets[*]}): see $root/build.log"

# Binaries from other build settings must not survive beside the new ones.
if [[ -f "$stamp" && "$(cat "$stamp")" != "$stamp_text" ]]; then
  rm -rf "$bin_dir"
fi
mkdir -p "$bin_dir"
for target in "${targets[@]}"; do
  install -m 0755 "$build_dir/bin/$target" "$bin_dir/$target"
done
printf '%s\n' "$stamp_text" >"$stamp"
status "build_seconds:=$(llama_rpc_status elapsed "$started")"
log "built ${targets[*]} into $bin_dir"
