"""Issue 41, route 1 and the rule behind it: definer code never resolves a cast, operator or
function through the catalog for a type a caller owns.

A data owner creates, on their own enum type (and domains over it), casts to and from every type
dpsql's definer code converts to, operators, and functions named like the built-ins dpsql calls,
in a schema on everybody's search path. Each records the role it ran as. Then the owner registers
a dataset with a column of every kind registration accepts (and labels of each kind), grants it,
and an analyst trains every mechanism, previews, and the owner estimates and audits. None of the
owner's functions may run as anyone but the owner. On 0.8.0 the enum cast ran as the extension
owner (a superuser) about 200 times in register_dataset alone."""

from __future__ import annotations

import uuid

import pytest
from psycopg import sql

# what each mechanism needs on small tables (its spec's [small_table])
from tests.server.test_durable_charge import EXTRA

ROWS = 1500

# Types definer code converts registered values to (and casts the owner may create: they own
# one side of each).
TARGETS = ["text", "varchar", "bpchar", "name", "float8", "float4", "int4", "int8", "int2",
           "numeric", "boolean"]  # fmt: skip


def _arm(s: str) -> list[str]:
    """The owner's traps in schema s: every one inserts (current_user) into s.flags first."""
    stmts = [
        f"CREATE TABLE {s}.flags (who name, what text)",
        f"GRANT INSERT ON {s}.flags TO PUBLIC",
        f"CREATE TYPE {s}.colour AS ENUM ('red', 'green', 'blue')",
        f"CREATE DOMAIN {s}.dcolour AS {s}.colour",
        f"CREATE DOMAIN {s}.dtext AS text",
        f"CREATE DOMAIN {s}.dnum AS float8",
        f"CREATE DOMAIN {s}.dbool AS boolean",
        f"CREATE FUNCTION {s}.flag(what text) RETURNS void LANGUAGE sql"
        f" AS $$ INSERT INTO {s}.flags VALUES (current_user, what) $$",
    ]
    value = "pg_catalog.textin(pg_catalog.enum_out(v))"
    for t in TARGETS:
        # (the conversion the built-in I/O path would make, so that nothing looks wrong)
        out = f"({value})::{t}" if t not in ("boolean",) else "true"
        if t in ("float8", "float4", "int4", "int8", "int2", "numeric"):
            out = f"pg_catalog.length({value})::{t}"
        stmts += [
            f"CREATE FUNCTION {s}.to_{t}(v {s}.colour) RETURNS {t} LANGUAGE plpgsql"
            f" AS $$ BEGIN PERFORM {s}.flag('cast colour -> {t}'); RETURN {out}; END $$",
            f"CREATE CAST ({s}.colour AS {t}) WITH FUNCTION {s}.to_{t}({s}.colour)",
            f"CREATE FUNCTION {s}.from_{t}(v {t}) RETURNS {s}.colour LANGUAGE plpgsql"
            f" AS $$ BEGIN PERFORM {s}.flag('cast {t} -> colour');"
            f" RETURN (SELECT e FROM pg_catalog.unnest(pg_catalog.enum_range(NULL::{s}.colour)) e"
            f" WHERE pg_catalog.textin(pg_catalog.enum_out(e)) = v::text); END $$",
            f"CREATE CAST ({t} AS {s}.colour) WITH FUNCTION {s}.from_{t}({t})",
        ]
    stmts += [
        f"CREATE FUNCTION {s}.to_text_array(v {s}.colour[]) RETURNS text[] LANGUAGE plpgsql"
        f" AS $$ BEGIN PERFORM {s}.flag('cast colour[] -> text[]');"
        f" RETURN ARRAY(SELECT pg_catalog.textin(pg_catalog.enum_out(e))"
        f" FROM pg_catalog.unnest(v) e); END $$",
        f"CREATE CAST ({s}.colour[] AS text[]) WITH FUNCTION {s}.to_text_array({s}.colour[])",
    ]
    # Operators on the owner's type and on built-in ones, and functions named like the
    # built-ins dpsql calls, all in a schema first on the search path.
    for i, (op, left, right) in enumerate(
        [
            ("=", "colour", "colour"),
            ("<>", "colour", "colour"),
            ("=", "colour", "text"),
            ("=", "text", "text"),
            ("<>", "text", "text"),
            ("=", "float8", "float8"),
            ("<", "colour", "colour"),
        ]  # fmt: skip
    ):
        lt = f"{s}.{left}" if left == "colour" else left
        rt = f"{s}.{right}" if right == "colour" else right
        stmts += [
            f"CREATE FUNCTION {s}.op{i}(a {lt}, b {rt}) RETURNS boolean LANGUAGE plpgsql"
            f" AS $$ BEGIN PERFORM {s}.flag('operator {left} {op} {right}');"
            f" RETURN a::text OPERATOR(pg_catalog.{op}) b::text; END $$",
            f"CREATE OPERATOR {s}.{op} (LEFTARG = {lt}, RIGHTARG = {rt}, FUNCTION = {s}.op{i})",
        ]
    for name, args, ret in [
        ("textin", "text", "text"), ("enum_out", f"{s}.colour", "text"),
        ("float8", f"{s}.colour", "float8"), ("text", f"{s}.colour", "text"),
        ("format", "text", "text"), ("array_agg", "text", "text"), ("btrim", "text", "text"),
    ]:  # fmt: skip
        body = "NULL"
        stmts.append(
            f"CREATE FUNCTION {s}.{name}(a {args}) RETURNS {ret} LANGUAGE plpgsql"
            f" AS $$ BEGIN PERFORM {s}.flag('function {name}'); RETURN {body}; END $$"
        )
    return stmts


