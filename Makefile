# berth's developer and CI entry points. Go's build and module caches are
# left where Go keeps them by default, so repeated runs stay warm.
#
#   make build            bin/berthd, bin/berth, bin/berth-agent (static)
#   make launcher         rebuild the native launcher the agent embeds (gcc)
#   make image            install dependencies, build build/base.oci.tar
#   make demo             scripts/demo.sh: a command in a real sandbox
#   make test             unit tests: no root, no containerd (well under a minute)
#   make integration      root: a private containerd, real containers (BERTH_E2E=1)
#   make test-kubernetes  berth-controller against a real kube-apiserver (built once into .cache)
#   make check            lint, gofmt, vet, generated code, breaking changes
#   make ci               check, test and integration: what .ci/run runs
#   make generate         regenerate proto/ and clients/ with buf
#   make clients          build the TypeScript client (clients/typescript/dist)
#   make python-sdk       build the Python SDK's wheel and sdist (build/python)
#   make ts-sdk           pack the TypeScript SDK's npm tarball (build/typescript)
#   make container-image  build the Dockerfile with buildah (slow; not in test)
#   make lint             buf lint, gofmt, go vet
#   make check-generated  fail when proto/ differs from what buf generates
#   make console-assets   copy xterm.js from npm into the web console (server/console/static/vendor)
#   make check-console    fail when the console's committed copies differ from npm's packages
#   make breaking         buf breaking against proto/BREAKING_BASELINE
#   make bench            scripts/bench.sh: berth beside its anchors, one table
#   make gobench          any Go benchmarks (BENCH=regexp, PKG=packages)
#   make soak             100 000 execs in one sandbox: flat latency, memory, descriptors

GO      ?= go
# VERSION is what berthd, berth-agent and berth report (--version, the
# agent's Info, version skew); the same for all three.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/berth-sandbox/berth/internal/version.Version=$(VERSION)
BUF     := $(GO) tool -modfile=tools.go.mod buf
BENCH   ?= .
PKG     ?= ./...
IMAGE   := $(CURDIR)/build/base.oci.tar

.PHONY: launcher check-launcher test-kubernetes console-assets check-console all build image demo test integration check ci test-debian generate clients python-sdk ts-sdk lint breaking check-generated bench gobench soak clean container-image

all: build

# berth-agent runs as PID 1 inside images that may have no libc at all, so it
# must be static: CGO_ENABLED=0.
build:
	@mkdir -p bin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/berthd ./cmd/berth
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/berth-agent ./cmd/berth-agent
	cd kubernetes && $(GO) build -o ../bin/ ./cmd/berth-controller

# The native launcher, a static C program the agent binary embeds
# (agent/launcher/native_amd64.go) and runs from a memfd: it is committed, so that
# a plain go build of the agent carries it; rebuild it after editing
# agent/launcher/c/launcher.c (needs gcc and libc6-dev).
LAUNCHER_CC = gcc -static -O2 -s -Wall -Wextra -Werror
launcher:
	$(LAUNCHER_CC) -o agent/launcher/c/berth-launcher agent/launcher/c/launcher.c

# check-launcher: the committed launcher is what its source builds to (gcc's
# static build is byte-for-byte reproducible with Debian 12's gcc 12.2).
check-launcher:
	@tmp=$$(mktemp) && $(LAUNCHER_CC) -o $$tmp agent/launcher/c/launcher.c && \
	if cmp -s $$tmp agent/launcher/c/berth-launcher; then rm -f $$tmp; echo "check-launcher: agent/launcher/c/berth-launcher is launcher.c's build"; \
	else rm -f $$tmp; echo "check-launcher: agent/launcher/c/berth-launcher is not what launcher.c builds to with $$(gcc -dumpfullversion): run 'make launcher' and commit it"; exit 1; fi

image:
	scripts/deps.sh
	scripts/base-image.sh

demo:
	scripts/demo.sh

# Packages whose tests need root, a containerd or real containers; they run
# under `make integration`, every other package under `make test`.
INTEGRATION_PKGS := ./integration/ ./server/runtime/qgroup/ ./server/auth/

test:
	$(GO) test -count=1 -timeout 5m $$($(GO) list ./... | grep -v -e '/integration$$' -e '/server/runtime/qgroup$$' -e '/server/auth$$')
	cd kubernetes && $(GO) test -count=1 -timeout 5m ./api/... ./controller/...

integration:
	GO_TEST_PKGS='$(INTEGRATION_PKGS)' scripts/test.sh

check: lint breaking check-generated check-console check-launcher

ci: check test integration test-debian test-kubernetes

# berth-controller (the Go module kubernetes/, apart from berthd's so that
# Kubernetes' modules stay out of berthd's dependencies) against a real
# kube-apiserver on Debian's etcd, with a real berthd: kube-apiserver is
# built once from the Go module proxy into .cache (scripts/kube-apiserver.sh,
# ~5 minutes of two cores the first time).
test-kubernetes:
	scripts/deps.sh
	scripts/base-image.sh
	BERTH_E2E=1 BERTH_TEST_IMAGE=$(IMAGE) BERTH_KUBE_APISERVER=$$(scripts/kube-apiserver.sh) && export BERTH_E2E BERTH_TEST_IMAGE BERTH_KUBE_APISERVER && \
		cd kubernetes && $(GO) test -count=1 -timeout 20m -v ./integration/

