"""The dpsql Docker image, in a running container (the ``running`` fixture, conftest.py): what
only a container can show. The roles are those the image creates on first start from
``DPSQL_ANALYST`` / ``DPSQL_OWNER`` (docker/initdb/10-dpsql.sh).
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dpsql.loading import load_numpy


def test_a_wrong_password_is_refused_over_tcp(running) -> None:
    for dsn in (running.dsn, running.analyst, running.owner):
        info = conninfo_to_dict(dsn)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(make_conninfo(dsn, password=f"{info['password']}x"))


def test_no_trust_in_pg_hba(running) -> None:
    with psycopg.connect(running.dsn) as conn:
        methods = {
            r[0] for r in conn.execute("SELECT auth_method FROM pg_hba_file_rules").fetchall()
        }
    assert methods <= {"scram-sha-256", "reject"}, methods


def test_the_analyst_of_the_documented_route_trains_privately_and_reads_no_rows(running) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3)) / 2
    y = (X @ np.array([1.0, -1.0, 0.5]) > 0).astype(float)
    analyst = conninfo_to_dict(running.analyst)["user"]
    owner_role = conninfo_to_dict(running.owner)["user"]
    with psycopg.connect(running.owner, autocommit=True) as owner:
        # the first start gave the owner a schema of their own, first on their search_path
        # (PostgreSQL 15+ grants no CREATE in public): an unqualified table lands there
        owner.execute("CREATE TABLE probe (a int)")
        (schema,) = owner.execute(
            "SELECT relnamespace::regnamespace::text FROM pg_class WHERE relname = 'probe'"
        ).fetchone()
        assert schema == owner_role
        owner.execute("DROP TABLE probe")
        load_numpy(owner, "points", X, y, replace=True)
        ds = owner.execute(
            "SELECT dpsql.register_dataset('points', '{x}', 'y', epsilon_budget => 5,"
            " delta_budget => 1e-3,"
            " labels => '{0,1}', row_norm => 'clip', name => 'points')"
        ).fetchone()[0]
        owner.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    with psycopg.connect(running.analyst, autocommit=True) as a:
        model = a.execute(
            "SELECT dpsql.train('points', NULL, NULL, privacy => 'bolton', epsilon => 1)"
        ).fetchone()[0]
        assert model > 0
        # DP-SGD calibrates with the accountant the image presets (dpsql.accountant_command)
        dpsgd = a.execute(
            "SELECT dpsql.train('points', NULL, NULL, privacy => 'dpsgd', epsilon => 1,"
            " delta => 1e-5)"
        ).fetchone()[0]
        assert dpsgd > model
        for query in (
            f'SELECT * FROM "{owner_role}".points LIMIT 1',
            "SELECT * FROM dpsql.model_store LIMIT 1",
            "SELECT * FROM dpsql.runs LIMIT 1",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute(query)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("SELECT dpsql.train('points', '{x}', 'y')")  # noiseless: owners only


def _counts(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM dpsql.ledger), (SELECT count(*) FROM dpsql.datasets),"
            " (SELECT count(*) FROM dpsql.model_store)"
        ).fetchone()
    assert row is not None
    return row


def test_a_restart_keeps_the_ledger_datasets_and_models(running) -> None:
    before = _counts(running.dsn)
    assert before[0] > 0 and before[1] > 0 and before[2] > 0  # the analyst test ran first
    running.restart()
    assert _counts(running.dsn) == before
