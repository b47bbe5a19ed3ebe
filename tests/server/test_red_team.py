"""Issue 9's findings, each replayed as the role that found it (F4 definer rights through a
registered view, F5 forged releases and other owners' runs, F6 values in errors and
dimensions read from data). F1 is tests/server/test_pinned_settings.py; F2 and F3 the C fuzz and
interrupt tests."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import errors

MODEL_COLUMNS = (
    "source, features, label, model, n_features, fit_intercept, coef, weights, flags, epochs,"
    " epochs_run, batch_size, lambda, schedule, step_offset, row_norm, shuffle, rows,"
    " dropped_rows, loss_history, prepare_seconds, train_seconds"
)
MODEL_VALUES = (
    "'t', '{x}', 'y', 'logistic', 2, false, '{9,9}', '{9,9}', 0, 1, 1, 1, 0, 'constant', 0,"
    " 'clip', true, 100, 0, '{}', 0, 0"
)


@pytest.fixture
def points(conn, scratch_schema) -> str:
    conn.execute(
        "CREATE TABLE points AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
        " CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 200) g"
    )
    return f"{scratch_schema}.points"


def _register(conn, source: str, *, features: str = "{a,b}", **kw) -> tuple[int, str]:
    name = f"rt_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    (ds,) = conn.execute(
        f"SELECT dpsql.register_dataset(%(source)s, %(features)s, 'y', 10.0, 1e-5,"
        f" name => %(name)s, accept => true{extra})",
        {"source": source, "features": features, "name": name, **kw},
    ).fetchone()
    return ds, name


def _spent(conn, ds: int) -> float:
    return conn.execute(
        "SELECT coalesce(sum(epsilon), 0) FROM dpsql.ledger_entries WHERE dataset_id = %s", (ds,)
    ).fetchone()[0]


# ------------------------------------------------------------------------------------ F4


def test_registered_views_are_read_without_superuser_rights(
    conn,
    scratch_schema,
    points,
    make_role,  # noqa: F811
) -> None:
    """A registered view's functions run as dpsql_reader, not as the extension owner."""
    conn.execute(
        "CREATE FUNCTION guard(v float8) RETURNS float8 LANGUAGE plpgsql AS $$"
        " BEGIN IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN"
        "   RAISE EXCEPTION 'read as superuser %', current_user; END IF; RETURN v; END $$"
    )
    conn.execute("CREATE VIEW guarded AS SELECT guard(a::float8) AS a, b, y FROM points")
    ds, name = _register(conn, f"{scratch_schema}.guarded")
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    with connect() as a:
        (mid,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, epochs => 1)",
            (name,),
        ).fetchone()
    assert mid is not None and _spent(conn, ds) == 1.0


def test_temp_objects_cannot_capture_names_in_a_registered_view(
    conn,
    scratch_schema,
    points,
    make_role,  # noqa: F811
) -> None:
    """The red team's route: an owner's function pinned to its schema still searches pg_temp
    first, where the analyst's temp view runs code as whoever reads the registered view."""
    conn.execute("CREATE TABLE rt_scale AS SELECT 1.0::float8 AS f")
    # What the view's code reads beyond the view's own relations, the reader must be granted.
    conn.execute("GRANT SELECT ON rt_scale TO dpsql_reader")
    conn.execute(
        "CREATE FUNCTION factor() RETURNS float8 LANGUAGE plpgsql"
        f" SET search_path = {scratch_schema} AS $$"
        " BEGIN RETURN (SELECT f FROM rt_scale LIMIT 1); END $$"
    )
    conn.execute("CREATE VIEW scaled AS SELECT a * factor() AS a, b, y FROM points")
    ds, name = _register(conn, f"{scratch_schema}.scaled")
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    with connect() as a:
        a.execute(
            "CREATE TEMP VIEW rt_scale AS SELECT f FROM (SELECT 1.0::float8 AS f,"
            " pg_catalog.set_config('rt.leak', current_user::text, false) AS leak) q"
            " WHERE leak IS NOT NULL"
        )
        with pytest.raises(errors.ObjectInUse, match="temporary"):
            a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
                " epochs => 1)",
                (name,),
            )
        assert a.execute("SELECT current_setting('rt.leak', true)").fetchone()[0] in (None, "")
        assert _spent(conn, ds) == 0
        a.execute("DISCARD TEMP")
        a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, epochs => 1)",
            (name,),
        )
    assert _spent(conn, ds) == 1.0


