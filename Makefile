.PHONY: help install build lint test test-pure run openapi bench

VENV ?= .venv
PY := $(VENV)/bin/python

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(PY):
	python3 -m venv $(VENV)

install: $(PY)  ## install with test extras (compiles the Cython core)
	$(PY) -m pip install -q -e '.[test]'

build: install  ## rebuild the Cython core in place
	$(PY) setup.py build_ext --inplace

lint: install  ## ruff and mypy
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy service

test: install  ## the test suite (SQLite and PostgreSQL)
	$(PY) -m pytest -q

test-pure: install  ## core and sizing tests on the pure-Python reference
	CI_SIZER_PURE_PYTHON=1 $(PY) -m pytest -q tests/core tests/test_sizing_api.py tests/test_golden.py

run: install  ## serve on the embedded SQLite default
	$(VENV)/bin/ci-sizer serve

openapi: install  ## regenerate openapi/openapi.json
	$(VENV)/bin/ci-sizer openapi --output openapi/openapi.json
