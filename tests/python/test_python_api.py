"""The Python API: dpsql.connect() in its forms, Database.train, Model."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

import dpsql
from tests.pg_helpers import leftovers


@pytest.fixture
def data():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 3)) * 0.5
    y = np.where(X @ [1.0, -1.0, 2.0] > 0, 1.0, -1.0)
    return X, y


def test_connect_accepts_dsn_sqlalchemy_url_connection_and_engine(server_uri) -> None:
    with dpsql.connect(server_uri) as db:
        assert db.execute("SELECT extname FROM pg_extension WHERE extname = 'dpsql'").fetchone()
    sa_url = server_uri.replace("postgresql://", "postgresql+psycopg://", 1)
    with dpsql.connect(sa_url) as db:
        assert db.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(server_uri, autocommit=True) as raw:
        db = dpsql.connect(raw)
        db.close()
        assert not raw.closed  # a connection handed in stays open
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(sa_url)
    with dpsql.connect(engine) as db:
        assert db.execute("SELECT 1").fetchone() == (1,)
    engine.dispose()
    with pytest.raises(TypeError, match="expected a DSN"):
        dpsql.connect(42)


def test_train_returns_a_model_with_sklearn_attributes(server_uri, scratch_schema, data) -> None:
    X, y = data
    with dpsql.connect(server_uri) as db:
        db.execute(f"SET search_path TO {scratch_schema}, public")
        db.load_numpy("pts", X, y, schema=scratch_schema)
        m = db.train(
            f"{scratch_schema}.pts",
            features="x",
            label="y",
            model="logistic",
            epochs=5,
            batch_size=5,
            step_size=0.5,
            seed=3,
            intercept=True,
            progress=False,
        )
        assert isinstance(m.model_id, int) and m.coef_.shape == (3,)
        assert m.intercept_.shape == (1,) and len(m.loss_history_) == 5
        pred = m.predict(X)
        assert set(np.unique(pred)) <= {-1.0, 1.0}
        acc = m.evaluate(f"{scratch_schema}.pts")
        assert acc["accuracy"] == pytest.approx(np.mean(pred == y))
        assert acc["rows"] == 300 and acc["accuracy"] > 0.9
        proba = m.predict_proba(X[:3])
        np.testing.assert_allclose(proba.sum(axis=1), 1.0)
        # The same model through the server's predict.
        p = db.execute("SELECT dpsql.predict(%s, %s)", (m.model_id, list(X[0]))).fetchone()[0]
        assert p == pytest.approx(proba[0, 1], rel=1e-12)
        assert db.model(m.model_id).coef_.tolist() == m.coef_.tolist()
        with pytest.raises(ValueError, match="expects 3 features"):
            m.predict(X[:, :2])


def test_failed_python_train_leaves_nothing(server_uri, scratch_schema, data) -> None:
    X, y = data
    X = X.copy()
    X[-1, 0] = np.inf
    with dpsql.connect(server_uri) as db:
        db.load_numpy("bad", X, y, schema=scratch_schema)
        before = leftovers(db.conn)
        with pytest.raises(psycopg.errors.DataException, match="NaN or Infinity"):
            db.train(f"{scratch_schema}.bad", "x", "y", epochs=2, progress=False)
        assert leftovers(db.conn) == before
        with pytest.raises(ValueError, match="pass a mechanism object"):
            db.train(f"{scratch_schema}.bad", "x", "y", privacy="bolton")


def test_mechanisms_lists_the_servers_registry(server_uri) -> None:
    from dpsql.privacy import MECHANISMS

    with dpsql.connect(server_uri) as db:
        rows = db.mechanisms()
    assert {r["name"] for r in rows} == set(MECHANISMS)
    op = next(r for r in rows if r["name"] == "objective_perturbation")
    assert op["models"] == ["logistic", "huber", "linear"] and "newton_steps" in op["options"]
    assert "lambda" in op["params"] and op["needs_delta"] is False
