"""Issue 44, item 2: register_dataset(..., holdout => f) splits one table into a training
dataset and '<name>_holdout', by a secret-keyed hash of the row's key, each with its own
budget; every private read of one side sees its rows only."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from scipy import stats


@pytest.fixture
def table(conn, scratch_schema) -> str:
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, a float8, b float8, y int, note text)")
    conn.execute(
        "INSERT INTO t SELECT g, (g % 10) / 10.0, -(g % 7) / 7.0,"
        " CASE WHEN (g % 10) / 10.0 - (g % 7) / 14.0 > 0.2 THEN 1 ELSE -1 END, 'x'"
        " FROM generate_series(1, 5000) g"
    )
    return f"{scratch_schema}.t"


def _register(conn, source: str, **kw) -> tuple[int, str]:
    name = f"ho_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    (ds,) = conn.execute(
        f"SELECT dpsql.register_dataset(%(source)s, '{{a,b}}', 'y', 10, 1e-5,"
        f" feature_bounds => '{{{{0,1}},{{-1,0}}}}', name => %(name)s{extra})",
        {"source": source, "name": name, **kw},
    ).fetchone()
    return ds, name


def _side_rows(conn, name: str) -> int:
    return conn.execute(
        "SELECT dpsql_internal._public_row_count(dpsql_internal._lookup_dataset(%s))", (name,)
    ).fetchone()[0]


def test_the_split_partitions_the_rows_at_the_fraction(conn, table) -> None:
    """Every row with a key is on exactly one side; the holdout's share is binomial around
    the fraction (two-sided test at level 1e-6: false-failure rate 1e-6)."""
    ds, name = _register(conn, table, holdout=0.2)
    rows = conn.execute(
        "SELECT name, split_side, split_key, split_fraction, epsilon_budget FROM dpsql.my_datasets"
        " WHERE name IN (%s, %s) ORDER BY name",
        (name, name + "_holdout"),
    ).fetchall()
    assert rows == [
        (name, "train", "id", 0.2, 10.0),
        (name + "_holdout", "holdout", "id", 0.2, 10.0),
    ]
    train, held = _side_rows(conn, name), _side_rows(conn, name + "_holdout")
    assert train + held == 5000
    assert stats.binomtest(held, 5000, 0.2).pvalue > 1e-6


def test_each_side_reads_its_own_rows(conn, table) -> None:
    """The sides' rows, read through the private path, are the ids whose keyed hash falls
    below (holdout) or at or above (training) the fraction: recomputed here from the secret."""
    ds, name = _register(conn, table, holdout=0.3)
    secret = conn.execute(
        "SELECT secret FROM dpsql_internal.split_secrets WHERE dataset_id = %s", (ds,)
    ).fetchone()[0]
    held = conn.execute(
        "SELECT count(*) FROM t WHERE dpsql_internal._split_unit(id::text, %s) < 0.3", (secret,)
    ).fetchone()[0]
    assert _side_rows(conn, name + "_holdout") == held
    assert _side_rows(conn, name) == 5000 - held
    # a second split of the same kind of table draws another secret: other rows
    conn.execute("CREATE TABLE t2 AS SELECT * FROM t")
    conn.execute("ALTER TABLE t2 ADD PRIMARY KEY (id)")
    ds2, _ = _register(conn, table.replace(".t", ".t2"), holdout=0.3)
    secret2 = conn.execute(
        "SELECT secret FROM dpsql_internal.split_secrets WHERE dataset_id = %s", (ds2,)
    ).fetchone()[0]
    assert secret2 != secret and len(secret) == 48


def test_training_and_charges_stay_on_their_side(conn, table, make_role) -> None:
    ds, name = _register(conn, table, holdout=0.2)
    hold = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name + "_holdout",)
    ).fetchone()[0]
    role, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, role))
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (hold, role))
    with connect() as a:
        (m,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (name,)
        ).fetchone()
        assert m is not None
        a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 2)",
            (name + "_holdout",),
        )
        spent = dict(
            a.execute(
                "SELECT name, epsilon_spent FROM dpsql.my_datasets WHERE name IN (%s, %s)",
                (name, name + "_holdout"),
            ).fetchall()
        )
        # the analyst reads no row and no key
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute(f"SELECT id FROM {table}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("SELECT secret FROM dpsql_internal.split_secrets")
    assert spent == {name: 1.0, name + "_holdout": 2.0}
    # nor does a data owner read the secret (not even of their own split)
    _, connect_owner = make_role("owner", "dpsql_admin")
    with connect_owner() as o, pytest.raises(psycopg.errors.InsufficientPrivilege):
        o.execute("SELECT secret FROM dpsql_internal.split_secrets")
    # a release's public row count is its side's
    (preview,) = conn.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (name,)
    ).fetchone()
    assert preview["rows"] == _side_rows(conn, name) < 5000


def test_the_table_name_means_the_training_side(conn, table) -> None:
    ds, name = _register(conn, table, holdout=0.2)
    looked = conn.execute(
        "SELECT (dpsql_internal._lookup_dataset(%s)).dataset_id", (table,)
    ).fetchone()[0]
    assert looked == ds


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"holdout": 0.0}, "holdout must be a fraction in (0, 1)"),
        ({"holdout": 1.0}, "holdout must be a fraction in (0, 1)"),
        ({"holdout": float("nan")}, "holdout must be a fraction in (0, 1)"),
        ({"key": "id"}, "key is the holdout's"),
        ({"holdout": 0.2, "key": "nope"}, "has no column nope"),
        ({"holdout": 0.2, "key": "a"}, "is a registered feature or label"),
        ({"holdout": 0.2, "key": "b"}, "is a registered feature or label"),
    ],
)
def test_bad_holdouts_are_refused_and_register_nothing(conn, table, kw, message) -> None:
    before = conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0]
    with pytest.raises(psycopg.Error, match=message.replace("(", r"\(").replace(")", r"\)")):
        _register(conn, table, **kw)
    assert conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0] == before


def test_a_key_of_another_type_or_no_primary_key_is_refused(conn, table) -> None:
    conn.execute("CREATE TABLE nokey AS SELECT * FROM t")
    with pytest.raises(psycopg.Error, match="has no one-column primary key"):
        _register(conn, table.replace(".t", ".nokey"), holdout=0.2)
    conn.execute("ALTER TABLE nokey ADD COLUMN f float8 DEFAULT 1")
    with pytest.raises(psycopg.Error, match="has type double precision"):
        _register(conn, table.replace(".t", ".nokey"), holdout=0.2, key="f")
    # a text key works
    ds, name = _register(conn, table.replace(".t", ".nokey"), holdout=0.5, key="note")
    # every key is 'x': all rows on one side
    assert sorted([_side_rows(conn, name), _side_rows(conn, name + "_holdout")]) == [0, 5000]


def test_a_key_changed_to_an_owner_type_is_refused_at_read(conn, table) -> None:
    """The key's type is checked at every read: an owner's type's cast is never resolved."""
    ds, name = _register(conn, table, holdout=0.2)
    conn.execute("CREATE TYPE mood AS ENUM ('a', 'b')")
    conn.execute("ALTER TABLE t DROP CONSTRAINT t_pkey")
    conn.execute("ALTER TABLE t ALTER COLUMN id TYPE text USING 'a'")
    conn.execute("ALTER TABLE t ALTER COLUMN id TYPE mood USING 'a'::mood")
    with pytest.raises(psycopg.Error, match="has type .*mood"):
        _side_rows(conn, name)


