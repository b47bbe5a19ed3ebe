"""Red team of the roles (docs/architecture.md, privacy rule 2): what dpsql_analyst and dpsql_admin
members can and cannot do, on a real server, connected as real login roles."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import errors, sql

# The container stage runs this module against the image (tests/container).
pytestmark = pytest.mark.smoke

# What an analyst may execute in schema dpsql: the entry points, the SECURITY INVOKER helpers
# that evaluate/predict run as the caller, and the checks the views and train call.
ANALYST_FUNCTIONS = {
    # issue 44: the private releases beside training, and their previews
    "describe",
    "preview_describe",
    "tune",
    "preview_tune",
    "_train_validated",  # train(..., validation => ...): SECURITY DEFINER, its own checks
    "train",
    "mechanisms",
    "predict",
    "evaluate",
    "loss_constants",
    "bolton_sensitivity",
    "_train_private",
    "_source_sql",
    "_source_regclass",
    "_feature_sql",
    "_label_sql",
    "_bad_label",
    "_check_labels",
    "_canonical_model",
    "_loss_code",
    "_predict",
    "_fail",
    "_model",
    "_is_admin",
    "_can_use_dataset",
    "_owns_dataset",  # the models view (issue 41)
    "_models_visible",
    "_ledger_outcome",
    "_apply_bounds",
    "_is_positive",
    "_preprocess",
    "_preprocessed",
    "_preprocessed_sql",
    "_clip_norm",
    "_jsonb_weights",
    # tables as they come and previews (issue 27)
    "predict_label",
    "predict_row",
    "_predict_label",
    "_one_hot",
    "_one_hot_sql",
    "_category_values",
    "_model_label_values",
    "_encode_row",
    "preview",
    "_preview_private",
    "_private_params",
    "_previewing",
    # private evaluation (issue 44): SECURITY DEFINER with its own checks, and evaluate's hint
    "preview_evaluate",
    "_evaluate_private",
    "_names_usable_dataset",
    "_binary_metrics",
    "_multiclass_metrics",
    "_regression_metrics",
    "confint",
    "zcdp_rho",
    "zcdp_epsilon",
    "budget_report",
}
ADMIN_FUNCTIONS = ANALYST_FUNCTIONS | {
    "audit",
    "register_dataset",
    "_register_dataset",
    "grant_dataset",
    "revoke_dataset",
    "alter_dataset",
    "drop_dataset",
    "estimate_bounds",
    "estimate_label_bound",
    # non-private runs, as the data owner
    "_prepare",
    "_training_table_name",
    "_check_run_settings",
    "_fill_run",
    "_fill_training_table",
    "_initial_state",
    "_huber_h",
    "_run_epoch",
    "_finish",
    "_abort",
    "_locked_run",
    "sgd_epoch",
    "_sgd_init",
    "_sgd_info",
    "_sgd_weights",
    "_shuffle_key",
    "_random_seed",
    "_work_schema",
    "_load_module",  # loads the library before a training table (durable_drops.c)
    "_flag",
    "_refuse_on_worker",
    "_citus_installed",
    "_citus_layout",
    "_reads_citus",
    "_fill_distributed_table",
    "_runs_no_code",
}
# Named in the brief: must exist and be refused to analysts.
FORBIDDEN = [
    "sgd_epoch",
    "_sgd_init",
    "_sgd_transition",
    "_prepare",
    "_run_epoch",
    "_finish",
    "_abort",
    "_locked_run",
    "_charge",
    "_set_ledger_model",
    "_register_dataset",
    "register_dataset",
    "grant_dataset",
    "revoke_dataset",
    "_dataset_for_source",
]


@pytest.fixture
def dataset(conn, scratch_schema) -> tuple[int, str]:
    """A registered table (features a, b; label y in {-1, 1}): (dataset_id, qualified name)."""
    conn.execute(
        "CREATE TABLE points AS SELECT g AS rid, g / 100.0 AS a, -g / 100.0 AS b,"
        " CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 100) g"
    )
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 2.0, 1e-5,"
        " feature_bounds => '{{0,1},{-1,0}}', name => %s)",
        (f"{scratch_schema}.points", f"points_{uuid.uuid4().hex[:8]}"),
    ).fetchone()
    return ds, f"{scratch_schema}.points"


def _refused(c: psycopg.Connection, query: str, *params, code: str = "42501") -> str:
    with pytest.raises(psycopg.Error) as err:
        c.execute(query, params or None)
    assert err.value.sqlstate == code, f"{query}: {err.value.sqlstate} {err.value}"
    return str(err.value)


def _null_call(conn: psycopg.Connection, name: str) -> list[str]:
    """SELECT statements calling every overload of dpsql(_internal).<name> with typed NULLs."""
    rows = conn.execute(
        "SELECT p.pronamespace::regnamespace::text, p.proargtypes::oid[]::regtype[]::text[]"
        " FROM pg_proc p WHERE p.proname = %s"
        " AND p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)",
        (name,),
    ).fetchall()
    assert rows, f"dpsql.{name} does not exist"
    calls = []
    for schema, types in rows:
        if "internal" in types:
            continue  # no SQL call can pass an internal (an aggregate's C state): 0A000 for all
        # Arguments from a subquery that cannot be flattened: a STRICT function of constant
        # NULLs would be folded away by the planner, never executed, never checked.
        # (a polymorphic argument takes an array of some type: register_dataset's labels)
        concrete = [t.replace("anycompatiblearray", "double precision[]") for t in types]
        cols = ", ".join(f"NULL::{t} AS a{i}" for i, t in enumerate(concrete))
        args = ", ".join(f"a{i}" for i in range(len(types)))
        calls.append(f"SELECT {schema}.{name}({args}) FROM (SELECT {cols} OFFSET 0) s")
    return calls


def _visible(c: psycopg.Connection, view: str, dataset_id: int) -> int:
    rows = c.execute(f"SELECT dataset_id FROM dpsql.{view}").fetchall()
    return sum(1 for (d,) in rows if d == dataset_id)


# --------------------------------------------------------------------------------------------
# Analysts: no tables, no internals
# --------------------------------------------------------------------------------------------


def test_roles_exist_and_cannot_log_in(conn) -> None:
    rows = conn.execute(
        "SELECT rolname, rolcanlogin, rolsuper FROM pg_roles"
        " WHERE rolname IN ('dpsql_admin', 'dpsql_analyst') ORDER BY 1"
    ).fetchall()
    assert rows == [("dpsql_admin", False, False), ("dpsql_analyst", False, False)]


def test_analyst_cannot_read_any_table(conn, make_role, dataset) -> None:
    name, connect = make_role("analyst", "dpsql_analyst")
    ds, table = dataset
    conn.execute("CREATE TABLE dpsql_work.test_probe (x float8[])")
    try:
        with connect() as a:
            for target in [
                table,
                "dpsql.datasets",
                "dpsql.dataset_grants",
                "dpsql.ledger_entries",
                "dpsql.runs",
                "dpsql_work.test_probe",
            ]:
                _refused(a, f"SELECT * FROM {target}")
            _refused(
                a,
                "INSERT INTO dpsql.ledger_entries (dataset_id, mechanism, epsilon, delta)"
                " VALUES (%s, 'x', 0, 0)",
                ds,
            )
            _refused(a, "UPDATE dpsql.datasets SET epsilon_budget = 1e9")
            # dpsql.models: a row-filtered view over a base table the analyst cannot read.
            kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = 'dpsql.models'::regclass")
            if kind.fetchone()[0] == "v":
                bases = conn.execute(
                    "SELECT DISTINCT d.refobjid::regclass::text FROM pg_rewrite r"
                    " JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid"
                    " JOIN pg_class c ON c.oid = d.refobjid"
                    " WHERE r.ev_class = 'dpsql.models'::regclass"
                    "   AND d.refclassid = 'pg_class'::regclass AND c.relkind IN ('r', 'p')"
                ).fetchall()
                assert bases, "dpsql.models is a view over no table?"
                for (base,) in bases:
                    _refused(a, f"SELECT * FROM {base}")
            else:
                _refused(a, "SELECT * FROM dpsql.models")
    finally:
        conn.execute("DROP TABLE dpsql_work.test_probe")
    # Every table, sequence and schema of the extension: no privilege at all.
    leaks = conn.execute(
        "SELECT c.oid::regclass::text FROM pg_class c"
        " WHERE c.relnamespace::regnamespace::text IN ('dpsql', 'dpsql_internal', 'dpsql_work')"
        "   AND ((c.relkind IN ('r', 'p', 'm', 'v') AND c.oid::regclass::text NOT IN"
        "          ('dpsql.models', 'dpsql.ledger', 'dpsql.budgets', 'dpsql.my_datasets')"
        "          AND has_table_privilege(%(r)s, c.oid, %(t)s))"
        "     OR (c.relkind = 'S' AND has_sequence_privilege(%(r)s, c.oid, %(s)s)))",
        {"r": name, "t": "SELECT, INSERT, UPDATE, DELETE, TRUNCATE", "s": "USAGE, SELECT, UPDATE"},
    ).fetchall()
    assert leaks == []
    assert (
        conn.execute(
            "SELECT has_schema_privilege(%s, 'dpsql_work', 'USAGE, CREATE')", (name,)
        ).fetchone()[0]
        is False
    )
    assert (
        conn.execute("SELECT has_schema_privilege(%s, 'dpsql', 'CREATE')", (name,)).fetchone()[0]
        is False
    )


def test_analyst_executes_only_the_entry_points(conn, make_role) -> None:
    name, connect = make_role("analyst", "dpsql_analyst")
    for role, allowed in [(name, ANALYST_FUNCTIONS), ("dpsql_admin", ADMIN_FUNCTIONS)]:
        executable = {
            n
            for (n,) in conn.execute(
                "SELECT p.proname FROM pg_proc p WHERE p.pronamespace IN ('dpsql'::regnamespace,"
                " 'dpsql_internal'::regnamespace)"
                " AND has_function_privilege(%s, p.oid, 'EXECUTE')",
                (role,),
            ).fetchall()
        }
        assert executable <= allowed, f"{role} may execute {sorted(executable - allowed)}"
    assert "train" in executable and "register_dataset" in executable
    # PUBLIC has nothing.
    public = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(p.proacl) a"
        " WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace) AND"
        " a.grantee = 0"
    ).fetchall()
    assert public == []
    nulls = conn.execute(
        "SELECT count(*) FROM pg_proc WHERE pronamespace IN ('dpsql'::regnamespace,"
        " 'dpsql_internal'::regnamespace) AND proacl IS NULL"
    ).fetchone()[0]
    assert nulls == 0  # a NULL ACL means the default: EXECUTE for PUBLIC
    # Real calls are refused before any argument is looked at.
    with connect() as a:
        _refused(
            a,
            "SELECT dpsql.sgd_epoch(x, y, NULL)"
            " FROM (VALUES (ARRAY[1.0]::float8[], 1.0::float8)) v(x, y)",
        )
        for fn in FORBIDDEN:
            for call in _null_call(conn, fn):
                msg = _refused(a, call)
                assert "permission denied" in msg, msg
        # Every other function not on the allowlist, whatever later releases add.
        others = conn.execute(
            "SELECT DISTINCT proname FROM pg_proc WHERE pronamespace IN ('dpsql'::regnamespace,"
            " 'dpsql_internal'::regnamespace)"
            " AND NOT (proname = ANY (%s))",
            (sorted(ANALYST_FUNCTIONS),),
        ).fetchall()
        for (fn,) in others:
            for call in _null_call(conn, fn):
                _refused(a, call)


def test_admin_entry_points_check_membership_themselves(conn, make_role, dataset) -> None:
    """Defence in depth: EXECUTE granted by mistake still does not make a data owner."""
    ds, table = dataset
    rogue, connect = make_role("rogue", "dpsql_analyst")
    for fn in ["register_dataset", "_register_dataset", "grant_dataset", "revoke_dataset"]:
        for (sig,) in conn.execute(
            "SELECT oid::regprocedure::text FROM pg_proc"
            " WHERE pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace) AND"
            " proname = %s",
            (fn,),
        ).fetchall():
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                    sql.SQL(sig), sql.Identifier(rogue)
                )
            )
    conn.execute(f"GRANT USAGE ON SCHEMA {table.split('.')[0]} TO {rogue}")
    conn.execute(f"GRANT SELECT ON {table} TO {rogue}")
    with connect() as r:
        for call, args in [
            ("SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 100, name => 'stolen')", (table,)),
            ("SELECT dpsql_internal._register_dataset(%s::regclass, '{a}', 'y', 100)", (table,)),
            ("SELECT dpsql.grant_dataset(%s, %s)", (ds, rogue)),
            ("SELECT dpsql.revoke_dataset(%s, %s)", (ds, rogue)),
        ]:
            msg = _refused(r, call, *args)
            assert "only a data owner (member of dpsql_admin)" in msg, msg
        assert r.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0] is False
    stolen = conn.execute("SELECT count(*) FROM dpsql.datasets WHERE name = 'stolen'").fetchone()
    assert stolen[0] == 0


# --------------------------------------------------------------------------------------------
# Data owners
# --------------------------------------------------------------------------------------------


def test_admin_registers_grants_and_revokes(conn, scratch_schema, make_role) -> None:
    admin, connect_admin = make_role("admin", "dpsql_admin")
    analyst, connect_analyst = make_role("analyst", "dpsql_analyst")
    conn.execute(
        "CREATE TABLE owned AS SELECT g::float8 AS f, (g % 2) * 2 - 1 AS y"
        " FROM generate_series(1, 20) g"
    )
    conn.execute("CREATE TABLE secret AS SELECT * FROM owned")
    conn.execute(f"GRANT USAGE ON SCHEMA {scratch_schema} TO {admin}")
    conn.execute(f"GRANT SELECT ON owned TO {admin}")
    name = f"owned_{uuid.uuid4().hex[:8]}"
    with connect_admin() as ad:
        assert ad.execute("SELECT dpsql_internal._is_admin()").fetchone()[0] is True
        ad.execute(f"SET search_path = {scratch_schema}")
        # Unqualified names resolve with the admin's own search_path.
        (ds,) = ad.execute(
            "SELECT dpsql.register_dataset('owned', '{f}', 'y', 1.5, name => %s)", (name,)
        ).fetchone()
        row = conn.execute(
            "SELECT source, created_by, labels, row_norm, delta_budget FROM dpsql.datasets"
            " WHERE dataset_id = %s",
            (ds,),
        ).fetchone()
        assert row == (f"{scratch_schema}.owned", admin, [-1.0, 1.0], "clip", 0.0)
        # Data the admin cannot read cannot be registered (the training reads it as owner).
        msg = _refused(ad, "SELECT dpsql.register_dataset('secret', '{f}', 'y', 1)")
        assert "cannot read column" in msg
        # Nor a view owned by a non-superuser (its functions would run as the extension owner).
        conn.execute(f"GRANT CREATE ON SCHEMA {scratch_schema} TO {admin}")
        ad.execute("CREATE VIEW mine AS SELECT f, y FROM owned")
        msg = _refused(ad, "SELECT dpsql.register_dataset('mine', '{f}', 'y', 1)")
        assert "view owned by a non-superuser" in msg
        # Nor a table with row-level security (the training would read every row).
        ad.execute("CREATE TABLE guarded AS SELECT * FROM owned")
        ad.execute("ALTER TABLE guarded ENABLE ROW LEVEL SECURITY")
        msg = _refused(ad, "SELECT dpsql.register_dataset('guarded', '{f}', 'y', 1)")
        assert "row-level security" in msg
        # Grants: the role must exist; granting twice is one grant; NOTICE for non-analysts.
        _refused(ad, "SELECT dpsql.grant_dataset(%s, 'no_such_role_x')", ds, code="42704")
        _refused(ad, "SELECT dpsql.grant_dataset(%s, %s)", -1, analyst, code="42704")
        ad.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
        ad.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
        grants = ad.execute(
            "SELECT role, granted_by FROM dpsql.dataset_grants WHERE dataset_id = %s", (ds,)
        ).fetchall()
        assert grants == [(analyst, admin)]
        # Data owners see budgets of every dataset, but no raw table of the extension.
        assert _visible(ad, "my_datasets", ds) == 1
        _refused(ad, "SELECT * FROM dpsql.ledger_entries")
        _refused(ad, "SELECT dpsql_internal._charge(%s, 0.1, 0, 'x')", ds)
        with connect_analyst() as an:
            assert (
                an.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0]
                is True
            )
            ad.execute("SELECT dpsql.revoke_dataset(%s, %s)", (ds, analyst))
            assert (
                an.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0]
                is False
            )
        ad.execute("SELECT dpsql.revoke_dataset(%s, %s)", (ds, analyst))  # idempotent


def test_grants_decide_what_an_analyst_sees(conn, make_role, dataset) -> None:
    ds, _ = dataset
    analyst, connect = make_role("analyst", "dpsql_analyst")
    team, _ = make_role("team")  # a group: its members use what it is granted
    conn.execute(f"GRANT {team} TO {analyst}")
    (entry,) = conn.execute(
        "SELECT dpsql_internal._charge(%s, 0.5, 1e-6, 'test', note => 'n')", (ds,)
    ).fetchone()
    with connect() as a:
        assert a.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0] is False
        for view in ["ledger", "budgets", "my_datasets"]:
            assert _visible(a, view, ds) == 0
        assert a.execute("SELECT dpsql_internal._is_admin()").fetchone()[0] is False

        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, team))
        assert a.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0] is True
        for view in ["ledger", "budgets", "my_datasets"]:
            assert _visible(a, view, ds) == 1
        row = a.execute(
            "SELECT entry_id, mechanism, epsilon, delta, note FROM dpsql.ledger"
            " WHERE dataset_id = %s",
            (ds,),
        ).fetchone()
        assert row == (entry, "test", 0.5, 1e-6, "n")
        budget = a.execute(
            "SELECT epsilon_budget, epsilon_spent, epsilon_remaining, delta_remaining"
            " FROM dpsql.budgets WHERE dataset_id = %s",
            (ds,),
        ).fetchone()
        assert budget == (2.0, 0.5, 1.5, pytest.approx(9e-6))
        mine = a.execute(
            "SELECT features, label, labels, feature_bounds, row_norm FROM dpsql.my_datasets"
            " WHERE dataset_id = %s",
            (ds,),
        ).fetchone()
        assert mine == (["a", "b"], "y", [-1.0, 1.0], [[0.0, 1.0], [-1.0, 0.0]], "clip")

        conn.execute("SELECT dpsql.revoke_dataset(%s, %s)", (ds, team))
        assert _visible(a, "ledger", ds) == 0
    # A grant to a role dropped later is ignored (not an error for everyone else).
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, team))
    conn.execute(f"DROP ROLE {team}")
    with connect() as a:
        assert a.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0] is False
        assert _visible(a, "my_datasets", ds) == 0
    conn.execute(f"CREATE ROLE {team}")  # for make_role's cleanup


# --------------------------------------------------------------------------------------------
# search_path hijacking
# --------------------------------------------------------------------------------------------

# Objects shadowing built-ins used inside the definer functions: membership tests that always
# succeed, and comparisons that always hold.
_EVIL_OPERATORS = [
    # (operator, argument type, result)
    ("=", "bigint", "true"),
    ("=", "name", "true"),
    ("=", "text", "true"),
    ("<>", "text", "false"),
    (">", "float8", "true"),
    ("<", "float8", "true"),
    (">=", "float8", "true"),
    ("<=", "float8", "true"),
]


def _evil_sql(s: str) -> str:
    stmts = [
        f"CREATE SCHEMA {s}",
        f"CREATE FUNCTION {s}.pg_has_role(name, name, text) RETURNS boolean"
        " LANGUAGE sql AS 'SELECT true'",
        f"CREATE FUNCTION {s}.pg_has_role(name, oid, text) RETURNS boolean"
        " LANGUAGE sql AS 'SELECT true'",
    ]
    for i, (op, typ, result) in enumerate(_EVIL_OPERATORS):
        stmts.append(
            f"CREATE FUNCTION {s}.f{i}({typ}, {typ}) RETURNS boolean"
            f" LANGUAGE sql AS 'SELECT {result}'"
        )
        stmts.append(
            f"CREATE OPERATOR {s}.{op} (LEFTARG = {typ}, RIGHTARG = {typ}, FUNCTION = {s}.f{i})"
        )
    stmts.append(f"SET search_path = {s}, pg_catalog, public")
    return ";\n".join(stmts)


def _arm(c: psycopg.Connection, schema: str) -> None:
    c.execute(_evil_sql(schema))
    # The shadowing works in the caller's own queries.
    assert c.execute("SELECT 1::bigint = 2::bigint").fetchone()[0] is True
    assert c.execute("SELECT pg_has_role('nobody_at_all', 'dpsql_admin', 'MEMBER')").fetchone()[0]


def test_search_path_hijack_does_not_reach_definer_code(conn, make_role, dataset) -> None:
    ds, table = dataset
    dbname = conn.info.dbname
    analyst, connect = make_role("analyst", "dpsql_analyst")
    admin, connect_admin = make_role("admin", "dpsql_admin")
    conn.execute(
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}, {}").format(
            sql.Identifier(dbname), sql.Identifier(analyst), sql.Identifier(admin)
        )
    )
    schema = table.split(".")[0]
    conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {admin}")
    conn.execute(f"GRANT SELECT ON {table} TO {admin}")
    entries = conn.execute("SELECT count(*) FROM dpsql.ledger_entries").fetchone()[0]
    with connect() as a:
        _arm(a, f"evil_{analyst}")
        assert a.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0] is False
        assert a.execute("SELECT dpsql_internal._is_admin()").fetchone()[0] is False
        for view in ["ledger", "budgets", "my_datasets"]:
            assert a.execute(f"SELECT count(*) FROM dpsql.{view}").fetchone()[0] == 0
        # The private entry point resolves datasets and grants with pinned names.
        with pytest.raises(psycopg.Error) as err:
            a.execute(
                "SELECT dpsql_internal._train_private(%s, 'logistic', %s::jsonb)",
                (table, '{"privacy": "bolton", "epsilon": 0.5}'),
            )
        # (an ungranted dataset reads as an unknown one: issue 24)
        assert err.value.sqlstate == "42704", str(err.value)
        assert "among the datasets you can use" in str(err.value)
        with pytest.raises(psycopg.Error):
            a.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
        assert a.execute("SELECT dpsql_internal._can_use_dataset(%s)", (ds,)).fetchone()[0] is False
    with connect_admin() as ad:
        _arm(ad, f"evil_{admin}")
        # Every check below would pass with the shadowing operators. (The dataset is the
        # superuser's: another data owner may not grant it, issue 41.)
        with pytest.raises(errors.InsufficientPrivilege):
            ad.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, admin))
        with pytest.raises(errors.UndefinedObject):
            ad.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds + 10**9, analyst))
        with pytest.raises(errors.InvalidParameterValue):
            ad.execute("SELECT dpsql.register_dataset(%s, '{a}', 'y', -1)", (table,))
        with pytest.raises(errors.InvalidParameterValue):
            ad.execute("SELECT dpsql.register_dataset(%s, '{a}', 'y', 1, 2)", (table,))
        with pytest.raises(errors.DuplicateObject):
            ad.execute("SELECT dpsql.register_dataset(%s, '{a}', 'y', 1)", (table,))
    assert conn.execute("SELECT count(*) FROM dpsql.ledger_entries").fetchone()[0] == entries
    assert (
        conn.execute(
            "SELECT count(*) FROM dpsql.dataset_grants WHERE dataset_id = %s", (ds,)
        ).fetchone()[0]
        == 0
    )


def test_security_definer_functions_pin_search_path(conn) -> None:
    unpinned = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace) AND"
        " p.prosecdef"
        "   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)"
    ).fetchall()
    assert unpinned == []
    definers = conn.execute(
        "SELECT count(*) FROM pg_proc WHERE pronamespace IN ('dpsql'::regnamespace,"
        " 'dpsql_internal'::regnamespace) AND prosecdef"
    ).fetchone()[0]
    assert definers >= 4


def test_ledger_is_append_only_even_for_superusers(conn, dataset) -> None:
    ds, _ = dataset
    (entry,) = conn.execute("SELECT dpsql_internal._charge(%s, 0.1, 0, 'test')", (ds,)).fetchone()
    for stmt in [
        "UPDATE dpsql.ledger_entries SET epsilon = 0 WHERE entry_id = %s",
        "DELETE FROM dpsql.ledger_entries WHERE entry_id = %s",
    ]:
        with pytest.raises(errors.InsufficientPrivilege, match="append-only"):
            conn.execute(stmt, (entry,))
    with pytest.raises(errors.InsufficientPrivilege, match="append-only"):
        conn.execute("TRUNCATE dpsql.ledger_entries")
    # Not even with triggers switched off for replication.
    conn.execute("SET session_replication_role = replica")
    try:
        with pytest.raises(errors.InsufficientPrivilege, match="append-only"):
            conn.execute("DELETE FROM dpsql.ledger_entries WHERE entry_id = %s", (entry,))
    finally:
        conn.execute("RESET session_replication_role")
    assert (
        conn.execute(
            "SELECT epsilon FROM dpsql.ledger_entries WHERE entry_id = %s", (entry,)
        ).fetchone()[0]
        == 0.1
    )


# --------------------------------------------------------------------------------------------
# Registration checks and finding a dataset by source
# --------------------------------------------------------------------------------------------


@pytest.fixture
def mixed(conn, scratch_schema) -> str:
    conn.execute(
        "CREATE TABLE mixed AS SELECT g::float8 AS a, g::int AS b, g::numeric AS c,"
        " ARRAY[g, -g]::float8[] AS v, g::text AS t, (g % 2) * 2 - 1 AS y,"
        " (g % 2 = 0) AS flag FROM generate_series(1, 10) g"
    )
    return f"{scratch_schema}.mixed"


REGISTRATION_ERRORS = [
    # (arguments after source, SQLSTATE, message fragment)
    ("'{a}', 'y', 1, name => ''", "22023", "must not be empty"),
    ("'{a,t}', 'y', 1", "42804", "feature column t has type text"),
    ("'{a,v}', 'y', 1", "42804", "feature column v has type double precision[]"),
    ("'{a,a}', 'y', 1", "22023", "features must be distinct"),
    ("'{}', 'y', 1", "22023", "non-empty list"),
    ("'{a,NULL}', 'y', 1", "22023", "non-empty list"),
    ("'{a}', 'v', 1", "42804", "label column v has type double precision[]"),
    ("'{a}', 'y', 1, labels => '{no,yes}'", "42804", "are not numbers"),
    ("'{a}', 't', 1", "22023", "label column t holds text"),
    ("'{a}', 't', 1, labels => '{1,1}'", "22023", "labels must be distinct"),
    ("'{a,t}', 'y', 1, categories => '[1]'", "22023", "categories must be a JSON object"),
    ("'{a}', 'y', 1, categories => '{\"t\": [\"1\"]}'", "22023", "not a feature"),
    ("'{a,t}', 'y', 1, categories => '{\"t\": []}'", "22023", "1 to 1024 distinct"),
    ("'{a,t}', 'y', 1, categories => '{\"t\": [\"1\", \"1\"]}'", "22023", "1 to 1024 distinct"),
    ("'{a,v}', 'y', 1, categories => '{\"v\": [\"1\"]}'", "42804", "categories are for text"),
    ("'{a}', 'nope', 1", "42703", "column nope does not exist"),
    ("'{\"a; DROP TABLE mixed\"}', 'y', 1", "42703", "does not exist"),
    ("'{a}', NULL, 1", "22023", "label must name a column"),
    ("'{a}', 'a', 1", "22023", "also a feature"),
    ("'{a}', 'y', 0", "22023", "epsilon_budget must be"),
    ("'{a}', 'y', 'Infinity'", "22023", "epsilon_budget must be"),
    ("'{a}', 'y', NULL", "22023", "epsilon_budget must be"),
    ("'{a}', 'y', 1, -0.1", "22023", "delta_budget must be"),
    ("'{a}', 'y', 1, 'NaN'", "22023", "delta_budget must be"),
    ("'{a}', 'y', 1, labels => '{1}'", "22023", "2 to 1024"),
    ("'{a}', 'y', 1, labels => '{{1,2},{3,4}}'", "22023", "2 to 1024"),
    ("'{a}', 'y', 1, labels => '{1,NaN}'", "22023", "distinct finite"),
    ("'{a}', 'y', 1, labels => '{1,NULL}'", "22023", "distinct finite"),
    ("'{a}', 'y', 1, row_norm => 'none'", "22023", "row_norm must be clip or unit"),
    ("'{a,b}', 'y', 1, feature_bounds => '{{0,1}}'", "22023", "must be a 2 x 2"),
    ("'{a}', 'y', 1, feature_bounds => '{0,1}'", "22023", "must be a 1 x 2"),
    ("'{a}', 'y', 1, feature_bounds => '{{0,1,2}}'", "22023", "must be a 1 x 2"),
    ("'{a}', 'y', 1, feature_bounds => '{{1,1}}'", "22023", "lo < hi"),
    ("'{a}', 'y', 1, feature_bounds => '{{NaN,1}}'", "22023", "lo < hi"),
    ("'{a}', 'y', 1, feature_bounds => '{{0,NULL}}'", "22023", "lo < hi"),
    ("'{v}', 'y', 1, feature_bounds => '{{0,-Infinity}}'", "22023", "lo < hi"),
]


@pytest.mark.parametrize(
    "args,code,message", REGISTRATION_ERRORS, ids=[c[0] for c in REGISTRATION_ERRORS]
)
def test_registration_refuses_bad_declarations(conn, mixed, args, code, message) -> None:
    before = conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0]
    msg = _refused(conn, f"SELECT dpsql.register_dataset(%s, {args})", mixed, code=code)
    assert msg.startswith("dpsql: ") and message in msg, msg
    assert conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0] == before
    assert conn.execute("SELECT count(*) FROM mixed").fetchone()[0] == 10


def test_registration_of_relations(conn, scratch_schema, mixed) -> None:
    s = scratch_schema
    for source, code, message in [
        ("no_such_table", "42P01", "relation 'no_such_table' does not exist"),
        ("SELECT * FROM mixed", "42P01", "does not exist"),
        ("mixed; DROP TABLE mixed", "42P01", "does not exist"),
        (None, "42P01", "relation NULL does not exist"),
        ("dpsql.ledger_entries", "42809", "system relation"),
        ("pg_catalog.pg_authid", "42809", "system relation"),
        ("mixed_a_idx", "42809", "not a table or view"),
        ("tmp_mixed", "42809", "temporary table"),
    ]:
        if source == "mixed_a_idx":
            conn.execute("CREATE INDEX mixed_a_idx ON mixed (a)")
        if source == "tmp_mixed":
            conn.execute("CREATE TEMP TABLE tmp_mixed AS SELECT * FROM mixed")
        msg = _refused(conn, "SELECT dpsql.register_dataset(%s, '{a}', 'y', 1)", source, code=code)
        assert message in msg, msg
    # Array features: any dimension; bounds stored with lower bounds 1; defaults.
    name = f"arr_{uuid.uuid4().hex[:8]}"
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset('mixed', '{v}', 'y', 3, 1e-6, labels => '{1,-1}',"
        " feature_bounds => '[0:2][5:6]={{-1,1},{-2,2},{0,3}}', row_norm => 'unit', name => %s,"
        " accept => true)",  # 3 declared features over 2-element arrays: on purpose
        (name,),
    ).fetchone()
    row = conn.execute(
        "SELECT relid::oid = %s::regclass::oid, source, features, label, labels,"
        " feature_bounds, array_lower(feature_bounds, 1), row_norm, epsilon_budget,"
        " delta_budget, created_by = session_user FROM dpsql.datasets WHERE dataset_id = %s",
        (f"{s}.mixed", ds),
    ).fetchone()
    assert row == (
        True,
        f"{s}.mixed",
        ["v"],
        "y",
        [1.0, -1.0],
        [[-1.0, 1.0], [-2.0, 2.0], [0.0, 3.0]],
        1,
        "unit",
        3.0,
        1e-6,
        True,
    )
    # One budget per relation, and one dataset per name.
    msg = _refused(conn, "SELECT dpsql.register_dataset('mixed', '{a}', 'y', 1)", code="42710")
    assert f"already registered as dataset '{name}'" in msg
    conn.execute("CREATE TABLE other AS SELECT * FROM mixed")
    msg = _refused(
        conn,
        "SELECT dpsql.register_dataset('other', '{a}', 'y', 1, name => %s)",
        name,
        code="42710",
    )
    assert "a dataset named" in msg
    # A superuser-owned view may be registered; a quoted mixed-case name is resolved and kept
    # quoted.
    # (registration reads a view's rows as dpsql_reader, which refuses a session with
    # temporary relations: tmp_mixed above)
    conn.execute("DISCARD TEMP")
    conn.execute('CREATE VIEW "Mixed View" AS SELECT a, b, y FROM mixed')
    (view_ds,) = conn.execute(
        "SELECT dpsql.register_dataset('\"Mixed View\"', '{a,b}', 'y', 1, name => %s)",
        (f"view_{uuid.uuid4().hex[:8]}",),
    ).fetchone()
    source = conn.execute(
        "SELECT source FROM dpsql.datasets WHERE dataset_id = %s", (view_ds,)
    ).fetchone()[0]
    assert source == f'{s}."Mixed View"'


def test_dataset_for_source(conn, scratch_schema) -> None:
    s = scratch_schema
    conn.execute("CREATE TABLE alpha AS SELECT 1.0::float8 AS f, 1 AS y")
    conn.execute("CREATE SCHEMA IF NOT EXISTS " + s + "_b")
    try:
        conn.execute(f"CREATE TABLE {s}_b.alpha AS SELECT 1.0::float8 AS f, 1 AS y")
        n1, n2 = (f"ds_{uuid.uuid4().hex[:8]}" for _ in range(2))
        (d1,) = conn.execute(
            "SELECT dpsql.register_dataset(%s, '{f}', 'y', 1, name => %s)", (f"{s}.alpha", n1)
        ).fetchone()

        def found(source: str) -> tuple[int, str]:
            return conn.execute(
                "SELECT (d).dataset_id, (d).source FROM dpsql_internal._dataset_for_source(%s) d",
                (source,),
            ).fetchone()

        for source in [n1, f"{s}.alpha", f'"{s}"."alpha"', f"{s}.ALPHA", "alpha"]:
            assert found(source) == (d1, f"{s}.alpha"), source
        (d2,) = conn.execute(
            "SELECT dpsql.register_dataset(%s, '{f}', 'y', 1, name => %s)", (f"{s}_b.alpha", n2)
        ).fetchone()
        assert found(f"{s}_b.alpha") == (d2, f"{s}_b.alpha")
        msg = _refused(conn, "SELECT dpsql_internal._dataset_for_source('alpha')", code="42P09")
        assert "names 2 registered datasets" in msg
        for source in ["beta", "SELECT * FROM alpha", "", None, f"{s}.alpha.x"]:
            msg = _refused(
                conn, "SELECT dpsql_internal._dataset_for_source(%s)", source, code="42704"
            )
            assert "is not a registered dataset; private training needs" in msg, msg
        # A renamed relation is found by its new name too; the source returned is current.
        conn.execute("ALTER TABLE alpha RENAME TO gamma")
        assert found(f"{s}.gamma") == (d1, f"{s}.gamma")
        assert found(n1) == (d1, f"{s}.gamma")
        # A dropped one is marked (event trigger) and refused, whatever later gets its oid;
        # the name can then be registered anew.
        conn.execute("DROP TABLE gamma")
        msg = _refused(conn, "SELECT dpsql_internal._dataset_for_source(%s)", n1, code="42P01")
        assert f"dataset '{n1}' was dropped at" in msg
        _refused(conn, "SELECT dpsql_internal._dataset_for_source(%s)", f"{s}.gamma", code="42704")
        dropped = conn.execute(
            "SELECT dropped_at IS NOT NULL FROM dpsql.budgets WHERE dataset_id = %s", (d1,)
        ).fetchone()
        assert dropped == (True,)
        assert _visible(conn, "my_datasets", d1) == 0
        conn.execute("CREATE TABLE gamma AS SELECT 1.0::float8 AS f, 1 AS y")
        (d3,) = conn.execute(
            "SELECT dpsql.register_dataset('gamma', '{f}', 'y', 1, name => %s)",
            (f"ds_{uuid.uuid4().hex[:8]}",),
        ).fetchone()
        assert found(f"{s}.gamma") == (d3, f"{s}.gamma")
    finally:
        conn.execute(f"DROP SCHEMA {s}_b CASCADE")


def test_data_owner_trains_non_private_and_analyst_trains_private_only(
    conn, scratch_schema, make_role
) -> None:
    """End to end with real roles: the owner's noiseless model stays invisible to the analyst,
    whose private release is charged and visible."""
    admin, connect_admin = make_role("owner", "dpsql_admin")
    analyst, connect_analyst = make_role("analyst", "dpsql_analyst")
    conn.execute(
        f"CREATE TABLE {scratch_schema}.pts AS SELECT i AS rid,"
        " ARRAY[sin(i), cos(i)]::float8[] AS x, (i % 2)::float8 AS y"
        " FROM generate_series(1, 200) i"
    )
    conn.execute(f"GRANT USAGE ON SCHEMA {scratch_schema} TO {admin}")
    conn.execute(f"GRANT SELECT ON {scratch_schema}.pts TO {admin}")
    with connect_admin() as ad:
        (noiseless,) = ad.execute(
            f"SELECT dpsql.train('{scratch_schema}.pts', '{{x}}', 'y', labels => '{{0,1}}',"
            " epochs => 2)"
        ).fetchone()
        (ds,) = ad.execute(
            f"SELECT dpsql.register_dataset('{scratch_schema}.pts', '{{x}}', 'y',"
            f" epsilon_budget => 2, labels => '{{0,1}}', name => 'pts_{analyst}')"
        ).fetchone()
        ad.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    with connect_analyst() as a:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="data owners"):
            a.execute(f"SELECT dpsql.train('{scratch_schema}.pts', '{{x}}', 'y')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="noise_seed"):
            a.execute(
                f"SELECT dpsql.train('pts_{analyst}', NULL, NULL, privacy => 'bolton',"
                " epsilon => 1, noise_seed => 1)"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="reproductions"):
            a.execute(
                f"SELECT dpsql.train('pts_{analyst}', NULL, NULL, privacy => 'bst14',"
                " epsilon => 1, delta => 1e-5, bst14_noise => 'paper')"
            )
        (mid,) = a.execute(
            f"SELECT dpsql.train('pts_{analyst}', NULL, NULL, epochs => 2,"
            " privacy => 'bolton', epsilon => 1)"
        ).fetchone()
        seen = [r[0] for r in a.execute("SELECT model_id FROM dpsql.models").fetchall()]
        assert mid in seen and noiseless not in seen
        assert a.execute("SELECT dpsql.predict(%s, '{0.1, 0.2}')", (mid,)).fetchone()[0] > 0
        with pytest.raises(psycopg.Error, match="no model"):
            a.execute("SELECT dpsql.predict(%s, '{0.1, 0.2}')", (noiseless,))
        assert a.execute("SELECT epsilon_spent FROM dpsql.budgets").fetchone()[0] == 1
        assert a.execute("SELECT count(*) FROM dpsql.ledger").fetchone()[0] == 1


def test_the_api_schema_holds_only_the_api(conn) -> None:
    """Internal routines (names starting with _) live in dpsql_internal, the API in dpsql."""
    misplaced = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE (p.pronamespace = 'dpsql'::regnamespace AND p.proname LIKE '\\_%')"
        " OR (p.pronamespace = 'dpsql_internal'::regnamespace AND p.proname NOT LIKE '\\_%')"
    ).fetchall()
    assert misplaced == []
    (internal,) = conn.execute(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'dpsql_internal'::regnamespace"
    ).fetchone()
    assert internal > 100