CATEGORIES = {
    "t": ["a", "b"], "v": ["a", "b"], "c": ["a", "b"], "e": ["red", "green"],
    "de": ["red", "blue"], "dt": ["a", "b"],
}  # fmt: skip


def _tables(s: str) -> list[str]:
    g = "g % 2 = 0"
    cols = (
        "(g % 5)::int4 AS i, (g % 3)::int2 AS sm, (g % 4)::int8 AS b8, (g % 7) / 7.0::float8 AS f,"
        " (g % 6)::real / 6 AS r, ((g % 9) / 9.0)::numeric AS n, ((g % 8) / 8.0)::float8::"
        f"{s}.dnum AS dnum, {g} AS fl, ({g})::{s}.dbool AS dbool,"
        " CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END AS t,"
        " (CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END)::varchar(4) AS v,"
        " (CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END)::char(3) AS c,"
        f" (ARRAY['red', 'green', 'blue'])[g % 3 + 1]::{s}.colour AS e,"
        f" (ARRAY['red', 'green', 'blue'])[g % 3 + 1]::{s}.dcolour AS de,"
        f" (CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END)::{s}.dtext AS dt,"
        f" CASE WHEN {g} THEN 1 ELSE -1 END AS yi, {g} AS yb,"
        f" CASE WHEN {g} THEN 'yes' ELSE 'no' END AS yt,"
        f" (CASE WHEN {g} THEN 'red' ELSE 'blue' END)::{s}.colour AS ye,"
        f" (CASE WHEN {g} THEN 'red' ELSE 'blue' END)::{s}.dcolour AS yde,"
        " ((g % 11) / 11.0 - 0.5)::float8 AS yr,"
        " ARRAY[(g % 5) / 5.0, (g % 3) / 3.0]::float8[] AS arr"
    )
    return [f"CREATE TABLE {s}.pts AS SELECT {cols} FROM generate_series(1, {ROWS}) g"]


FEATURES = ["i", "sm", "b8", "f", "r", "n", "dnum", "fl", "dbool", "t", "v", "c", "e", "de", "dt"]
# (label column, labels) per classification dataset
LABELS = [("ye", ["blue", "red"]), ("yde", ["blue", "red"]), ("yt", ["no", "yes"]),
          ("yb", None), ("yi", None)]  # fmt: skip


@pytest.fixture
def trapped(conn, make_role):
    owner, connect_owner = make_role("olivia", "dpsql_admin")
    analyst, connect_analyst = make_role("alice", "dpsql_analyst")
    s = f"oc_{uuid.uuid4().hex[:8]}"
    conn.execute(
        sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
            sql.Identifier(s), sql.Identifier(owner)
        )
    )
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(sql.Identifier(s)))
    for role in (owner, analyst):
        conn.execute(
            sql.SQL("ALTER ROLE {} SET search_path = {}, pg_catalog, public").format(
                sql.Identifier(role), sql.Identifier(s)
            )
        )
    try:
        with connect_owner() as o:
            for stmt in _arm(s) + _tables(s):
                o.execute(stmt)
            # The traps work: the owner's own conversions run them.
            o.execute(f"TRUNCATE {s}.flags")
            o.execute(f"SELECT 'red'::{s}.colour::text, 'red'::text::{s}.colour")
            ran = {w for (w,) in o.execute(f"SELECT what FROM {s}.flags")}
            assert {"cast colour -> text", "cast text -> colour", "operator text = text"} <= ran
            o.execute(f"TRUNCATE {s}.flags")
        yield s, owner, connect_owner, analyst, connect_analyst
    finally:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


def _ran_elsewhere(conn, s: str, owner: str) -> list[tuple]:
    return conn.execute(
        f"SELECT who, what, count(*) FROM {s}.flags WHERE who <> %s GROUP BY 1, 2", (owner,)
    ).fetchall()


