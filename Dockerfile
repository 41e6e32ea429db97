# berthd, berth-agent and the berth CLI in one image, for running berthd next
# to a node's containerd: deploy/kubernetes/berthd-daemonset.yaml runs it as
# a Kubernetes DaemonSet (what it mounts and why is written there). It also
# holds berth-controller, the command of deploy/kubernetes/
# berth-controller.yaml's Deployment (kubernetes/integration
# TestKubernetesControllerPod runs it as that Deployment says).
#
# Build:   docker build --build-arg VERSION=$(git describe --tags --always) -t berth .
# or, without a Docker engine, with Debian's buildah: scripts/container-image.sh
# (make container-image), which is how this file is verified: it builds the
# image, then runs berthd from it (the entrypoint, the settings of the
# `docker run` line below, through containerd and runc: ctr run) against
# that same containerd, and runs a command in a sandbox through it. Not
# verified: EGRESS sandboxes (no CNI plugins or nft in this image) and
# running under Docker or Kubernetes themselves (docs/operating.md "Deployment").
#
# berthd does not run containerd: it dials the host's containerd socket,
# mounted in. It mounts each sandbox's root file system (an idmapped mount
# of the sandbox's snapshot) and a tmpfs for its run directory itself, and
# containerd (on the host) hands those paths, the agent binary and each
# sandbox's socket directory to runc BY HOST PATH, in the host's mount
# namespace. So:
#   - the state directory (/run/berth) is a bind mount of the same host path
#     with rshared propagation, so that berthd's mounts reach the host
#     (Docker refuses it unless the host's /run/berth is on a shared mount,
#     as it is where systemd runs the host); the entrypoint copies the agent
#     into it;
#   - containerd's root (/var/lib/containerd) is mounted at the same path:
#     the mounts containerd returns for a snapshot name its directories;
#   - --privileged: mounting needs CAP_SYS_ADMIN, and Docker's default
#     seccomp and AppArmor profiles refuse mount_setattr(2), open_tree(2)
#     and the user namespace an idmapped mount takes its mapping from; the
#     capabilities berthd uses are listed in deploy/berthd.service
#     (overlayfs writes of sandboxes run with berthd's credentials, so
#     those matter to sandboxes too);
#   - --pid host: berthd reads /proc/<pid> of sandbox tasks (host pids).
#
#   docker run -d --name berthd --privileged --pid host \
#     -v /run/containerd:/run/containerd \
#     -v /var/lib/containerd:/var/lib/containerd \
#     -v /run/berth:/run/berth:rshared \
#     berth
#
# Clients use unix:///run/berth/berthd.sock on the host. To publish a
# port, berthd needs TLS (it refuses plaintext TCP): mount the certificate,
# key, client CA and token file and pass --listen=:7443 --tls-cert ...
# --tls-key ... [--tls-client-ca ...] [--token-file ...] (docs/security.md,
# "Security model"). Extra arguments go to berthd (e.g. --metrics-listen=:9464).
#
# Disk quotas (docs/disk-quotas.md) need containerd's btrfs snapshotter on a
# btrfs with quotas (scripts/btrfs-quota.sh on the host), and berthd must
# reach the snapshotter's root by the same path (its mounts name the btrfs
# device, which --privileged shows in /dev):
#
#   docker run ... -v /var/lib/berth-btrfs:/var/lib/berth-btrfs \
#     berth --snapshotter btrfs

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO_ENABLED=0 for all three: berth-agent runs as PID 1 in images that may
# have no libc, and static berthd/berth do not depend on the builder's glibc
# being no newer than the runtime image's. -buildvcs=false: the build
# context has no .git (VERSION names the version instead).
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-X github.com/berth-sandbox/berth/internal/version.Version=${VERSION}" \
      -o /out/ ./cmd/berthd ./cmd/berth ./cmd/berth-agent
# berth-controller (deploy/kubernetes/berth-controller.yaml runs this image
# with it as the command): the Go module kubernetes/, apart from berthd's.
RUN cd kubernetes && go mod download && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/ ./cmd/berth-controller

FROM debian:bookworm-slim
# ca-certificates: image pulls are fetched by berthd itself (the containerd
# client resolves and downloads; the daemon only stores).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/berthd /out/berth /usr/local/bin/
COPY --from=build /out/berth-agent /usr/local/lib/berth/berth-agent
COPY --from=build /out/berth-controller /usr/local/bin/berth-controller
COPY deploy/berthd-entrypoint.sh /usr/local/bin/berthd-entrypoint
VOLUME ["/run/berth"]
ENTRYPOINT ["/usr/local/bin/berthd-entrypoint"]
