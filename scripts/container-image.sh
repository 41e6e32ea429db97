#!/usr/bin/env bash
# container-image.sh builds the repository's Dockerfile without a Docker
# engine or a registry (= make container-image): with Debian's buildah, vfs
# storage and chroot isolation, in a private storage directory. The
# Dockerfile's bases (golang:1.26, debian:bookworm-slim) cannot be pulled
# here, so they are made locally first under those names:
#   debian:bookworm-slim  a debootstrap --variant=minbase bookworm root
#   golang:1.26           that root plus this machine's Go toolchain
#                         (go env GOROOT) in /usr/local/go and the host's
#                         CA bundle
# Then it builds the image, runs `berthd --version`, `berth version` and
# `berth-agent --version` in it, and finally runs berthd from the image
# against a private containerd (scripts/containerd.sh) and a command in a
# sandbox through it. Slow on a fresh machine (debootstrap, a cold Go
# build inside the image): not part of `make test`.
#
# Environment:
#   BERTH_BUILDAH_DIR  storage, run and cache directory (default /tmp/berth-buildah)
#   VERSION            the version built in (default: git describe)
#   IMAGE              the image name (default berth:$VERSION)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
DIR=${BERTH_BUILDAH_DIR:-/tmp/berth-buildah}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
IMAGE=${IMAGE:-berth:$VERSION}
GO_VERSION=1.26

need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$DIR"
bh() { buildah --root "$DIR/root" --runroot "$DIR/run" --storage-driver vfs "$@"; }

have() { bh inspect --type image "$1" >/dev/null 2>&1; }

if ! have docker.io/library/debian:bookworm-slim; then
	echo "container-image: making debian:bookworm-slim (debootstrap minbase)"
	if [[ ! -x $DIR/debian/bin/sh ]]; then
		rm -rf "$DIR/debian"
		debootstrap --variant=minbase bookworm "$DIR/debian" "$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || echo http://deb.debian.org/debian)" >"$DIR/debootstrap.log"
		rm -rf "$DIR/debian/var/cache/apt/archives/"*.deb
	fi
	c=$(bh from scratch)
	bh copy "$c" "$DIR/debian" / >/dev/null
	bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
	bh commit -q --rm "$c" docker.io/library/debian:bookworm-slim >/dev/null
fi
if ! have "docker.io/library/golang:$GO_VERSION"; then
	echo "container-image: making golang:$GO_VERSION (debian + $(go env GOVERSION))"
	c=$(bh from docker.io/library/debian:bookworm-slim)
	bh copy "$c" "$(go env GOROOT)" /usr/local/go >/dev/null
	# The real golang image has ca-certificates; this one gets the host's
	# bundle, which also holds any CA that the host's way to the module
	# proxy needs (go mod download in the Dockerfile verifies TLS).
	bh copy "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
	bh config --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--env GOPATH=/go --env GOTOOLCHAIN=local --env "GOPROXY=$(go env GOPROXY)" "$c"
	bh commit -q --rm "$c" "docker.io/library/golang:$GO_VERSION" >/dev/null
fi

echo "container-image: building $IMAGE"
# Go's module and build caches live in $DIR between runs (mounted into the
# build's RUN steps only; the image does not keep them).
mkdir -p "$DIR/gomod" "$DIR/gocache"
bh bud --isolation chroot --layers=false --build-arg "VERSION=$VERSION" --build-arg "GO_VERSION=$GO_VERSION" \
	-v "$DIR/gomod:/go/pkg/mod" -v "$DIR/gocache:/root/.cache/go-build" -t "$IMAGE" .

c=$(bh from "$IMAGE")
run=$(mktemp -d /tmp/berth-img.XXXXXX) # short: unix socket paths
cleanup() {
	local pid
	for pid in $(pgrep -f -- "--state-dir $run/state " || true); do kill "$pid" 2>/dev/null || true; done
	BERTH_BTRFS=0 scripts/containerd.sh stop "$run/c" >/dev/null 2>&1 || true
	bh rm "$c" >/dev/null
	rm -rf "$run"
}
trap cleanup EXIT
got=$(bh run --isolation chroot "$c" -- /usr/local/bin/berthd --version)
cli=$(bh run --isolation chroot "$c" -- /usr/local/bin/berth version)
agent=$(bh run --isolation chroot "$c" -- /usr/local/lib/berth/berth-agent --version)
echo "container-image: $IMAGE: berthd $got; $cli; berth-agent $agent"
[[ $got == "$VERSION" ]] || { echo "container-image: berthd --version says $got, want $VERSION" >&2; exit 1; }

# berthd from the image as the Dockerfile's header runs it, next to a
# containerd outside it (a private one, scripts/containerd.sh) with the
# state directory mounted at the same path; then the host's berth CLI
# imports the base image and runs a command in a sandbox through it.
echo "container-image: running berthd from $IMAGE against a private containerd"
scripts/deps.sh 2>/dev/null
scripts/base-image.sh >/dev/null
go build -o "$run/berth" ./cmd/berth
BERTH_BTRFS=0 scripts/containerd.sh start "$run/c" >/dev/null
mkdir -p "$run/state"
bh run --isolation chroot -v "$run:$run" -e "CONTAINERD_ADDRESS=$run/c/containerd.sock" -e "BERTH_STATE_DIR=$run/state" "$c" -- \
	/usr/local/bin/berthd-entrypoint --namespace "berth-img-$$" --snapshotter overlayfs >"$run/berthd.log" 2>&1 &
berth=("$run/berth" --addr "unix://$run/state/berthd.sock")
for ((i = 0; i < 300; i++)); do
	[[ -S $run/state/berthd.sock ]] && break
	sleep 0.1
done
"${berth[@]}" image import build/base.oci.tar >/dev/null
out=$("${berth[@]}" run --image berth.dev/base:latest -- sh -c 'echo sandbox ok')
[[ $out == "sandbox ok" ]] || { echo "container-image: a command in a sandbox of the image's berthd printed \"$out\"; berthd's log:" >&2; cat "$run/berthd.log" >&2; exit 1; }
echo "container-image: berthd from $IMAGE ran a command in a sandbox"