# ------------------------------------------------------------------------------------ F5


def test_data_owner_cannot_forge_a_release(conn, points, make_role) -> None:  # noqa: F811
    ds, _ = _register(conn, points)
    owner, connect = make_role("owner", "dpsql_admin")
    with connect() as o:
        for extra_cols, extra_vals in [
            (
                ", privacy, dataset_id, epsilon, delta, params",
                f", 'bolton', {ds}, 1, 0,"
                ' \'{"privacy": {"noise_seed": "pg_strong_random"}}\'',
            ),
            (", privacy, params", ", 'bolton', '{}'"),
            (", created_by, params", ", 'postgres', '{}'"),
        ]:
            with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
                o.execute(
                    f"INSERT INTO dpsql.model_store ({MODEL_COLUMNS}{extra_cols})"
                    f" VALUES ({MODEL_VALUES}{extra_vals})"
                )
        # Only the server's support functions of the aggregate, never called directly.
        for call in [
            "SELECT dpsql_internal._sgd_final('{1}'::float8[])",
            "SELECT dpsql_internal._sgd_combine('{1}'::float8[], '{1}'::float8[])",
        ]:
            with pytest.raises(errors.InsufficientPrivilege):
                o.execute(call)
        with pytest.raises(errors.InsufficientPrivilege):
            o.execute(
                "CREATE AGGREGATE pg_temp.forged(float8[], float8, float8[]) ("
                " SFUNC = dpsql_internal._sgd_transition, STYPE = float8[], INITCOND = '{0}')"
            )


def test_data_owners_see_only_their_own_runs(conn, points, make_role) -> None:  # noqa: F811
    first, connect_first = make_role("owner", "dpsql_admin")
    second, connect_second = make_role("owner", "dpsql_admin")
    conn.execute(f"GRANT USAGE ON SCHEMA {points.split('.')[0]} TO {first}")
    conn.execute(f"GRANT SELECT ON {points} TO {first}")
    with connect_first() as a, connect_second() as b:
        (run,) = a.execute(
            "SELECT (dpsql_internal._prepare(%s, '{a,b}', 'y', 'logistic', 1, 1, 0, NULL,"
            " 'constant', 0,"
            " NULL, true, 1, NULL, false, 'none', 0.1, NULL)).run_id",
            (points,),
        ).fetchone()
        assert (
            a.execute("SELECT count(*) FROM dpsql.runs WHERE run_id = %s", (run,)).fetchone()[0]
            == 1
        )
        assert b.execute("SELECT count(*) FROM dpsql.runs").fetchone()[0] == 0
        assert b.execute("UPDATE dpsql.runs SET state = '{0}' RETURNING run_id").fetchall() == []
        with pytest.raises(psycopg.Error, match="no training run"):
            b.execute("SELECT dpsql_internal._run_epoch(%s)", (run,))
        a.execute("SELECT dpsql_internal._abort(%s)", (run,))


# ------------------------------------------------------------------------------------ F6


