"""Fixtures against a real PostgreSQL server (never mocks).

By default the session runs a throw-away embedded server (``DPSQL_PG_VERSION``: 18 or 16) in a
temporary data directory, with the dpsql extension built from this checkout. ``DPSQL_TEST_DSN``
points the suite at an existing server instead (the extension must be installable there: it is
built automatically only for the embedded PostgreSQL).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus

from dpsql import extension, server

REPO_ROOT = Path(__file__).resolve().parent.parent


# Markers by directory (pyproject.toml lists them all), and the groups pytest-xdist keeps on one
# worker (make test runs `-n 2 --dist loadgroup`): the Citus tests share one cluster, and the
# packaging tests install and purge packages of the one Debian PostgreSQL 15.
_BY_DIRECTORY = {"packaging": "packaging", "citus": "citus", "container": "container"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in _BY_DIRECTORY:
            item.add_marker(getattr(pytest.mark, _BY_DIRECTORY[folder]))
            item.add_marker(pytest.mark.xdist_group(folder))
        doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
        if "false-failure" in doc or "false failure" in doc:
            item.add_marker(pytest.mark.statistical)


def _prepare_extension(uri: str, pg_config: Path | None) -> None:
    # A broken extension build must not stop the tests that do not need the extension; the
    # warning (in pytest's summary) says why those that do fail.
    try:
        extension.ensure_available(uri, pg_config)
    except (RuntimeError, OSError) as err:
        warnings.warn(f"dpsql extension not available: {err}", stacklevel=1)


@pytest.fixture(scope="session")
def server_uri() -> Iterator[str]:
    """URI of the test server: ``DPSQL_TEST_DSN``, else a temporary embedded server."""
    dsn = os.environ.get("DPSQL_TEST_DSN")
    if dsn:
        _prepare_extension(dsn, None)
        yield dsn
        return
    version = server.DEFAULT_PG_VERSION
    with server.temporary_server(version) as uri:
        _prepare_extension(uri, server.pg_config_path(version))
        yield uri


@pytest.fixture
def own_server_uri() -> Iterator[str]:
    """A throw-away embedded server of the test's own, for tests that crash or restart a
    server: the shared one stays up for every other test (issue 43)."""
    version = server.DEFAULT_PG_VERSION
    with server.temporary_server(version) as uri:
        _prepare_extension(uri, server.pg_config_path(version))
        with psycopg.connect(uri, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS dpsql")
        yield uri


def _connect(uri: str) -> psycopg.Connection:
    """A connection; a server that is starting or recovering (a loaded machine, a container
    that restarted) is waited for, up to two minutes, instead of failing the test."""
    try:
        return psycopg.connect(uri, autocommit=True)
    except psycopg.OperationalError:
        server.wait_until_ready(uri, 120)
        return psycopg.connect(uri, autocommit=True)


@pytest.fixture
def conn(server_uri: str) -> Iterator[psycopg.Connection]:
    """A fresh autocommit connection, with the dpsql extension created when it can be."""
    with _connect(server_uri) as connection:
        # Not installable (yet): the tests that need it fail on their own.
        with contextlib.suppress(psycopg.Error):
            connection.execute("CREATE EXTENSION IF NOT EXISTS dpsql")
        yield connection


@pytest.fixture
def scratch_schema(conn: psycopg.Connection, server_uri: str) -> Iterator[str]:
    """Name of a fresh schema, first on ``conn``'s search_path; dropped after the test."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(name)))
    yield name
    if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
        conn.rollback()  # a transaction left open would hold locks that block the DROP
    # Own connection: the test may have closed or broken ``conn``.
    with psycopg.connect(server_uri, autocommit=True) as cleanup:
        cleanup.execute("SET lock_timeout = '30s'")
        cleanup.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """Shared real datasets: ``$DPSQL_DATASETS``, else ``../shared/datasets``; skip if absent."""
    override = os.environ.get("DPSQL_DATASETS")
    path = Path(override) if override else REPO_ROOT.parent / "shared" / "datasets"
    if not path.is_dir():
        pytest.skip(f"datasets folder {path} not found")
    return path


# A login role as (name, connect); the factory below makes them (roles, red team, errors).
Role = tuple[str, Callable[..., psycopg.Connection]]


@pytest.fixture
def make_role(conn, server_uri) -> Iterator[Callable[..., Role]]:
    """Factory of login roles (unique names, random passwords) and a way to connect as them."""
    made: list[str] = []

    def make(prefix: str, *member_of: str) -> Role:
        name = f"test_{prefix}_{uuid.uuid4().hex[:8]}"
        password = secrets.token_hex(16)
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
        made.append(name)
        for group in member_of:
            conn.execute(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name))
            )

        def connect(**kw) -> psycopg.Connection:
            info = make_conninfo(server_uri, user=name, password=password)
            return psycopg.connect(info, autocommit=True, **kw)

        return name, connect

    yield make
    for name in reversed(made):
        role = sql.Identifier(name)
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
        conn.execute(sql.SQL("DROP ROLE {}").format(role))
