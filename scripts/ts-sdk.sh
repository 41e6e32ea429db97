#!/usr/bin/env bash
# ts-sdk.sh packs berth's TypeScript SDK (clients/typescript, the npm package
# @berth-sandbox/client) into an npm tarball with its built dist/ and types:
# `make ts-sdk`.
#
#   scripts/ts-sdk.sh [OUTDIR]     default OUTDIR: build/typescript
#
# The version is berth's, VERSION (as the Makefile passes it: git describe
# --tags --always --dirty) made a semver: v1.2.3 -> 1.2.3, v1.2.3-4-gabc ->
# 1.2.4-dev.4+gabc (after 1.2.3, before 1.2.4), a bare commit abc ->
# 0.0.0-dev+gabc, "-dirty" -> +....dirty. It is set in package.json for the
# pack only (the checked-in package.json says 0.0.0-dev). dist/ is built by
# tsc incrementally (`make clients`; unchanged sources take seconds).
# Install with: npm install OUTDIR/berth-sandbox-client-VERSION.tgz
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/build/typescript}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VERSION=${VERSION:-$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo dev)}

semver() {
	local v=${1#v} build="" dirty=""
	if [[ $v == *-dirty ]]; then dirty=dirty; v=${v%-dirty}; fi
	if [[ $v =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)-([0-9]+)-g([0-9a-f]+)$ ]]; then
		v=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.$((BASH_REMATCH[3] + 1))-dev.${BASH_REMATCH[4]}; build=g${BASH_REMATCH[5]}
	elif [[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		:
	elif [[ $v =~ ^[0-9a-f]{4,40}$ ]]; then
		build=g$v; v=0.0.0-dev
	else
		build=$(tr -c 'A-Za-z0-9\n' - <<<"$v"); v=0.0.0-dev
	fi
	build=${build:+$build${dirty:+.$dirty}}
	[[ -z $build && -n $dirty ]] && build=$dirty
	echo "$v${build:++$build}"
}
NPMVERSION=$(semver "$VERSION")

cd "$REPO/clients/typescript"
[[ -d node_modules ]] || npm ci --no-audit --no-fund
cp package.json "$OUT/.package.json.orig"
trap 'cp "$OUT/.package.json.orig" package.json; rm -f "$OUT/.package.json.orig"' EXIT
npm pkg set version="$NPMVERSION"
rm -f "$OUT"/berth-sandbox-client-*.tgz
npm pack --silent --pack-destination "$OUT" >/dev/null
ls -l "$OUT"/berth-sandbox-client-*.tgz
