# xlimit — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The BPF toolchain is pinned: the committed objects in maps/ and bench/gen/
# are what this exact compiler produces from bpf/ and bench/gen/xlgen.c, and
# `make check-generated` proves it.
CLANG ?= clang-19
STRIP ?= llvm-strip-19
CLANG_FORMAT ?= clang-format-19
BPF_CFLAGS := -O2 -g -Wall -Werror -mcpu=v3
export BPF2GO_CC := $(CLANG)
export BPF2GO_STRIP := $(STRIP)
export BPF2GO_CFLAGS := $(BPF_CFLAGS)

GO ?= go
GOFLAGS_TEST ?= -count=1
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# The developers' build: the release binary plus `xlimit demo` (build tag
# xlimit_demo), which runs on the test kit's lab (tests/kit/lab). What is
# installed is the release build, without it: make build-release, make deb,
# make image (cmd/xlimit's TestReleaseDepsNoKit checks its dependencies).
BIN := bin/xlimit
RELEASE_BIN := bin/release/xlimit
# The test build: the developers' build plus fault-injection flags (build
# tag xlimit_faults) that the end-to-end tests use. Never installed.
TEST_BIN := bin/xlimit-faults

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Debian 12 packages the build and the tests need (what .ci/run installs).
DEB_PACKAGES := clang-19 llvm-19 clang-format-19 libbpf-dev iproute2 util-linux \
	netsniff-ng nftables iptables ethtool bpftool make git ca-certificates systemd vagrant \
	qemu-system-x86 busybox-static redis-server \
	prometheus mmdebstrap systemd-container lintian xdp-tools

.PHONY: deps
deps: ## Install the Debian/Ubuntu packages the build and tests need (root).
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_PACKAGES)

# What make box, vm-test, real-host and bench-http need on top (not in CI: they do not run there).
# dnsmasq-base: vagrant-libvirt's network needs the dnsmasq binary, only a recommend of
# libvirt-daemon-system (issue 43: `vagrant up` stopped without it).
DEB_VM_PACKAGES := qemu-utils vagrant-libvirt libvirt-daemon-system dnsmasq-base wrk curl nginx

.PHONY: deps-vm
deps-vm: deps ## Install what make box, vm-test, real-host and bench-http need as well (root).
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_VM_PACKAGES)

.PHONY: generate
generate: ## Compile bpf/ into maps/ and bench/gen/xlgen.c into bench/gen/ with the pinned clang (bpf2go).
	$(GO) generate ./

# Where bpf2go writes: every file there must be what `go generate ./` makes.
GENERATED := maps/ bench/gen/ tests/kit/xdpcount/

