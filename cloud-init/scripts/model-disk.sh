#!/usr/bin/env bash
# The main node's model disk (MODEL_DISK_GB, on AWS): a volume of its own, attached once the node
# runs, since a volume made apart from the node takes twice the throughput of one made with it.
# Each boot waits for it, knows it by its model name and size among the unpartitioned disks,
# formats it if it is blank (ext4, once) and mounts it at the model directory. A volume kept
# from an earlier main node keeps its verified parts; a new size is a new volume (the stack).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_count MODEL_DISK_GB
require_setting MODEL_DISK_MODEL
MODEL_DISK_WAIT_SECONDS="${MODEL_DISK_WAIT_SECONDS:-900}"
require_count MODEL_DISK_WAIT_SECONDS
# Where the kernel lists disks and their nodes; a test points them at a stand-in.
sys_block="${LLAMA_SYS_BLOCK:-/sys/block}"
dev_dir="${LLAMA_DEV_DIR:-/dev}"
target="${MODEL_DIR:-$LLAMA_DATA_DIR/models}"
want_sectors=$((MODEL_DISK_GB * 1024 * 1024 * 1024 / 512))

# The disks of the model's make and the volume's size that hold no partition table (the root
# disk has one), one name per line.
model_disks() {
  local disk name model
  for disk in "$sys_block"/*; do
    name="${disk##*/}"
    [[ -r "$disk/device/model" && -r "$disk/size" ]] || continue
    model="$(<"$disk/device/model")"
    model="${model%"${model##*[![:space:]]}"}"
    [[ "$model" == "$MODEL_DISK_MODEL" ]] || continue
    [[ "$(<"$disk/size")" == "$want_sectors" ]] || continue
    compgen -G "$disk/$name*/partition" >/dev/null && continue
    printf '%s\n' "$name"
  done
}

if [[ -L "$target" ]]; then
  fail_final "$target is a symbolic link; refusing to mount the model disk through it"
fi
waited=0
while :; do
  mapfile -t disks < <(model_disks)
  [[ ${#disks[@]} -eq 0 ]] || break
  if [[ $waited -ge $MODEL_DISK_WAIT_SECONDS ]]; then
    fail "no ${MODEL_DISK_GB} GiB disk of '$MODEL_DISK_MODEL' attached after ${waited} s; is the stack's model volume attached to this node (pulumi up)?"
  fi
  [[ $waited -gt 0 ]] || status model_disk=waiting
  sleep 5
  waited=$((waited + 5))
done
if [[ ${#disks[@]} -gt 1 ]]; then
  fail_final "${#disks[@]} disks could be the model disk (${disks[*]}); detach all but the stack's model volume"
fi
device="$dev_dir/${disks[0]}"
[[ -b "$device" ]] || fail "$device is not a block device"

if ! mountpoint -q "$target"; then
  filesystem="$(blkid -p -s TYPE -o value "$device" 2>/dev/null || true)"
  if [[ -z "$filesystem" ]]; then
    log "formatting the model disk $device (ext4)"
    # No discard pass: a new volume has nothing to discard, and it would read the whole disk.
    mkfs.ext4 -q -F -m 0 -L llama-models -E nodiscard "$device" ||
      fail "could not format the model disk $device (mkfs.ext4)"
  elif [[ "$filesystem" != ext4 ]]; then
    fail_final "the model disk $device holds a $filesystem file system; the stack's model volume must be blank or ext4"
  fi
  mkdir -p "$target"
  mount -o noatime "$device" "$target" || fail "could not mount the model disk $device on $target"
fi
if [[ -n "${LLAMA_SERVICE_USER:-}" && $EUID -eq 0 ]]; then
  chown "root:$LLAMA_SERVICE_USER" "$target"
  chmod 2750 "$target"
fi
status "model_disk=$device"
log "model disk $device mounted on $target"
