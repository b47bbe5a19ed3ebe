"""Small helpers for tests that talk to the server."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg

from dpsql.loading import load_numpy
from dpsql.training import TrainingRun, train_args

DEFAULTS: dict[str, Any] = dict(
    model="logistic",
    epochs=1,
    batch_size=1,
    lambda_=0.0,
    step_size=None,
    schedule="constant",
    radius=None,
    shuffle=True,
    seed=7,
    labels=None,
    intercept=False,
    row_norm="none",
    huber_h=0.1,
    step_offset=0.0,
    tolerance=None,
    parallel_workers=0,
)


def load(conn: psycopg.Connection, schema: str, table: str, X: np.ndarray, y: np.ndarray) -> str:
    load_numpy(conn, table, X, y, schema=schema)
    return f"{schema}.{table}"


def prepare(
    conn: psycopg.Connection, source: str, features: Any = "x", label: str = "y", **kw: Any
) -> TrainingRun:
    args = {**DEFAULTS, **kw}
    return TrainingRun.prepare(
        conn, train_args(source=source, features=features, label=label, **args)
    )


def run_state(conn: psycopg.Connection, run_id: int) -> np.ndarray:
    row = conn.execute("SELECT state FROM dpsql.runs WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return np.asarray(row[0], dtype=np.float64)


def training_rows(conn: psycopg.Connection, run_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The run's training table in scan (rid) order."""
    (table,) = conn.execute(
        "SELECT train_table FROM dpsql.runs WHERE run_id = %s", (run_id,)
    ).fetchone()
    rows = conn.execute(f"SELECT x, y FROM {table} ORDER BY rid").fetchall()
    return np.array([r[0] for r in rows], dtype=np.float64), np.array([r[1] for r in rows])


def leftovers(conn: psycopg.Connection) -> tuple[int, int, int]:
    """(training tables, runs, models): what a failed call must not change."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = 'dpsql_work'),"
        " (SELECT count(*) FROM dpsql.runs), (SELECT count(*) FROM dpsql.models)"
    ).fetchone()
    assert row is not None
    return row
