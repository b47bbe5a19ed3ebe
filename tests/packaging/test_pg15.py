"""PGXS builds per PostgreSQL major: `make -C sql install` for Debian's PostgreSQL 15 right after
a build for the embedded 18 installs a module built for 15 (an 18 one fails to load there:
undefined symbol pqsignal_be), and the extension then works in a 15 cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest

from dpsql import server
from tests import definer_role
from tests.packaging import debian15
from tests.packaging.pgxs import copy_built, make


def _make(sql: Path, pg_config: Path, *targets: str) -> None:
    out = make(sql, pg_config, *targets)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.fixture(scope="session")
def built_for_15_after_18(
    tmp_path_factory: pytest.TempPathFactory,
    embedded_18_build: tuple[Path, subprocess.CompletedProcess[str]],
) -> Path:
    """A copy of the tree test_build.py built for 18 (conftest.py), as that build left it, then
    `make install` for Debian's 15 in it (one build for 15 serves both tests here)."""
    debian15.require(headers=True)
    built, out = embedded_18_build
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sql = copy_built(built, tmp_path_factory.mktemp("build15"))
    assert (sql / "dpsql.so").is_file() and str(server.pg_config_path(18).parent.parent) in (
        (sql / ".pg_build_id").read_text()
    )
    _make(sql, debian15.PG_CONFIG, "install")  # no clean in between: the Makefile's business
    return sql


def test_install_into_15_right_after_the_embedded_build(built_for_15_after_18: Path) -> None:
    # (again: a purge of the 15 deb in between would have removed it; built, it only installs)
    _make(built_for_15_after_18, debian15.PG_CONFIG, "install")
    with debian15.cluster() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION dpsql")  # creating its C functions loads the module
        conn.execute("SELECT dpsql_internal._load_module()")
        version = conn.execute("SHOW server_version_num").fetchone()[0]
        assert version.startswith("15")


def test_the_definer_role_on_15(built_for_15_after_18: Path) -> None:
    """On PostgreSQL 15: dpsql_definer is what tests/definer_role.py says, and a release's
    charge worker, which cannot connect as a role without login before PostgreSQL 17, takes it
    after connecting. The extension is installed here: another packaging test purges the 15
    deb, and with it what `make pg15` installed, in an order xdist decides."""
    _make(built_for_15_after_18, debian15.PG_CONFIG, "install")  # (built: it installs)
    with debian15.cluster() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION dpsql")
        definer_role.check_all(conn)
        conn.execute(
            "CREATE TABLE pts AS SELECT (g % 10) / 10.0::float8 AS a, (g % 2)::float8 AS y"
            " FROM generate_series(1, 200) g"
        )
        conn.execute(
            "SELECT dpsql.register_dataset('pts', '{a}', 'y', 5.0, labels => '{0,1}', name => 'p')"
        )
        conn.execute("SELECT dpsql.train('p', NULL, NULL, privacy => 'bolton', epsilon => 0.5)")
        (spent,) = conn.execute("SELECT sum(epsilon) FROM dpsql.ledger_entries").fetchone()
        assert spent == 0.5
