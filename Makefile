# The front door. `make test` is what CI runs (.ci/run); `make help` lists targets.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
# Steps share cargo's lock and two cores: run them one after another.
.NOTPARALLEL:

WASM        := target/wasm32-wasip1/release/envoy_prefix_router.wasm
PODSIM      := target/release/podsim
BENCH       := target/release/prefix-bench
ENVOY_BIN   ?= $(CURDIR)/.venv/bin/envoy
TEST_RUNNER := $(CURDIR)/.tools/bin/wasm-bindgen-test-runner
CONFIGS     := $(wildcard envoy/*.yaml)

.PHONY: help setup build lint unit-test wasm-test integration-test validate test run bench bench-compute bench-iperf bench-real fuzz clean distclean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: ## install toolchain targets, Envoy (.venv), redis-server, wasm-bindgen-test-runner (.tools); idempotent
	@scripts/setup.sh

build: ## build the filter module, its fault-injection and next-layout test builds (target/fault, target/layout) and the benchmark's reference filter (wasm32-wasip1), podsim and prefix-bench
	cargo build --target wasm32-wasip1 --release
	cargo build --target wasm32-wasip1 --release -p reference-filter
	cargo build --target wasm32-wasip1 --release --features fault-injection --target-dir target/fault
	cargo build --target wasm32-wasip1 --release --features next-layout --target-dir target/layout
	cargo build --release -p podsim
	cargo build --release -p prefix-bench

lint: ## rustfmt check, clippy (host and Envoy's wasm target) and rustdoc's link checks, warnings are errors
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --target wasm32-wasip1 --lib -- -D warnings
	cargo clippy --target wasm32-wasip1 -p reference-filter --lib -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --document-private-items

unit-test: ## host unit tests
	cargo test --workspace --lib --bins

wasm-test: ## pure-logic unit tests compiled to wasm32-unknown-unknown, run under node
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(TEST_RUNNER) \
		cargo test --lib --target wasm32-unknown-unknown

integration-test: build ## tests/ against real Envoy, podsim and Redis; podsim's own server tests
	ENVOY_BIN=$(ENVOY_BIN) cargo test --test '*'
	cargo test -p podsim --tests

validate: build ## envoy --mode validate on every envoy/*.yaml (loads the module: needs build)
	@for f in $(CONFIGS); do \
		if out=$$($(ENVOY_BIN) --mode validate -c "$$f" 2>&1); then \
			echo "validate: $$f OK"; \
		else \
			echo "$$out" | tail -n 20; echo "validate: $$f FAILED"; exit 1; \
		fi; \
	done

test: setup build lint unit-test wasm-test integration-test validate test-release ## everything CI checks

run: setup build ## demo: 2 Envoy replicas syncing via Redis, 4 simulated pods, a shared-prefix workload, a summary
	cargo build --release -p prefix-bench
	$(BENCH) run --replicas 2

bench: setup build ## benchmarks: filter overhead, sync cost, compat aibrix cost, sync convergence, memory, placement wait, routers side by side, inference-perf (tables; JSON/SVG in results/)
	cargo build --release -p prefix-bench
	$(BENCH) overhead
	$(MAKE) --no-print-directory bench-compute
	$(BENCH) sync-cost
	$(BENCH) compat-cost
	$(BENCH) convergence
	$(BENCH) memory
	$(BENCH) place-wait
	scripts/bench/setup-peers.sh
	$(BENCH) compare
	$(MAKE) --no-print-directory bench-iperf
	@echo "bench: results in $(CURDIR)/results/"

bench-compute: setup ## the filter's request-path compute (parse, hash, route) compiled to wasm, timed under node's V8: no Envoy, no hostcalls
	cargo build --release --target wasm32-unknown-unknown -p vm-bench
	node scripts/bench/vm-compute.js target/wasm32-unknown-unknown/release/vm_bench.wasm

bench-iperf: setup build ## kubernetes-sigs inference-perf against the filter and round robin over simulated pods
	scripts/bench/setup-inference-perf.sh
	$(BENCH) iperf

bench-real: setup build ## real LLM: 2 llama-servers (Gemma 3 270M, CPU) behind round robin, the filter, sglang, vllm-router
	scripts/bench/setup-real-llm.sh
	scripts/bench/setup-peers.sh
	$(BENCH) real

.PHONY: release test-release
release: ## dist/: the module, its .sha256 and an OCI Wasm image, named by Cargo's version (docs/install.md)
	scripts/release/release.sh

test-release: setup release ## the release's OCI image through a real registry on 127.0.0.1: push, pull back (skopeo, oras), check digests, route through the pulled module
	ENVOY_BIN=$(ENVOY_BIN) cargo test --test release -- --ignored --nocapture

FUZZ_ITERS ?= 1000000
FUZZ_SEED  ?= $(shell date +%s)

# make test runs tests/fuzz.rs with 10^4 inputs per target and a fixed seed
# (it is one of tests/*.rs). This is the long run: release with overflow
# checks and unwinding (each failing input is reported), no LTO (fast build).
fuzz: ## fuzz every parser of untrusted bytes: $(FUZZ_ITERS) inputs per target (FUZZ_SEED=... replays)
	CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
	CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true \
	CARGO_PROFILE_RELEASE_PANIC=unwind \
	FUZZ_ITERS=$(FUZZ_ITERS) FUZZ_SEED=$(FUZZ_SEED) \
		cargo test --release --test fuzz -- --nocapture

clean: ## remove build output (keeps .venv and .tools)
	cargo clean
	rm -rf results

distclean: clean ## also remove the installed tools (.venv, .tools)
	rm -rf .venv .tools
