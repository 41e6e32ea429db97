#!/usr/bin/env bash
# deps.sh installs what berth needs on a Debian (bookworm) machine and skips
# whatever is already there, so running it again costs about a second.
#
#   - containerd, runc (and ctr, which ships with containerd), busybox-static,
#     libarchive-tools (bsdtar: the tar round-trip tests check berth's archives
#     against GNU tar, bsdtar and busybox tar), plus make, git and
#     btrfs-progs (for disk quotas, scripts/btrfs-quota.sh), runsc (gVisor,
#     run through scripts/runsc-berth), and for the sandbox network
#     containernetworking-plugins (CNI bridge, host-local, loopback under
#     /usr/lib/cni), nftables and iproute2, util-linux (setpriv, unshare)
#     and libc-bin (ldd), when missing: apt-get update + apt-get install.
#     The containerd package's systemd unit is not enabled or started; berth's
#     scripts run a private containerd instead (scripts/containerd.sh).
#   - the clients' tools (see the end): protoc, grpc_python_plugin,
#     python3-grpcio, the Python SDK's build and test tools (setuptools,
#     wheel, pip, venv), node, npm and clients/typescript's npm packages.
#   - the web console's: chromium (Debian's; integration/console_test.go
#     drives it headless with chromedp) and server/console's npm packages
#     (xterm.js; scripts/console-assets.sh copies them into the console).
#   - bash-static: the .deb is fetched with `apt-get download` and unpacked
#     with `dpkg-deb -x` into $BERTH_CACHE/bash-static (not installed), for
#     the offline base image (scripts/base-image.sh).
#
# Environment:
#   BERTH_CACHE  cache directory (default: $REPO/.cache, gitignored)
#
# Output: the bash-static tree at $BERTH_CACHE/bash-static, whose
# bin/bash-static is the binary. Needs root (or sudo) only when it installs.
# Go itself is a prerequisite: it fails with a clear message without it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${BERTH_CACHE:-$REPO/.cache}
BASH_STATIC_DIR=$CACHE/bash-static

log() { printf 'deps: %s\n' "$*" >&2; }

