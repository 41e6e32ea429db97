# syntax=docker/dockerfile:1
#
# berthd, berth-agent and the berth CLI in one image, for running berthd next
# to a node's containerd (for example as a Kubernetes DaemonSet).
#
# NOTE: this file has not been built: the machine it was written on has no
# Docker engine and no registry access. It is written to be correct; build it
# with BuildKit (docker build . / docker buildx build .).
#
# berthd does not run containerd: it dials the host's containerd socket,
# mounted in. containerd (on the host) bind-mounts the agent binary and each
# sandbox's socket directory into sandboxes BY HOST PATH, so those paths must
# be the same on the host and in this container. The entrypoint therefore
# copies the agent into the shared state directory, which must be a bind
# mount of the same host path:
#
#   docker run -d --name berthd \
#     -v /run/containerd/containerd.sock:/run/containerd/containerd.sock \
#     -v /run/berth:/run/berth \
#     berth
#
# and clients use unix:///run/berth/berthd.sock on the host. To publish a
# port, berthd needs TLS (it refuses plaintext TCP): mount the certificate,
# key, client CA and token file and pass --listen=:7443 --tls-cert ...
# --tls-key ... [--tls-client-ca ...] [--token-file ...] (README "Security
# model"). Extra arguments go to berthd.
#
# Disk quotas (README "Disk quotas") need containerd's btrfs snapshotter on a
# btrfs with quotas (scripts/btrfs-quota.sh on the host), and berthd must
# reach the snapshotter's root by the same path and set quota limits there:
#
#   docker run ... --cap-add SYS_ADMIN \
#     -v /var/lib/berth-btrfs:/var/lib/berth-btrfs \
#     berth --snapshotter btrfs

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
# CGO_ENABLED=0 for all three: berth-agent runs as PID 1 in images that may
# have no libc, and static berthd/berth do not depend on the builder's glibc
# being no newer than the runtime image's.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/berthd ./cmd/berth ./cmd/berth-agent

FROM debian:bookworm-slim
# ca-certificates: image pulls are fetched by berthd itself (the containerd
# client resolves and downloads; the daemon only stores).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/berthd /out/berth /usr/local/bin/
COPY --from=build /out/berth-agent /usr/local/lib/berth/berth-agent
COPY --chmod=0755 <<'EOF' /usr/local/bin/berthd-entrypoint
#!/bin/sh
# Put the agent where the host's containerd can find it (same path on host
# and here, see the Dockerfile), then run berthd with any extra arguments.
set -eu
state=${BERTH_STATE_DIR:-/run/berth}
mkdir -p "$state/bin"
install -m 0755 /usr/local/lib/berth/berth-agent "$state/bin/berth-agent"
exec /usr/local/bin/berthd \
  --containerd-address "${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}" \
  --state-dir "$state" \
  --agent-binary "$state/bin/berth-agent" \
  --listen "${BERTH_LISTEN:-unix://$state/berthd.sock}" \
  "$@"
EOF
VOLUME ["/run/berth"]
ENTRYPOINT ["/usr/local/bin/berthd-entrypoint"]
