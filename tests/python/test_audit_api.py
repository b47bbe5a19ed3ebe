"""Database.audit: dpsql.audit from Python, the mechanism object as the configuration."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_budget_report_and_pld_composition_from_python(conn, scratch_schema) -> None:
    from tests.pg_helpers import load

    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 2)) / 2
    source = load(conn, scratch_schema, "pts", X, (X[:, 0] > 0).astype(float))
    db = dpsql.Database(conn, owns_connection=False, embedded=False)
    name = f"pld_{scratch_schema}"
    db.register_dataset(
        source,
        "x",
        "y",
        epsilon_budget=10,
        delta_budget=1e-5,
        labels=[0, 1],
        name=name,
        composition="pld",
    )
    assert db.budgets()[-1]["composition"] == "pld"
    for _ in range(2):
        db.train(name, None, None, privacy=dpsql.BoltOn(epsilon=1.0), progress=False)
    report = db.budget_report(name)
    assert report["entries"] == 2 and report["epsilon_spent"] == 2.0
    # two pure epsilon = 1 releases: PLD composition is never worse than the sum
    assert report["epsilon_pld"] <= 2.0 + 1e-9
    with pytest.raises(dpsql.NotRegistered):
        db.budget_report("no_such_dataset")


def test_audit_picks_the_most_powerful_method(conn, scratch_schema) -> None:
    """method None: white-box Dirac canaries for DP-SGD, the counts in details."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 2)) / 2
    ds, source = register(conn, scratch_schema, X, (X[:, 0] > 0).astype(float), labels=[0, 1])
    db = dpsql.Database(conn, owns_connection=False, embedded=False)
    out = db.audit(
        source, dpsql.DPSGD(epsilon=1.0, delta=1e-5), canaries=50, epochs=1, batch_size=250,
        test="dp", seed=1,
    )  # fmt: skip
    assert out["method"] == "dirac" and out["runs"] == 1 and 0 <= out["epsilon_lower"] <= 1
    details = conn.execute(
        "SELECT details FROM dpsql.audits ORDER BY audit_id DESC LIMIT 1"
    ).fetchone()[0]
    assert details["canaries"] == 50 and details["test"] == "dp"
