"""The analyst-facing SQL API: dpsql.train / dpsql.models / dpsql.predict / dpsql.evaluate."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row

from dpsql import _core
from tests.pg_helpers import leftovers, load

# The container stage runs this module against the image (tests/container).
pytestmark = pytest.mark.smoke


@pytest.fixture
def binary(conn, scratch_schema):
    rng = np.random.default_rng(11)
    X = rng.normal(size=(400, 3)) * 0.5
    y = np.where(X @ [2.0, -1.0, 0.5] + 0.1 * rng.normal(size=400) > 0, 1.0, 0.0)
    load(conn, scratch_schema, "pts", X, y)
    conn.execute(
        "CREATE TABLE cols AS SELECT x[1] AS a, x[2]::real AS b, (x[3] * 1000)::int AS c,"
        " y::int AS label FROM pts"
    )
    conn.execute("CREATE VIEW pts_view AS SELECT * FROM pts WHERE rid % 2 = 0")
    return X, y


def _model(conn, model_id):
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (model_id,)).fetchone()


def test_train_records_provenance_and_cleans_up(conn, binary) -> None:
    before = leftovers(conn)
    (mid,) = conn.execute(
        "SELECT dpsql.train('pts', ARRAY['x'], 'y', 'logistic', epochs => 4, batch_size => 8,"
        " lambda => 0.001, schedule => 'decreasing', seed => 99, labels => '{0,1}')"
    ).fetchone()
    m = _model(conn, mid)
    assert m["model"] == "logistic" and m["features"] == ["x"] and m["label"] == "y"
    assert m["epochs"] == m["epochs_run"] == 4 and m["batch_size"] == 8 and m["lambda"] == 0.001
    assert m["schedule"] == "decreasing" and m["radius"] == pytest.approx(1000.0)
    assert m["seed"] == 99 and m["seed_policy"] == "user" and m["rows"] == 400
    assert m["dropped_rows"] == 0 and len(m["loss_history"]) == 4
    assert m["train_loss"] == m["loss_history"][-1] and m["train_seconds"] > 0
    assert m["classes"] == [0.0, 1.0] and m["privacy"] == "none" and len(m["coef"]) == 3
    assert m["params"]["remainder"] == "drop_last"
    # The training table and the run's state are gone; only the model was added.
    tables, runs, models = leftovers(conn)
    assert (tables, runs, models) == (before[0], before[1], before[2] + 1)
    # Training made progress.
    assert m["loss_history"][-1] < m["loss_history"][0] < np.log(2) + 0.01


def test_feature_columns_array_column_view_and_query_agree(conn, binary) -> None:
    common = "'y', epochs => 2, seed => 5, labels => '{0,1}', shuffle => false"
    (a,) = conn.execute(f"SELECT dpsql.train('pts', '{{x}}', {common})").fetchone()
    (b,) = conn.execute(
        f"SELECT dpsql.train('SELECT x[1] AS f1, x[2] AS f2, x[3] AS f3, y FROM pts ORDER BY rid',"
        f" '{{f1,f2,f3}}', {common})"
    ).fetchone()
    assert _model(conn, a)["coef"] == _model(conn, b)["coef"]
    (v,) = conn.execute(f"SELECT dpsql.train('pts_view', '{{x}}', {common})").fetchone()
    assert _model(conn, v)["rows"] == 200
    (c,) = conn.execute(
        "SELECT dpsql.train('cols', '{a,b,c}', 'label', labels => '{0,1}', epochs => 1)"
    ).fetchone()
    assert _model(conn, c)["n_features"] == 3


def test_predict_and_evaluate(conn, binary) -> None:
    X, y = binary
    (mid,) = conn.execute(
        "SELECT dpsql.train('pts', '{x}', 'y', epochs => 5, labels => '{0,1}',"
        " step_size => 0.5, batch_size => 4, seed => 3, intercept => true)"
    ).fetchone()
    m = _model(conn, mid)
    assert m["fit_intercept"] and len(m["intercept"]) == 1
    p = conn.execute("SELECT dpsql.predict(%s, %s)", (mid, list(X[0]))).fetchone()[0]
    w = np.array(m["weights"])
    assert p == pytest.approx(1 / (1 + np.exp(-(X[0] @ w[:3] + w[3]))), rel=1e-12)
    metric, value, rows = conn.execute(
        "SELECT metric, value, rows FROM dpsql.evaluate(%s, 'pts')", (mid,)
    ).fetchone()
    probs = _core.predict("logistic", _core.FLAG_INTERCEPT, w, X)
    assert metric == "accuracy" and rows == 400
    assert value == pytest.approx(np.mean((probs >= 0.5) == (y > 0)))
    assert value > 0.9
    # Columns under other names.
    metric2, value2, _ = conn.execute(
        "SELECT metric, value, rows FROM dpsql.evaluate(%s, 'cols', '{a,b,c}', 'label')", (mid,)
    ).fetchone()
    assert metric2 == "accuracy" and 0.5 < value2 <= 1


def test_linear_huber_and_multinomial(conn, scratch_schema) -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(600, 4)) * 0.5
    beta = np.array([1.0, -2.0, 0.5, 0.0])
    load(conn, scratch_schema, "reg", X, X @ beta + 0.01 * rng.normal(size=600))
    (lin,) = conn.execute(
        "SELECT dpsql.train('reg', '{x}', 'y', 'linear', epochs => 30, step_size => 0.2, seed => 1)"
    ).fetchone()
    np.testing.assert_allclose(_model(conn, lin)["coef"], beta, atol=0.05)
    metric, mse, _ = conn.execute(
        "SELECT metric, value, rows FROM dpsql.evaluate(%s, 'reg')", (lin,)
    ).fetchone()
    assert metric == "mse" and mse < 0.01

    ybin = np.where(X @ beta > 0, 1.0, -1.0)
    load(conn, scratch_schema, "bin", X, ybin)
    (hub,) = conn.execute(
        "SELECT dpsql.train('bin', '{x}', 'y', 'huber', epochs => 5, step_size => 0.1, seed => 1)"
    ).fetchone()
    assert conn.execute("SELECT value FROM dpsql.evaluate(%s, 'bin')", (hub,)).fetchone()[0] > 0.9

    cls = np.argmax(X @ rng.normal(size=(4, 3)), axis=1).astype(float) + 1  # classes 1, 2, 3
    load(conn, scratch_schema, "multi", X, cls)
    (mul,) = conn.execute(
        "SELECT dpsql.train('multi', '{x}', 'y', 'multinomial', epochs => 10,"
        " labels => '{1,2,3}', step_size => 0.5, seed => 1)"
    ).fetchone()
    m = _model(conn, mul)
    assert np.array(m["coef"]).shape == (3, 4)
    acc = conn.execute("SELECT value FROM dpsql.evaluate(%s, 'multi')", (mul,)).fetchone()[0]
    assert acc > 0.8
    pred = conn.execute("SELECT dpsql.predict(%s, %s)", (mul, list(X[0]))).fetchone()[0]
    assert pred in (1.0, 2.0, 3.0)


def test_tolerance_stops_early(conn, binary) -> None:
    (mid,) = conn.execute(
        "SELECT dpsql.train('pts', '{x}', 'y', labels => '{0,1}', epochs => 200,"
        " tolerance => 1e-3, seed => 1, step_size => 0.05, lambda => 0.01)"
    ).fetchone()
    m = _model(conn, mid)
    assert 2 <= m["epochs_run"] < 200
    h = m["loss_history"]
    assert abs(h[-1] - h[-2]) <= 1e-3 * abs(h[-2])


def test_random_seed_when_none_given(conn, binary) -> None:
    (a,) = conn.execute("SELECT dpsql.train('pts', '{x}', 'y', labels => '{0,1}')").fetchone()
    (b,) = conn.execute("SELECT dpsql.train('pts', '{x}', 'y', labels => '{0,1}')").fetchone()
    ma, mb = _model(conn, a), _model(conn, b)
    assert ma["seed_policy"] == "random" and ma["seed"] != mb["seed"]


def test_failed_train_in_a_transaction_leaves_nothing(conn, binary) -> None:
    before = leftovers(conn)
    conn.execute("UPDATE pts SET x[1] = 'NaN' WHERE rid = 399")
    with pytest.raises(psycopg.errors.DataException, match="NaN"):
        conn.execute("SELECT dpsql.train('pts', '{x}', 'y', labels => '{0,1}', epochs => 3)")
    assert leftovers(conn) == before


def test_sql_flag_names_are_the_core_bits(conn) -> None:
    """dpsql_internal._flag gives sgd.h's bits by name (SQL builds no flag from literals)."""
    for name, bit in [
        ("clip_rows", _core.FLAG_CLIP_ROWS),
        ("unit_rows", _core.FLAG_UNIT_ROWS),
        ("row_transform", _core.FLAG_CLIP_ROWS | _core.FLAG_UNIT_ROWS),
        ("intercept", _core.FLAG_INTERCEPT),
        ("sanitize", _core.FLAG_SANITIZE),
    ]:
        assert conn.execute("SELECT dpsql_internal._flag(%s)", (name,)).fetchone()[0] == bit
    with pytest.raises(psycopg.Error, match="unknown state flag"):
        conn.execute("SELECT dpsql_internal._flag('nope')")
