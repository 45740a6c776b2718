# The two commands a user needs are `make demo` and `make test`; both install whatever
# is missing first (through `meshmark setup`, which owns the list of prerequisites).

GO       ?= go
BIN      := bin/meshmark
# `make build` also writes bin/meshmark-pod, the small binary of the in-pod roles
# (workload service, load generator, plaintext probe, pause): the local testbed's pods
# and the Kubernetes image run it, and meshmark finds it beside itself. Static, so that
# an image on scratch can hold it.
VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/meshmark/meshmark/internal/cli.Version=$(VERSION) -X github.com/meshmark/meshmark/internal/podcmd.Version=$(VERSION)
export PATH := $(CURDIR)/.tools/bin:$(PATH)

.PHONY: all build setup demo test lint vet staticcheck bench bench-load fuzz clean

all: build

# Every Go command here builds without cgo, which nothing of meshmark's needs: the pod
# binary must be static anyway, and one build configuration lets both binaries, vet and
# the tests share what the first of them compiled (a cold build of both, with the
# module cache warm: 246 s against 280 s with the two configurations).
GOBUILD  := CGO_ENABLED=0 $(GO)

build:
	$(GOBUILD) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/meshmark ./cmd/meshmark-pod

# setup installs the system packages, Envoy and Go tools that are missing; SETUP_FOR
# narrows it to what a target needs (run, test, cluster, bench). The Kubernetes tests
# run on a local cluster, so test needs cluster's parts too.
SETUP_FOR ?= run,test,cluster
setup: build
	$(BIN) setup --for $(SETUP_FOR)

demo: SETUP_FOR = run
demo: setup
	$(BIN) demo --report-dir results

vet:
	$(GOBUILD) vet ./...

# The staticcheck setup found: .tools/bin first, then PATH, as setup looks.
staticcheck: setup
	PATH="$(CURDIR)/.tools/bin:$$PATH" CGO_ENABLED=0 staticcheck ./...

lint: vet staticcheck
	@test -z "$$(gofmt -l cmd internal)" || { echo "gofmt needed:"; gofmt -l cmd internal; exit 1; }

# Tests need root (network namespaces, iptables). -p 1 keeps packages that bring up
# testbeds from competing for this machine's two cores.
test: setup lint
	$(GOBUILD) test -p 1 -count=1 -timeout 45m ./...
	$(BIN) clean

bench: SETUP_FOR = run,test,cluster,bench
bench: setup
	$(GOBUILD) test -p 1 -run '^$$' -bench . -benchmem ./...

bench-load: SETUP_FOR = run,test,cluster,bench
bench-load: setup
	scripts/bench-load.sh

# Short fuzzing of every parser; FUZZTIME=5m for a longer run.
FUZZTIME ?= 20s
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

clean:
	-$(BIN) clean
	rm -rf bin
