#!/usr/bin/env bash
# bench.sh measures berth beside its anchors in one run on this machine and
# prints one table (berth, anchor, ratio, the issue's target): Exec stdout
# throughput beside containerd's task.Exec with a FIFO and a host pipe,
# and StartExec over Connect (HTTP/1.1) beside Exec over gRPC;
# ReadFile, WriteFile, `berth cp`, Download and Upload of 128 MiB beside
# host cp, cp && sync, tar; exec round trip (p50, p99) beside containerd's
# task.Exec and fork+exec on the host, and under gVisor beside fork+exec
# timed inside the gVisor sandbox; 50 sandboxes x 10 concurrent Run(true)
# loops beside 500 host fork+exec loops (execs/s, refusals); a 256 MiB HTTP GET through
# PortForward and `berth port-forward` beside a direct connection in the
# sandbox's network namespace; a gVisor sandbox's HibernateSandbox keeping
# 100 MiB of memory (checkpoint) and the Exec that restores it beside a
# hibernation whose checkpoint fails (processes ended) and its wake; CreateSnapshot of a sandbox with 256 MiB
# written beside `btrfs subvolume snapshot -r` and `cp -a --reflink=never`
# of the same data, create to first exec from that snapshot beside a
# cold create, and CommitSnapshot of it beside `tar c | gzip` of the data;
# ForkSandbox of 1 and of 10 children of a sandbox with 1 GiB
# written beside a cold CreateSandbox and `cp -a --reflink=never` of the
# same data; create to first exec beside `ctr run --rm`,
# for the base image and for a real Debian image (scripts/debian-image.sh,
# built once into the cache), cold and from a warm pool, with the disk each
# Debian sandbox takes. It is integration.BenchmarkSideBySide: go test -bench
# with the integration tests' TestMain, which starts a private containerd
# (or uses BERTH_CONTAINERD_ADDRESS) and builds the real agent and CLI.
# `make bench` runs it. BENCHMARKS.md says what each side does.
#
# Environment:
#   BENCH        sub-benchmarks to run, a go test -bench pattern
#                (default SideBySide; e.g. SideBySide/stdout, SideBySide/portforward)
#   BENCH_COUNT  runs of each sub-benchmark; the table shows the median
#                (default 1)
#   BENCH_TIME   go test -benchtime per sub-benchmark (default 2s)
#   BERTH_BENCH_STDOUT_BYTES  bytes the stdout benchmarks stream
#                (default 268435456)
#   BERTH_BENCH_FORK_BYTES  bytes the fork group's parent has written
#                (default 1073741824)
#   BERTH_SNAPSHOTTER  the sandboxes' snapshotter, as for the integration
#                tests (default btrfs with quotas; overlayfs puts sandbox
#                and host files on containerd's root file system)
#   BERTH_BENCH_CONCURRENT_SANDBOXES, BERTH_BENCH_CONCURRENT_LOOPS,
#   BERTH_BENCH_CONCURRENT_SECONDS  the concurrent group's sandboxes
#                (default 50), Run loops per sandbox (10) and window (20 s)
#   GO_TEST_FLAGS  extra go test flags, e.g. -cpuprofile cpu.out
#
# The go test output comes first, then the table; the exit status is go
# test's.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

scripts/deps.sh >/dev/null
scripts/base-image.sh >/dev/null
export BERTH_TEST_IMAGE=$REPO/build/base.oci.tar
BERTH_DEBIAN_ROOT=$(scripts/debian-image.sh)
export BERTH_DEBIAN_ROOT
# A benchmark that cannot run fails instead of skipping.
export BERTH_E2E=1
# shellcheck disable=SC2086 # GO_TEST_FLAGS is a word list
exec go test -count="${BENCH_COUNT:-1}" -run '^$' -bench "${BENCH:-SideBySide}" \
	-benchtime "${BENCH_TIME:-2s}" -timeout 60m ${GO_TEST_FLAGS:-} ./integration/
