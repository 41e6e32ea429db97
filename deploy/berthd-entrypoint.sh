#!/bin/sh
# Entrypoint of the berth image (see the Dockerfile): puts the agent where
# the host's containerd can find it, then runs berthd with any extra
# arguments.
#
# containerd runs on the host and bind-mounts the agent binary into each
# sandbox by its HOST path, so the agent must be in the state directory,
# which is a bind mount of the same host path (/run/berth by default).
set -eu
state=${BERTH_STATE_DIR:-/run/berth}
mkdir -p "$state/bin"
# A new file renamed over the old one: running sandboxes keep the agent
# they started with. cp, chmod and mv rather than install(1), so that the
# script also runs with busybox (the artefact test's root file system,
# integration/deploy_test.go).
cp /usr/local/lib/berth/berth-agent "$state/bin/berth-agent.new"
chmod 0755 "$state/bin/berth-agent.new"
mv -f "$state/bin/berth-agent.new" "$state/bin/berth-agent"
exec /usr/local/bin/berthd \
	--containerd-address "${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}" \
	--state-dir "$state" \
	--agent-binary "$state/bin/berth-agent" \
	--listen "${BERTH_LISTEN:-unix://$state/berthd.sock}" \
	"$@"
