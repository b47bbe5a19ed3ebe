"""Small helpers for tests that talk to the server."""

from __future__ import annotations

import time
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
    shard_parallel=False,
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
        "SELECT (SELECT count(*) FROM pg_tables"
        "         WHERE schemaname IN ('dpsql_work', 'dpsql_owner_work')),"
        " (SELECT count(*) FROM dpsql.runs), (SELECT count(*) FROM dpsql.models)"
    ).fetchone()
    assert row is not None
    return row


def await_waiter(conn: psycopg.Connection, holder: psycopg.Connection, timeout: float) -> None:
    """Return once another transaction waits for one that holder holds (e.g. a release's
    charge for the dataset's row that holder locked); fails after timeout seconds. Only a
    wait for holder's own transaction counts, not any lock wait on the server."""
    row = holder.execute("SELECT pg_current_xact_id()::xid::text").fetchone()
    assert row is not None
    deadline = time.monotonic() + timeout
    waiting = (
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
        " AND locktype = 'transactionid' AND transactionid::text = %s)"
    )
    while not conn.execute(waiting, (row[0],)).fetchone()[0]:
        assert time.monotonic() < deadline, "nothing waited for the held lock"
        time.sleep(0.005)


def register(
    conn: psycopg.Connection,
    schema: str,
    X: np.ndarray,
    y: np.ndarray,
    *,
    prefix: str = "ds",
    **kw: Any,
) -> tuple[int, str]:
    """Load (X, y) into a new table of schema and register it (epsilon budget 1000, delta
    budget 0.5, the other registration arguments from kw): (dataset id, source)."""
    import uuid

    source = load(conn, schema, f"t_{uuid.uuid4().hex[:6]}", X, y)
    extra = "".join(f", {k} => %({k})s" for k in kw)
    row = conn.execute(
        f"SELECT dpsql.register_dataset(%(t)s, '{{x}}', 'y', epsilon_budget => 1000,"
        f" delta_budget => 0.5, name => %(n)s{extra})",
        {"t": source, "n": f"{prefix}_{uuid.uuid4().hex[:8]}", **kw},
    ).fetchone()
    assert row is not None
    return row[0], source


def binary_dataset(conn: psycopg.Connection, schema: str) -> tuple[int, str, Any, Any]:
    """4,000 rows of 4 features, labels {0, 1} of a noisy linear rule (row_norm clip)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 4)) / 2
    y = (X @ np.array([2.0, -1.0, 0.5, 0.0]) + 0.2 * rng.normal(size=4000) > 0).astype(float)
    ds, source = register(conn, schema, X, y, labels=[0, 1])
    return ds, source, X, y


def regression_dataset(conn: psycopg.Connection, schema: str) -> tuple[int, str, Any, Any]:
    """4,000 rows of 3 features, |y| <= 2 (label_bound 2), rows clipped to the unit ball."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(4000, 3)) / 2
    y = np.clip(X @ np.array([0.5, -0.25, 0.125]) + 0.1 * rng.normal(size=4000), -2, 2)
    ds, source = register(conn, schema, X, y, label_bound=2.0, row_bound=2.0, row_norm="clip")
    return ds, source, X, y


def release(conn: psycopg.Connection, source: str, **args: Any) -> dict[str, Any] | None:
    """dpsql.train on a registered dataset with named arguments (dicts sent as jsonb): the
    release's row of dpsql.models, or None when nothing was released."""
    from psycopg.rows import dict_row
    from psycopg.types.json import Jsonb

    args = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in args.items()}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    row = conn.execute(
        f"SELECT dpsql.train(%(source)s, NULL, NULL, {names})", {"source": source, **args}
    ).fetchone()
    if row is None or row[0] is None:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (row[0],)).fetchone()


def one_hot_design(
    n: int = 8000, columns: int = 6, levels: int = 4, seed: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded categorical design, one-hot encoded (six ones a row: norm sqrt(6), clipped to 1
    at registration), labels of per-level effects with an offset: 78% of one class."""
    rng = np.random.default_rng(seed)
    cats = rng.integers(0, levels, size=(n, columns))
    effects = rng.normal(size=(columns, levels))
    score = effects[np.arange(columns), cats].sum(1) - 3.0
    y = (score + rng.logistic(size=n) > 0).astype(float)
    X = np.zeros((n, columns * levels))
    X[np.arange(n)[:, None], np.arange(columns) * levels + cats] = 1.0
    return X, y
