"""privacy => 'auto' (issue 10): a mechanism chosen from public quantities, charged exactly
what the model states, refusing what it would override; the strongly convex bolt-on warns
when its noise dwarfs any model it can reach."""

from __future__ import annotations

import uuid

import numpy as np
import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

import dpsql
from tests.pg_helpers import load


def _classification(conn, schema: str, m: int = 4000, seed: int = 0) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = np.array([2.0, -1.5, 1.0, 0.5, 0.0])
    X = rng.normal(size=(2 * m, 5)) / 2
    y = np.where(rng.random(2 * m) < 1 / (1 + np.exp(-4 * (X @ w))), 1.0, 0.0)
    source = load(conn, schema, "cls", X[:m], y[:m])
    load(conn, schema, "cls_test", X[m:], y[m:])
    name = f"cls_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 100, 1e-4, labels => '{0,1}', name => %s)",
        (source, name),
    )
    return name, y[m:]


def _regression(conn, schema: str, m: int = 4000, seed: int = 1) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(2 * m, 3))
    y = X @ np.array([1.0, -0.5, 0.25]) + 0.1 * rng.normal(size=2 * m)
    source = load(conn, schema, "reg", X[:m], y[:m])
    load(conn, schema, "reg_test", X[m:], y[m:])
    name = f"reg_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 100, 1e-4, label_bound => 3,"
        " row_bound => 2, name => %s)",
        (source, name),
    )
    return name, y[m:]


def _auto(conn, name: str, model: str, **kw) -> dict:
    args = {"privacy": "auto", **kw}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(name)s, NULL, NULL, %(model)s, {names})",
        {"name": name, "model": model, **args},
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


def _ledger(conn, name: str) -> list[tuple]:
    return conn.execute(
        "SELECT l.mechanism, l.epsilon, l.delta FROM dpsql.ledger_entries l"
        " JOIN dpsql.datasets d USING (dataset_id) WHERE d.name = %s ORDER BY l.entry_id",
        (name,),
    ).fetchall()


@pytest.mark.parametrize(
    ("delta", "mechanism"), [(1e-6, "dpsgd"), (0.0, "bolton")], ids=["delta", "pure"]
)
def test_auto_classification_charges_what_it_states(conn, scratch_schema, delta, mechanism) -> None:
    name, y_test = _classification(conn, scratch_schema)
    m = _auto(conn, name, "logistic", epsilon=1.0, delta=delta, noise_seed=3)
    auto = m["params"]["privacy"]["auto"]
    assert m["privacy"] == mechanism == auto["chosen"]["privacy"]
    assert auto["cost"].startswith("none")
    assert (m["epsilon"], m["delta"]) == (1.0, delta)
    assert _ledger(conn, name) == [(mechanism, 1.0, delta)]
    # Better than the trivial model (deterministic: seeded data, shuffle and noise).
    (accuracy,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], f"{scratch_schema}.cls_test")
    ).fetchone()
    majority = max(np.mean(y_test), 1 - np.mean(y_test))
    assert accuracy > majority + 0.1, (accuracy, majority)


@pytest.mark.parametrize(
    ("epsilon", "mechanism"), [(8.0, "dpgd"), (1.0, "dpsgd_f")], ids=["large", "small"]
)
def test_auto_regression_picks_by_n_epsilon(conn, scratch_schema, epsilon, mechanism) -> None:
    """4,000 rows: n epsilon = 32,000 >= 20,000 picks DP-GD with intervals; 4,000 picks
    DPSGD-F (issue 25: DP-GD's preconditioner is mostly noise there). Both beat the mean."""
    name, y_test = _regression(conn, scratch_schema)
    m = _auto(conn, name, "linear", epsilon=epsilon, delta=1e-6, noise_seed=4)
    assert m["privacy"] == mechanism and _ledger(conn, name) == [(mechanism, epsilon, 1e-6)]
    assert m["fit_intercept"]
    (mse,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], f"{scratch_schema}.reg_test")
    ).fetchone()
    assert mse < 0.5 * np.var(y_test), (mse, np.var(y_test))
    if mechanism == "dpgd":
        rows = conn.execute("SELECT * FROM dpsql.confint(%s, 0.05)", (m["model_id"],)).fetchall()
        assert len(rows) == 4  # three coefficients and the intercept


