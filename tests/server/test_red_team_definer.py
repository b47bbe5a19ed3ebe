"""Issue 24's findings, each replayed as the role that found it: a data owner reaching the
extension owner's rights through a temp table the audit used (1) or a cast of their own (2),
raw values in cast errors (5), dataset names told to ungranted analysts (9), run tables that
owners pre-create (10), and raw PostgreSQL errors from bad dpsql.train input (11)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

ROWS = 200
MODEL_COLUMNS = (
    "source, features, label, model, n_features, fit_intercept, coef, weights, flags, epochs,"
    " epochs_run, batch_size, lambda, schedule, step_offset, row_norm, shuffle, rows,"
    " dropped_rows, loss_history, prepare_seconds, train_seconds, params"
)
MODEL_VALUES = (
    "'t', '{x}', 'y', 'logistic', 2, false, '{9,9}', '{9,9}', 0, 1, 1, 1, 0, 'constant', 0,"
    " 'clip', true, 100, 0, '{}', 0, 0, '{}'"
)


def _ledger(conn) -> tuple:
    return conn.execute(
        "SELECT count(*), coalesce(sum(epsilon), 0) FROM dpsql.ledger_entries"
    ).fetchone()


def _is_superuser(conn, role: str) -> bool:
    return conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0]


@pytest.fixture
def owned(conn, make_role):
    """A data owner with a schema of their own, a table of theirs registered in it, and an
    analyst it is granted to: (owner, connect_owner, schema, dataset id, name, analyst,
    connect_analyst)."""
    owner, connect_owner = make_role("owner", "dpsql_admin")
    analyst, connect_analyst = make_role("analyst", "dpsql_analyst")
    schema = f"rt_{uuid.uuid4().hex[:8]}"
    conn.execute(
        sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
            sql.Identifier(schema), sql.Identifier(owner)
        )
    )
    name = f"rtd_{uuid.uuid4().hex[:8]}"
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}")
        o.execute(
            "CREATE TABLE pts AS SELECT (g % 10) / 10.0::float8 AS a, -(g % 7) / 7.0::float8 AS b,"
            f" CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, {ROWS}) g"
        )
        (ds,) = o.execute(
            "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 100.0, 1e-5, name => %s)",
            (f"{schema}.pts", name),
        ).fetchone()
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    yield owner, connect_owner, schema, ds, name, analyst, connect_analyst
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# (the red team's trigger ran ALTER ROLE ... SUPERUSER; this one says as whom it ran, which
# an audit that fails later, e.g. where the accountant cannot run, does not roll back)
ESCALATE = (
    "CREATE FUNCTION {s}.escalate() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN RAISE EXCEPTION 'trigger ran as %', current_user; END $$"
)


# ------------------------------------------------------------------------------------ 1


@pytest.mark.parametrize("method", ["one_run", "distinguish"])
def test_audit_uses_no_temp_table_of_the_callers(conn, owned, method) -> None:
    owner, connect_owner, schema, ds, name, *_ = owned
    with connect_owner() as o:
        o.execute(ESCALATE.format(s=schema))
        for table, columns in [
            ("dpsql_audit_runs", "side int, i int, w float8[]"),
            ("dpsql_audit_canaries", "slot int, x float8[], y float8, included boolean"),
        ]:
            o.execute(f"CREATE TEMP TABLE {table} ({columns})")
            o.execute(
                f"CREATE TRIGGER escalate BEFORE INSERT ON {table}"
                f" FOR EACH ROW EXECUTE FUNCTION {schema}.escalate()"
            )
        runs = 1 if method == "one_run" else 20
        try:
            o.execute(
                "SELECT * FROM dpsql.audit(%s, 'bolton', 1, 0, %s, %s,"
                ' \'{"canaries": 10, "train": {"epochs": 1}}\')',
                (name, runs, method),
            )
        except psycopg.Error as e:
            assert "trigger ran" not in str(e), str(e)
            assert "accountant" in str(e), str(e)  # (its statistics, after the runs)
        # the caller's tables were never touched
        assert o.execute("SELECT count(*) FROM pg_temp.dpsql_audit_runs").fetchone() == (0,)
    assert not _is_superuser(conn, owner)


# ------------------------------------------------------------------------------------ 2, 5


def _train(c, name: str, **kw):
    extra = "".join(f", {k} => %({k})s" for k in kw)
    return c.execute(
        "SELECT dpsql.train(%(name)s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
        f" epochs => 1{extra})",
        {"name": name, **kw},
    ).fetchone()[0]


@pytest.mark.parametrize("who", ["owner", "analyst"])
def test_a_column_changed_to_an_owners_type_is_refused_at_every_read(conn, owned, who) -> None:
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute("CREATE TYPE evil AS (v float8)")
        o.execute(
            "CREATE FUNCTION to_float(e evil) RETURNS float8 LANGUAGE plpgsql AS $$"
            " BEGIN EXECUTE format('ALTER ROLE %I SUPERUSER', session_user); RETURN e.v; END $$"
        )
        o.execute("CREATE CAST (evil AS float8) WITH FUNCTION to_float(evil)")
        o.execute("ALTER TABLE pts ALTER COLUMN a TYPE evil USING ROW(a)::evil")
    before = _ledger(conn)
    connect = connect_owner if who == "owner" else connect_analyst
    with connect() as c, pytest.raises(errors.DatatypeMismatch) as caught:
        _train(c, name)
    message = str(caught.value)
    assert message.startswith("dpsql:") and "built-in numeric" in message, message
    assert not _is_superuser(conn, owner)
    assert _ledger(conn) == before


@pytest.mark.parametrize(
    ("types", "column"),
    [
        # (type definitions, the column's type): each holds one value a float8 cast refuses
        ("CREATE DOMAIN d1 AS numeric; CREATE DOMAIN d2 AS d1", "d2"),
        ("CREATE DOMAIN d1 AS numeric; CREATE DOMAIN d2 AS d1; CREATE DOMAIN d3 AS d2", "d3"),
    ],
)
@pytest.mark.parametrize("value", ["1e400", "-1e400", "1e-400", "NaN", "Infinity"])
def test_scalar_domains_print_no_value(conn, owned, types, column, value) -> None:
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute(types)
        o.execute(f"ALTER TABLE pts ALTER COLUMN a TYPE {column} USING a::numeric")
        o.execute(f"UPDATE pts SET a = '{value}' WHERE b = 0 AND a = 0")
    with connect_analyst() as a:
        assert _train(a, name) is not None  # the row is a null record (or 0): no error


@pytest.mark.parametrize(
    ("types", "column"),
    [
        ("CREATE DOMAIN arr AS numeric[]", "arr"),
        ("CREATE DOMAIN d1 AS numeric; CREATE DOMAIN d2 AS d1", "d2[]"),
        ("CREATE DOMAIN d1 AS numeric; CREATE DOMAIN arr AS d1[]", "arr"),
        ("CREATE DOMAIN d1 AS numeric; CREATE DOMAIN a1 AS d1[]; CREATE DOMAIN a2 AS a1", "a2"),
    ],
)
@pytest.mark.parametrize("value", ["1e400", "1e-400"])
def test_array_domains_print_no_value(conn, owned, types, column, value) -> None:
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    arr_name = f"{name}_arr"
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute(types)
        o.execute(
            f"CREATE TABLE arrs AS SELECT ARRAY[a::numeric, b::numeric]::{column} AS x, y FROM pts"
        )
        o.execute(f"UPDATE arrs SET x = ARRAY['{value}'::numeric, 0]::{column} WHERE y = 1")
        (ads,) = o.execute(
            "SELECT dpsql.register_dataset(%s, '{x}', 'y', 100.0, 1e-5, name => %s, dim => 2,"
            " accept => true)",
            (f"{schema}.arrs", arr_name),
        ).fetchone()
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (ads, analyst))
    with connect_analyst() as a:
        assert _train(a, arr_name) is not None


# ------------------------------------------------------------------------------------ 9


def test_ungranted_and_unknown_datasets_look_alike(conn, owned, make_role) -> None:
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    other, connect_other = make_role("analyst", "dpsql_analyst")
    seen = []
    with connect_other() as a:
        for source in [name, f"{schema}.pts", "pts", "rtd_unknown", f"{schema}.nope", None]:
            before = _ledger(conn)
            with pytest.raises(psycopg.Error) as caught:
                _train(a, source)
            err = caught.value
            assert _ledger(conn) == before
            shown = str(err).replace(f"'{source}'" if source else "NULL", "<source>")
            seen.append((err.sqlstate, shown, err.diag.message_hint))
            if source != name:
                assert name not in str(err) and name not in (err.diag.message_hint or "")
        assert len(set(seen)) == 1, seen
        assert seen[0][0] == "42704" and seen[0][1].startswith("dpsql:")
        # the budget report says the same of both
        reports = []
        for source in [name, "rtd_unknown"]:
            with pytest.raises(errors.UndefinedObject) as caught:
                a.execute("SELECT * FROM dpsql.budget_report(%s)", (source,))
            reports.append(str(caught.value).replace(source, "<source>"))
        assert reports[0] == reports[1]
    # the granted analyst still trains
    with connect_analyst() as a:
        assert _train(a, name) is not None


# ------------------------------------------------------------------------------------ 10


def test_owners_cannot_plant_training_tables_or_runs(conn, owned) -> None:
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_owner() as o:
        (last,) = o.execute(
            "SELECT nextval(pg_get_serial_sequence('dpsql.runs', 'run_id'))"
        ).fetchone()
        for run in range(last + 1, last + 6):
            with pytest.raises(errors.InsufficientPrivilege):
                o.execute(f"CREATE TABLE dpsql_work.train_{run} (rid bigint, x float8[], y float8)")
            with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
                o.execute(
                    "INSERT INTO dpsql.runs (run_id, spec, train_table, state, rows,"
                    " prepare_seconds) VALUES (%s, '{}', 'x', '{}', 0, 0)",
                    (run,),
                )
        # nor move a run of their own to a later id
        o.execute(
            "INSERT INTO dpsql.runs (run_id, spec, train_table, state, rows, prepare_seconds)"
            " VALUES (%s, '{}', 'x', '{}', 0, 0)",
            (last,),
        )
        with pytest.raises(errors.InsufficientPrivilege):
            o.execute("UPDATE dpsql.runs SET run_id = %s WHERE run_id = %s", (last + 1, last))
        o.execute("DELETE FROM dpsql.runs WHERE run_id = %s", (last,))
        # nor store a noiseless model under the id a release will draw
        (mid,) = o.execute(
            "SELECT nextval(pg_get_serial_sequence('dpsql.model_store', 'model_id'))"
        ).fetchone()
        for model_id in range(mid + 1, mid + 6):
            with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
                o.execute(
                    f"INSERT INTO dpsql.model_store (model_id, {MODEL_COLUMNS})"
                    f" VALUES (%s, {MODEL_VALUES})",
                    (model_id,),
                )
        # an owner's own non-private training still works
        o.execute(f"SET search_path = {schema}")
        (mid,) = o.execute(
            "SELECT dpsql.train('pts', '{a,b}', 'y', epochs => 1, seed => 1)"
        ).fetchone()
        assert mid is not None
    with connect_analyst() as a:
        for _ in range(3):
            assert _train(a, name) is not None


# ------------------------------------------------------------------------------------ 11

RAW = {"XX000", "22P02", "42846", "22003", "42883", "55000", "57014", "2202E", "22012"}

# (mechanism, dpsql.train arguments): each once a raw PostgreSQL error or a timeout
BAD_TRAIN: list[tuple[str, dict[str, Any]]] = [
    ("bolton", {"model": None}),
    ("dpsgd", {"model": None}),
    ("bolton", {"epochs": 2147483647}),
    ("bolton", {"tuning_epochs": [2147483647]}),
    ("bolton", {"lambda": 1e-320}),
    ("bst14", {"radius": 1e308}),
    ("bst14", {"epsilon": 1e-320}),
    ("bst14", {"delta": 1e-320}),
    ("dpsgd", {"clip_norm": 1e308}),
    ("dp_ftrl", {"clip_norm": 1e-320}),
    ("dp_ftrl", {"options": '{"radius": 1e400}'}),
    ("dp_ftrl", {"options": '{"regularizer": 1e400}'}),
]
TYPES = {
    "model": "text",
    "epochs": "int",
    "tuning_epochs": "int[]",
    "lambda": "float8",
    "radius": "float8",
    "epsilon": "float8",
    "delta": "float8",
    "clip_norm": "float8",
    "step_size": "float8",
    "options": "jsonb",
}


def _refused_cleanly(conn, c, call: str, params: dict) -> psycopg.Error:
    before = _ledger(conn)
    with pytest.raises(psycopg.Error) as caught:
        c.execute(call, params)
    err = caught.value
    assert err.sqlstate not in RAW, (err.sqlstate, str(err))
    assert (err.diag.message_primary or "").startswith("dpsql:"), str(err)
    assert _ledger(conn) == before
    return err


@pytest.mark.parametrize(
    ("mechanism", "args"), BAD_TRAIN, ids=[f"{m}-{next(iter(a))}" for m, a in BAD_TRAIN]
)
def test_bad_train_arguments_are_dpsql_errors(conn, owned, mechanism, args) -> None:
    *_, name, analyst, connect_analyst = owned
    full = {"privacy": mechanism, "epsilon": 1.0, "delta": 1e-5, "epochs": 1, **args}
    names = ", ".join(f"{k} => %({k})s::{TYPES.get(k, 'text')}" for k in full)
    with connect_analyst() as a:
        a.execute("SET statement_timeout = '60s'")
        _refused_cleanly(
            conn, a, f"SELECT dpsql.train(%(name)s, NULL, NULL, {names})", {"name": name, **full}
        )


@pytest.mark.parametrize("mechanism", ["dpsgd", "dpsgd_f", "dpsgd_f_alg2"])
def test_a_huge_step_size_releases_a_finite_model(conn, owned, mechanism) -> None:
    """A public step size that overflows the weights (1e308; DPSGD-F's eta_0 / tau^2 over a
    noisy tau) used to fail with "the model diverged" after the charge; a private run's weights
    stay in a public box instead (core/sgd.c, guard_weights) and the step is capped:
    a model is released, and it is finite."""
    *_, name, analyst, connect_analyst = owned
    with connect_analyst() as a:
        (mid,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => %s, epsilon => 1, delta => %s,"
            " epochs => 1, step_size => 1e308)",
            (name, mechanism, 1e-5),
        ).fetchone()
        (coef,) = a.execute("SELECT coef FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()
    flat = [v for row in coef for v in (row if isinstance(row, list) else [row])]
    assert all(abs(v) <= 1e100 for v in flat)


@pytest.mark.parametrize(
    "params",
    [
        '{"privacy": "bolton", "epsilon": "abc"}',
        '{"privacy": "bolton", "epsilon": 1, "epochs": "many"}',
        '{"privacy": "bolton", "epsilon": 1, "epochs": 1, "intercept": "perhaps"}',
        '{"privacy": "bolton", "epsilon": 1, "epochs": 1, "lambda": 1e400}',
        '{"privacy": "dpsgd", "epsilon": 1, "delta": 1e-5, "epochs": 1, "clip_norm": [1]}',
    ],
)
def test_the_private_entry_point_refuses_jsonb_of_wrong_types(conn, owned, params) -> None:
    """dpsql_internal._train_private is the analysts' too: any jsonb, no raw cast error."""
    *_, name, analyst, connect_analyst = owned
    with connect_analyst() as a:
        err = _refused_cleanly(
            conn,
            a,
            "SELECT dpsql_internal._train_private(%(name)s, 'logistic', %(p)s::jsonb)",
            {"name": name, "p": params},
        )
        assert err.diag.message_hint


