#!/usr/bin/env bash
# demo.sh is berth from nothing to a command run in a real sandbox, on a
# Debian machine with Go: it installs containerd, runc, busybox-static and
# bash-static (scripts/deps.sh), builds the binaries (make build) and the base
# image (scripts/base-image.sh), starts a private containerd
# (scripts/containerd.sh, with its loop-mounted btrfs for disk quotas) and
# berthd on the btrfs snapshotter, then imports the image, creates a sandbox
# with a 100 MiB disk quota, runs a command in it, fills its disk up to the
# quota and removes it. It can be run again and again on the same machine.
#
# Environment:
#   BERTH_DEMO_DIR  working directory for containerd, berthd and their logs
#                   (default /tmp/berth-demo; keep it short: unix sockets)
#   KEEP=1          leave containerd and berthd running at the end (also on
#                   failure) and print how to use and stop them
#
# Layout under BERTH_DEMO_DIR: containerd's files (see containerd.sh),
# berthd.sock, berthd.pid, berthd.log, state-berth/ (agent sockets).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${BERTH_DEMO_DIR:-/tmp/berth-demo}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
ADDR=unix://$DIR/berthd.sock
BERTHD_PID=$DIR/berthd.pid
BERTHD_LOG=$DIR/berthd.log
IMAGE_REF=berth.dev/base:latest
BERTH=("$REPO/bin/berth" --addr "$ADDR")
READY_TIMEOUT=${BERTHD_READY_TIMEOUT:-60}

cd "$REPO"

t_all=$(date +%s%N)
phase_start=0
phase() {
	phase_start=$(date +%s%N)
	printf '\n==> %s\n' "$*"
}
done_phase() {
	local ms=$((($(date +%s%N) - phase_start) / 1000000))
	printf '    (%d.%03ds)\n' $((ms / 1000)) $((ms % 1000))
}

# berthd_pid prints the pid of the berthd this script started, if it runs.
berthd_pid() {
	local p
	[[ -f $BERTHD_PID ]] || return 1
	p=$(<"$BERTHD_PID")
	[[ $p =~ ^[0-9]+$ && -r /proc/$p/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF -- "--listen $ADDR " || return 1
	echo "$p"
}

stop_berthd() {
	local p i
	p=$(berthd_pid) || { rm -f "$BERTHD_PID"; return 0; }
	kill -TERM "$p" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		[[ -d /proc/$p ]] || break
		sleep 0.1
	done
	if [[ -d /proc/$p ]]; then
		echo "berthd (pid $p) still running after 10s: SIGKILL" >&2
		kill -KILL "$p" 2>/dev/null || true
	fi
	rm -f "$BERTHD_PID"
}

cleanup() {
	local rc=$?
	set +e
	if [[ ${KEEP:-0} == 1 ]]; then
		cat <<EOF

KEEP=1: containerd and berthd are still running.
  berthd:      pid $(cat "$BERTHD_PID" 2>/dev/null), log $BERTHD_LOG
  containerd:  $DIR/containerd.sock, log $DIR/containerd.log
Use them (the README's CLI and grpcurl examples work after these two lines):
  export PATH=$REPO/bin:\$PATH BERTH_ADDR=$ADDR
  S=${ADDR#unix://}
  $REPO/bin/berth --addr $ADDR sandbox create --image $IMAGE_REF --id mybox
  $REPO/bin/berth --addr $ADDR exec mybox -- bash -c 'uname -a'
  $REPO/bin/berth --addr $ADDR sandbox rm mybox
  ctr --address $DIR/containerd.sock --namespace berth containers ls
Stop them:
  kill \$(cat $BERTHD_PID); $REPO/scripts/containerd.sh stop $DIR
EOF
		exit "$rc"
	fi
	phase "stop berthd and containerd"
	stop_berthd
	"$REPO/scripts/containerd.sh" stop "$DIR" 2>&1 | sed 's/^/    /'
	done_phase
	local ms=$((($(date +%s%N) - t_all) / 1000000))
	if [[ $rc -eq 0 ]]; then
		printf '\ndemo: done in %d.%03ds\n' $((ms / 1000)) $((ms % 1000))
	else
		printf '\ndemo: FAILED (exit %d) after %d.%03ds; logs: %s, %s\n' "$rc" $((ms / 1000)) $((ms % 1000)) "$BERTHD_LOG" "$DIR/containerd.log" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT

phase "dependencies (scripts/deps.sh)"
scripts/deps.sh
done_phase

phase "build (make build)"
make --no-print-directory build
done_phase

phase "base image (scripts/base-image.sh)"
scripts/base-image.sh
done_phase

phase "private containerd in $DIR"
scripts/containerd.sh start "$DIR" >/dev/null
done_phase

phase "berthd on $ADDR"
stop_berthd # one left by an earlier KEEP=1 run: restart it on the new binary
rm -f "$DIR/berthd.sock"
printf '\n--- %s: demo.sh starts berthd\n' "$(date -Is)" >>"$BERTHD_LOG"
# shellcheck disable=SC2016 # expanded by the inner shell
setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$BERTHD_PID" \
	"$REPO/bin/berthd" \
	--containerd-address "$DIR/containerd.sock" \
	--listen "$ADDR" \
	--agent-binary "$REPO/bin/berth-agent" \
	--snapshotter btrfs \
	--state-dir "$DIR/state-berth" \
	</dev/null >>"$BERTHD_LOG" 2>&1 &
ready=0
for ((i = 0; i < READY_TIMEOUT * 10; i++)); do
	if "${BERTH[@]}" sandbox ls >/dev/null 2>&1; then
		ready=1
		break
	fi
	if ((i > 10)) && ! berthd_pid >/dev/null; then
		echo "berthd exited" >&2
		break
	fi
	sleep 0.1
done
if [[ $ready != 1 ]]; then
	echo "berthd did not answer on $ADDR within ${READY_TIMEOUT}s; last lines of $BERTHD_LOG:" >&2
	tail -n 30 "$BERTHD_LOG" >&2
	exit 1
fi
echo "    berthd pid $(berthd_pid), log $BERTHD_LOG"
done_phase

phase "berth image import build/base.oci.tar"
"${BERTH[@]}" image import build/base.oci.tar
done_phase

phase "berth sandbox create --image $IMAGE_REF --id demo --disk-bytes 104857600"
"${BERTH[@]}" sandbox rm demo >/dev/null 2>&1 || true # left by an earlier run
"${BERTH[@]}" sandbox create --image "$IMAGE_REF" --id demo --disk-bytes 104857600
done_phase

phase "berth exec demo -- bash -c 'echo hello from \$(hostname); uname -a; ls /'"
# shellcheck disable=SC2016 # expanded in the sandbox
"${BERTH[@]}" exec demo -- bash -c 'echo hello from $(hostname); uname -a; ls /'
done_phase

phase "berth exec demo -- sh -c 'dd if=/dev/zero of=/workspace/fill bs=1M count=200; ls -l /workspace/fill'"
# The 100 MiB disk quota stops dd (EDQUOT): the host's disk is out of reach.
"${BERTH[@]}" exec demo -- sh -c 'dd if=/dev/zero of=/workspace/fill bs=1M count=200; ls -l /workspace/fill'
done_phase

phase "berth sandbox rm demo"
"${BERTH[@]}" sandbox rm demo
done_phase
