"""The embedded server trusts no one (issue 9): every login needs its password, the
superuser's included; `dpsql role create` gives analysts and data owners theirs."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dpsql import cli, roles, server

# The container stage runs this module against the image (tests/container).
pytestmark = pytest.mark.smoke


@pytest.fixture(scope="module")
def fresh_server() -> Iterator[tuple[str, Path]]:
    """A server dpsql initialised itself (the test server may be DPSQL_TEST_DSN's)."""
    parent = Path(tempfile.mkdtemp(prefix="dpsql-auth-"))
    pgdata = parent / "pg"
    uri = server.start(pgdata=pgdata, keep_running=False)
    yield uri, pgdata
    server.stop(pgdata=pgdata)
    shutil.rmtree(parent, ignore_errors=True)


def _without_passfile(uri: str, **extra: str) -> str:
    params = conninfo_to_dict(uri)
    params.pop("passfile", None)
    params.update(extra)
    return make_conninfo("", **params)


def test_superuser_needs_its_password(fresh_server) -> None:
    uri, pgdata = fresh_server
    passfile = server.password_file(pgdata)
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert passfile.stat().st_uid == os.getuid()
    with psycopg.connect(uri) as conn:  # the printed URI works for its owner
        assert conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()[0]
        rules = conn.execute(
            "SELECT DISTINCT auth_method FROM pg_hba_file_rules WHERE error IS NULL"
        ).fetchall()
    assert rules == [("scram-sha-256",)]
    for attempt in [_without_passfile(uri), _without_passfile(uri, password="wrong")]:
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(attempt, connect_timeout=10)


def test_role_create_gives_a_working_password(fresh_server, capsys) -> None:
    uri, _ = fresh_server
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS dpsql")
    name = f"ana_{uuid.uuid4().hex[:8]}"
    assert cli.main(["role", "create", name, "--dsn", uri]) == 0
    analyst_uri = capsys.readouterr().out.strip()
    with psycopg.connect(analyst_uri) as a:
        assert a.execute("SELECT current_user").fetchone()[0] == name
        assert a.execute("SELECT pg_has_role(current_user, 'dpsql_analyst', 'MEMBER')").fetchone()[
            0
        ]
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(_without_passfile(analyst_uri, password="nope"), connect_timeout=10)
    # Creating it twice fails cleanly (exit 1, the server's message).
    assert cli.main(["role", "create", name, "--dsn", uri]) == 1
    assert "already exists" in capsys.readouterr().err


def test_a_failed_role_create_logs_no_password(fresh_server) -> None:
    """CREATE ROLE that fails (the role exists) is logged with its statement: the statement
    must hold no password (issue 24)."""
    uri, pgdata = fresh_server
    log = pgdata / "log"
    start = log.stat().st_size
    name = f"ana_{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS dpsql")
        assert roles.create_role(conn, name, password=password) == password
        with pytest.raises(psycopg.errors.DuplicateObject):
            roles.create_role(conn, name, password=password)
    assert cli.main(["role", "create", name, "--dsn", uri]) == 1
    with psycopg.connect(roles.role_uri(uri, name, password)) as a:
        assert a.execute("SELECT current_user").fetchone()[0] == name
    written = log.read_bytes()[start:].decode(errors="replace")
    assert "already exists" in written  # the failures are in the log...
    assert password not in written  # ...their passwords are not, not even as verifiers
    assert "PASSWORD '" not in written and "SCRAM-SHA-256$" not in written
