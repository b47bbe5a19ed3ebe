"""`dpsql evaluate`, `dpsql predict` (issue 42, item 6) and `dpsql dataset estimate-bounds`
(item 5) against the test server, as the roles that run them: their output, their refusals
(one line, hints in the CLI's flags) and what they charge."""

from __future__ import annotations

import csv
import io
import uuid

import numpy as np
import psycopg
from psycopg import sql

import tests.python.test_cli_load as load_tests
from tests.python.test_cli import as_json, assert_aligned, assert_one_line_error, dpsql_cli

owner = load_tests.owner  # a data owner with a schema of their own: (name, URI)


def _numeric_csv(path, rows: int = 2000) -> None:
    """Two numeric features and a text label of a noisy rule (leading spaces, as raw files
    have them)."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(5, 2, rows), rng.normal(-1, 1, rows)
    y = np.where(a - 2 * b + rng.normal(0, 1, rows) > 7, " yes", " no")
    lines = ["a,b,y"] + [f"{u:.4f},{v:.4f},{w}" for u, v, w in zip(a, b, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def _trained(uri: str, name: str) -> int:
    trained = as_json(
        dpsql_cli("train", name, "--privacy", "bolton", "--epsilon", "1", "--json", "--dsn", uri)
    )
    return int(trained["model_id"])


def test_evaluate_and_predict(conn, owner, tmp_path, make_role) -> None:
    name, uri = owner
    _numeric_csv(tmp_path / "train.csv")
    assert dpsql_cli("load", str(tmp_path / "train.csv"), "train", "--dsn", uri).returncode == 0
    _numeric_csv(tmp_path / "test.csv", rows=300)
    assert dpsql_cli("load", str(tmp_path / "test.csv"), "test", "--dsn", uri).returncode == 0
    dataset = f"ev_{uuid.uuid4().hex[:6]}"
    registered = dpsql_cli(
        *["dataset", "register", "train", "--features", "a,b", "--label", "y"],
        *["--labels", "no,yes", "--feature-bounds", "[[-5,15],[-6,4]]"],
        *["--epsilon-budget", "5", "--name", dataset, "--dsn", uri],
    )
    assert registered.returncode == 0, registered.stderr
    model_id = _trained(uri, dataset)

    result = as_json(dpsql_cli("evaluate", str(model_id), "test", "--json", "--dsn", uri))
    assert result["rows"] == 300 and 0 <= result["accuracy"] <= 1
    assert set(result["baselines"]) >= {"accuracy", "roc_auc"}
    text = dpsql_cli("evaluate", str(model_id), "test", "--dsn", uri)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"model {model_id} (logistic) on test: 300 rows"
    assert lines[1].split() == ["metric", "model", "baseline"]
    assert lines[3].split()[0] == "accuracy"  # the main metric first
    assert_aligned("\n".join(lines[1:-1]))

    rows = as_json(
        dpsql_cli("predict", str(model_id), "test", "--limit", "5", "--json", "--dsn", uri)
    )
    assert [r["row"] for r in rows] == [1, 2, 3, 4, 5]
    assert {r["predicted"] for r in rows} <= {"no", "yes"}  # the label's values, trimmed
    assert all(r["y"] in ("no", "yes") and 0 <= r["probability"] <= 1 for r in rows)
    printed = dpsql_cli("predict", str(model_id), "test", "--csv", "--key", "a", "--dsn", uri)
    table = list(csv.DictReader(io.StringIO(printed.stdout)))
    assert len(table) == 300 and list(table[0]) == ["row", "a", "y", "predicted", "probability"]
    human = dpsql_cli("predict", str(model_id), "test", "--limit", "3", "--dsn", uri).stdout
    assert_aligned(human)
    assert len(human.splitlines()) == 5

    # An analyst granted the dataset: their model evaluates on a test table granted to them,
    # and is refused (one line, with the hint) on one that is not.
    analyst, connect = make_role("ev_ana", "dpsql_analyst")
    dpsql_cli("dataset", "grant", dataset, analyst, "--dsn", uri)
    with connect() as a:
        analyst_uri = a.info.dsn + " password=" + a.info.password
    with psycopg.connect(uri, autocommit=True) as o:
        o.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(*map(sql.Identifier, (name, analyst)))
        )
    refused = dpsql_cli("evaluate", str(model_id), f"{name}.test", "--dsn", analyst_uri)
    message = assert_one_line_error(refused)
    assert "may not" in message and "hint: " in refused.stderr
    assert_one_line_error(dpsql_cli("predict", str(model_id), f"{name}.test", "--dsn", analyst_uri))
    with psycopg.connect(uri, autocommit=True) as o:
        o.execute(sql.SQL("GRANT SELECT ON test TO {}").format(sql.Identifier(analyst)))
    assert (
        as_json(
            dpsql_cli("evaluate", str(model_id), f"{name}.test", "--json", "--dsn", analyst_uri)
        )["rows"]
        == 300
    )


def test_unknown_models_and_tables_are_one_line_errors(owner, tmp_path) -> None:
    name, uri = owner
    for command in ("evaluate", "predict"):
        message = assert_one_line_error(dpsql_cli(command, "999999999", "test", "--dsn", uri))
        assert message == "dpsql: no model 999999999"
    _numeric_csv(tmp_path / "t.csv", rows=200)
    dpsql_cli("load", str(tmp_path / "t.csv"), "t", "--dsn", uri)
    dataset = f"ev_{uuid.uuid4().hex[:6]}"
    dpsql_cli(
        *["dataset", "register", "t", "--features", "a,b", "--label", "y", "--labels", "no,yes"],
        *["--feature-bounds", "[[-5,15],[-6,4]]", "--epsilon-budget", "5", "--name", dataset],
        *["--dsn", uri],
    )
    model_id = str(_trained(uri, dataset))
    for command in ("evaluate", "predict"):
        assert_one_line_error(dpsql_cli(command, model_id, "no_such_table", "--dsn", uri))
    assert "--key" in assert_one_line_error(
        dpsql_cli("predict", model_id, "t", "--key", "nope", "--dsn", uri)
    )
    assert dpsql_cli("predict", model_id, "t", "--json", "--csv", "--dsn", uri).returncode == 2


def test_estimate_bounds_charges_and_says_so(conn, owner, tmp_path) -> None:
    name, uri = owner
    _numeric_csv(tmp_path / "t.csv")
    dpsql_cli("load", str(tmp_path / "t.csv"), "t", "--dsn", uri)
    dataset = f"eb_{uuid.uuid4().hex[:6]}"
    registered = dpsql_cli(
        *["dataset", "register", "t", "--features", "a,b", "--label", "y", "--labels", "no,yes"],
        *["--epsilon-budget", "5", "--name", dataset, "--dsn", uri],
    )
    assert registered.returncode == 0, registered.stderr
    done = dpsql_cli(
        "dataset",
        "estimate-bounds",
        dataset,
        "--epsilon",
        "1",
        "--search-range=-100,100",
        "--dsn",
        uri,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"registered feature bounds of {dataset}:"
    assert [line.split()[0] for line in lines[3:5]] == ["a", "b"]
    lo, hi = (float(v) for v in lines[3].split()[1:])
    assert -5 < lo < 3 < 7 < hi < 15  # a ~ N(5, 2)
    assert lines[-1] == f"charged epsilon 1 (delta 0); left on {dataset}: epsilon 4 of 5"
    (entry,) = as_json(dpsql_cli("ledger", "--json", "--dataset", dataset, "--dsn", uri))
    assert (entry["mechanism"], entry["epsilon"]) == ("estimate_bounds", 1)

    # Refusals: one line and a hint, nothing charged, no SQL syntax.
    again = dpsql_cli("dataset", "estimate-bounds", dataset, "--epsilon", "1", "--dsn", uri)
    assert "already has feature bounds" in assert_one_line_error(again)
    assert "=>" not in again.stderr
    usage = dpsql_cli("dataset", "estimate-bounds", dataset, "--dsn", uri)
    assert usage.returncode == 2 and "--epsilon" in usage.stderr
    assert len(as_json(dpsql_cli("ledger", "--json", "--dataset", dataset, "--dsn", uri))) == 1