def test_private_errors_do_not_print_values(conn, scratch_schema, make_role) -> None:  # noqa: F811
    """A numeric feature or label beyond float8's range is a null record, not a cast error
    that prints it."""
    conn.execute(
        "CREATE TABLE wide AS SELECT (g % 10)::numeric / 10 AS a, (g % 3)::numeric AS b,"
        " CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END::numeric AS y FROM generate_series(1, 100) g"
    )
    conn.execute("INSERT INTO wide VALUES (1e400, 0, 1), (0, 0, 1e400), ('NaN', 0, -1)")
    conn.execute("CREATE TABLE wide_arrays AS SELECT ARRAY[a, b] AS x, y FROM wide")
    analyst, connect = make_role("analyst", "dpsql_analyst")
    for source, features in [("wide", "{a,b}"), ("wide_arrays", "{x}")]:
        ds, name = _register(conn, f"{scratch_schema}.{source}", features=features)
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
        with connect() as a:
            (mid,) = a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
                " epochs => 1)",
                (name,),
            ).fetchone()
            assert (
                a.execute("SELECT rows FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()[0]
                == 103
            )


def test_dimension_comes_from_the_registration(conn, scratch_schema) -> None:
    """The first physical row no longer decides a private run's dimension."""
    conn.execute(
        "CREATE TABLE arr AS SELECT ARRAY[(g % 10) / 10.0, (g % 7) / 7.0]::float8[] AS x,"
        " CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 100) g"
    )
    ds, name = _register(conn, f"{scratch_schema}.arr", features="{x}")
    assert (
        conn.execute("SELECT dim FROM dpsql.datasets WHERE dataset_id = %s", (ds,)).fetchone()[0]
        == 2
    )
    conn.execute("DELETE FROM arr")
    conn.execute("INSERT INTO arr VALUES ('{1,2,3,4,5}', 1)")
    conn.execute(
        "INSERT INTO arr SELECT ARRAY[(g % 10) / 10.0, 0.5], 1 - 2 * (g % 2)"
        " FROM generate_series(1, 99) g"
    )
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, epochs => 1)",
        (name,),
    ).fetchone()
    assert (
        conn.execute("SELECT n_features FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()[
            0
        ]
        == 2
    )
    # An explicit declaration wins, and a contradictory one is refused.
    with pytest.raises(errors.InvalidParameterValue, match="dimension"):
        _register(
            conn, f"{scratch_schema}.arr", features="{x}", dim=3, feature_bounds=[[0, 1], [0, 1]]
        )


# ------------------------------------------------------------------- SQL and Python agree


def test_python_predicts_as_the_server_on_bounded_data(conn, scratch_schema, server_uri) -> None:
    """Python applied no feature bounds (probabilities off by up to 0.69): one transform and
    one decision rule (the C core's) now serve both."""
    import numpy as np

    import dpsql

    conn.execute(
        "CREATE TABLE raw AS SELECT 40 + 30 * sin(g) AS a, 1000 * cos(g * 1.7) AS b,"
        " CASE WHEN sin(g) + cos(g * 1.7) / 2 > 0 THEN 1 ELSE 0 END AS y"
        " FROM generate_series(1, 400) g"
    )
    ds, name = _register(
        conn, f"{scratch_schema}.raw", feature_bounds=[[10, 70], [-1000, 1000]], labels=[0, 1]
    )
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 5, epochs => 3,"
        " step_size => 1)",
        (name,),
    ).fetchone()
    rows = conn.execute(
        "SELECT a, b, y, dpsql.predict(%s, ARRAY[a, b]) FROM raw ORDER BY a, b", (mid,)
    ).fetchall()
    X = np.array([[r[0], r[1]] for r in rows])
    y = np.array([r[2] for r in rows])
    in_sql = np.array([r[3] for r in rows])
    (accuracy,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, f"{scratch_schema}.raw")
    ).fetchone()
    with dpsql.connect(server_uri) as db:
        model = db.model(mid)
        np.testing.assert_array_equal(model.predict_proba(X)[:, 1], in_sql)
        predicted = model.predict(X)
    assert set(np.unique(predicted)) <= {0.0, 1.0}
    assert accuracy == np.mean(predicted == y)
    assert np.array_equal(predicted == 1, in_sql >= 0.5)


def test_only_relations_that_run_no_code_are_read_directly(conn, scratch_schema) -> None:
    """A child or partition may be a foreign table: only plain tables and materialized views
    without children skip dpsql_reader."""
    conn.execute("CREATE TABLE plain (a float8, y float8)")
    conn.execute("CREATE MATERIALIZED VIEW mat AS SELECT * FROM plain")
    conn.execute("CREATE VIEW v AS SELECT * FROM plain")
    conn.execute("CREATE TABLE parent (a float8, y float8)")
    conn.execute("CREATE TABLE child () INHERITS (parent)")
    conn.execute("CREATE TABLE part (a float8, y float8) PARTITION BY RANGE (a)")
    expected = {"plain": True, "mat": True, "v": False, "parent": False, "part": False}
    for rel, direct in expected.items():
        (got,) = conn.execute(
            "SELECT dpsql_internal._runs_no_code(%s::regclass)", (f"{scratch_schema}.{rel}",)
        ).fetchone()
        assert got is direct, rel
