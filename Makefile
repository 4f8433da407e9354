# consul-cni-repair
#
#   make demo    install what is missing, build, run the race scenarios on an embedded local cluster
#   make test    lint + unit + privileged (netns, iptables) + integration/e2e (local control plane)
#   make help    every target with what it does (the "## target: text" comments below)
#
# Everything the targets need is installed (apt-get) or built (go build) by them.

SHELL       := /bin/bash
comma       := ,
empty       :=
space       := $(empty) $(empty)
GO          ?= go
# hack/install-go.sh puts the Go of go.mod here when no recent enough Go is found.
GO_PREFIX   ?= /usr/local/go
export GO_PREFIX
export PATH := $(GO_PREFIX)/bin:$(PATH)
# One way to compile for every Go command of the targets (vet, tests and the binaries tests build, the project's
# commands and the images' amd64 binaries, the control plane and node binaries, Helm): static (no cgo) and
# -trimpath. The build cache keys a compiled package on both, so with one setting each package is compiled once and
# shared by all of them (client-go and its friends were compiled four times). runc, which needs cgo for seccomp,
# sets CGO_ENABLED=1 itself (hack/build-node.sh).
export CGO_ENABLED := 0
export GOFLAGS := $(strip -trimpath $(filter-out -trimpath,$(GOFLAGS)))
BIN         := bin
CACHE       := .cache
# The control plane and node binaries live once per user (hack/bin-cache.sh), keyed by these files and the Go
# toolchain; KUBE_BIN and NODE_BIN link there.
KUBE_BIN    := $(CACHE)/kube/bin
NODE_BIN    := $(CACHE)/node/bin
KUBE_SOURCES := tests/kube/go.mod tests/kube/go.sum hack/build-kube.sh
NODE_SOURCES := $(KUBE_SOURCES) tests/node/go.mod tests/node/go.sum hack/build-node.sh
CNI_BIN     := $(CACHE)/cni/bin
NODES       ?= 1
GOTEST      ?= $(GO) test
TEST_FLAGS  ?=
# Consul's SDK v0.19.0, the nftables oracle of the tests (module tests/sdkoracle/nftables), needs a newer Go
# than the main module: only that module is built with this toolchain, which the go command fetches from the
# module proxy on first use.
SDK_NFT_GOTOOLCHAIN ?= go1.27.3
export CCR_SDK_NFT_GOTOOLCHAIN := $(SDK_NFT_GOTOOLCHAIN)
# Configurations of the SDK-oracle corpus (tests/suites/sdkcorpus) in test-privileged and test-corpus.
CORPUS_N    ?= 2000
export CCR_KUBE_BIN_DIR := $(abspath $(KUBE_BIN))
export CCR_CNI_BIN_DIR  := $(abspath $(CNI_BIN))
export CCR_NODE_BIN_DIR := $(abspath $(NODE_BIN))

# One version string for every binary, image and manifest (hack/version.sh).
VERSION     ?= $(shell ./hack/version.sh)
LDFLAGS     := -X github.com/consul-cni-repair/consul-cni-repair/pkg/version.Version=$(VERSION)

COMMANDS := consul-cni consul-cni-installer consul-cni-check consul-cni-verifier repair

# Images (tools/ociimage): FROM scratch, one OCI archive with a multi-arch
# index per image under bin/images/, created at the commit time.
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
# Registry/path of the image names; empty: the manifests' ghcr.io/consul-cni-repair.
IMAGE_REGISTRY  ?=
IMAGES_DIR      := $(BIN)/images
DIST            := dist
TOOLS_BIN       := $(BIN)/tools
REVISION        ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 1)
CNI_PLUGINS := \
	github.com/containernetworking/plugins/plugins/main/ptp \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/ipam/host-local

.PHONY: all version toolchain build images tools release release-chart deps kube-bins node-bins kubectl cni-bins test test-tiers test-unit test-privileged test-corpus test-integration test-integration-main \
	doctor host-packages podman hoststate \
	test-manifests test-manifests-integration test-images test-monitoring promtool dashboard docs chart-docs publish registry-bin lint fmt bench bench-cni bench-startup bench-repair bench-audit bench-verify fuzz cluster demo \
	clean clean-testbin helm help

## all: build (the default target)
all: build

