"""db.tune / db.preview_tune, db.register_dataset(holdout=...) and `dpsql tune` / `dpsql
dataset register --holdout` (issue 44, items 2 and 3) against the test server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import dpsql
from dpsql.errors import DpsqlError
from tests.python.test_cli import as_json, dpsql_cli

CANDIDATES: list[dict[str, Any]] = [
    {"privacy": "bolton"},
    {"privacy": "bolton", "epochs": 1, "step_size": 1e-4},
]


@pytest.fixture
def table(conn, scratch_schema) -> str:
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, a float8, b float8, y int)")
    conn.execute(
        "INSERT INTO t SELECT g, (g % 10) / 10.0, -(g % 7) / 7.0,"
        " CASE WHEN (g % 10) / 10.0 - (g % 7) / 14.0 > 0.2 THEN 1 ELSE -1 END"
        " FROM generate_series(1, 4000) g"
    )
    return f"{scratch_schema}.t"


def test_python_registers_a_holdout_and_tunes_on_it(conn, table, make_role) -> None:
    name = f"tp_{uuid.uuid4().hex[:8]}"
    owner = dpsql.connect(conn, install=False)
    ds = owner.register_dataset(
        table,
        ["a", "b"],
        "y",
        epsilon_budget=5,
        feature_bounds=[[0, 1], [-1, 0]],
        name=name,
        holdout=0.2,
    )
    hold = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name + "_holdout",)
    ).fetchone()[0]
    role, connect = make_role("analyst", "dpsql_analyst")
    for d in (ds, hold):
        owner.grant_dataset(d, role)
    with connect() as a:
        db = dpsql.connect(a, install=False)
        plan = db.preview_tune(name, name + "_holdout", 1.5, 0, candidates=CANDIDATES)
        assert [c["epsilon"] for c in plan["charges"]] == [pytest.approx(1.5)] * 2
        model = db.tune(name, name + "_holdout", 1.5, 0, candidates=CANDIDATES)
        assert model.row["params"]["tune"]["validation"] == name + "_holdout"
        assert model.predict([[0.5, -0.5]]).shape == (1,)
        auto = db.train(
            name, None, None, privacy=dpsql.Auto(epsilon=1.5, delta=0), validation=name + "_holdout"
        )
        assert auto.row["params"]["tune"]["runs"] >= 1
        with pytest.raises(DpsqlError, match="validation dataset other than"):
            db.tune(name, name, 1.0, 0, candidates=CANDIDATES)
        budgets = {b["name"]: b["epsilon_spent"] for b in db.budgets()}
    assert budgets == {name: pytest.approx(3.0), name + "_holdout": pytest.approx(3.0)}


def test_the_cli_registers_a_holdout_and_tunes(conn, table, server_uri) -> None:
    name = f"tc_{uuid.uuid4().hex[:8]}"
    out = dpsql_cli(
        "dataset",
        "register",
        table,
        "--features",
        "a,b",
        "--label",
        "y",
        "--epsilon-budget",
        "5",
        "--feature-bounds",
        "[[0, 1], [-1, 0]]",
        "--name",
        name,
        "--holdout",
        "0.25",
        "--key",
        "id",
        dsn=server_uri,
    )
    assert out.returncode == 0, out.stderr
    assert f"registered dataset {name}_holdout: 0.25 of the rows" in out.stdout
    candidates = '[{"privacy": "bolton"}, {"privacy": "bolton", "lambda": 0.01}]'
    dry = dpsql_cli(
        "tune",
        name,
        name + "_holdout",
        "--epsilon",
        "1.5",
        "--delta",
        "0",
        "--candidates",
        candidates,
        "--dry-run",
        dsn=server_uri,
    )
    assert dry.returncode == 0, dry.stderr
    assert as_json(dry)["run_epsilon"] == pytest.approx(0.5)
    run = dpsql_cli(
        "tune",
        name,
        name + "_holdout",
        "--epsilon",
        "1.5",
        "--delta",
        "0",
        "--candidates",
        candidates,
        dsn=server_uri,
    )
    assert run.returncode == 0, run.stderr
    assert "charged epsilon 1.5 (delta 0)" in run.stdout and "runs" in run.stdout
    auto = dpsql_cli(
        "train",
        name,
        "--privacy",
        "auto",
        "--epsilon",
        "1",
        "--delta",
        "0",
        "--validation",
        name + "_holdout",
        dsn=server_uri,
    )
    assert auto.returncode == 0, auto.stderr
    assert f"charged epsilon 1 (delta 0) to {name} and 1 to {name}_holdout" in auto.stdout
    wrong = dpsql_cli(
        "train",
        name,
        "--privacy",
        "bolton",
        "--epsilon",
        "1",
        "--validation",
        "x",
        dsn=server_uri,
    )
    assert wrong.returncode == 2 and "--privacy auto" in wrong.stderr
    bad = dpsql_cli(
        "tune", name, name + "_holdout", "--epsilon", "1", "--candidates", "{", dsn=server_uri
    )
    assert bad.returncode == 2 and "not JSON" in bad.stderr
