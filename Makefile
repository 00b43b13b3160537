.PHONY: help install build lint test test-ci test-pure durations run openapi bench

VENV ?= .venv
PY := $(VENV)/bin/python

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(PY):
	python3 -m venv $(VENV)

install: $(PY)  ## install with test extras (compiles the Cython core)
	$(PY) -m pip install -q -e '.[test]'

build: install  ## rebuild the Cython core in place (an isolated build: the venv's setuptools may be old)
	$(PY) -m pip install -q --no-deps -e .

lint: install  ## ruff and mypy
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy service

test: install  ## the test suite (SQLite and PostgreSQL)
	$(PY) -m pytest -q

test-ci: install  ## the CI tier: long end-to-end tests the README's command leaves out (README)
	$(PY) -m pytest -q -m ci

test-pure: install  ## core and sizing tests on the pure-Python reference
	CI_SIZER_PURE_PYTHON=1 $(PY) -m pytest -q tests/core tests/sizing/test_sizing_api.py tests/sizing/test_golden.py tests/sizing/test_policy_parity.py

durations: install  ## both tiers timed: rewrites tests/durations.json (the long tests, which start first)
	CI_SIZER_FULL_EXAMPLES=1 $(PY) -m pytest -q -m '' --durations=0 | tee .durations.log
	$(PY) tests/tools/durations.py .durations.log && rm -f .durations.log

run: install  ## serve on the embedded SQLite default
	$(VENV)/bin/ci-sizer serve

openapi: install  ## regenerate openapi/openapi.json
	$(VENV)/bin/ci-sizer openapi --output openapi/openapi.json

# Benchmarks print figures and write bench/RESULTS.md; they are not tests. They need wrk
# (apt-get install wrk) and PostgreSQL: BENCH_DATABASE_URL if given, else CI_SIZER_TEST_DATABASE_URL,
# else a throwaway initdb/pg_ctl cluster. See docs/performance.md.
BENCH_DATABASE_URL ?=
DB_FLAG = $(if $(BENCH_DATABASE_URL),--database-url $(BENCH_DATABASE_URL),)

bench: $(PY)  ## all benches (under 10 minutes); writes bench/RESULTS.md
	$(PY) -m pip install -q -e '.[bench]'
	mkdir -p bench/out
	$(PY) bench/mixed.py $(DB_FLAG) --paced --results bench/out/mixed.json
	$(PY) bench/mixed.py $(DB_FLAG) --workers 2 --results bench/out/mixed-workers.json
	$(PY) bench/mixed.py $(DB_FLAG) --replicas 2 --results bench/out/mixed-replicas.json
	$(PY) bench/core.py --results bench/out/core.json
	$(PY) bench/http.py $(DB_FLAG) --results bench/out/http.json
	$(PY) bench/http.py --sqlite --results bench/out/http-sqlite.json
	$(PY) bench/history.py $(DB_FLAG) --results bench/out/history.json
	$(PY) bench/ingest.py $(DB_FLAG) --results bench/out/ingest.json
	$(PY) bench/pgpool.py $(DB_FLAG) --results bench/out/pgpool.json
	$(PY) bench/placement.py --results bench/out/placement.json
	$(PY) bench/backtest.py --results bench/out/backtest.json
	$(PY) bench/ui.py $(DB_FLAG) --results bench/out/ui.json
	$(PY) bench/ui.py --sqlite --results bench/out/ui-sqlite.json
	$(PY) bench/report.py bench/out/mixed.json bench/out/mixed-workers.json bench/out/mixed-replicas.json bench/out/core.json bench/out/http.json bench/out/http-sqlite.json bench/out/history.json bench/out/ingest.json bench/out/pgpool.json bench/out/placement.json bench/out/backtest.json bench/out/ui.json bench/out/ui-sqlite.json > bench/RESULTS.md
	@echo "wrote bench/RESULTS.md"