## help: every target with what it does, from the "## target: text" comments of this Makefile
help:
	@awk -v w=$${COLUMNS:-120} 'function out() { if (!t) return; n = split(d, ws, " "); l = sprintf("  %-24s", t); \
			for (k = 1; k <= n; k++) { if (length(l) + 1 + length(ws[k]) > w && length(l) > 26) { print l; l = sprintf("  %-24s", "") } \
				l = l " " ws[k] } print l; t = "" } \
		/^## [a-z][a-z0-9-]*: / { out(); i = index($$0, ": "); t = substr($$0, 4, i - 4); d = substr($$0, i + 2); next } \
		/^## / { if (t) d = d " " substr($$0, 4); next } { out() } END { out() }' $(firstword $(MAKEFILE_LIST))

## version: the version string stamped into binaries (hack/version.sh)
version:
	@echo $(VERSION)

## toolchain: the Go version go.mod names, installed into GO_PREFIX when missing
toolchain:
	@./hack/install-go.sh

## build: the project's commands into bin/
build: toolchain
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./,$(wildcard $(COMMANDS:%=cmd/%)))
	@# The kubectl plugin "kubectl consul-cni audit": repair under the plugin's name.
	ln -sf repair $(BIN)/kubectl-consul_cni

## images: OCI archives of repair, consul-cni-installer (with consul-cni) and consul-cni-check for
## IMAGE_PLATFORMS, each a multi-arch index, plus bin/images/digests.txt
images: toolchain tools
	@for p in $(IMAGE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; mkdir -p $(BIN)/$${os}_$${arch}; \
		echo ">> binaries for $$p"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
			-o $(BIN)/$${os}_$${arch}/ $(addprefix ./,$(wildcard $(COMMANDS:%=cmd/%))) || exit 1; \
	done
	$(TOOLS_BIN)/images --bin-dir $(BIN) --out $(IMAGES_DIR) $(if $(IMAGE_REGISTRY),--registry $(IMAGE_REGISTRY)) \
		--version '$(VERSION)' --revision '$(REVISION)' --created '$(SOURCE_DATE_EPOCH)' \
		--platforms '$(subst $(space),$(comma),$(strip $(IMAGE_PLATFORMS)))'

## release: dist/ with the image archives and digests, the manifests of every overlay with the images
## tagged VERSION, a CycloneDX SBOM per image, the kubectl plugin per platform with its krew manifest
## (plugin/consul-cni.yaml), the packaged chart (release-chart) and SHA256SUMS
release: images
	rm -rf $(DIST)
	$(TOOLS_BIN)/release assemble --images $(IMAGES_DIR) --out $(DIST) --manifests manifests \
		--version '$(VERSION)' $(if $(IMAGE_REGISTRY),--registry $(IMAGE_REGISTRY))
	$(MAKE) release-chart
	$(TOOLS_BIN)/release checksums --dir $(DIST)
	@cat $(DIST)/SHA256SUMS

## publish: push the images of `make images` (every platform of IMAGE_PLATFORMS under one index each) to
## REGISTRY=host[:port]/path as <REGISTRY>/<name>:<tag>, and the chart, its images defaulting to REGISTRY, as the
## OCI artifact oci://<REGISTRY>/charts/consul-cni-repair (version VERSION without its "v"); plain HTTP for a
## loopback registry or PLAIN_HTTP=1. Credentials: ~/.docker/config.json and helm registry login.
REGISTRY    ?=
PLAIN_HTTP  ?=
publish: images tools helm
	@test -n '$(REGISTRY)' || { echo 'make publish: set REGISTRY=host[:port]/path' >&2; exit 2; }
	$(TOOLS_BIN)/release publish --images $(IMAGES_DIR) --registry '$(REGISTRY)' --version '$(VERSION)' \
		--chart charts/consul-cni-repair --helm $(BIN)/helm $(if $(PLAIN_HTTP),--plain-http)

## tools: the image, release and dashboard tools (separate module tools/)
tools: toolchain
	@mkdir -p $(TOOLS_BIN)
	cd tools && $(GO) build -o $(abspath $(TOOLS_BIN))/ ./cmd/...

## deps: system packages (iptables, iproute2, nsenter, etcd) via apt-get when missing
deps: toolchain
	@./hack/install-deps.sh

## kube-bins: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl v1.37.2 (cold: ~15 min on 2 cores)
kube-bins: toolchain
	@d=$$(./hack/bin-cache.sh $(KUBE_BIN) kube $(KUBE_SOURCES)) && flock "$$d.lock" ./hack/build-kube.sh "$$d"

## node-bins: what a real test node runs (tests/harness/realnode): containerd, ctr, containerd-shim-runc-v2 and runc
## (tests/node/go.mod), kubelet v1.37.2 (tests/kube); installs libseccomp-dev (cold: ~5 min with a warm kube cache)
node-bins: toolchain
	@d=$$(./hack/bin-cache.sh $(NODE_BIN) node $(NODE_SOURCES)) && flock "$$d.lock" ./hack/build-node.sh "$$d"

## kubectl: kubectl v1.37.2 (k8s.io/kubectl) into .cache/kube/bin, for the local cluster (make cluster)
kubectl: toolchain
	@d=$$(./hack/bin-cache.sh $(KUBE_BIN) kube $(KUBE_SOURCES)) && flock "$$d.lock" ./hack/build-kube.sh "$$d" kubectl

## cni-bins: reference CNI plugins pinned in go.mod
cni-bins: toolchain
	@mkdir -p $(CNI_BIN)
	$(GO) build -o $(CNI_BIN)/ $(CNI_PLUGINS)

## test: everything (.ci/run calls this): the host check (doctor), every tier, and a check that the host is left
## as it was found (hoststate)
test: doctor host-packages hoststate
	@mkdir -p $(CACHE)
	@$(HOSTSTATE) sweep && $(HOSTSTATE) save $(CACHE)/hoststate-test.json
	@rc=0; $(MAKE) test-tiers || rc=$$?; $(HOSTSTATE) compare $(CACHE)/hoststate-test.json || rc=1; exit $$rc

## test-tiers: the tiers of make test without the host checks: lint, unit, privileged, integration, images
test-tiers: lint test-unit test-privileged test-integration test-images

## doctor: what this host lacks, or has, that breaks make test and make demo; each line says how to fix it
## (runs first in both, after installing the packages it probes with)
doctor: deps
	@./hack/doctor.sh

## host-packages: every system package the tiers install (before the host is recorded, so installing them is no
## difference)
host-packages: deps promtool podman registry-bin

## podman: podman, conmon and runc via apt-get when missing (test-images runs the images with them)
podman:
	@./hack/install-podman.sh

## hoststate: the host-state recorder (tests/cmd/hoststate): `make test` and `make demo` sweep what killed runs left, record the host before
## they start anything and fail when it differs afterwards
HOSTSTATE := $(TOOLS_BIN)/hoststate
hoststate: toolchain
	@mkdir -p $(TOOLS_BIN)
	@$(GO) build -o $(HOSTSTATE) ./tests/cmd/hoststate

## test-unit: go test ./... of the main module, then test-manifests and test-monitoring
test-unit: toolchain
	$(GOTEST) $(TEST_FLAGS) -count=1 ./...
	$(MAKE) test-manifests
	$(MAKE) test-monitoring

# tagged_pkgs: the packages of the main module with tests of build tag $(1). test-privileged and test-integration
# run only those (their untagged tests run again there); every other package's tests ran in test-unit, and
# compiling and running them again under each tag cost minutes.
tagged_pkgs = $(shell $(GO) list -e -tags $(1) -f '{{.ImportPath}} {{.Dir}}' ./... | while read p d; do \
	grep -qsx '//go:build $(1)' $$d/*_test.go && echo $$p; done)

## test-privileged: real netns and iptables/nftables; includes the SDK-oracle corpus (CORPUS_N configurations)
test-privileged: deps
	CCR_CORPUS_N=$(CORPUS_N) $(GOTEST) $(TEST_FLAGS) -count=1 -tags privileged -timeout 20m $(call tagged_pkgs,privileged)

## test-corpus: only the SDK-oracle corpus: CORPUS_N generated configs applied by Consul's SDK (v0.18.1 iptables
## commands, v0.19.0 nft script) and by the plugin in real netns, tables compared (CORPUS_SEED to vary it)
CORPUS_SEED ?= 20261201
test-corpus: deps
	CCR_CORPUS_N=$(CORPUS_N) $(GOTEST) $(TEST_FLAGS) -count=1 -tags privileged -timeout 30m -v -run 'Corpus|Oracle' \
		./tests/suites/sdkcorpus -args -corpus.seed=$(CORPUS_SEED)

## test-integration: the integration and end-to-end tier in two lanes at once, test-integration-main and
## test-manifests-integration, each printed whole when it ends (both run to the end; either failing fails the tier).
## The harness gives every control plane, node and registry its own addresses, names and directories, so the lanes
## share nothing but the machine
test-integration: deps kube-bins node-bins helm registry-bin
	$(MAKE) -k -j2 --output-sync=target --no-print-directory test-integration-main test-manifests-integration

## test-integration-main: the main module's integration and end-to-end packages (-tags integration, -p 1: one
## control plane per package)
test-integration-main: deps kube-bins node-bins
	$(GOTEST) $(TEST_FLAGS) -count=1 -tags integration -timeout 45m -p 1 $(call tagged_pkgs,integration)

## test-manifests: kustomize builds, RBAC, dashboard PromQL and alert rules (separate module tests/suites/manifests)
test-manifests: toolchain
	cd tests/suites/manifests && $(GOTEST) $(TEST_FLAGS) -count=1 ./...

## promtool: promtool (Debian package prometheus) via apt-get when missing
promtool:
	@./hack/install-promtool.sh

## test-monitoring: the alert rules evaluated on data by `promtool test rules`, the runbook, the dashboard
## (generated from Go, checked against the shipped JSON and the metrics contract)
MONITORING_TESTS := ^(TestAlertRulesOnData|TestAlertRules|TestRunbook|TestDashboard.*|TestServiceMonitor)$$
test-monitoring: toolchain promtool
	cd tests/suites/manifests && CCR_PROMTOOL=$$(command -v promtool || echo promtool-not-installed) $(GOTEST) $(TEST_FLAGS) -count=1 -run '$(MONITORING_TESTS)' ./...
	cd tools && $(GOTEST) $(TEST_FLAGS) -count=1 ./dashboard

## docs: write docs/reference/flags.md from the commands' --help (tests/suites/cli fails when it differs)
docs: toolchain
	CCR_UPDATE_DOCS=1 $(GOTEST) -count=1 -run '^TestFlagsReference$$' ./tests/suites/cli

## chart-docs: write charts/consul-cni-repair/README.md from values.yaml's `# --` comments with helm-docs (the
## version pinned in tests/suites/manifests/chartdocs_test.go); test-manifests fails when it differs
chart-docs: toolchain
	cd tests/suites/manifests && CCR_UPDATE_DOCS=1 $(GOTEST) -count=1 -run '^TestChartREADMEGenerated$$' .

## dashboard: write manifests/base/monitoring/grafana-dashboard.json from its Go source (tools/dashboard, Grafana
## Foundation SDK); test-monitoring fails when the shipped file differs
dashboard: toolchain
	cd tools && $(GO) run ./cmd/dashboard -o ../manifests/base/monitoring/grafana-dashboard.json

## test-manifests-integration: server-side dry-run of every overlay, RBAC by impersonation, the controller's metrics,
## helm install/upgrade/uninstall of the chart on a simulated node, the base overlay and the chart on two real nodes,
## the lifecycle matrix (every way in or out) on two real nodes, the local walkthrough of docs/demo.md with kubectl, the README's path after make publish to a local registry
test-manifests-integration: deps kube-bins node-bins helm registry-bin
	cd tests/suites/manifests && HELM=$(abspath $(BIN))/helm $(GOTEST) $(TEST_FLAGS) -count=1 -tags integration -timeout 60m ./...

## registry-bin: Debian's docker-registry (a real OCI registry the publish test runs on loopback)
registry-bin:
	@./hack/apt-install.sh --stop docker-registry docker-registry=docker-registry

## helm: the Helm CLI pinned in tools/go.mod (tool directive), into bin/helm
helm: toolchain
	@mkdir -p $(BIN)
	cd tools && $(GO) build \
		-ldflags "-X helm.sh/helm/v4/internal/version.version=$$($(GO) list -m -f '{{.Version}}' helm.sh/helm/v4)" \
		-o $(abspath $(BIN))/helm helm.sh/helm/v4/cmd/helm

## release-chart: dist/consul-cni-repair-<version>.tgz; chart version VERSION without its "v", appVersion (the
## images' default tag) VERSION as an image tag ("+" becomes "-", as the images are tagged)
CHART_VERSION := $(patsubst v%,%,$(VERSION))
CHART_APP_VERSION := $(subst +,-,$(VERSION))
release-chart: helm
	@mkdir -p $(DIST)
	$(BIN)/helm lint --strict charts/consul-cni-repair
	$(BIN)/helm package charts/consul-cni-repair --version '$(CHART_VERSION)' --app-version '$(CHART_APP_VERSION)' --destination $(DIST)


## test-images: inspect every image of every platform (make images), and run those of this machine's
## platform with podman: --version, the UID of its manifest, the installer chaining consul-cni
test-images: images podman
	cd tools && CCR_IMAGES_DIR=$(abspath $(IMAGES_DIR)) CCR_IMAGE_VERSION='$(VERSION)' \
		$(GOTEST) $(TEST_FLAGS) -count=1 -tags images -timeout 20m ./...

## lint: gofmt, go vet with every build tag in every module, and no function over 80 lines in pkg/ and cmd/
## (hack/funclen; test files are exempt)
lint: toolchain
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) run ./hack/funclen -max 80 pkg cmd
	$(GO) vet ./...
	$(GO) vet -tags privileged ./...
	$(GO) vet -tags integration ./...
	@# With the flags of hack/build-kube.sh (GOFLAGS above), so this vet and the kube build share the compiled packages
	cd tests/kube && $(GO) vet ./...
	cd tests/suites/manifests && $(GO) vet ./... && $(GO) vet -tags integration ./...
	cd tools && $(GO) vet ./... && $(GO) vet -tags images ./...
	cd tests/sdkoracle/iptables && $(GO) vet ./...
	cd tests/sdkoracle/nftables && GOTOOLCHAIN=$(SDK_NFT_GOTOOLCHAIN) $(GO) vet ./...

## fmt: gofmt -w every Go file git tracks
fmt: toolchain
	gofmt -w $$(git ls-files '*.go')

## bench: unit-level Go benchmarks
bench: toolchain
	$(GOTEST) -run '^$$' -bench . -benchmem ./pkg/...

## bench-cni: consul-cni ADD in fresh netns, iptables and nftables backends (with and without API calls to a
## loopback stub), vs one iptables exec per rule (root); prints median, p99, CPU per ADD and ratios
BENCH_CNI_ADDS ?= 100
bench-cni: deps
	$(GOTEST) -tags privileged -run '^$$' -bench '^BenchmarkADD$$' -benchtime $(BENCH_CNI_ADDS)x -timeout 60m ./tests/suites/cnichain

## bench-startup: start-up of the consul-cni binary against an empty Go program (hyperfine): median, user, system
bench-startup: deps build
	GO=$(GO) ./hack/bench-startup.sh $(BIN)

## bench-repair: the repair controller against the local control plane, rate limit lifted:
## bursts of 100 and 1,000 pods turning broken (median/p99 s to eviction, actions/s), RSS, Go heap and time to all
## cached with 10,000 and 100,000 pods (REPAIR_BENCH_SKIP_100K=1 leaves the 100,000 row out)
bench-repair: deps kube-bins
	$(GOTEST) -tags integration -count=1 -timeout 60m -run '^$$' -bench 'Repair' -benchtime 1x ./pkg/repair

## bench-audit: `repair audit` against the local control plane: 10,000 injected pods (one in ten
## outside the mesh) on 20 nodes; prints wall time and peak RSS (targets: < 5 s, < 100 MiB)
bench-audit: deps kube-bins
	$(GOTEST) -tags integration -count=1 -timeout 60m -run '^$$' -bench 'Audit' -benchtime 1x ./pkg/audit

## bench-verify: the node verifier on one node with 110 injected pods (real namespaces, iptables-nft and nftables
## rules, a CRI server on a unix socket; root): CPU of the first, a steady and a change-finding pass, held heap, peak RSS
bench-verify: deps
	$(GOTEST) -tags privileged -count=1 -timeout 30m -run '^$$' -bench '^BenchmarkVerify110Pods$$' -benchtime 1x ./pkg/verify

## fuzz: run each fuzz target briefly (FUZZTIME=30s by default)
FUZZTIME ?= 30s
fuzz: toolchain
	@for spec in $$(grep -rl --include='*_test.go' '^func Fuzz' pkg | xargs -n1 dirname | sort -u); do \
		for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$spec/*_test.go | cut -d' ' -f2); do \
			echo ">> $$spec $$f"; $(GOTEST) -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./$$spec || exit 1; \
		done; \
	done

## cluster: local control plane with NODES simulated nodes in the foreground (Ctrl-C stops it)
cluster: deps kube-bins
	$(GO) run ./tests/cmd/cluster --nodes $(NODES)

## demo: the race, reproduced and repaired, on an embedded local cluster of real nodes
## (DEMO_NODES=simnode: simulated nodes); fails when a run does not show what it claims, or leaves the host changed
demo: doctor kube-bins node-bins hoststate
	@mkdir -p $(CACHE)
	@$(HOSTSTATE) sweep && $(HOSTSTATE) save $(CACHE)/hoststate-demo.json
	@rc=0; $(GO) run ./tests/cmd/demo $(if $(DEMO_NODES),--nodes $(DEMO_NODES)) || rc=$$?; \
		$(HOSTSTATE) compare $(CACHE)/hoststate-demo.json || rc=1; exit $$rc

## clean: remove bin/, dist/ and the test binaries (the per-user kube and node binary cache stays)
clean: clean-testbin
	rm -rf $(BIN) $(DIST) $(CACHE)/testbin

## clean-testbin: where tests/harness/testbin builds when this checkout is not reachable by other users
clean-testbin:
	rm -rf "$${TMPDIR:-/tmp}/ccr-testbin-$$(printf %s "$(CURDIR)" | sha256sum | cut -c1-12)"