# The Debian root is built once into the cache (scripts/debian-image.sh);
# every test named TestDebian* (files tagged debian) runs against it.
test-debian:
	scripts/deps.sh
	BERTH_E2E=1 BERTH_DEBIAN_ROOT=$$(scripts/debian-image.sh) BERTH_DEBIAN_MATPLOTLIB_ROOT=$$(scripts/debian-image.sh matplotlib) GO_TEST_PKGS=./integration/ \
		GO_TEST_FLAGS='-tags debian -run ^TestDebian -v' scripts/test.sh

# generate also makes the Python and TypeScript clients (buf.gen.clients.yaml),
# whose tools scripts/deps.sh installs.
# PROTO_SUM is the digest of the .proto files that clients/PROTO_SUM records
# for the generated clients: make check regenerates the clients only when it
# differs (the clients' generators need protoc and npm packages).
PROTO_SUM = cat $$(find proto -name '*.proto' | LC_ALL=C sort) | sha256sum | cut -d' ' -f1

generate:
	$(BUF) generate
	$(BUF) generate --template buf.gen.clients.yaml
	$(PROTO_SUM) > clients/PROTO_SUM

# tsc only when the TypeScript sources changed (about a minute on 2 busy
# cores; incremental, dist/.tsbuildinfo, so an unchanged tree takes seconds).
clients: clients/typescript/dist/index.js

clients/typescript/dist/index.js: $(shell find clients/typescript/src -name '*.ts') clients/typescript/tsconfig.json clients/typescript/package-lock.json
	cd clients/typescript && npm run --silent build
	@touch $@

# The Python SDK (clients/python, import berth) as a wheel and an sdist,
# built with Debian's setuptools (scripts/python-sdk.sh), version $(VERSION).
python-sdk:
	VERSION=$(VERSION) scripts/python-sdk.sh build/python

# The TypeScript SDK (clients/typescript, @berth-sandbox/client) as an npm
# tarball with dist/ and types (scripts/ts-sdk.sh), version from $(VERSION).
ts-sdk: clients
	VERSION=$(VERSION) scripts/ts-sdk.sh build/typescript

# The web console embeds xterm.js (server/console/package.json, pinned;
# scripts/deps.sh runs npm ci there). The copies in static/vendor are
# committed, so that go build needs no npm; check-console fails when they
# differ from what npm installed.
console-assets:
	scripts/deps.sh
	scripts/console-assets.sh

check-console:
	@scripts/deps.sh 2>/dev/null
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	scripts/console-assets.sh "$$tmp" || exit 1; \
	if ! diff -r -q "$$tmp" server/console/static/vendor; then \
		echo "check-console: server/console/static/vendor differs from server/console's npm packages: run 'make console-assets' and commit the result."; \
		exit 1; \
	fi; \
	echo "check-console: server/console/static/vendor matches its npm packages"

lint:
	$(BUF) lint
	@unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$unformatted"; exit 1; \
	fi
	$(GO) vet ./...
	cd kubernetes && $(GO) vet ./...

breaking:
	$(BUF) breaking --against ".git#ref=$$(cat proto/BREAKING_BASELINE)"

# Generates into a temporary directory and compares with the working tree, so
# it checks that the .go files match the .proto files next to them, committed
# or not; the clients only when the .proto files changed since they were
# generated (clients/PROTO_SUM). Of clients/python only the generated
# directories (berth/v1, google) are compared: the SDK's own modules
# (berth/*.py, pyproject.toml, tests/) live beside them.
check-generated:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BUF) generate -o "$$tmp" || exit 1; \
	if ! diff -r -q -x '*.proto' -x BREAKING_BASELINE "$$tmp/proto" proto; then \
		echo "check-generated: the generated code in proto/ is stale: run 'make generate' and commit the result."; \
		exit 1; \
	fi; \
	if [ "$$($(PROTO_SUM))" = "$$(cat clients/PROTO_SUM 2>/dev/null)" ]; then \
		echo "check-generated: proto/ is up to date; clients/ were generated from these .proto files (clients/PROTO_SUM)"; \
		exit 0; \
	fi; \
	scripts/deps.sh || exit 1; \
	$(BUF) generate --template buf.gen.clients.yaml -o "$$tmp" || exit 1; \
	if ! diff -r -q -x __pycache__ "$$tmp/clients/python/berth/v1" clients/python/berth/v1 || \
		! diff -r -q -x __pycache__ "$$tmp/clients/python/google" clients/python/google || \
		! diff -r -q "$$tmp/clients/typescript/src/gen" clients/typescript/src/gen; then \
		echo "check-generated: the generated clients are stale: run 'make generate' and commit the result."; \
		exit 1; \
	fi; \
	echo "check-generated: the clients match proto/ but clients/PROTO_SUM is old: run 'make generate' and commit it."; \
	exit 1

# The side-by-side benchmark (BENCHMARKS.md records its output); it installs
# what it needs and builds the image itself.
bench:
	scripts/bench.sh

# Benchmarks that need containers find the base image through
# BERTH_TEST_IMAGE, as the tests do.
# The soak (BENCHMARKS.md records its output): BERTH_SOAK_EXECS execs
# (default 100000) of `true` in one sandbox of a berthd process; fails when
# latency, memory or descriptors grow with the count. 10 to 20 minutes.
soak: image
	BERTH_E2E=1 BERTH_TEST_IMAGE=$(IMAGE) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkSoak$$' -benchtime 1x -timeout 3h ./integration/

gobench: image
	BERTH_TEST_IMAGE=$(IMAGE) $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count=1 -timeout 30m $(PKG)

clean:
	rm -rf bin build

container-image:
	scripts/container-image.sh
