"""Privacy units from Python and the CLI (issue 46): db.register_dataset(privacy_unit=...,
max_rows_per_unit=...), `dpsql dataset register --privacy-unit --max-rows-per-unit` and
`dpsql dataset alter`; an analyst's train, describe, evaluate and tune on a unit dataset are
each charged the epsilon they asked for, at unit level."""

from __future__ import annotations

import uuid

import pytest

import dpsql
from dpsql.errors import DpsqlError
from tests.python.test_cli import dpsql_cli


@pytest.fixture
def visits(conn, scratch_schema) -> str:
    """1,500 people with 1-4 visits each."""
    conn.execute(
        "CREATE TABLE v (visit bigserial PRIMARY KEY, person int, a float8, b float8, y int)"
    )
    conn.execute(
        "INSERT INTO v (person, a, b, y) SELECT p, ((p * 7 + j) % 10) / 10.0, -((p + j) % 7) / 7.0,"
        " CASE WHEN ((p * 7 + j) % 10) / 10.0 - ((p + j) % 7) / 14.0 > 0.2 THEN 1 ELSE -1 END"
        " FROM generate_series(1, 1500) p, generate_series(1, 1 + p % 4) j"
    )
    return f"{scratch_schema}.v"


def test_an_analyst_pays_what_they_ask_at_unit_level(conn, visits, make_role) -> None:
    name = f"pua_{uuid.uuid4().hex[:8]}"
    owner = dpsql.connect(conn, install=False)
    ds = owner.register_dataset(
        visits,
        ["a", "b"],
        "y",
        epsilon_budget=10,
        feature_bounds=[[0, 1], [-1, 0]],
        name=name,
        privacy_unit="person",
        max_rows_per_unit=2,
        holdout=0.3,
    )
    hold = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name + "_holdout",)
    ).fetchone()[0]
    role, connect = make_role("analyst", "dpsql_analyst")
    for d in (ds, hold):
        owner.grant_dataset(d, role)
    with connect() as a:
        db = dpsql.connect(a, install=False)
        model = db.train(name, None, None, privacy=dpsql.BoltOn(epsilon=1, delta=0))
        assert model.row["params"]["privacy_unit"]["max_rows_per_unit"] == 2
        db.describe(name, 0.5)
        db.evaluate(model.model_id, name + "_holdout", epsilon=0.5)
        db.tune(name, name + "_holdout", 1.0, 0, candidates=[{"privacy": "bolton"}])
        budgets = {b["name"]: b["epsilon_spent"] for b in db.budgets()}
        mine = {
            r[0]: r[1:]
            for r in a.execute(
                "SELECT name, privacy_unit, max_rows_per_unit FROM dpsql.my_datasets"
            )
        }
    assert budgets == {name: pytest.approx(2.5), name + "_holdout": pytest.approx(1.5)}
    assert mine[name] == mine[name + "_holdout"] == ("person", 2)
    with pytest.raises(DpsqlError, match="its privacy unit is fixed"):
        owner.alter_dataset(name, max_rows_per_unit=3)


def test_the_cli_declares_and_alters_a_unit(conn, visits, server_uri) -> None:
    name = f"puc_{uuid.uuid4().hex[:8]}"
    args = ["dataset", "register", visits, "--features", "a,b", "--label", "y"]
    out = dpsql_cli(
        *args,
        "--epsilon-budget",
        "5",
        "--feature-bounds",
        "[[0, 1], [-1, 0]]",
        "--name",
        name,
        "--privacy-unit",
        "person",
        "--max-rows-per-unit",
        "3",
        dsn=server_uri,
    )
    assert out.returncode == 0, out.stderr
    assert "1500 units (privacy_unit person)" in out.stderr + out.stdout
    altered = dpsql_cli("dataset", "alter", name, "--max-rows-per-unit", "1", dsn=server_uri)
    assert altered.returncode == 0, altered.stderr
    assert conn.execute(
        "SELECT privacy_unit, max_rows_per_unit FROM dpsql.datasets WHERE name = %s", (name,)
    ).fetchone() == ("person", 1)