@pytest.mark.parametrize("column", ["label_t text", "label_b boolean", "label_d date"])
def test_a_non_numeric_label_is_refused_by_its_type(conn, owned, column) -> None:
    owner, connect_owner, schema, *_ = owned
    col, typ = column.split()
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}")
        o.execute(f"ALTER TABLE pts ADD COLUMN {col} {typ}")
        err = _refused_cleanly(
            conn, o, f"SELECT dpsql.train('pts', '{{a,b}}', '{col}', epochs => 1)", {}
        )
        assert err.sqlstate == "42804" and "not a number" in str(err)


# ------------------------------------------------------------------------------------ 2+


@pytest.mark.parametrize(
    "plant",
    [
        "CREATE INDEX ON pts (a) WHERE boom()",
        "CREATE INDEX ON pts ((a + boom()::int))",
        "CREATE STATISTICS st ON (a + boom()::int), b FROM pts",
    ],
)
def test_owner_code_in_indexes_or_statistics_does_not_run_as_the_definer(conn, owned, plant):
    """The planner folds an IMMUTABLE function without arguments in an index's (or extended
    statistics') expressions into a constant: it would run as the reader."""
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute(
            "CREATE FUNCTION boom() RETURNS boolean IMMUTABLE LANGUAGE plpgsql AS $$ BEGIN"
            " IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)"
            " THEN RAISE EXCEPTION 'owner code ran as %', current_user; END IF;"
            " RETURN true; END $$"
        )
        o.execute(plant)
    before = _ledger(conn)
    with (
        connect_analyst() as a,
        pytest.raises(errors.ObjectNotInPrerequisiteState, match="not built in") as caught,
    ):
        _train(a, name)
    assert str(caught.value).startswith("dpsql:") and _ledger(conn) == before
    # the owner's own definer-rights calls on the dataset: the estimates and the audit
    for call in [
        "SELECT dpsql.estimate_bounds(%s, 1, '{-10,10}')",
        "SELECT * FROM dpsql.audit(%s, 'bolton', 1, options => '{\"canaries\": 10}')",
    ]:
        with (
            connect_owner() as o,
            pytest.raises(errors.ObjectNotInPrerequisiteState, match="not built in"),
        ):
            o.execute(call, (name,))
    assert _ledger(conn) == before
    # built-in expressions are fine
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute("DROP FUNCTION boom() CASCADE")
        o.execute("CREATE INDEX ON pts (abs(a)) WHERE b < 0")
    with connect_analyst() as a:
        assert _train(a, name) is not None


