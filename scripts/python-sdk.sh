#!/usr/bin/env bash
# python-sdk.sh builds berth's Python SDK (clients/python: import berth) into
# a wheel and an sdist with Debian's setuptools and wheel, without the
# network (PyPI is not reachable here): `make python-sdk`.
#
#   scripts/python-sdk.sh [OUTDIR]     default OUTDIR: build/python
#
# The version is berth's, VERSION (as the Makefile passes it: git describe
# --tags --always --dirty) made a PEP 440 version: v1.2.3 -> 1.2.3,
# v1.2.3-4-gabc -> 1.2.3.post4+gabc, a bare commit abc -> 0.0.0+gabc,
# "-dirty" -> +...dirty. It is written into berth/_version.py of a copy of
# clients/python, which is built there, so the source tree stays clean.
# Install with: python3 -m venv --system-site-packages VENV &&
# VENV/bin/pip install --no-index OUTDIR/berth_client-*.whl (the runtime
# dependencies grpcio and protobuf come from Debian's python3-grpcio and
# python3-protobuf; with PyPI reachable plain `pip install` fetches them).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/build/python}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VERSION=${VERSION:-$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo dev)}

pep440() {
	local v=${1#v} local="" dirty=""
	if [[ $v == *-dirty ]]; then dirty=dirty; v=${v%-dirty}; fi
	if [[ $v =~ ^([0-9]+(\.[0-9]+)*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
		v=${BASH_REMATCH[1]}.post${BASH_REMATCH[3]}; local=g${BASH_REMATCH[4]}
	elif [[ $v =~ ^[0-9]+(\.[0-9]+)*$ ]]; then
		:
	elif [[ $v =~ ^[0-9a-f]{4,40}$ ]]; then
		local=g$v; v=0.0.0
	else
		local=$(tr -c 'A-Za-z0-9\n' . <<<"$v"); v=0.0.0
	fi
	local=${local:+$local${dirty:+.$dirty}}
	[[ -z $local && -n $dirty ]] && local=$dirty
	echo "$v${local:++$local}"
}
PYVERSION=$(pep440 "$VERSION")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$REPO/clients/python" --exclude=__pycache__ --exclude=tests -cf - . | tar -C "$work" -xf -
printf '# Written by scripts/python-sdk.sh from berth %s.\n__version__ = "%s"\n' "$VERSION" "$PYVERSION" >"$work/berth/_version.py"
rm -f "$OUT"/berth_client-*
(cd "$work" && /usr/bin/python3 -c '
import sys
from setuptools import build_meta as b
out = sys.argv[1]
print(b.build_sdist(out))
print(b.build_wheel(out))
' "$OUT")
ls -l "$OUT"/berth_client-*
