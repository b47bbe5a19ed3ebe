"""Fixing registrations (issue 27): alter a dataset's budgets and name (its owner only, never
below what is spent, recorded), drop it (history kept, name and relation free), grant and
revoke by name, and concurrent registrations in one schema."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest

from tests.pg_helpers import load


def _points(conn, schema: str, table: str = "pts") -> str:
    rng = np.random.default_rng(1)
    X = rng.uniform(-0.5, 0.5, size=(300, 2))
    return load(conn, schema, table, X, (X[:, 0] > 0).astype(float))


def _register(c, source: str, name: str, epsilon: float = 2.0) -> int:
    (ds,) = c.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', %s, 1e-5, labels => '{0,1}', name => %s)",
        (source, epsilon, name),
    ).fetchone()
    return ds


def _history(conn, ds: int) -> list:
    return [
        r[0]
        for r in conn.execute(
            "SELECT change FROM dpsql.dataset_history WHERE dataset_id = %s ORDER BY change_id",
            (ds,),
        )
    ]


def test_the_owner_alters_budgets_never_below_what_is_spent(
    conn, scratch_schema, make_role
) -> None:
    owner, connect_owner = make_role("own", "dpsql_admin")
    other, connect_other = make_role("oth", "dpsql_admin")
    analyst, connect_analyst = make_role("ana", "dpsql_analyst")
    conn.execute(f"GRANT USAGE ON SCHEMA {scratch_schema} TO {owner}")
    source = _points(conn, scratch_schema)
    conn.execute(f"GRANT SELECT ON {source} TO {owner}")
    name = f"alt_{scratch_schema}"
    with connect_owner() as o:
        ds = _register(o, source, name)
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (name, analyst))  # by name
        with connect_analyst() as a:
            a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1.1)", (name,)
            )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 100)", (name,))
        with connect_other() as x, pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
            x.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 100)", (name,))
        assert "registered by" in str(err.value)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as below:
            o.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 1)", (name,))
        assert "spent epsilon 1.1" in str(below.value)
        o.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 1.1)", (name,))
        with connect_analyst() as a, pytest.raises(psycopg.Error) as over:
            a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 0.2)", (name,)
            )
        assert over.value.sqlstate == "DP001" and "spent ε=1.1," in str(over.value)
        o.execute(
            "SELECT dpsql.alter_dataset(%s, epsilon_budget => 5, delta_budget => 1e-4,"
            " new_name => %s)",
            (name, f"{name}_v2"),
        )
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="changes nothing"):
            o.execute("SELECT dpsql.alter_dataset(%s)", (f"{name}_v2",))
    assert _history(conn, ds) == [
        {"granted": analyst},
        {"epsilon_budget": [2.0, 1.1]},
        {"epsilon_budget": [1.1, 5.0], "delta_budget": [1e-5, 1e-4], "name": [name, f"{name}_v2"]},
    ]
    row = conn.execute(
        "SELECT name, epsilon_budget, delta_budget FROM dpsql.datasets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    assert row == (f"{name}_v2", 5.0, 1e-4)


def test_dropping_frees_the_name_and_keeps_the_ledger(conn, scratch_schema) -> None:
    source = _points(conn, scratch_schema)
    name = f"drop_{scratch_schema}"
    first = _register(conn, source, name)
    conn.execute("SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 0.5)", (name,))
    with pytest.raises(psycopg.errors.DuplicateObject):
        _register(conn, source, f"{name}_again")
    conn.execute("SELECT dpsql.drop_dataset(%s)", (name,))
    second = _register(conn, source, name)  # the name and the relation are free
    assert second != first
    (entries,) = conn.execute(
        "SELECT count(*) FROM dpsql.ledger_entries WHERE dataset_id = %s", (first,)
    ).fetchone()
    assert entries == 1
    (remaining,) = conn.execute(
        "SELECT epsilon_remaining FROM dpsql.budgets WHERE name = %s AND dropped_at IS NULL",
        (name,),
    ).fetchone()
    assert remaining == 2.0  # the new registration's budget
    assert _history(conn, first) == [{"dropped": name}]
    # a dropped table's name is free too, and the drop is recorded
    conn.execute(f"DROP TABLE {source}")
    assert _history(conn, second) == [{"relation_dropped": name}]
    third = _register(conn, _points(conn, scratch_schema, "pts2"), name)
    assert third not in (first, second)
    with pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SELECT dpsql.drop_dataset(%s)", ("no such dataset",))


def test_grant_and_revoke_by_name_or_id(conn, scratch_schema, make_role) -> None:
    analyst, connect = make_role("ana", "dpsql_analyst")
    name = f"gr_{scratch_schema}"
    ds = _register(conn, _points(conn, scratch_schema), name)
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (str(ds), analyst))  # an id as text
    conn.execute("SELECT dpsql.revoke_dataset(%s, %s)", (name, analyst))
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))  # the bigint form
    conn.execute(f"SELECT dpsql.grant_dataset('{name}', '{analyst}')")  # untyped literals
    with connect() as a:
        assert a.execute("SELECT count(*) FROM dpsql.my_datasets").fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("SELECT dpsql.grant_dataset(%s, %s)", (name, analyst))
    with pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", ("nope", analyst))


def test_two_registrations_at_once_in_one_schema(conn, scratch_schema, server_uri) -> None:
    sources = [_points(conn, scratch_schema, f"c{i}") for i in range(2)]
    conn.execute(f"REVOKE USAGE ON SCHEMA {scratch_schema} FROM dpsql_reader")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def register(i: int) -> None:
        try:
            with psycopg.connect(server_uri, autocommit=True) as c:
                barrier.wait()
                _register(c, sources[i], f"conc{i}_{scratch_schema}")
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
