"""What dpsql's definer role (dpsql_definer) is and cannot do: checked on every server dpsql
starts (tests/server/test_definer_role.py on the embedded server and, through the server suite,
in Docker; tests/packaging/test_pg15.py on Debian's PostgreSQL 15; tests/citus on a cluster).

Each check takes a superuser's autocommit connection. The refusals are tried as the role itself
(SET ROLE), as code that found its way into a definer function would run."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import errors, sql

# What the role may not do, each with the error that says so (SQLSTATE 42501 unless noted).
ATTEMPTS: list[tuple[str, str]] = [
    ("create a role", "CREATE ROLE dpsql_definer_escalates LOGIN SUPERUSER"),
    ("create a schema", "CREATE SCHEMA dpsql_definer_schema"),
    ("load C code", "CREATE FUNCTION pg_temp.f() RETURNS int AS 'dpsql', 'x' LANGUAGE C"),
    ("load a library", "LOAD 'auto_explain'"),
    ("read a server file", "SELECT pg_read_file('PG_VERSION')"),
    ("write a server file", "COPY (SELECT 1) TO '/tmp/dpsql_definer_wrote'"),
    ("run a program", "COPY (SELECT 1) TO PROGRAM 'true'"),
    ("change a superuser's setting", "SET log_statement = 'none'"),
    ("join a dpsql group", "GRANT dpsql_admin TO dpsql_definer"),
    ("change the ledger's triggers", "ALTER TABLE dpsql.ledger_entries DISABLE TRIGGER ALL"),
]


def check_role_attributes(conn: psycopg.Connection, login: bool = False) -> None:
    """``login``: on Citus the role logs in (with a password only Citus knows)."""
    row = conn.execute(
        "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolcanlogin, rolbypassrls"
        " FROM pg_roles WHERE rolname = 'dpsql_definer'"
    ).fetchone()
    assert row == (False, False, False, False, login, True), row
    groups = {
        g
        for (g,) in conn.execute(
            "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
            " WHERE m.member = 'dpsql_definer'::regrole"
        ).fetchall()
    }
    assert groups == {"dpsql_reader"}, groups


def check_definer_functions_owned(conn: psycopg.Connection) -> None:
    """Every SECURITY DEFINER function is dpsql_definer's, but the two documented ones."""
    owners: dict[str, str] = dict(
        conn.execute(
            "SELECT p.oid::regprocedure::text, pg_get_userbyid(p.proowner) FROM pg_proc p"
            " WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)"
            " AND p.prosecdef"
        ).fetchall()
    )
    assert len(owners) > 15
    extension_owner = conn.execute(
        "SELECT pg_get_userbyid(extowner) FROM pg_extension WHERE extname = 'dpsql'"
    ).fetchone()[0]
    expected = {
        "dpsql_internal._read_source(regclass,text)": "dpsql_reader",
        "dpsql_internal._grant_reader(regclass,text[])": extension_owner,
    }
    wrong = {f: who for f, who in owners.items() if who != expected.get(f, "dpsql_definer")}
    assert not wrong, wrong


def check_refusals(conn: psycopg.Connection) -> None:
    """As dpsql_definer: none of ATTEMPTS, and no unregistered table (nor an unregistered
    column of a registered one) can be read."""
    schema = f"definer_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.secret AS SELECT g::float8 AS a, (g % 2)::float8 AS y,"
                " 'x' || g AS private FROM generate_series(1, 20) g"
            ).format(sql.Identifier(schema))
        )
        conn.execute(
            sql.SQL("CREATE TABLE {}.other AS SELECT g AS v FROM generate_series(1, 3) g").format(
                sql.Identifier(schema)
            )
        )
        conn.execute(
            "SELECT dpsql.register_dataset(%s, '{a}', 'y', 1.0, labels => '{0,1}',"
            " feature_bounds => '{{0,20}}', name => %s)",
            (f"{schema}.secret", schema),
        )
        reads: list[sql.SQL | sql.Composed] = [
            sql.SQL("SELECT v FROM {}.other").format(sql.Identifier(schema)),
            sql.SQL("SELECT private FROM {}.secret").format(sql.Identifier(schema)),
            sql.SQL("SELECT * FROM dpsql.datasets JOIN pg_authid ON true"),
        ]
        attempts: list[tuple[str, sql.SQL | sql.Composed]] = [(w, sql.SQL(s)) for w, s in ATTEMPTS]
        attempts += [(f"read {r.as_string(conn)}", r) for r in reads]
        done = []
        for what, stmt in attempts:
            with conn.transaction():
                conn.execute("SET LOCAL ROLE dpsql_definer")
                try:
                    with conn.transaction():
                        conn.execute(stmt)
                    done.append(what)
                except errors.InsufficientPrivilege:
                    pass
        assert not done, f"dpsql_definer could {done}"
        # and the registered columns are readable (the role is not merely broken)
        with conn.transaction():
            conn.execute("SET LOCAL ROLE dpsql_definer")
            (n,) = conn.execute(
                sql.SQL("SELECT count(a) FROM {}.secret").format(sql.Identifier(schema))
            ).fetchone()
        assert n == 20
    finally:
        conn.execute("SELECT dpsql.drop_dataset(%s)", (schema,))
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def check_all(conn: psycopg.Connection, login: bool = False) -> None:
    check_role_attributes(conn, login)
    check_definer_functions_owned(conn)
    check_refusals(conn)
