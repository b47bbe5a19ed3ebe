"""The README's `dpsql load`, `dataset estimate-bounds`, `evaluate` and `predict` lines, run as
written (issue 42: every documented command is run by a test): read from the README, in the
repository's root, as a data owner of a fresh database (so the model trained first is 1)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from dpsql import roles

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = ("load", "dataset estimate-bounds", "evaluate", "predict")


def readme_lines() -> dict[str, str]:
    """The README's command line of each DOCUMENTED command, without its comment."""
    found = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        for command in DOCUMENTED:
            if line.startswith(f".venv/bin/dpsql {command} "):
                found[command] = line.split("  #")[0].strip()
    assert set(found) == set(DOCUMENTED), found
    return found


@pytest.fixture
def owner_of_fresh_database(conn, server_uri) -> Iterator[str]:
    """A data owner's URI in a new database with the extension."""
    database, name = f"readme_{uuid.uuid4().hex[:8]}", f"readme_own_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    uri = make_conninfo(server_uri, dbname=database)
    try:
        with psycopg.connect(uri, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION dpsql")
            password = roles.create_role(admin, name, "owner")
        yield roles.role_uri(uri, name, password)
    finally:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _run(line: str, dsn: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DPSQL_DSN", "DPSQL_PGDATA")}
    env["DPSQL_PGDATA"] = str(Path(tempfile.gettempdir()) / f"dpsql-cli-none-{uuid.uuid4().hex}")
    env["DPSQL_DSN"] = dsn
    return subprocess.run(
        ["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600
    )


def test_readme_commands_run_as_written(owner_of_fresh_database, tmp_path) -> None:
    dsn, lines = owner_of_fresh_database, readme_lines()
    loaded = _run(lines["load"], dsn)
    assert loaded.returncode == 0, loaded.stderr
    assert re.match(
        r"created table \S+\.hi: 4000 rows from tests/data/hi_sample.csv.gz", loaded.stdout
    )

    # protein and protein_test, as the README's other lines name them: numeric features
    rng = np.random.default_rng(5)
    for table, rows in (("protein", 3000), ("protein_test", 500)):
        X = rng.normal(size=(rows, 3))
        y = (X @ [1.0, -1.0, 0.5] + 0.3 * rng.normal(size=rows) > 0).astype(int)
        path = tmp_path / f"{table}.csv"
        body = "".join(f"{a},{b},{c},{v}\n" for (a, b, c), v in zip(X, y, strict=True))
        path.write_text("a,b,c,y\n" + body)
        assert _run(f".venv/bin/dpsql load {path} {table}", dsn).returncode == 0
    setup = (
        ".venv/bin/dpsql dataset register protein --features a,b,c --label y --labels 0,1"
        " --epsilon-budget 5"
    )
    assert _run(setup, dsn).returncode == 0

    estimated = _run(lines["dataset estimate-bounds"], dsn)
    assert estimated.returncode == 0, estimated.stderr
    assert estimated.stdout.splitlines()[-1].startswith("charged epsilon 0.5 (delta 0)")
    trained = _run(".venv/bin/dpsql train protein --privacy bolton --epsilon 1", dsn)
    assert trained.stdout.startswith("model 1: "), (trained.stdout, trained.stderr)

    evaluated = _run(lines["evaluate"], dsn)
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith("model 1 (logistic) on protein_test: 500 rows")
    predicted = _run(lines["predict"], dsn)
    assert predicted.returncode == 0, predicted.stderr
    assert len(predicted.stdout.splitlines()) == 2 + 5
