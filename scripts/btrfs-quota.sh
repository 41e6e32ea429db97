#!/usr/bin/env bash
# btrfs-quota.sh prepares the file system that berthd's per-sandbox disk
# quotas (resources.disk_bytes) need: a btrfs with quotas enabled, for
# containerd's btrfs snapshotter. Every sandbox's writable layer is then a
# btrfs subvolume, and berthd limits that subvolume's quota group (qgroup)
# to the sandbox's disk_bytes.
#
# Usage: scripts/btrfs-quota.sh up|down|status DIR [SIZE]
#
#   up      makes DIR a mounted btrfs with quotas enabled; idempotent:
#           - DIR is already a btrfs mount (say a disk you formatted with
#             mkfs.btrfs and mounted there): quotas are enabled if they are
#             off; nothing else changes.
#           - otherwise DIR is backed by an image file, $BTRFS_IMAGE
#             (default DIR.img, beside DIR), created sparse with SIZE
#             (default 20G; host disk is used only as data is written) and
#             formatted when it does not exist, then loop-mounted at DIR.
#             `mount -o loop` takes a free loop device and releases it at
#             unmount, so runs side by side on one machine (each with its
#             own DIR) never share or leak one.
#           In both cases DIR/metadata.db, where containerd's btrfs
#           snapshotter keeps its record of snapshots, becomes a symlink to
#           $BTRFS_METADATA (default DIR.metadata.db, beside DIR, off the
#           pool): on a pool a sandbox filled, a record on the pool could
#           not be written (ENOSPC), so deleting the sandbox freed nothing
#           (docs/disk-quotas.md). An existing metadata.db is moved there
#           unless containerd holds it (then: stop containerd, run up).
#           Its last stdout line is DIR.
#   down    unmounts DIR (lazily when it is busy), which frees its loop
#           device; the image file stays, so `up` mounts the same data again.
#   status  prints the file system, whether quotas are on, and the image;
#           exits 0 when DIR is a btrfs with quotas, 3 when not.
#
# Then point containerd's btrfs snapshotter at DIR (config.toml, version 2):
#
#   [plugins."io.containerd.snapshotter.v1.btrfs"]
#     root_path = "DIR"
#
# and start berthd with --snapshotter btrfs. A loop mount does not survive a
# reboot: run `up` again before containerd starts (or add
# "DIR.img DIR btrfs loop,nosuid,nodev 0 0" to /etc/fstab). Quotas, once enabled, are
# kept by the file system. Needs root and btrfs-progs (scripts/deps.sh
# installs it).
set -euo pipefail

usage() { echo "usage: $0 up|down|status DIR [SIZE]" >&2; exit 2; }
[[ $# -ge 2 && $# -le 3 ]] || usage
cmd=$1
DIR=$2
SIZE=${3:-20G}

log() { printf 'btrfs-quota.sh: %s\n' "$*" >&2; }

for tool in btrfs mkfs.btrfs findmnt; do
	command -v "$tool" >/dev/null || { log "$tool not found: install btrfs-progs (scripts/deps.sh)"; exit 1; }
done

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
IMAGE=${BTRFS_IMAGE:-$DIR.img}
METADATA=${BTRFS_METADATA:-$DIR.metadata.db}

# fstype prints the type of the file system mounted exactly at DIR, or
# nothing when DIR is not a mount point.
fstype() { findmnt -n -o FSTYPE --mountpoint "$DIR" 2>/dev/null | tail -1 || true; }

# quotas_on reports whether quotas are enabled on DIR's btrfs (qgroup show
# fails with "quotas not enabled" otherwise).
quotas_on() { btrfs qgroup show "$DIR" >/dev/null 2>&1; }

up() {
	local t
	t=$(fstype)
	if [[ -z $t ]]; then
		if [[ ! -e $IMAGE ]]; then
			log "creating $IMAGE ($SIZE, sparse) with a btrfs"
			truncate -s "$SIZE" "$IMAGE.tmp"
			mkfs.btrfs -q "$IMAGE.tmp" >/dev/null
			mv "$IMAGE.tmp" "$IMAGE"
		fi
		# nosuid,nodev: on an idmapped btrfs root a sandbox's files are
		# stored under its own ids (its root's setuid copy of bash is a
		# setuid-root file here). Sandboxes mount their subvolumes anew,
		# with flags of their own; this mount of the whole is the host's.
		mount -o loop,nosuid,nodev "$IMAGE" "$DIR"
		log "mounted $IMAGE at $DIR ($(findmnt -n -o SOURCE --mountpoint "$DIR" | tail -1))"
		t=$(fstype)
	fi
	if [[ $t != btrfs ]]; then
		log "$DIR is a $t mount, not btrfs: unmount it or choose another directory"
		exit 1
	fi
	if ! quotas_on; then
		log "enabling quotas on $DIR"
		btrfs quota enable "$DIR"
		# Account what is there already before limits are relied on.
		btrfs quota rescan -w "$DIR" >/dev/null
	fi
	metadata_off_pool
	echo "$DIR"
}

# metadata_off_pool makes DIR/metadata.db, the btrfs snapshotter's bolt
# database, a symlink to $METADATA on another file system. containerd
# opens it through the link (and creates $METADATA when it is missing).
metadata_off_pool() {
	local db=$DIR/metadata.db
	if [[ -L $db ]]; then
		return 0 # placed already (berthd warns at start if it is on the pool)
	fi
	mkdir -p "$(dirname "$METADATA")"
	if [[ $(stat -f -c %i "$(dirname "$METADATA")") == $(stat -f -c %i "$DIR") ]]; then
		log "BTRFS_METADATA=$METADATA is on the pool itself: choose a path on another file system"
		exit 1
	fi
	if [[ -e $db ]]; then
		# bolt holds an exclusive flock on its file while containerd runs.
		if ! flock -n -E 75 "$db" true; then
			log "WARNING: containerd holds $db on the pool: stop containerd and run up again to move it to $METADATA; until then deleting a sandbox on a full pool may free nothing"
			return 0
		fi
		if [[ -e $METADATA ]]; then
			log "both $db and $METADATA exist: keep the one containerd used last, remove the other, and run up again"
			exit 1
		fi
		mv "$db" "$METADATA"
		log "moved the btrfs snapshotter's metadata.db off the pool to $METADATA"
	fi
	ln -s "$METADATA" "$db"
}

down() {
	local i
	if [[ -z $(fstype) ]]; then
		log "$DIR is not mounted"
		return 0
	fi
	for ((i = 0; i < 20; i++)); do
		if umount "$DIR" 2>/dev/null; then
			log "unmounted $DIR"
			return 0
		fi
		sleep 0.1
	done
	umount -l "$DIR"
	log "$DIR was busy: detached it (lazy unmount); its loop device is freed when the last user leaves"
}

status() {
	local t
	t=$(fstype)
	if [[ $t == btrfs ]] && quotas_on; then
		echo "btrfs with quotas at $DIR ($(findmnt -n -o SOURCE --mountpoint "$DIR" | tail -1))"
		return 0
	fi
	if [[ $t == btrfs ]]; then
		echo "btrfs without quotas at $DIR"
	elif [[ -n $t ]]; then
		echo "$t (not btrfs) at $DIR"
	else
		echo "not mounted: $DIR (image: $IMAGE$([[ -e $IMAGE ]] || echo ', missing'))"
	fi
	return 3
}

case $cmd in
up) up ;;
down) down ;;
status) status ;;
*) usage ;;
esac