def test_a_view_is_split_through_the_reader(conn, table) -> None:
    """A view is read as dpsql_reader (_read_source): the key travels with the columns."""
    conn.execute("CREATE VIEW v AS SELECT id, a, b, y FROM t")
    ds, name = _register(conn, table.replace(".t", ".v"), holdout=0.25, key="id")
    secret = conn.execute(
        "SELECT secret FROM dpsql_internal.split_secrets WHERE dataset_id = %s", (ds,)
    ).fetchone()[0]
    held = conn.execute(
        "SELECT count(*) FROM t WHERE dpsql_internal._split_unit(id::text, %s) < 0.25", (secret,)
    ).fetchone()[0]
    assert _side_rows(conn, name + "_holdout") == held
    assert _side_rows(conn, name) == 5000 - held


def test_registration_findings_count_the_whole_table(conn, table) -> None:
    """The owner's findings are of the relation, both sides: a count that does not depend on
    the secret (the quickstart prints it)."""
    conn.execute("UPDATE t SET y = NULL WHERE id <= 7")
    with pytest.raises(psycopg.Error, match="of 5000 rows, 7 rows"):
        _register(conn, table, holdout=0.2)
    ds, name = _register(conn, table, holdout=0.2, accept=True)
    assert _side_rows(conn, name) + _side_rows(conn, name + "_holdout") == 5000
