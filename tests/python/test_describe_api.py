"""db.describe / db.preview_describe and `dpsql describe` (issue 44, item 4) against the test
server: the answer's shape, one charge, the preview charging nothing, refusals as dpsql's
errors (Python) and one line with the CLI's flags (CLI)."""

from __future__ import annotations

import sys
import uuid

import pytest

import dpsql
from dpsql import describe as describe_module
from dpsql.errors import DpsqlError, NotRegistered
from tests.python.test_cli import as_json, assert_one_line_error, dpsql_cli


@pytest.fixture
def dataset(conn, scratch_schema) -> tuple[int, str]:
    conn.execute(
        "CREATE TABLE t AS SELECT g AS rid, (g % 10) / 10.0 AS a,"
        " (ARRAY['red', 'green'])[1 + g % 2] AS colour,"
        " CASE WHEN g % 4 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 1000) g"
    )
    name = f"d_{uuid.uuid4().hex[:8]}"
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,colour}', 'y', 10, 0, name => %s,"
        ' feature_bounds => \'{{0,1}}\', categories => \'{"colour": ["red", "green"]}\')',
        (f"{scratch_schema}.t", name),
    ).fetchone()
    return ds, name


def _charges(conn, ds: int) -> list[tuple]:
    return conn.execute(
        "SELECT mechanism, epsilon FROM dpsql.ledger_entries WHERE dataset_id = %s", (ds,)
    ).fetchall()


def test_describe_returns_a_data_frame_for_one_charge(conn, dataset, make_role) -> None:
    ds, name = dataset
    role, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, role))
    with connect() as a:
        db = dpsql.connect(a, install=False)
        preview = db.preview_describe(name, 1.0, features="a")
        assert preview["plan"]["quantile"]["epsilon"] == pytest.approx(0.08)
        assert _charges(conn, ds) == []
        frame = db.describe(name, 1.0)
    assert list(frame.columns) == ["feature", "statistic", "key", "value", "noise_sd"]
    assert frame.iloc[0].to_dict()["statistic"] == "rows" and frame.iloc[0]["value"] == 1000
    assert set(frame["feature"].dropna()) == {"a", "colour", "y"}
    assert _charges(conn, ds) == [("describe", 1.0)]
    with connect() as a:
        db = dpsql.connect(a, install=False)
        with pytest.raises(NotRegistered):
            db.describe("no_such_dataset", 1.0)
        with pytest.raises(DpsqlError, match="no column 'b'"):
            db.describe(name, 1.0, features=["b"])
    assert len(_charges(conn, ds)) == 1


def test_without_pandas_the_error_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        describe_module.to_frame([])


def test_the_cli(conn, dataset, server_uri) -> None:
    ds, name = dataset
    dry = dpsql_cli("describe", name, "--epsilon", "1", "--dry-run", "--dsn", server_uri)
    assert dry.returncode == 0, dry.stderr
    assert "would charge epsilon 1" in dry.stdout and "quantile: 0.02667" in dry.stdout
    assert _charges(conn, ds) == []
    text = dpsql_cli("describe", name, "--epsilon", "1", "--features", "a", "--dsn", server_uri)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "1000 rows (public)"
    assert lines[1].split() == ["feature", "statistic", "value", "±", "noise", "sd"]
    assert any(line.split()[:3] == ["a", "quantile", "0.5"] for line in lines)
    records = as_json(
        dpsql_cli("describe", name, "--epsilon", "1", "--delta", "0", "--json", "--dsn", server_uri)
    )
    assert {r["statistic"] for r in records} == {
        "rows", "mean", "stddev", "quantile", "histogram", "frequency"
    }  # fmt: skip
    assert _charges(conn, ds) == [("describe", 1.0), ("describe", 1.0)]
    refused = dpsql_cli("describe", name, "--epsilon", "1", "--features", "b", "--dsn", server_uri)
    assert "no column 'b'" in assert_one_line_error(refused)
    assert "hint: Its registered columns: a, colour, y." in refused.stderr
    over = dpsql_cli("describe", name, "--epsilon", "100", "--dry-run", "--dsn", server_uri)
    assert over.returncode == 1 and "budget" in over.stdout
    assert len(_charges(conn, ds)) == 2
