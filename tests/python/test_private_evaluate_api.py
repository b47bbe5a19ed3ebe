"""Private evaluation from Python and the shell (issue 44, item 1): ``Database.evaluate(model,
'dataset', epsilon=...)``, ``Database.preview_evaluate``, an estimator's ``score('dataset',
epsilon=...)`` and ``dpsql evaluate MODEL DATASET --epsilon E [--dry-run]``, as an analyst granted
a test dataset without SELECT on its table: noisy metrics with their noise sds, one charge."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

import dpsql
from dpsql.estimators import LogisticRegression
from tests.python.test_cli import as_json, assert_one_line_error, dpsql_cli


@pytest.fixture
def analyst(conn, scratch_schema, make_role):
    """Train and test datasets granted to an analyst, and the analyst's private model on the
    train set: (connect, analyst URI, train name, test (id, name), model id)."""
    s = scratch_schema
    for t, n in (("tr", 1500), ("te", 2000)):
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.{} AS SELECT g AS rid, a, b,"
                " CASE WHEN a - b / 2 > 0.1 THEN 1 ELSE 0 END AS y"
                " FROM (SELECT g, 2 * random() - 1 AS a, 2 * random() - 1 AS b"
                "        FROM generate_series(1, {}) g) r"
            ).format(sql.Identifier(s), sql.Identifier(t), sql.Literal(n))
        )
    names = {}
    for t in ("tr", "te"):
        names[t] = f"pe_{uuid.uuid4().hex[:8]}"
        conn.execute(
            "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 100, 1e-3, name => %s,"
            " labels => '{0,1}', feature_bounds => '{{-1,1},{-1,1}}')",
            (f"{s}.{t}", names[t]),
        )
    name, connect = make_role("pe_ana", "dpsql_analyst")
    for t in names.values():
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (t, name))
    (test_id,) = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (names["te"],)
    ).fetchone()
    with connect() as a:
        (mid,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 2)", (names["tr"],)
        ).fetchone()
        uri = a.info.dsn + " password=" + a.info.password
    return connect, uri, names["tr"], (test_id, names["te"]), mid


def _charges(conn, ds: int) -> list[tuple]:
    return conn.execute(
        "SELECT mechanism, epsilon, delta FROM dpsql.ledger_entries WHERE dataset_id = %s"
        " ORDER BY entry_id",
        (ds,),
    ).fetchall()


def test_database_evaluate_and_preview(conn, analyst) -> None:
    _, uri, _, (test_id, test), mid = analyst
    with dpsql.connect(uri) as db:
        preview = db.preview_evaluate(mid, test, 0.5)
        assert preview["epsilon"] == 0.5 and preview["dp_event"]["type"] == "Composed"
        assert _charges(conn, test_id) == []
        result = db.evaluate(db.model(mid), test, epsilon=0.5, delta=1e-6)
        assert result["rows"] == 2000 and 0 <= result["accuracy"] <= 1
        assert set(result["noise_sd"]) >= {"accuracy", "roc_auc", "f1", "balanced_accuracy"}
        assert result["baselines"]["predictor"] == "majority class"
        assert result["private"]["mechanism"] == "gaussian"
        with pytest.raises(dpsql.DpsqlError, match="epsilon"):
            db.evaluate(mid, test)  # a registered dataset without epsilon
    assert _charges(conn, test_id) == [("evaluate", 0.5, 1e-6)]


def test_an_estimators_private_score(conn, analyst) -> None:
    _, uri, train, (test_id, test), _ = analyst
    with dpsql.connect(uri) as db:
        clf = LogisticRegression(db=db, privacy=dpsql.BoltOn(epsilon=2)).fit(train)
        score = clf.score(test, epsilon=0.5)
        assert 0.5 < score <= 1
        with pytest.raises(ValueError, match="epsilon"):
            clf.score(test)
        with pytest.raises(ValueError, match="epsilon"):
            clf.score([[0.0, 0.0]], [1], epsilon=1)
    assert _charges(conn, test_id) == [("evaluate", 0.5, 0.0)]


def test_cli_evaluate_with_epsilon_and_dry_run(conn, analyst) -> None:
    _, uri, _, (test_id, test), mid = analyst
    preview = as_json(
        dpsql_cli("evaluate", str(mid), test, "--epsilon", "0.3", "--dry-run", "--dsn", uri)
    )
    assert preview["epsilon"] == 0.3 and "refused" not in preview
    assert _charges(conn, test_id) == []
    result = as_json(
        dpsql_cli("evaluate", str(mid), test, "--epsilon", "0.3", "--json", "--dsn", uri)
    )
    assert result["rows"] == 2000 and "accuracy" in result["noise_sd"]
    text = dpsql_cli("evaluate", str(mid), test, "--epsilon", "0.3", "--dsn", uri)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1].split() == ["metric", "model", "baseline", "noise_sd"]
    assert lines[-1].startswith("private: epsilon 0.3")
    refused = dpsql_cli("evaluate", str(mid), test, "--dsn", uri)
    assert "epsilon" in assert_one_line_error(refused) and "hint: " in refused.stderr
    assert dpsql_cli("evaluate", str(mid), test, "--dry-run", "--dsn", uri).returncode == 2
    assert _charges(conn, test_id) == [("evaluate", 0.3, 0.0)] * 2
    with pytest.raises(psycopg.errors.InsufficientPrivilege), psycopg.connect(uri) as a:
        a.execute("SELECT count(*) FROM dpsql.ledger_entries")