def test_auto_regression_with_delta_zero_is_objective_perturbation(conn, scratch_schema) -> None:
    name, y_test = _regression(conn, scratch_schema)
    m = _auto(conn, name, "linear", epsilon=1.0, delta=0.0, noise_seed=4)
    assert m["privacy"] == "objective_perturbation"
    assert _ledger(conn, name) == [("objective_perturbation", 1.0, 0.0)]
    (mse,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], f"{scratch_schema}.reg_test")
    ).fetchone()
    assert mse < 0.5 * np.var(y_test), (mse, np.var(y_test))


@pytest.mark.parametrize(
    ("model", "kw", "message"),
    [
        ("logistic", {"epochs": 3}, "chooses epochs"),
        ("logistic", {"batch_size": 10, "step_size": 0.1}, "chooses batch_size, step_size"),
        ("logistic", {"clip_norm": 2.0}, "chooses clip_norm"),
    ],
)
def test_auto_refuses_and_charges_nothing(conn, scratch_schema, model, kw, message) -> None:
    name = (_regression if model == "linear" else _classification)(conn, scratch_schema)[0]
    kw = {"epsilon": 1.0, "delta": 1e-6, **kw}
    with pytest.raises(errors.InvalidParameterValue, match=message):
        _auto(conn, name, model, **kw)
    assert _ledger(conn, name) == []


def test_auto_from_python(server_uri, conn, scratch_schema) -> None:
    name, _ = _classification(conn, scratch_schema)
    with dpsql.connect(server_uri) as db:
        model = db.train(name, None, None, privacy=dpsql.Auto(epsilon=0.5, noise_seed=1))
    assert model.row["privacy"] == "dpsgd"
    assert model.row["params"]["privacy"]["auto"]["chosen"]["sampling"] == "poisson"


def test_strongly_convex_bolton_warns_when_noise_dwarfs_the_model(conn, scratch_schema) -> None:
    """Public arithmetic: lambda = 1e-5 on 4,000 rows gives a noise norm far above
    sqrt(2 ln 2 / lambda); a large lambda does not warn."""
    name, _ = _classification(conn, scratch_schema)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    for lam, warns in [(1e-5, True), (0.5, False)]:
        notices.clear()
        m = _auto_free(conn, name, lam)
        info = m["params"]["privacy"]
        assert (info["expected_noise_norm"] > info["reachable_norm"]) == warns
        assert any("mostly noise" in n for n in notices) == warns


def _auto_free(conn: psycopg.Connection, name: str, lam: float) -> dict:
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => 'bolton', epsilon => 0.5,"
        " lambda => %s, epochs => 2, noise_seed => 2)",
        (name, lam),
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


@pytest.mark.parametrize("delta", [1e-4, 0.0])
def test_auto_fits_an_intercept_for_regression(conn, scratch_schema, delta) -> None:
    """Issue 25 (4): labels far from 0 (mean 3). Without an intercept auto's fit was worse than
    the mean predictor; with it, evaluate's MSE (which must equal x·coef + intercept by hand on
    the clipped rows) beats the mean predictor clearly at epsilon 2 on 4,000 rows."""
    rng = np.random.default_rng(4)
    m = 4000
    X = rng.uniform(-1, 1, size=(2 * m, 3))
    y = 3 + X @ np.array([1.0, -0.5, 0.25]) + 0.1 * rng.normal(size=2 * m)
    source = load(conn, scratch_schema, "off", X[:m], y[:m])
    test = load(conn, scratch_schema, "off_test", X[m:], y[m:])
    name = f"off_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 100, 1e-4, label_bound => 6,"
        " row_bound => 2, name => %s)",
        (source, name),
    )
    model = _auto(conn, name, "linear", epsilon=2.0, delta=delta)
    assert model["fit_intercept"] and model["params"]["privacy"]["auto"]["chosen"]["intercept"]
    (mse,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (model["model_id"], test)
    ).fetchone()
    Xt = X[m:] / np.maximum(1.0, np.linalg.norm(X[m:], axis=1) / 2)[:, None]  # row_bound 2
    by_hand = np.mean((Xt @ np.asarray(model["coef"]) + model["intercept"][0] - y[m:]) ** 2)
    assert mse == pytest.approx(by_hand, rel=1e-6)
    assert mse < 0.5 * np.var(y[m:])  # the mean predictor's MSE is var(y)