def test_no_owner_code_runs_as_anyone_else(conn, trapped) -> None:
    s, owner, connect_owner, analyst, connect_analyst = trapped
    names: dict[str, str] = {}
    cats = "{" + ", ".join(f'"{k}": {v}' for k, v in CATEGORIES.items()).replace("'", '"') + "}"
    with connect_owner() as o:
        for label, labels in LABELS:
            o.execute(f"CREATE TABLE {s}.cls_{label} AS SELECT * FROM {s}.pts")
            name = f"cls_{label}_{s}"
            o.execute(
                "SELECT dpsql.register_dataset(%s, %s, %s, 1000.0, 1e-3, labels => %s,"
                " categories => %s::jsonb, name => %s, accept => true)",
                (f"{s}.cls_{label}", FEATURES, label, labels, cats, name),
            )
            o.execute("SELECT dpsql.grant_dataset(%s, %s)", (name, analyst))
            names[label] = name
        o.execute(
            "SELECT dpsql.register_dataset(%s, %s, 'yr', 1000.0, 1e-3, categories => %s::jsonb,"
            " label_bound => 1.0, row_bound => 4.0, name => %s, accept => true)",
            (f"{s}.pts", FEATURES, cats, f"reg_{s}"),
        )
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (f"reg_{s}", analyst))
        o.execute(f"CREATE TABLE {s}.arr AS SELECT arr, ye FROM {s}.pts")
        o.execute(
            "SELECT dpsql.register_dataset(%s, '{arr}', 'ye', 1000.0, 1e-3,"
            " labels => '{blue,red}'::text[], name => %s, accept => true)",
            (f"{s}.arr", f"arr_{s}"),
        )
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (f"arr_{s}", analyst))
    assert _ran_elsewhere(conn, s, owner) == [], "registration ran the owner's code"

    mechanisms = conn.execute("SELECT name, task, models FROM dpsql.mechanisms()").fetchall()
    with connect_analyst() as a:
        for name, task, models in mechanisms:
            regression = task == "regression" or (task == "any" and "logistic" not in models)
            model = ("lasso" if "lasso" in models else "linear") if regression else "logistic"
            delta = "" if "delta" in EXTRA.get(name, "") else ", delta => 1e-6"
            call = (
                f"SELECT dpsql.train(%s, NULL, NULL, model => '{model}', privacy => '{name}',"
                f" epsilon => 10{delta}{EXTRA.get(name, '')})"
            )
            # (the exponential mechanism is for a few coefficients: the array dataset's two)
            dataset = f"reg_{s}" if regression else names["ye"]
            dataset = f"arr_{s}" if name == "exponential_mechanism" else dataset
            a.execute(call, (dataset,))
            a.execute(call.replace("dpsql.train", "dpsql.preview"), (dataset,))
        a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'auto', epsilon => 1, delta => 1e-6)",
            (names["ye"],),
        )
        for label, _ in LABELS[1:]:
            (mid,) = a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)",
                (names[label],),
            ).fetchone()
            # private evaluation (issue 44) reads the rows as training does
            a.execute("SELECT * FROM dpsql.evaluate(%s, %s, epsilon => 1)", (mid, names[label]))
        (model_id,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'dpsgd', epsilon => 1, delta => 1e-6)",
            (f"arr_{s}",),
        ).fetchone()
        a.execute(
            "SELECT * FROM dpsql.evaluate(%s, %s, epsilon => 1, delta => 1e-6)",
            (model_id, f"arr_{s}"),
        )
        (mid,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, model => 'linear', privacy => 'adassp',"
            " epsilon => 1, delta => 1e-6)",
            (f"reg_{s}",),
        ).fetchone()
        a.execute("SELECT * FROM dpsql.evaluate(%s, %s, epsilon => 1)", (mid, f"reg_{s}"))
    assert _ran_elsewhere(conn, s, owner) == [], "an analyst's training ran the owner's code"

    with connect_owner() as o:
        o.execute(f"CREATE TABLE {s}.est AS SELECT * FROM {s}.pts")
        o.execute(
            "SELECT dpsql.register_dataset(%s, '{i,f,n,dnum,dbool,fl}', 'yr', 1000.0, 1e-3,"
            " regression => true, name => %s, accept => true)",
            (f"{s}.est", f"est_{s}"),
        )
        o.execute("SELECT dpsql.estimate_label_bound(%s, 1.0, ARRAY[0.01, 100])", (f"est_{s}",))
        o.execute("SELECT dpsql.estimate_bounds(%s, 1.0, ARRAY[0.01, 100])", (f"est_{s}",))
        o.execute(f"CREATE TABLE {s}.aud AS SELECT * FROM {s}.pts")
        o.execute(
            "SELECT dpsql.register_dataset(%s, '{i,sm,b8,f,r,n,dnum,fl}', 'dbool', 1000.0,"
            " 1e-3, name => %s, accept => true)",
            (f"{s}.aud", f"aud_{s}"),
        )
        o.execute("SELECT * FROM dpsql.audit(%s, 'bolton', 1.0)", (f"aud_{s}",))
        # (evaluate runs as its caller: the owner's code runs as the owner)
        o.execute("SELECT * FROM dpsql.evaluate(%s, %s)", (model_id, f"{s}.arr"))
    assert _ran_elsewhere(conn, s, owner) == [], "an estimate or audit ran the owner's code"
