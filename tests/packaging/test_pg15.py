"""PGXS builds per PostgreSQL major: `make -C sql install` for Debian's PostgreSQL 15 right after
a build for the embedded 18 installs a module built for 15 (an 18 one fails to load there:
undefined symbol pqsignal_be), and the extension then works in a 15 cluster."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg

from dpsql import server
from tests.packaging import debian15

REPO = Path(__file__).resolve().parents[2]


def _make(sql: Path, pg_config: Path, *targets: str) -> None:
    out = subprocess.run(
        ["make", "-C", str(sql), "-j2", f"PG_CONFIG={pg_config}", *targets],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_install_into_15_right_after_the_embedded_build(tmp_path: Path) -> None:
    debian15.require(headers=True)
    ignore = shutil.ignore_patterns("*.o", "*.so", "build", ".pg_build_id")
    shutil.copytree(REPO / "sql", tmp_path / "sql", ignore=ignore)
    shutil.copytree(REPO / "core", tmp_path / "core", ignore=ignore)
    sql = tmp_path / "sql"
    _make(sql, server.pg_config_path(18))
    _make(sql, debian15.PG_CONFIG, "install")  # no clean in between: the Makefile's business
    with debian15.cluster() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION dpsql")  # creating its C functions loads the module
        conn.execute("SELECT dpsql_internal._load_module()")
        version = conn.execute("SHOW server_version_num").fetchone()[0]
        assert version.startswith("15")
