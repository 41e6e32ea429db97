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
# (its entrypoint, with the settings of the Dockerfile's `docker run` line,
# through ctr and runc) against a private containerd (scripts/containerd.sh)
# and a command in a sandbox through it; the command's output is printed
# last, and berthd's log when a step fails. Slow on a fresh machine
# (debootstrap, a cold Go build inside the image): not part of `make test`,
# where integration/deploy_test.go runs berthd with the DaemonSet's
# settings on a root laid out like the image, from the tests' binaries.
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
pod=berthd-img-$$
ctrns=berth-img-pod
ctr_() { ctr --address "$run/c/containerd.sock" --namespace "$ctrns" "$@"; }
# On failure berthd's log is printed first, then everything is undone.
cleanup() {
	local rc=$?
	if ((rc != 0)) && [[ -s $run/berthd.log ]]; then
		echo "container-image: failed (exit $rc); berthd's log:" >&2
		cat "$run/berthd.log" >&2
	fi
	if [[ -S $run/c/containerd.sock ]]; then
		ctr_ task kill --signal SIGKILL "$pod" >/dev/null 2>&1 || true
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			ctr_ task delete --force "$pod" >/dev/null 2>&1 && break
			sleep 0.2
		done
		ctr_ container delete "$pod" >/dev/null 2>&1 || true
	fi
	BERTH_BTRFS=0 scripts/containerd.sh stop "$run/c" >/dev/null 2>&1 || true
	umount -l "$run/state" 2>/dev/null || true
	bh rm "$c" >/dev/null
	rm -rf "$run"
	return "$rc"
}
trap cleanup EXIT
got=$(bh run --isolation chroot "$c" -- /usr/local/bin/berthd --version)
cli=$(bh run --isolation chroot "$c" -- /usr/local/bin/berth version)
agent=$(bh run --isolation chroot "$c" -- /usr/local/lib/berth/berth-agent --version)
echo "container-image: $IMAGE: berthd $got; $cli; berth-agent $agent"
[[ $got == "$VERSION" ]] || { echo "container-image: berthd --version says $got, want $VERSION" >&2; exit 1; }

# berthd from the image, run as the Dockerfile's `docker run` line runs it,
# next to a containerd outside it (a private one, scripts/containerd.sh),
# which also runs berthd's container: ctr run with the image's root file
# system (buildah mount) and what Docker makes of that line:
#   --privileged            all capabilities, no seccomp or AppArmor
#                           profile, the host's devices, no no_new_privs
#   --pid host              the host's pid namespace
#   -v SRC:DST[:rshared]    rbind mounts; rshared also makes the root's
#                           propagation rshared, and Docker wants SRC on a
#                           shared mount, as it is where systemd runs the
#                           host (here: made so)
# and a network namespace of its own. The host paths are this run's:
# containerd's directory (socket and root) for /run/containerd and
# /var/lib/containerd, a state directory for /run/berth (at the same path
# inside, as the real ones; the entrypoint learns them from
# CONTAINERD_ADDRESS and BERTH_STATE_DIR). Not covered: Docker itself
# (its cgroup, its network, its overlay root), a host where / is not shared.
# Then the host's berth CLI imports the base image and runs a command in
# a sandbox through it.
echo "container-image: running berthd from $IMAGE (ctr run, the docker run line's settings) against a private containerd"
scripts/deps.sh 2>/dev/null
scripts/base-image.sh >/dev/null
go build -o "$run/berth" ./cmd/berth
BERTH_BTRFS=0 scripts/containerd.sh start "$run/c" >/dev/null
# Sandboxes run as unprivileged host ids: they must pass through to the
# agent binary in the state directory.
chmod 0711 "$run"
mkdir -p "$run/state"
chmod 0711 "$run/state"
mount --bind "$run/state" "$run/state"
mount --make-shared "$run/state"
rootfs=$(bh mount "$c")
ctr_ run -d --rootfs --log-uri "file://$run/berthd.log" \
	--privileged --allow-new-privs \
	--with-ns "pid:/proc/$$/ns/pid" \
	--mount "type=bind,src=$run/c,dst=$run/c,options=rbind:rprivate" \
	--mount "type=bind,src=$run/c/root,dst=$run/c/root,options=rbind:rprivate" \
	--mount "type=bind,src=$run/state,dst=$run/state,options=rbind:rshared" \
	--rootfs-propagation rshared \
	--env "CONTAINERD_ADDRESS=$run/c/containerd.sock" --env "BERTH_STATE_DIR=$run/state" \
	"$rootfs" "$pod" /usr/local/bin/berthd-entrypoint --namespace "berth-img-$$" --snapshotter overlayfs
berth=("$run/berth" --addr "unix://$run/state/berthd.sock")
for ((i = 0; i < 300; i++)); do
	"${berth[@]}" --rpc-timeout 2s image ls >/dev/null 2>&1 && break
	sleep 0.1
done
"${berth[@]}" image import build/base.oci.tar >/dev/null
out=$("${berth[@]}" run --image berth.dev/base:latest -- sh -c 'echo changed >> /etc/passwd && echo "sandbox ok: $(id -u):$(id -g) in $(uname -n)"')
[[ $out == "sandbox ok: 0:0 in "* ]] || { echo "container-image: a command in a sandbox of the image's berthd printed \"$out\"" >&2; exit 1; }
echo "container-image: berthd from $IMAGE ran a command in a sandbox; it printed:"
echo "$out"
