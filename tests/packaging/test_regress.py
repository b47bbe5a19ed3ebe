"""The regression suite of the SQL surface (sql/test, pg_regress layout): each
sql/test/sql/NAME.sql runs through psql in a fresh database, as pg_regress runs it
(`psql -X -a -q`), and its output must equal sql/test/expected/NAME.out.

`make -C sql installcheck` runs the same files with PGXS's pg_regress where that binary works
(Debian's postgresql-server-dev, the Docker image); the embedded wheel's pg_regress crashes on
start, so the test suite drives psql itself."""

from __future__ import annotations

import difflib
import os
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dpsql import extension, server

TEST_DIR = Path(extension.source_dir()) / "test"
CASES = sorted(p.stem for p in (TEST_DIR / "sql").glob("*.sql"))


def _psql() -> Path:
    pg_config = server.pg_config_path(server.DEFAULT_PG_VERSION)
    bindir = subprocess.run(
        [str(pg_config), "--bindir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(bindir) / "psql"


@pytest.mark.parametrize("case", CASES)
def test_sql_surface(server_uri: str, case: str) -> None:
    psql = _psql()
    if not psql.exists():
        pytest.skip(f"no psql at {psql}")
    db = f"regress_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_uri, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    try:
        info = conninfo_to_dict(make_conninfo(server_uri, dbname=db))
        env = {
            **os.environ,
            "PGAPPNAME": "pg_regress",
            "LC_MESSAGES": "C",
            "PGOPTIONS": "-c lc_messages=C -c client_min_messages=warning",
        }
        for key, var in (
            ("host", "PGHOST"),
            ("port", "PGPORT"),
            ("user", "PGUSER"),
            ("password", "PGPASSWORD"),
            ("passfile", "PGPASSFILE"),
            ("dbname", "PGDATABASE"),
        ):
            if info.get(key):
                env[var] = str(info[key])
        # pg_regress's layout: the output in sql/results (ignored by git), for review or to
        # become the expected file; a file, as pg_regress gives psql, keeps errors in place
        results = TEST_DIR.parent / "results"
        results.mkdir(exist_ok=True)
        with (
            open(TEST_DIR / "sql" / f"{case}.sql") as script,
            open(results / f"{case}.out", "w") as output,
        ):
            subprocess.run(
                [str(psql), "-X", "-a", "-q"],
                stdin=script,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
            )
        got = (results / f"{case}.out").read_text()
        expected = (TEST_DIR / "expected" / f"{case}.out").read_text()
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                got.splitlines(keepends=True),
                f"expected/{case}.out",
                f"results/{case}.out",
            )
        )
        assert not diff, diff[-4000:]
    finally:
        with psycopg.connect(server_uri, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )
