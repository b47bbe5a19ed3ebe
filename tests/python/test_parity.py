"""Parity: the PostgreSQL aggregate, the in-memory engine and the numpy reference agree."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql import _core
from tests.pg_helpers import load, prepare, run_state, training_rows
from tests.reference import psgd

CASES = [
    # model, schedule, batch, lambda, radius, intercept, row_norm
    ("logistic", "constant", 1, 0.0, None, False, "none"),
    ("logistic", "decreasing", 10, 0.01, None, True, "clip"),
    ("linear", "sqrt", 3, 0.001, 5.0, True, "none"),
    ("huber", "inverse", 1, 0.0, None, False, "unit"),
    ("multinomial", "constant", 4, 0.01, 3.0, True, "clip"),
]


def _data(model: str, m: int = 257, d: int = 7, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, d)) * 0.6
    if model == "multinomial":
        return X, rng.integers(0, 3, size=m).astype(float) * 10.0  # classes {0, 10, 20}
    if model == "linear":
        return X, X @ rng.normal(size=d) + 0.1 * rng.normal(size=m)
    return X, np.where(X[:, 0] + 0.3 * rng.normal(size=m) > 0, 1.0, -1.0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_database_memory_and_reference_agree(conn, scratch_schema, case) -> None:
    model, schedule, b, lam, radius, intercept, row_norm = case
    X, y = _data(model)
    src = load(conn, scratch_schema, "src", X, y)
    labels = [0.0, 10.0, 20.0] if model == "multinomial" else None
    run = prepare(
        conn,
        src,
        model=model,
        schedule=schedule,
        batch_size=b,
        lambda_=lam,
        radius=radius,
        intercept=intercept,
        row_norm=row_norm,
        labels=labels,
        epochs=3,
        step_size=None if schedule == "decreasing" else 0.2,
    )
    state = run_state(conn, run.run_id)
    Xs, ys = training_rows(conn, run.run_id)
    memory = state
    for _ in range(3):
        run.run_epoch()
        memory = _core.run_epoch(memory, Xs, ys)
        db = run_state(conn, run.run_id)
        np.testing.assert_allclose(db, memory, rtol=1e-12, atol=1e-12)
    h = _core.header(state)
    W, _ = psgd(
        Xs,
        ys,
        model=model,
        epochs=3,
        b=b,
        lam=lam,
        schedule=schedule,
        eta=h["eta"],
        offset=h["offset"],
        beta=h["beta"],
        radius=h["radius"],
        n_classes=int(h["n_out"]),
        intercept=intercept,
        row_norm=row_norm,
    )
    np.testing.assert_allclose(_core.weights(db), W, rtol=1e-9, atol=1e-12)
    run.abort()


def test_shuffle_is_the_seeded_permutation(conn, scratch_schema) -> None:
    X, y = _data("logistic", m=300)
    src = load(conn, scratch_schema, "src", X, y)
    run = prepare(conn, src, seed=12345)
    Xs, ys = training_rows(conn, run.run_id)
    order = np.argsort([_core.shuffle_key(12345, pos) for pos in range(1, 301)], kind="stable")
    np.testing.assert_array_equal(Xs, X[order])
    np.testing.assert_array_equal(ys, y[order])
    run.abort()
    # The permutation does not read data values: other values, same order.
    src2 = load(conn, scratch_schema, "src2", -X * 3, -y)
    run = prepare(conn, src2, seed=12345)
    Xs2, _ = training_rows(conn, run.run_id)
    np.testing.assert_array_equal(Xs2, -X[order] * 3)
    run.abort()


def test_no_shuffle_keeps_physical_order(conn, scratch_schema) -> None:
    X, y = _data("logistic", m=120)
    src = load(conn, scratch_schema, "src", X, y)
    run = prepare(conn, src, shuffle=False)
    Xs, ys = training_rows(conn, run.run_id)
    np.testing.assert_array_equal(Xs, X)
    run.abort()


def test_same_seed_same_model_other_seed_other_model(conn, scratch_schema) -> None:
    X, y = _data("logistic")
    src = load(conn, scratch_schema, "src", X, y)

    def train(seed):
        (mid,) = conn.execute(
            "SELECT dpsql.train(%s, '{x}', 'y', 'logistic', epochs => 2, seed => %s)", (src, seed)
        ).fetchone()
        return conn.execute("SELECT coef FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()

    assert train(5) == train(5)
    assert train(5) != train(6)
