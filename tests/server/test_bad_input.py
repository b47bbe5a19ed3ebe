"""Bad input gets a clear error and changes nothing (no training table, run or model left)."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from tests.pg_helpers import leftovers, load


@pytest.fixture
def src(conn, scratch_schema) -> str:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    load(conn, scratch_schema, "src", X, y)
    conn.execute("CREATE TABLE cols AS SELECT x[1] AS a, x[2] AS b, x[3] AS c, y FROM src")
    return f"{scratch_schema}.src"


def _train(conn, call: str, *params):
    return conn.execute(f"SELECT dpsql.train({call})", params).fetchone()


CASES = [
    # (setup SQL or None, train arguments, expected error fragment)
    ("UPDATE src SET x = NULL WHERE rid = 7", "'src', '{x}', 'y'", "NULL feature array"),
    ("UPDATE src SET x[2] = NULL WHERE rid = 7", "'src', '{x}', 'y'", "contains NULL"),
    ("UPDATE src SET x[2] = 'NaN' WHERE rid = 7", "'src', '{x}', 'y'", "NaN or Infinity"),
    ("UPDATE src SET x[1] = 'Infinity' WHERE rid = 9", "'src', '{x}', 'y'", "NaN or Infinity"),
    ("UPDATE src SET x = x || 1.0::float8 WHERE rid = 9", "'src', '{x}', 'y'", "length"),
    (
        "UPDATE src SET x = ARRAY[[1,2],[3,4]]::float8[] WHERE rid = 9",
        "'src', '{x}', 'y'",
        "one-dimensional",
    ),
    ("UPDATE src SET y = 0 WHERE rid = 3", "'src', '{x}', 'y'", "not in the declared label set"),
    ("UPDATE src SET y = NULL WHERE rid = 3", "'src', '{x}', 'y'", "label NULL"),
    ("UPDATE src SET y = 'NaN' WHERE rid = 3", "'src', '{x}', 'y', 'linear'", "label is NaN"),
    ("UPDATE cols SET b = NULL WHERE a > 0", "'cols', '{a,b,c}', 'y'", "contains NULL"),
    ("DELETE FROM src", "'src', '{x}', 'y'", "has no rows"),
    (None, "'no_such_table', '{x}', 'y'", "does not exist"),
    (None, "'src', '{x, nope}', 'y'", "nope"),
    (None, "'src', '{x}', 'nope'", "nope"),
    (None, "'cols', '{a, \"b; DROP TABLE cols; --\"}', 'y'", "does not exist"),
    (None, "'src; DROP TABLE src', '{x}', 'y'", "does not exist"),
    (None, "'src', '{x}', 'y', epochs => 0", "epochs must be >= 1"),
    (None, "'src', '{x}', 'y', batch_size => 0", "batch_size must be >= 1"),
    (None, "'src', '{x}', 'y', lambda => -1", "lambda must be"),
    (None, "'src', '{x}', 'y', lambda => 'NaN'", "lambda must be"),
    (None, "'src', '{x}', 'y', step_size => 0", "step_size must be"),
    (None, "'src', '{x}', 'y', schedule => 'decreasing'", "needs lambda > 0"),
    (None, "'src', '{x}', 'y', schedule => 'fast'", "unknown schedule"),
    (None, "'src', '{x}', 'y', 'svm2'", "unknown model"),
    (None, "'src', '{x}', 'y', 'multinomial'", "need labels"),
    (None, "'src', '{x}', 'y', labels => '{1,1}'", "distinct"),
    (None, "'src', '{x}', 'y', labels => '{1}'", "models need labels"),
    (None, "'src', '{x}', 'y', 'linear', labels => '{1,2}'", "classification models only"),
    (None, "'src', '{x}', 'y', privacy => 'bolton', epsilon => 1", "not a registered dataset"),
    (None, "'src', '{x}', 'y', row_norm => 'l1'", "row_norm must be"),
    (None, "'src', '{}', 'y'", "non-empty list"),
    (None, "'', '{x}', 'y'", "source is empty"),
]


@pytest.mark.parametrize(
    "setup,args,message", CASES, ids=[c[2] + str(i) for i, c in enumerate(CASES)]
)
def test_bad_input_is_refused_and_leaves_nothing(conn, src, setup, args, message) -> None:
    if setup:
        conn.execute(setup)
    before = leftovers(conn)
    with pytest.raises(psycopg.Error) as err:
        _train(conn, args)
    assert message in str(err.value), str(err.value)
    assert str(err.value).startswith("dpsql:") or "dpsql:" in str(err.value)
    assert leftovers(conn) == before
    # The injection attempts did nothing.
    assert conn.execute("SELECT count(*) FROM src").fetchone()[0] >= 0
    assert conn.execute("SELECT count(*) FROM cols").fetchone()[0] == 50


def test_aggregate_refuses_malformed_states(conn, src) -> None:
    for state in ("'{1,2,3}'", "NULL", "'{}'"):
        with pytest.raises(psycopg.Error, match="dpsql"):
            conn.execute(f"SELECT dpsql.sgd_epoch(x, y, {state}::float8[]) FROM src")
    good = conn.execute(
        "SELECT dpsql_internal._sgd_init('logistic', 3, 1, 0, 'constant', 0.1, 0, 0, 0.1, 1, 0)"
    ).fetchone()[0]
    bad = list(good)
    bad[4] = 1e9  # dim that does not match the array's length
    with pytest.raises(psycopg.Error, match="malformed model state"):
        conn.execute("SELECT dpsql.sgd_epoch(x, y, %s) FROM src", (bad,))
    with pytest.raises(psycopg.Error, match="outside an aggregate"):
        conn.execute("SELECT dpsql_internal._sgd_transition(NULL, '{1,2,3}', 1, %s)", (good,))


def test_predict_and_evaluate_bad_input(conn, src) -> None:
    (mid,) = _train(conn, "'src', '{x}', 'y', epochs => 1, seed => 1")
    with pytest.raises(psycopg.Error, match="length"):
        conn.execute("SELECT dpsql.predict(%s, '{1,2}')", (mid,))
    with pytest.raises(psycopg.Error, match="NaN"):
        conn.execute("SELECT dpsql.predict(%s, '{1,NaN,2}')", (mid,))
    with pytest.raises(psycopg.Error, match="no model"):
        conn.execute("SELECT dpsql.predict(-5, '{1,2,3}')")
    with pytest.raises(psycopg.Error, match="has 3 features"):
        conn.execute("SELECT * FROM dpsql.evaluate(%s, 'cols', '{a,b}')", (mid,))
