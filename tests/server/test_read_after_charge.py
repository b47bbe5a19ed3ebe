"""A private release reads no row before its charge (issue 45: plan, charge, then read).

The run is prepared from the public row count with an empty training table; its rows are read
after the charge has committed (dpsql_internal._read_rows), with the same seeded order. The
test holds the charge at the dataset's row lock, adds rows to the source meanwhile, and lets the
charge go: a release that had read its rows before the charge would train on the old ones; this
one reads the new ones, sees that the count it was planned from changed, and refuses with the
charge kept (it is durable before any read)."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from tests.pg_helpers import await_waiter

MECHANISMS = ["bolton", "dpsgd", "output_perturbation"]


@pytest.fixture
def dataset(conn, scratch_schema, make_role):
    conn.execute(
        "CREATE TABLE t AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
        " CASE WHEN g % 3 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 1000) g"
    )
    name = f"rc_{uuid.uuid4().hex[:8]}"
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 100, 1e-3, name => %s,"
        " row_norm => 'clip')",
        (f"{scratch_schema}.t", name),
    ).fetchone()
    role, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, role))
    return ds, name, connect, f"{scratch_schema}.t"


def _entries(conn, ds: int) -> int:
    (n,) = conn.execute(
        "SELECT count(*) FROM dpsql.ledger_entries WHERE dataset_id = %s", (ds,)
    ).fetchone()
    return n


@pytest.mark.parametrize("privacy", MECHANISMS)
def test_rows_are_read_after_the_charge(conn, server_uri, dataset, privacy):
    ds, name, connect, table = dataset
    outcome: dict[str, object] = {}

    def release() -> None:
        with connect() as analyst:
            try:
                outcome["model"] = analyst.execute(
                    "SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => %s, epsilon => 1,"
                    " delta => 1e-5, lambda => 0.1)",
                    (name, privacy),
                ).fetchone()
            except psycopg.Error as e:
                outcome["error"] = e

    with psycopg.connect(server_uri) as holder:  # a transaction: holds the row lock
        holder.execute("SELECT 1 FROM dpsql.datasets WHERE dataset_id = %s FOR UPDATE", (ds,))
        worker = threading.Thread(target=release)
        worker.start()
        # the charge waits for the dataset's row (its lock_timeout is 2 s: act at once)
        await_waiter(conn, holder, timeout=30)
        conn.execute(
            f"INSERT INTO {table} SELECT 2000 + g, 0.5, 0.5, 1 FROM generate_series(1, 10) g"
        )
        holder.commit()
    worker.join(60)
    assert "model" not in outcome, "the release trained on rows read before its charge"
    error = outcome["error"]
    assert isinstance(error, psycopg.Error)
    assert error.sqlstate == "DP003"  # not 40001: a client's automatic retry would charge again
    assert "rows changed while this release was planned" in str(error)
    assert "charge stands" in str(error)
    assert _entries(conn, ds) == 1  # charged, durably, before the read


def test_unchanged_rows_release_and_charge_once(conn, dataset):
    ds, name, connect, _ = dataset
    (last,) = conn.execute("SELECT last_value FROM dpsql.runs_run_id_seq").fetchone()
    with connect() as analyst:
        (mid,) = analyst.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => 'bolton', epsilon => 1,"
            " lambda => 0.1)",
            (name,),
        ).fetchone()
    (rows,) = conn.execute(
        "SELECT rows FROM dpsql.model_store WHERE model_id = %s", (mid,)
    ).fetchone()
    assert rows == 1000
    assert _entries(conn, ds) == 1
    # the pending read (its SQL and seed) is gone with the run
    left = conn.execute("SELECT count(*) FROM dpsql.runs WHERE run_id > %s", (last,)).fetchone()
    assert left == (0,)
