#!/usr/bin/env bash
# test.sh runs the tests that need root and real parts (make integration):
# dependencies (scripts/deps.sh), the base image (scripts/base-image.sh),
# the TypeScript client the Node example runs, then `go test -count=1` of
# GO_TEST_PKGS with the base image exported as BERTH_TEST_IMAGE.
# Integration tests start their own private containerd (their TestMain), so
# this script starts none. Lint, generated code and breaking changes are
# `make check`; unit tests `make test`.
#
# Environment:
#   BERTH_E2E=1        integration tests fail, not skip, when they cannot
#                      run (set here unless BERTH_E2E=0 is given)
#   GO_TEST_TIMEOUT    go test -timeout (default 45m: the integration package
#                      took 22 min on a quiet 2-core machine)
#   GO_TEST_FLAGS      extra go test flags, e.g. "-run TestExec -v"
#   GO_TEST_PKGS       packages (default ./...)
#
# go test's output is printed as it comes and is the last thing printed; the
# exit status is go test's.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

step() {
	local name=$1 start ms
	shift
	printf '==> %s\n' "$name"
	start=$(date +%s%N)
	"$@"
	ms=$((($(date +%s%N) - start) / 1000000))
	printf '    (%s: %d.%03ds)\n' "$name" $((ms / 1000)) $((ms % 1000))
}

step deps scripts/deps.sh
step base-image scripts/base-image.sh
# The TypeScript client the Node example runs (integration/polyglot_test.go).
step "clients (tsc)" make --no-print-directory clients

export BERTH_TEST_IMAGE=$REPO/build/base.oci.tar
if [[ ${BERTH_E2E:-} != 0 ]]; then
	export BERTH_E2E=1
fi
set -x
# shellcheck disable=SC2086 # GO_TEST_FLAGS and GO_TEST_PKGS are word lists
exec go test -count=1 -timeout "${GO_TEST_TIMEOUT:-45m}" ${GO_TEST_FLAGS:-} ${GO_TEST_PKGS:-./...}
