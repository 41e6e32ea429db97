#!/usr/bin/env bash
# debian-image.sh builds a real Debian root file system with debootstrap
# from Debian's archive, for `make test-debian` (integration/debian_test.go):
# bookworm, variant minbase, with python3, git and iputils-ping. It installs
# debootstrap when missing and keeps the tree in the cache: a second run
# costs nothing (FORCE=1 rebuilds). A first run downloads about 60 MB and
# takes 2-3 minutes.
#
# The tree is what `berth image import --name REF DIR` turns into an image
# in one command (the README's recipe); the test does exactly that.
#
# Environment:
#   BERTH_CACHE    cache directory (default: $REPO/.cache)
#   DEBIAN_MIRROR  archive to bootstrap from (default: http://deb.debian.org/debian)
#   FORCE=1        rebuild the tree
#
# With the argument "matplotlib" it builds a variant for the code-context
# tests (docs/contexts.md): a copy of the plain tree with
# python3-matplotlib added (chroot apt-get install), cached beside it in
# $BERTH_CACHE/debian-root-matplotlib; the plain tree, which the create
# benchmarks use, is not changed.
#
# Output: the tree's path on stdout ($BERTH_CACHE/debian-root). Needs root.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${BERTH_CACHE:-$REPO/.cache}
ROOT=$CACHE/debian-root
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { printf 'debian-image: %s\n' "$*" >&2; }

[[ $EUID -eq 0 ]] || { log "debootstrap needs root"; exit 1; }
if [[ ${1:-} == matplotlib ]]; then
	BASE=$(FORCE=0 "$0")
	VAR=$CACHE/debian-root-matplotlib
	if [[ ${FORCE:-0} != 1 && -f $VAR/.berth-complete ]]; then
		log "$VAR is built (FORCE=1 rebuilds)"
		echo "$VAR"
		exit 0
	fi
	rm -rf "$VAR" "$VAR.tmp"
	start=$(date +%s)
	cp -a "$BASE" "$VAR.tmp"
	rm -f "$VAR.tmp/.berth-complete"
	cp /etc/resolv.conf "$VAR.tmp/etc/resolv.conf"
	log "chroot apt-get install python3-matplotlib"
	{
		chroot "$VAR.tmp" apt-get -o DPkg::Lock::Timeout=300 update -qq &&
			DEBIAN_FRONTEND=noninteractive chroot "$VAR.tmp" apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends python3-matplotlib
	} >"$CACHE/debian-matplotlib.log" 2>&1 || { tail -20 "$CACHE/debian-matplotlib.log" >&2; exit 1; }
	rm -rf "$VAR.tmp"/var/cache/apt/archives/*.deb "$VAR.tmp"/var/lib/apt/lists/*
	touch "$VAR.tmp/.berth-complete"
	mv "$VAR.tmp" "$VAR"
	log "$VAR: $(du -sh "$VAR" | cut -f1) in $(($(date +%s) - start))s"
	echo "$VAR"
	exit 0
fi
if ! command -v debootstrap >/dev/null; then
	log "apt-get install debootstrap"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=300 update -qq
	apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends debootstrap >/dev/null
fi
if [[ ${FORCE:-0} != 1 && -x $ROOT/usr/bin/python3 && -x $ROOT/usr/bin/git && -f $ROOT/.berth-complete ]]; then
	log "$ROOT is built (FORCE=1 rebuilds)"
	echo "$ROOT"
	exit 0
fi
mkdir -p "$CACHE"
rm -rf "$ROOT" "$ROOT.tmp"
start=$(date +%s)
log "debootstrap --variant=minbase --include=python3,git,iputils-ping bookworm ($MIRROR)"
debootstrap --variant=minbase --include=python3,git,iputils-ping bookworm "$ROOT.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
	{ tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
# Nothing of the build host's package cache is wanted in an image.
rm -rf "$ROOT.tmp"/var/cache/apt/archives/*.deb "$ROOT.tmp"/var/lib/apt/lists/*
touch "$ROOT.tmp/.berth-complete"
mv "$ROOT.tmp" "$ROOT"
log "$ROOT: $(du -sh "$ROOT" | cut -f1) in $(($(date +%s) - start))s"
echo "$ROOT"