def test_a_view_over_an_owners_table_is_checked_too(conn, owned) -> None:
    """A superuser's view over a data owner's table: planning the view plans the table."""
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute(
            "CREATE FUNCTION boom() RETURNS boolean IMMUTABLE LANGUAGE plpgsql AS $$ BEGIN"
            " IF current_user <> session_user THEN"
            " RAISE EXCEPTION 'owner code ran as %', current_user; END IF;"
            " RETURN true; END $$"
        )
    conn.execute(f"CREATE VIEW {schema}.pts_view AS SELECT a, b, y FROM {schema}.pts")
    view = f"{name}_view"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10.0, 1e-5, name => %s, accept => true)",
        (f"{schema}.pts_view", view),
    )
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute("CREATE INDEX ON pts (a) WHERE boom()")
    # registration reads the rows too (its findings): refused there as well, nothing registered
    conn.execute(f"CREATE VIEW {schema}.pts_view2 AS SELECT a, b, y FROM {schema}.pts")
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="not built in"):
        conn.execute(
            "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10.0, 1e-5, name => %s)",
            (f"{schema}.pts_view2", f"{view}_2"),
        )
    conn.execute(
        "SELECT dpsql.grant_dataset(dataset_id, %s) FROM dpsql.datasets WHERE name = %s",
        (analyst, view),
    )
    with (
        connect_analyst() as a,
        pytest.raises(errors.ObjectNotInPrerequisiteState, match="not built in"),
    ):
        _train(a, view)


