"""dpsql.evaluate's metrics and baselines (issue 27) equal scikit-learn's on the same rows:
binary (logistic and huber, tied scores included), several classes, regression; a model that
predicts the majority class scores its baseline, and evaluate says so."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from sklearn import metrics as skm

from tests.pg_helpers import load


def _train(conn, source: str, model: str, labels: str | None, **kw) -> int:
    extra = "".join(f", {k} => {v}" for k, v in kw.items())
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%s, '{{x}}', 'y', %s, epochs => 3, seed => 1"
        f"{'' if labels is None else f', labels => {labels!r}'}{extra})",
        (source, model),
    ).fetchone()
    return mid


def _evaluate(conn, mid: int, source: str) -> tuple:
    return conn.execute(
        "SELECT metric, value, rows, baseline, metrics FROM dpsql.evaluate(%s, %s)", (mid, source)
    ).fetchone()


def _predictions(conn, mid: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    rows = conn.execute(
        f"SELECT dpsql.predict(%s, x), y FROM {source} ORDER BY rid", (mid,)
    ).fetchall()
    p, y = (np.asarray(c, dtype=np.float64) for c in zip(*rows, strict=True))
    return p, y


@pytest.mark.parametrize("model", ["logistic", "huber"])
def test_binary_metrics_are_sklearns(conn, scratch_schema, model) -> None:
    rng = np.random.default_rng(3)
    X = np.round(rng.normal(size=(600, 2)), 1) / 3  # rounded: tied scores
    y = (X[:, 0] + 0.3 * rng.normal(size=600) > 0.1).astype(float)
    source = load(conn, scratch_schema, "bin", X, y)
    mid = _train(conn, source, model, "{0,1}")
    metric, value, rows, baseline, m = _evaluate(conn, mid, source)
    p, yy = _predictions(conn, mid, source)
    predicted = (p > 0.5 if model == "logistic" else p > 0).astype(float)
    assert (metric, rows) == ("accuracy", 600)
    assert value == pytest.approx(skm.accuracy_score(yy, predicted), abs=1e-12)
    assert m["balanced_accuracy"] == pytest.approx(
        skm.balanced_accuracy_score(yy, predicted), abs=1e-12
    )
    assert m["f1"] == pytest.approx(skm.f1_score(yy, predicted), abs=1e-12)
    assert m["roc_auc"] == pytest.approx(skm.roc_auc_score(yy, p), abs=1e-12)
    if model == "logistic":
        assert m["log_loss"] == pytest.approx(skm.log_loss(yy, np.clip(p, 1e-15, 1 - 1e-15)))
    else:
        assert "log_loss" not in m
    majority = np.full_like(yy, float(yy.mean() > 0.5))
    b = m["baseline"]
    assert baseline == b["accuracy"] == pytest.approx(skm.accuracy_score(yy, majority))
    assert b["f1"] == pytest.approx(skm.f1_score(yy, majority, zero_division=0))
    assert b["balanced_accuracy"] == 0.5 and b["roc_auc"] == 0.5


def test_multiclass_metrics_are_sklearns(conn, scratch_schema) -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(500, 2)) / 2
    y = np.digitize(X[:, 0] + 0.2 * rng.normal(size=500), [-0.2, 0.3]).astype(float)
    source = load(conn, scratch_schema, "multi", X, y)
    mid = _train(conn, source, "multinomial", "{0,1,2}")
    metric, value, rows, baseline, m = _evaluate(conn, mid, source)
    p, yy = _predictions(conn, mid, source)
    assert value == pytest.approx(skm.accuracy_score(yy, p))
    assert m["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(yy, p))
    assert m["f1"] == pytest.approx(skm.f1_score(yy, p, average="macro"))
    counts = np.bincount(yy.astype(int))
    majority = np.full_like(yy, float(np.argmax(counts)))
    assert baseline == pytest.approx(skm.accuracy_score(yy, majority))
    assert m["baseline"]["f1"] == pytest.approx(
        skm.f1_score(yy, majority, average="macro", labels=np.unique(yy), zero_division=0)
    )


def test_regression_metrics_are_sklearns(conn, scratch_schema) -> None:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(400, 2)) / 2
    y = X @ np.array([1.0, -0.5]) + 0.1 * rng.normal(size=400)
    source = load(conn, scratch_schema, "reg", X, y)
    mid = _train(conn, source, "linear", None)
    metric, value, rows, baseline, m = _evaluate(conn, mid, source)
    p, yy = _predictions(conn, mid, source)
    assert metric == "mse" and value == pytest.approx(skm.mean_squared_error(yy, p))
    assert m["mae"] == pytest.approx(skm.mean_absolute_error(yy, p))
    assert m["r2"] == pytest.approx(skm.r2_score(yy, p))
    mean = np.full_like(yy, yy.mean())
    assert baseline == pytest.approx(skm.mean_squared_error(yy, mean))
    assert m["baseline"]["mae"] == pytest.approx(skm.mean_absolute_error(yy, mean))
    assert m["baseline"]["r2"] == 0


def test_a_model_no_better_than_the_majority_class_is_said_to_be(conn, scratch_schema) -> None:
    rng = np.random.default_rng(6)
    X = rng.normal(size=(300, 2)) / 2
    y = (rng.uniform(size=300) < 0.8).astype(float)  # the label ignores X
    source = load(conn, scratch_schema, "noise", X, y)
    # an intercept only, pushed hard toward the majority: it predicts the majority class
    mid = _train(conn, source, "logistic", "{0,1}", step_size=0.05, **{"lambda": 10})
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    _, value, _, baseline, _ = _evaluate(conn, mid, source)
    assert value == pytest.approx(baseline)
    assert any("no better than predicting the majority class" in n for n in notices)


def test_predict_refuses_a_wrong_length_vector(conn, scratch_schema) -> None:
    X = np.random.default_rng(7).normal(size=(50, 3)) / 2
    source = load(conn, scratch_schema, "three", X, (X[:, 0] > 0).astype(float))
    mid = _train(conn, source, "logistic", "{0,1}")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        conn.execute("SELECT dpsql.predict(%s, '{1,2}')", (mid,))
    assert "3 features, got a vector of length 2" in str(err.value)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT dpsql.predict(%s, '{1,NULL,2}')", (mid,))