.PHONY: check-generated
check-generated: ## Regenerate the BPF objects and fail if they differ from the committed ones.
	$(GO) generate ./
	@git diff --exit-code -- $(GENERATED) || { echo "$(GENERATED): generated BPF objects are stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "$(GENERATED): uncommitted generated files"; exit 1; }

.PHONY: build
build: ## Build bin/xlimit with `xlimit demo` (tag xlimit_demo; no clang needed). Not for installing: see build-release.
	CGO_ENABLED=0 $(GO) build -trimpath -tags xlimit_demo -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/xlimit

.PHONY: build-release
build-release: ## Build bin/release/xlimit, the release binary (no demo, no test kit), as make deb and make image do.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_BIN) ./cmd/xlimit

.PHONY: build-test
build-test: ## Build bin/xlimit-faults, the test build with fault injection and the demo (the e2e tests run it).
	CGO_ENABLED=0 $(GO) build -trimpath -tags xlimit_faults,xlimit_demo -ldflags '$(LDFLAGS)' -o $(TEST_BIN) ./cmd/xlimit

.PHONY: fmt
fmt: ## Format Go and C.
	gofmt -w $$(git ls-files '*.go')
	$(CLANG_FORMAT) -i bpf/*.c bpf/*.h bench/gen/*.c tests/kit/xdpcount/*.c

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, clang-format.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags xlimit_faults,xlimit_demo ./cmd/... ./daemon/...
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags xlimit_faults,xlimit_demo ./cmd/...
	@$(MAKE) --no-print-directory check-imports
	$(CLANG_FORMAT) --dry-run --Werror bpf/*.c bpf/*.h bench/gen/*.c tests/kit/xdpcount/*.c

# Only the kernel-facing packages (and the bench's traffic generator and
# the tests' kit, with its XDP pass program) may speak to the kernel's BPF
# objects: everything else depends on small interfaces, so that it is
# tested without root.
EBPF_ALLOWED := github.com/xlimit/xlimit/(maps|loader|bench|tests/kit)(/|$$)

.PHONY: check-imports
check-imports: ## Fail when a package other than maps/, loader/, bench/ and tests/kit/ imports github.com/cilium/ebpf.
	@bad=$$($(GO) list -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}' ./... | \
		awk '{for (i = 2; i <= NF; i++) if ($$i ~ /^github.com\/cilium\/ebpf/) { print $$1; break }}' | grep -vE '$(EBPF_ALLOWED)'); \
	test -z "$$bad" || { echo "check-imports: only maps/, loader/, bench/ and tests/kit/ may import github.com/cilium/ebpf; these do:"; echo "$$bad"; exit 1; }

.PHONY: test-unit
test-unit: ## Unprivileged tests: config, control laws, Go models, CLI, deploy files, the test kit, the daemon's parts (no cycle among its files).
	$(GO) test $(GOFLAGS_TEST) ./userspace/... ./daemon/... ./cmd/... ./deploy/... ./tests/kit/... ./bench/ ./bench/arrows/
	$(GO) test $(GOFLAGS_TEST) -run '^TestDesign' ./maps/  # docs/design.md §2 against the objects' ELF specs (no root)
	cd deploy/kubernetes/validate && $(GO) test $(GOFLAGS_TEST) ./...  # own module: keeps k8s.io/api out of xlimit's

.PHONY: test-kernel
test-kernel: ## Kernel tests (root): the real program under BPF_PROG_TEST_RUN with a fake clock; the bench's BPF helpers (bench/gen). Prints every skip.
	$(GO) test $(GOFLAGS_TEST) -v ./maps/... ./loader/... ./bench/gen/ 2>&1 | tee kernel.log | \
	awk '/^=== (RUN|CONT|PAUSE)/ { buf = ""; next } /^ *--- SKIP/ { printf "%s\n%s", $$0, buf; buf = ""; next } \
	/^ *--- (PASS|FAIL)/ { if ($$0 ~ /FAIL/) print; buf = ""; next } /^(PASS|FAIL|ok|panic)/ { print; next } { buf = buf $$0 "\n" }' ; \
	rc=$${PIPESTATUS[0]}; test $$rc -eq 0 || { echo "== test-kernel: the whole output of each failed test (all of it in kernel.log):"; \
	awk '/^=== RUN/ && $$3 !~ /\// { buf = "" } { buf = buf $$0 "\n" } /^--- FAIL/ { printf "%s", buf; buf = "" }' kernel.log; exit $$rc; }

.PHONY: e2e
e2e: build-test ## End-to-end tests (root): namespaces, veth, real traffic, the real daemon (its test build).
	XLIMIT_BIN=$(CURDIR)/$(TEST_BIN) $(GO) test $(GOFLAGS_TEST) -timeout 20m -v ./tests/ 2>&1 | tee e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|    .*(e2e|limit|measured))' ; \
	rc=$${PIPESTATUS[0]}; test $$rc -eq 0 || { echo "== e2e: the whole output of each failed test (all of it in e2e.log):"; \
	awk '/^=== RUN/ && $$3 !~ /\// { buf = "" } { buf = buf $$0 "\n" } /^--- FAIL/ { printf "%s", buf; buf = "" }' e2e.log; exit $$rc; }

# Debian package name or .deb of the kernel `make test-kernel-qemu` boots.
KERNEL ?= linux-image-cloud-amd64

.PHONY: test-kernel-qemu
test-kernel-qemu: ## Kernel tier on another kernel under qemu (KERNEL=Debian package or .deb; default Debian 12's 6.1 cloud kernel).
	tests/kernel-qemu/run.sh '$(KERNEL)'

.PHONY: vm-validate
vm-validate: ## Check the Vagrantfile (the VM itself cannot boot in CI).
	cd vagrant && vagrant validate --ignore-provider

# The developers' quick check (README): lint, the unit and kernel tiers
# with -short, and a few end-to-end smoke tests; under 3 minutes on two
# CPUs. `make test` is the full suite, which CI runs.
SMOKE_TESTS := ^(TestFloodLimited|TestSystemdNotify|TestAPIRules)$$

# The kernel tier's three statistical tests take 47 s of its 130 s with
# -short (measured: bench/results/2026-12-01-tests.log): test-fast leaves
# them to make test. The smoke tests mostly wait for traffic, so they run
# beside the unit and kernel tiers rather than after them.
FAST_SKIP := ^(TestMultiCoreBound|TestSourcePrefixAggregation|TestAccuracyHighRates)$$

.PHONY: test-fast
test-fast: lint build-test ## Quick check for developers (< 3 min): lint, unit and kernel tiers with -short, e2e smoke tests.
	@log=$$(mktemp); XLIMIT_BIN=$(CURDIR)/$(TEST_BIN) $(GO) test $(GOFLAGS_TEST) -run '$(SMOKE_TESTS)' ./tests/ > $$log 2>&1 & smoke=$$!; \
	$(GO) test $(GOFLAGS_TEST) -short -skip '$(FAST_SKIP)' ./userspace/... ./daemon/... ./cmd/... ./deploy/... ./tests/kit/... ./maps/... ./loader/...; unit=$$?; \
	wait $$smoke; e2e=$$?; cat $$log; rm -f $$log; \
	test $$unit -eq 0 && test $$e2e -eq 0

.PHONY: test
test: lint check-generated vm-validate test-unit test-kernel e2e image system-test ## Every tier: lint, generated-code check, Vagrantfile, unit, kernel, end-to-end, the OCI image check, the .deb in a booted guest.

.PHONY: bench bench-queues
bench-queues: ## The live multi-queue benchmark alone (root, ~6 min; loader.BenchmarkQueues, docs/design.md §7).
	$(GO) test -run '^$$' -bench '^BenchmarkQueues$$' -benchtime 1x -v ./loader/

# BENCH_FLAGS: e.g. -allow-dirty (the report then says so at its top), -quick.
BENCH_FLAGS ?=

bench: build ## Benchmarks (root, ~20 min, clean tree): every queue live, XDP_DROP beside xlimit, no live frames needed (bench/results/queues.txt); per-packet cost (SYN cookies apart), live flood vs nftables/iptables, random sources, every queue, accuracy, adaptive vs static (docs/design.md §7), paced queue (one report in bench/results/); compile cost of 64 rules × 65 536 shared prefixes (bench/results/compile-cost.txt); fleet sharing, 1 000 hosts × 100 rules simulated, and Redis's cost per exchange (bench/results/fleet-sim.txt).
	set -o pipefail; $(GO) test -run '^$$' -bench '^BenchmarkQueues$$' -benchtime 1x ./loader/ | tee bench/results/queues.txt
	XLIMIT_BIN=$(CURDIR)/$(BIN) $(GO) run ./bench -out bench/results $(BENCH_FLAGS)
	$(GO) test -run '^$$' -bench '^BenchmarkCompileSharedPrefixes$$' -benchtime 5x ./daemon/ | tee bench/results/compile-cost.txt
	$(GO) run ./bench/fleetsim -out bench/results/fleet-sim.txt

# make bench-http (issue 42): nginx (Debian's) proxying to a Go app with a
# bounded pool, vegeta from the other end of a veth pair; nginx's limit_req
# and limit_conn beside xlimit's variants, keep-alive on and off, 2x and 10x
# the measured capacity, then the same under a spoofed SYN flood.
# HTTP_BENCH_FLAGS: e.g. -variants unprotected,xl-example -keepalive on -quick.
HTTP_BENCH_FLAGS ?=

.PHONY: bench-http
bench-http: build ## HTTP overload side by side (root, ~25 min, needs nginx): nginx limit_req/limit_conn vs xlimit's variants and docs/examples/http-service.yaml, keep-alive on/off, 2x/10x, with and without a SYN flood (bench/results/http/).
	cd tests/realhost && $(GO) build -o $(CURDIR)/bin/hb-load ./cmd/load && $(GO) build -o $(CURDIR)/bin/hb-app ./cmd/app
	$(GO) run ./bench/httpbench -xlimit $(BIN) -load bin/hb-load -app bin/hb-app -out bench/results/http $(HTTP_BENCH_FLAGS)

FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (FuzzXDP needs root: kernel vs Go model).
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./userspace/config/
	$(GO) test -run '^$$' -fuzz '^FuzzFeedback$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./userspace/api/
	$(GO) test -run '^$$' -fuzz '^FuzzPutRules$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./userspace/api/
	$(GO) test -run '^$$' -fuzz '^FuzzXDP$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./maps/

# The local guest image and Vagrant box (no box can be downloaded):
# build/box/, cached by package list (docs/realhost.md).
.PHONY: box
box: ## Build the Debian 12 guest image and libvirt box in build/box/ (root, mmdebstrap; ~2-3 min, cached).
	vagrant/build-box.sh

.PHONY: vm-test
vm-test: box ## Boot the box with Vagrant (vagrant-libvirt, TCG here) and run the kernel-facing tests in it (root; docs/realhost.md).
	vagrant/vm-test.sh

# SCENARIOS: a subset of 0-5 (tests/realhost/run.sh). Not in make test or CI.
SCENARIOS ?=
.PHONY: real-host
real-host: box ## Issue 27's scenarios on virtio-net in a qemu guest (root, ~30-40 min under TCG): bench/results/DATE-real-host.md.
	tests/realhost/run.sh $(SCENARIOS)

# Packaging (packaging/README.md): the version of the .deb and the image
# is packaging/VERSION, with ~gitDATE.HASH when HEAD is not its release tag.
PKG_VERSION ?= $(shell packaging/version.sh)
DIST := dist
DEB := $(DIST)/xlimit_$(PKG_VERSION)_amd64.deb

.PHONY: deb
deb: ## Debian package dist/xlimit_VERSION_amd64.deb (binary, unit, default rules, alerts, dashboard, man page), lintian-checked.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(PKG_VERSION)' -o build/deb/xlimit ./cmd/xlimit
	packaging/build-deb.sh build/deb/xlimit '$(PKG_VERSION)' $(DIST)
	@if command -v lintian >/dev/null; then lintian --allow-root --fail-on error,warning --suppress-tags-from-file packaging/debian/lintian-suppress $(DEB) && echo "lintian: $(DEB) clean"; else echo "lintian not found: not checked (make deps installs it)"; fi

.PHONY: system-test
system-test: deb ## The .deb in a booted Debian 12 guest (systemd-nspawn, root): upgrades from earlier packages under a flood, install, READY, flood, reload, watchdog, stop, journal, Prometheus, alert.
	ST_OLD_DEBS="$$(packaging/system-test/old-debs.sh build/system-test/old-debs | tr '\n' ' ')" packaging/system-test/run.sh $(DEB)

IMAGE_REF := ghcr.io/xlimit/xlimit:$(shell cat packaging/VERSION)
IMAGE := $(DIST)/xlimit-$(PKG_VERSION).tar

.PHONY: image
image: ## OCI image archive dist/xlimit-VERSION.tar (no container daemon), checked against the DaemonSet (capabilities, read-only root).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(PKG_VERSION)' -o build/image/xlimit ./cmd/xlimit
	@mkdir -p $(DIST)
	cd packaging/image && $(GO) run . -binary $(CURDIR)/build/image/xlimit -version '$(PKG_VERSION)' -ref $(IMAGE_REF) \
		-revision "$$(git rev-parse HEAD 2>/dev/null)" -out $(CURDIR)/$(IMAGE)
	cd packaging/image && XLIMIT_IMAGE=$(CURDIR)/$(IMAGE) $(GO) test $(GOFLAGS_TEST) -v -run TestImage . | grep -E '^(---|ok|FAIL|\s+image_test)'; test $${PIPESTATUS[0]} -eq 0
	@echo "$(IMAGE): $(IMAGE_REF)"

.PHONY: clean
clean: ## Remove build output.
	rm -rf bin e2e.log build dist