def test_no_index_or_statistics_appears_between_the_check_and_the_read(conn, owned) -> None:
    """The check and the read are separate statements: the relation stays locked against
    CREATE INDEX and ALTER TABLE until the training's transaction ends (CREATE STATISTICS is
    not: the lock that would block it blocks other releases too, issue 41)."""
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_analyst() as a, connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute("SET lock_timeout = '200ms'")
        a.autocommit = False
        _train(a, name)
        for ddl in [
            "CREATE INDEX ON pts (a)",
            "ALTER TABLE pts ALTER COLUMN a TYPE numeric",
        ]:
            with pytest.raises(errors.LockNotAvailable):
                o.execute(ddl)
        o.execute("INSERT INTO pts VALUES (0, 0, 1)")  # writes go on
        a.rollback()
        o.execute("CREATE INDEX ON pts (a)")


def test_materialized_views_and_views_still_train(conn, owned) -> None:
    """(LOCK TABLE refuses materialized views: they are read unlocked.)"""
    owner, connect_owner, schema, ds, name, analyst, connect_analyst = owned
    with connect_owner() as o:
        o.execute(f"SET search_path = {schema}, pg_catalog")
        o.execute("CREATE MATERIALIZED VIEW pts_m AS SELECT a, b, y FROM pts")
        (mds,) = o.execute(
            "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10.0, 1e-5, name => %s)",
            (f"{schema}.pts_m", f"{name}_m"),
        ).fetchone()
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (mds, analyst))
    conn.execute(f"CREATE VIEW {schema}.pts_v AS SELECT a, b, y FROM {schema}.pts")
    (vds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10.0, 1e-5, name => %s)",
        (f"{schema}.pts_v", f"{name}_v"),
    ).fetchone()
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (vds, analyst))
    with connect_analyst() as a:
        assert _train(a, f"{name}_m") is not None
        assert _train(a, f"{name}_v") is not None


@pytest.mark.parametrize(
    "args",
    [
        {"epochs": 0},
        {"lambda": -1.0},
        {"delta": 2.0},
        {"clip_norm": -1.0, "privacy": "dp_ftrl"},
        {"batch_size": 0, "privacy": "dp_ftrl"},
        {"options": '{"output": 5}', "privacy": "dp_ftrl"},
        {"sampling": "", "privacy": "dpsgd"},
    ],
)
def test_refused_parameters_come_with_a_hint(conn, owned, args) -> None:
    *_, name, analyst, connect_analyst = owned
    full = {"privacy": "bolton", "epsilon": 1.0, "delta": 1e-5, "epochs": 1, **args}
    types = {**TYPES, "batch_size": "bigint"}
    names = ", ".join(f"{k} => %({k})s::{types.get(k, 'text')}" for k in full)
    with connect_analyst() as a:
        err = _refused_cleanly(
            conn, a, f"SELECT dpsql.train(%(name)s, NULL, NULL, {names})", {"name": name, **full}
        )
    assert err.sqlstate == "22023" and err.diag.message_hint, str(err)
