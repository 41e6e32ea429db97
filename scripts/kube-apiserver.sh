#!/usr/bin/env bash
# kube-apiserver.sh builds a real kube-apiserver from the Go module proxy,
# for the Kubernetes tests (kubernetes/integration, `make test-kubernetes`):
# a throwaway module that requires k8s.io/kubernetes $K8S_VERSION, with a
# replace for every staging module that its go.mod requires at v0.0.0 (the
# same release, v0.X.Y for v1.X.Y), then `go build
# k8s.io/kubernetes/cmd/kube-apiserver`. The binary is kept in the cache: a
# second run costs nothing (FORCE=1 rebuilds). A first run takes about 5
# minutes of two cores and downloads the modules once (Go's module cache).
#
# Environment:
#   BERTH_CACHE   cache directory (default: $REPO/.cache)
#   K8S_VERSION   the release to build (default: v1.37.2)
#   FORCE=1       rebuild
#
# Output: the binary's path on stdout ($BERTH_CACHE/kube-apiserver-$K8S_VERSION).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${BERTH_CACHE:-$REPO/.cache}
VERSION=${K8S_VERSION:-v1.37.2}
BIN=$CACHE/kube-apiserver-$VERSION
GO=${GO:-go}

log() { printf 'kube-apiserver: %s\n' "$*" >&2; }

if [[ ${FORCE:-0} != 1 && -x $BIN ]]; then
	log "$BIN is built (FORCE=1 rebuilds)"
	echo "$BIN"
	exit 0
fi
mkdir -p "$CACHE"
mod=$(mktemp -d)
trap 'rm -rf "$mod"' EXIT
start=$(date +%s)
staging=v0.${VERSION#v1.}
cd "$mod"
# GOFLAGS=-mod=mod lets go get and go build write go.mod and go.sum here.
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
"$GO" mod init berth.local/kube-apiserver >/dev/null 2>&1
gomod=$("$GO" mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[[ -f $gomod ]] || { log "no go.mod of k8s.io/kubernetes@$VERSION in the module cache"; exit 1; }
# Each staging module (k8s.io/api, k8s.io/apiserver, ...) is required at
# v0.0.0 and replaced by ./staging/... in Kubernetes' own tree; here by its
# published release.
replaces=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u)
[[ -n $replaces ]] || { log "k8s.io/kubernetes@$VERSION requires no staging module at v0.0.0"; exit 1; }
for m in $replaces; do
	"$GO" mod edit -replace "$m=$m@$staging"
done
"$GO" mod edit -require "k8s.io/kubernetes@$VERSION"
log "go get k8s.io/kubernetes/cmd/kube-apiserver@$VERSION (staging modules at $staging)"
"$GO" get "k8s.io/kubernetes/cmd/kube-apiserver@$VERSION" >&2
log "go build (about 5 minutes of two cores)"
"$GO" build -trimpath -o "$BIN.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$BIN.tmp" "$BIN"
log "$BIN: $(du -sh "$BIN" | cut -f1) in $(($(date +%s) - start))s"
echo "$BIN"
