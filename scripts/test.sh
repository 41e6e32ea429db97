#!/usr/bin/env bash
# test.sh runs everything CI checks: dependencies (scripts/deps.sh), the base
# image (scripts/base-image.sh), `make check-generated`, `buf lint`, then
# `go test -count=1 ./...` with the base image exported as BERTH_TEST_IMAGE.
# Integration tests start their own private containerd (their TestMain), so
# this script starts none.
#
# Environment:
#   BERTH_E2E=1        passed through: integration tests fail, not skip,
#                      when they cannot run (.ci/run sets it)
#   GO_TEST_TIMEOUT    go test -timeout (default 30m)
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
step check-generated make --no-print-directory check-generated
step "buf lint" go tool -modfile=tools.go.mod buf lint
# The API must stay wire- and JSON-compatible with the commit in
# proto/BREAKING_BASELINE (the first landed v1). Moving the baseline is a
# deliberate, reviewed act.
step "buf breaking" go tool -modfile=tools.go.mod buf breaking --against ".git#ref=$(cat proto/BREAKING_BASELINE)"

# The TypeScript client the Node example runs (integration/polyglot_test.go).
step "clients (tsc)" make --no-print-directory clients

export BERTH_TEST_IMAGE=$REPO/build/base.oci.tar
if [[ -n ${BERTH_E2E:-} ]]; then
	export BERTH_E2E
fi
set -x
# shellcheck disable=SC2086 # GO_TEST_FLAGS and GO_TEST_PKGS are word lists
exec go test -count=1 -timeout "${GO_TEST_TIMEOUT:-30m}" ${GO_TEST_FLAGS:-} ${GO_TEST_PKGS:-./...}
