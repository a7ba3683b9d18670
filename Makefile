# The two commands: `make demo` and `make test`. Both create/refresh .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fleetscope-installed
PYTEST_ARGS ?=

.PHONY: demo test venv lint typecheck bench clean browser-deps prometheus-deps

venv: $(STAMP)

# torch==2.13.0 (the local CPU build) goes in before anything that depends on torch,
# so pip never pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[all,dev]"
	touch $(STAMP)

demo: venv
	$(VENV)/bin/fleetscope demo

# Debian's chromium + chromium-driver for the browser tests (never a downloaded browser).
browser-deps:
	@if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian chromium + chromium-driver for the browser tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
	      || echo "warning: could not install chromium; browser tests will be skipped"; \
	  else echo "warning: chromium not installed and not root; browser tests will be skipped"; fi; \
	fi

# Debian's prometheus (+ promtool) for tests/test_prometheus.py and the promtool checks.
prometheus-deps:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian prometheus for the Prometheus tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
	      || echo "warning: could not install prometheus; the Prometheus tests will be skipped"; \
	  else echo "warning: prometheus not installed and not root; the Prometheus tests will be skipped"; fi; \
	fi

# Two runs: the unit tests on FAST_WORKERS workers (below), then the integration tests in
# one process, since they time real trainers, servers and a browser and must not share the
# cores with each other. Both run to the end; the exit status is the first failure's ("no
# tests collected", when PYTEST_ARGS picks tests of one kind only, is not a failure). In
# CI (2026-12-07) the serial suite ran 1231 s, 184 s of it unit tests.
test: venv browser-deps prometheus-deps
	@rc=0; \
	$(PY) -m pytest -m "not integration" -n $(FAST_WORKERS) --dist worksteal $(PYTEST_ARGS) || { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	$(PY) -m pytest -m integration $(PYTEST_ARGS) || { r=$$?; [ $$r = 5 ] || [ $$rc != 0 ] || rc=$$r; }; \
	exit $$rc

# Unit tests only: no subprocess, no server, no browser (tests/conftest.py marks the rest
# `integration` automatically). Under a minute; run it while you work, `make test` before
# you push. FAST_WORKERS pytest-xdist workers (0: in this process); idle workers steal
# tests from busy ones (--dist worksteal), so one heavy file no longer holds the run up
# (2 workers on 2 quiet cores: 48-51 s of pytest against 51-68 s with a file per worker). By default as
# many workers as CPUs while the 1-minute load is below that, else 0: on busy cores the
# workers' second collection costs more than the parallelism saves (at load 4-9, 120-146 s
# with two workers against 106-117 s in one process; at load 1-2, 49-56 s against 86 s).
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set, so pytest keeps its
# rewritten test modules and a re-run skips rewriting them (collection 16 s -> 8.6 s).
# The property/fuzz tests draw FAST_FUZZ_EXAMPLES examples each here (FLEETSCOPE_FUZZ_EXAMPLES,
# read by tests/test_codec_fuzz.py and tests/test_spool_properties.py); `make test` draws
# their default 300.
FAST_WORKERS ?= $(or $(shell $(PYTHON) -c 'import os; n = os.cpu_count() or 1; print(n if n >= 2 and os.getloadavg()[0] < n else 0)' 2>/dev/null),0)
FAST_FUZZ_EXAMPLES ?= 100
.PHONY: test-fast
test-fast: venv
	PYTHONDONTWRITEBYTECODE= FLEETSCOPE_FUZZ_EXAMPLES=$(FAST_FUZZ_EXAMPLES) $(PY) -m pytest -m "not integration" -n $(FAST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .fleetscope test-artifacts .pytest_cache
