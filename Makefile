# berth: `make run` sets up LXD and brings the quickstart project up; `make test` runs every test.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
FEATURES := --features berth/testing
BERTH_RELEASE := target/release/berth
BERTH_SOCKET ?= /run/berth/berth.sock
BERTH_DATA_DIR ?= /var/lib/berth
BERTH_LOG_FILE ?= /var/log/berth/berth.log

.PHONY: help run stop test unit bench lint images schemas build deb

help:
	@echo "make run     set up LXD and images, start the daemon, apply the quickstart project (Ready)"
	@echo "make test    set up LXD and images, then run every test (unit, API, CLI, end-to-end on LXD)"
	@echo "make bench   benchmarks, printed as tables"
	@echo "make lint    cargo fmt --check and clippy -D warnings"
	@echo "make images  rebuild the berth-base, berth-tiny and berth-agents LXD images"
	@echo "make stop    stop the daemon started by make run"
	@echo "make deb     build the Debian package target/debian/berth_<version>_<arch>.deb"

build:
	$(CARGO) build --release -p berth

run: build
	bash scripts/setup-lxd
	bash scripts/run-daemon "$(BERTH_RELEASE)" "$(BERTH_SOCKET)" "$(BERTH_DATA_DIR)" "$(BERTH_LOG_FILE)"
	$(BERTH_RELEASE) --server "$(BERTH_SOCKET)" apply -f examples/quickstart/ --wait --timeout 10m
	$(BERTH_RELEASE) --server "$(BERTH_SOCKET)" get projects
	@echo "berth is running: export BERTH_SERVER=$(BERTH_SOCKET); daemon log in $(BERTH_LOG_FILE)"

stop:
	bash scripts/run-daemon --stop "$(BERTH_SOCKET)" "$(BERTH_DATA_DIR)"

# A clean build writes no incremental state: the suite's target stays a few GB on a shared disk.
test: export CARGO_INCREMENTAL = 0
test:
	bash scripts/setup-lxd
	bash scripts/setup-test-deps
	$(CARGO) build -p berth $(FEATURES)
	set -o pipefail; $(CARGO) nextest run --workspace $(FEATURES) --no-fail-fast --profile ci 2>&1 \
		| tee target/nextest.log || { bash scripts/lxd-report; \
		echo "== failed tests (whole output in target/nextest.log):"; \
		grep -E '^ +(FAIL|TIMEOUT|SIGSEGV|SIGABRT|LEAK)' target/nextest.log | sort -u; \
		grep -E -A12 '^ +stderr ───' target/nextest.log | grep -E 'panicked at|^ {4}[^ ]' | head -40; \
		exit 1; }

unit:
	$(CARGO) nextest run --workspace $(FEATURES) --lib --bins

bench:
	bash scripts/setup-lxd
	$(CARGO) build --release -p berth $(FEATURES)
	bash scripts/bench

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(FEATURES) -- -D warnings

images:
	bash scripts/setup-lxd --rebuild

schemas:
	BERTH_UPDATE_SCHEMAS=1 $(CARGO) test -p berth-api schema

deb:
	bash scripts/build-deb