SUDO=()
if [[ $EUID -ne 0 ]]; then
	command -v sudo >/dev/null || { log "not root and no sudo: cannot install packages"; exit 1; }
	SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Several checkouts may run this script at once on one machine (parallel
# worktrees): wait for dpkg's lock instead of failing on it.
APT=(apt-get -o DPkg::Lock::Timeout=300)

apt_updated=0
apt_update() {
	if [[ $apt_updated -eq 0 ]]; then
		log "apt-get update"
		"${SUDO[@]}" "${APT[@]}" update -qq
		apt_updated=1
	fi
}

# installed PKG: whether dpkg has PKG installed (a command of the same name
# could come from elsewhere; busybox from the non-static package would not run
# in an image without libc).
installed() {
	[[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

missing=()
command -v containerd >/dev/null && command -v ctr >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
{ [[ -x /bin/busybox ]] && installed busybox-static; } || missing+=(busybox-static)
command -v bsdtar >/dev/null || missing+=(libarchive-tools)
command -v make >/dev/null || missing+=(make)
command -v git >/dev/null || missing+=(git)
# gVisor (runtime "gvisor"): Debian's runsc, run through scripts/runsc-berth.
[[ -x /usr/bin/runsc ]] || missing+=(runsc)
# btrfs-progs formats and manages the quota-enabled btrfs that disk quotas
# need (scripts/btrfs-quota.sh, run by scripts/containerd.sh).
{ command -v mkfs.btrfs >/dev/null && command -v btrfs >/dev/null; } || missing+=(btrfs-progs)
# The sandbox network (network mode EGRESS): the CNI plugins berth drives,
# nft for its rules, ip for the network tests.
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback && -x /usr/lib/cni/bandwidth ]] || missing+=(containernetworking-plugins)
command -v nft >/dev/null || missing+=(nftables)
command -v ip >/dev/null || missing+=(iproute2)
# The deployment artefact tests (integration/deploy_test.go) run berthd
# under setpriv and unshare (util-linux, essential in Debian, but a trimmed
# image may lack them) and list ldd's libraries (libc-bin).
{ command -v setpriv >/dev/null && command -v unshare >/dev/null; } || missing+=(util-linux)
command -v ldd >/dev/null || missing+=(libc-bin)
# make check-launcher rebuilds the agent's native launcher (a static C
# program, agent/launcher/c) to check the committed binary is its source's.
command -v gcc >/dev/null || missing+=(gcc)
installed libc6-dev || missing+=(libc6-dev)
if [[ ${#missing[@]} -gt 0 ]]; then
	apt_update
	# Always the full set, so versions stay consistent with each other.
	pkgs=(containerd runc busybox-static)
	for p in make git libarchive-tools btrfs-progs runsc containernetworking-plugins nftables iproute2 util-linux libc-bin gcc libc6-dev; do
		[[ " ${missing[*]} " == *" $p "* ]] && pkgs+=("$p")
	done
	log "apt-get install ${pkgs[*]} (missing: ${missing[*]})"
	"${SUDO[@]}" "${APT[@]}" install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
else
	log "containerd, runc, busybox-static, libarchive-tools, make, git, btrfs-progs, runsc, containernetworking-plugins, nftables, iproute2, util-linux, libc-bin, gcc, libc6-dev: present"
fi

if [[ -x $BASH_STATIC_DIR/bin/bash-static ]]; then
	log "bash-static: present in $BASH_STATIC_DIR"
else
	mkdir -p "$CACHE"
	tmp=$(mktemp -d "$CACHE/.bash-static.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	# apt-get download drops privileges to _apt when it is root; give _apt a
	# directory it can write so the download is sandboxed (it only warns
	# otherwise).
	mkdir "$tmp/deb"
	if [[ $EUID -eq 0 ]] && id _apt >/dev/null 2>&1; then
		chown _apt "$tmp/deb"
		chmod 0755 "$tmp"
	fi
	download() { (cd "$tmp/deb" && apt-get download -qq bash-static); }
	if ! download 2>/dev/null; then
		# A fresh machine (or an image with its lists removed) has no
		# package lists: update and retry once.
		apt_update
		download
	fi
	deb=$(ls "$tmp"/deb/bash-static_*.deb)
	log "bash-static: unpacking $(basename "$deb")"
	dpkg-deb -x "$deb" "$tmp/tree"
	[[ -x $tmp/tree/bin/bash-static ]] || { log "$deb has no bin/bash-static"; exit 1; }
	rm -rf "$BASH_STATIC_DIR"
	mv "$tmp/tree" "$BASH_STATIC_DIR"
fi

# shellcheck disable=SC2016 # expanded by bash-static
log "$(containerd --version | awk '{print $1, $3}'), $(runc --version | head -1), $("$BASH_STATIC_DIR/bin/bash-static" -c 'echo bash-static $BASH_VERSION')"

# Go is not a Debian package here (bookworm has 1.19; go.mod wants 1.26), so
# it is a prerequisite rather than something this script installs.
if ! command -v go >/dev/null; then
	log "go not found in PATH: install Go $(awk '/^go /{print $2}' "$REPO/go.mod") from https://go.dev/dl/ (Debian's golang is too old)"
	exit 1
fi

# grpcurl drives the server through reflection in the integration tests and
# the README's recipes. It is a Go program: install it from the module proxy.
GRPCURL_VERSION=v1.9.4
gobin=$(go env GOBIN)
[[ -n $gobin ]] || gobin=$(go env GOPATH)/bin
# (grpcurl built by go install reports no version, so presence is the check.)
if [[ -x $gobin/grpcurl ]]; then
	log "grpcurl: present in $gobin"
else
	log "go install grpcurl@$GRPCURL_VERSION (a few minutes on a cold cache)"
	GOFLAGS=-buildvcs=false go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
fi

# The Python and Node clients (clients/, examples/, buf.gen.clients.yaml):
# protoc with its Python generator and grpc_python_plugin, grpcio and
# protobuf for Debian's system python3 (/usr/bin/python3: PyPI is not
# reachable here, so a python of its own would have neither; Debian's
# python3-grpc-tools is NOT used, its libprotoc 3.5 rejects `optional`),
# Node with npm, and the npm packages of clients/typescript (ts-proto,
# TypeScript, @grpc/grpc-js, google-proto-files for google/rpc/*.proto).
client_pkgs=()
command -v protoc >/dev/null || client_pkgs+=(protobuf-compiler)
command -v grpc_python_plugin >/dev/null || client_pkgs+=(protobuf-compiler-grpc)
/usr/bin/python3 -c 'import grpc, google.protobuf' 2>/dev/null || client_pkgs+=(python3 python3-grpcio python3-protobuf)
# The Python SDK's wheel and sdist (scripts/python-sdk.sh: setuptools and
# wheel, no network) and its test that installs the wheel into a venv
# (venv, pip; ensurepip needs python3-venv).
/usr/bin/python3 -c 'import setuptools, wheel, pip, ensurepip, venv' 2>/dev/null ||
	client_pkgs+=(python3-setuptools python3-wheel python3-pip python3-venv)
command -v node >/dev/null || client_pkgs+=(nodejs)
command -v npm >/dev/null || client_pkgs+=(npm)
command -v chromium >/dev/null || client_pkgs+=(chromium)
# The Kubernetes tests (make test-kubernetes): kube-apiserver's store.
command -v etcd >/dev/null || client_pkgs+=(etcd-server)
if [[ ${#client_pkgs[@]} -gt 0 ]]; then
	apt_update
	log "apt-get install ${client_pkgs[*]}"
	"${SUDO[@]}" "${APT[@]}" install -y -qq --no-install-recommends "${client_pkgs[@]}" >/dev/null
else
	log "protoc, grpc_python_plugin, python3-grpcio, python3-setuptools/-wheel/-pip/-venv, node, npm, chromium, etcd: present"
fi
# npm_ci DIR installs DIR's npm packages unless node_modules/.berth-lock,
# the package-lock.json they were installed from, is current.
npm_ci() {
	if cmp -s "$REPO/$1/package-lock.json" "$REPO/$1/node_modules/.berth-lock" 2>/dev/null; then
		log "$1: node_modules current"
	else
		log "npm ci in $1"
		(cd "$REPO/$1" && npm ci --no-audit --no-fund --loglevel=error >/dev/null && cp package-lock.json node_modules/.berth-lock)
	fi
}
npm_ci clients/typescript
npm_ci server/console
