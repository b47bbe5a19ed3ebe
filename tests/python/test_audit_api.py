"""Database.audit: dpsql.audit from Python, the mechanism object as the configuration."""

from __future__ import annotations

import numpy as np

import dpsql
from tests.pg_helpers import register


def test_audit_from_python(conn, scratch_schema) -> None:
    rng = np.random.default_rng(0)
    ds, source = register(
        conn,
        scratch_schema,
        np.zeros((60, 1)),
        (rng.random(60) < 0.5).astype(float),
        labels=[0, 1],
    )
    db = dpsql.Database(conn, owns_connection=False, embedded=False)
    out = db.audit(
        source,
        dpsql.BoltOn(epsilon=1.0),
        runs=20,
        method="distinguish",
        model="huber",
        epochs=1,
        batch_size=1,
        step_size=0.01,
        seed=1,
    )
    assert out["epsilon_claimed"] == 1.0 and out["runs"] == 20 and out["epsilon_lower"] >= 0
    options = conn.execute(
        "SELECT options FROM dpsql.audits ORDER BY audit_id DESC LIMIT 1"
    ).fetchone()[0]
    assert options["train"]["step_size"] == 0.01 and options["train"]["gaussian"] == "analytic"
