#!/usr/bin/env bash
# demo.sh is berth from nothing to a command run in a real sandbox, on a
# Debian machine with Go: it installs containerd, runc, busybox-static and
# bash-static (scripts/deps.sh), builds the binaries (make build) and the base
# image (scripts/base-image.sh), starts a private containerd
# (scripts/containerd.sh, with its loop-mounted btrfs for disk quotas) and
# berthd on the btrfs snapshotter, then imports the image, creates a sandbox
# with a 100 MiB disk quota, runs a command in it, fills its disk up to the
# quota and removes it. It can be run again and again on the same machine,
# and demos in different BERTH_DEMO_DIRs can run at once: each berthd gets a
# sandbox network of its own (bridge and nftables tables, IPv4 /24), which the
# demo removes at the end.
#
# Environment:
#   BERTH_DEMO_DIR  working directory for containerd, berthd and their logs
#                   (default /tmp/berth-demo; keep it short: unix sockets)
#   KEEP=1          leave containerd and berthd running at the end (also on
#                   failure) and print how to use and stop them
#   BERTHD_FLAGS    more berthd flags, split at spaces (e.g. "--console
#                   --default-disk-bytes 2147483648"; a later flag wins)
#
# Layout under BERTH_DEMO_DIR: containerd's files (see containerd.sh),
# berthd.sock, berthd.pid, berthd.log, state-berth/ (agent sockets, net/).
#
# Host state outside it: runc's under /run/containerd/runc/berth-demo-HHHHHHHH
# (berthd's containerd namespace; HHHHHHHH: the first 8 hex digits of the
# SHA-256 of the demo dir's absolute path), the bridge bdemoHHHHHHHH with the first
# address of a free 10.X.Y.0/24 (X in 200-249 and Y from the same hash, the
# next free /24 when a route or address of another interface overlaps it),
# and berthd's nftables tables inet and bridge berth-bdemoHHHHHHHH. They are
# removed at the end unless KEEP=1; another berthd's (berth0, berth-berth0)
# are never touched.
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
# The quota of a sandbox created without one. The demo's btrfs pool is
# 20 GiB (btrfs-quota.sh) and berthd admits quotas summing to the pool's
# size (--disk-overcommit 1): with berthd's own default of 10 GiB, a third
# sandbox of the README's walk-through was refused (FLEET_BUSY, DISK).
DEFAULT_DISK_BYTES=1073741824 # 1 GiB: 20 sandboxes at once
HASH=$(printf %s "$DIR" | sha256sum | cut -c1-8)
BRIDGE=bdemo$HASH # 13 characters: interface names have at most 15
# runc keeps its containers' state by namespace and id on the host
# (/run/containerd/runc/NAMESPACE/ID), whichever containerd runs them: two
# demos both creating sandbox "demo" in one namespace collide there.
NAMESPACE=berth-demo-$HASH

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

# ip4 prints the IPv4 address $1 (a.b.c.d) as a number.
ip4() {
	local a b c d
	IFS=. read -r a b c d <<<"$1"
	echo $(((a << 24) | (b << 16) | (c << 8) | d))
}

# overlaps says whether the IPv4 prefixes $1 and $2 (a.b.c.d/n; a bare
# address is a /32) share an address.
overlaps() {
	local a=${1%/*} b=${2%/*} la=32 lb=32 m mask
	[[ $1 == */* ]] && la=${1#*/}
	[[ $2 == */* ]] && lb=${2#*/}
	m=$((la < lb ? la : lb))
	mask=$(((0xffffffff << (32 - m)) & 0xffffffff))
	(((($(ip4 "$a") ^ $(ip4 "$b")) & mask) == 0))
}

# pick_subnet prints the demo's IPv4 /24: the one its bridge has when it
# exists (left by a KEEP=1 run), else the first 10.X.Y.0/24 from the hash on
# that no route or address of another interface overlaps.
pick_subnet() {
	local cur x y k net dst used=()
	cur=$(ip -4 -o addr show dev "$BRIDGE" 2>/dev/null | awk '{print $4; exit}') || true
	if [[ $cur =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.[0-9]+/24$ ]]; then
		echo "${BASH_REMATCH[1]}.0/24"
		return
	fi
	# Every destination routed via another interface; addresses appear in
	# the local table. "default" overlaps everything and is no clash.
	while read -r dst; do
		[[ $dst =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(/[0-9]+)?$ ]] && used+=("$dst")
	done < <(ip -4 route show table all | awk -v br="$BRIDGE" '
		{ d = $1; if (d ~ /^(local|broadcast|unicast|anycast|multicast|blackhole|unreachable|prohibit|throw|nat)$/) d = $2
		  for (i = 1; i < NF; i++) if ($i == "dev" && $(i + 1) == br) next
		  print d }')
	x=$((200 + 16#${HASH:0:2} % 50))
	y=$((16#${HASH:2:2}))
	for ((k = 0; k < 256; k++)); do
		net=10.$x.$(((y + k) % 256)).0/24
		for dst in "${used[@]}"; do
			overlaps "$net" "$dst" && continue 2
		done
		echo "$net"
		return
	done
	echo "no free 10.$x.Y.0/24 for the demo's sandbox network" >&2
	return 1
}

# remove_network deletes the demo's bridge and its two nftables tables, and
# nothing else (berthd keeps them on exit for the sandboxes it re-adopts).
remove_network() {
	local fam
	for fam in inet bridge; do
		if nft list table "$fam" "berth-$BRIDGE" >/dev/null 2>&1; then
			nft delete table "$fam" "berth-$BRIDGE"
		fi
	done
	if ip link show dev "$BRIDGE" >/dev/null 2>&1; then
		ip link delete dev "$BRIDGE"
	fi
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
  network:     bridge $BRIDGE (${SUBNET:-not set up}), nft tables inet and bridge berth-$BRIDGE
Use them (the README's CLI and grpcurl examples work after these two lines):
  export PATH=$REPO/bin:\$(go env GOPATH)/bin:\$PATH BERTH_ADDR=$ADDR
  S=${ADDR#unix://}
  $REPO/bin/berth --addr $ADDR sandbox create --image $IMAGE_REF --id mybox
  $REPO/bin/berth --addr $ADDR exec mybox -- bash -c 'uname -a'
  $REPO/bin/berth --addr $ADDR sandbox rm mybox
  ctr --address $DIR/containerd.sock --namespace $NAMESPACE containers ls
Stop them and remove the network:
  kill \$(cat $BERTHD_PID); $REPO/scripts/containerd.sh stop $DIR
  nft delete table inet berth-$BRIDGE; nft delete table bridge berth-$BRIDGE; ip link delete $BRIDGE
EOF
		exit "$rc"
	fi
	phase "stop berthd and containerd, remove bridge $BRIDGE and its nftables tables"
	stop_berthd
	"$REPO/scripts/containerd.sh" stop "$DIR" 2>&1 | sed 's/^/    /'
	remove_network 2>&1 | sed 's/^/    /'
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

stop_berthd # one left by an earlier KEEP=1 run: restart it on the new binary
read -ra EXTRA_FLAGS <<<"${BERTHD_FLAGS:-}"
SUBNET=$(pick_subnet)
phase "berthd on $ADDR, sandbox network $BRIDGE $SUBNET"
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
	--namespace "$NAMESPACE" \
	--network-bridge "$BRIDGE" \
	--network-subnet "$SUBNET" \
	--default-disk-bytes "$DEFAULT_DISK_BYTES" \
	"${EXTRA_FLAGS[@]}" \
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
