"""dpsql's definer code runs as dpsql_definer, a role that is not a superuser and holds only what
dpsql needs (issue 41; docs/privacy.md, "The definer role"). The checks are tests/definer_role.py's,
shared with the PostgreSQL 15 and Citus suites; here on the suite's server (embedded, or the
container's in `make docker-test`)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from tests import definer_role

# The container stage runs this module against the image (tests/container).
pytestmark = pytest.mark.smoke


def test_the_definer_role_is_no_superuser(conn) -> None:
    definer_role.check_role_attributes(conn)


def test_every_definer_function_runs_as_the_definer_role(conn) -> None:
    definer_role.check_definer_functions_owned(conn)


def test_the_definer_role_cannot_escalate_or_read_unregistered_data(conn) -> None:
    definer_role.check_refusals(conn)


def test_releases_run_and_charge_as_the_definer_role(conn, make_role) -> None:
    """A release's definer code and its charge worker see current_user = dpsql_definer: a
    data owner's registered view records who reads it."""
    owner, connect_owner = make_role("olivia", "dpsql_admin")
    analyst, connect_analyst = make_role("alice", "dpsql_analyst")
    schema = f"definer_{uuid.uuid4().hex[:8]}"
    conn.execute(
        sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
            sql.Identifier(schema), sql.Identifier(owner)
        )
    )
    try:
        with connect_owner() as o:
            o.execute(
                f"CREATE TABLE {schema}.t AS SELECT (g % 10) / 10.0::float8 AS a,"
                " (g % 2)::float8 AS y FROM generate_series(1, 200) g"
            )
            o.execute(
                "SELECT dpsql.register_dataset(%s, '{a}', 'y', 5.0, 1e-4, labels => '{0,1}',"
                " name => %s)",
                (f"{schema}.t", schema),
            )
            o.execute("SELECT dpsql.grant_dataset(%s, %s)", (schema, analyst))
        # who runs the definer code: a superuser's statement-level trigger on the ledger
        # (the definer role cannot create one: it has no TRIGGER on it)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.seen (who name, session name);"
                " CREATE FUNCTION {}.note() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN INSERT INTO {}.seen VALUES (current_user, session_user); RETURN NULL;"
                " END $$;"
                " GRANT USAGE ON SCHEMA {} TO dpsql_definer;"
                " GRANT INSERT ON {}.seen TO dpsql_definer;"
                " CREATE TRIGGER definer_role_note AFTER INSERT ON dpsql.ledger_entries"
                " FOR EACH STATEMENT EXECUTE FUNCTION {}.note()"
            ).format(*[sql.Identifier(schema)] * 6)
        )
        try:
            with connect_analyst() as a:
                a.execute(
                    "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 0.5)",
                    (schema,),
                )
                a.execute(
                    "SELECT dpsql.train(%s, NULL, NULL, privacy => 'dpsgd', epsilon => 0.5,"
                    " delta => 1e-5)",
                    (schema,),
                )
        finally:
            conn.execute("DROP TRIGGER definer_role_note ON dpsql.ledger_entries")
        seen = conn.execute(sql.SQL("SELECT who FROM {}.seen").format(sql.Identifier(schema)))
        assert [w for (w,) in seen.fetchall()] == ["dpsql_definer", "dpsql_definer"]
    finally:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_the_definer_role_cannot_be_set_by_others(conn, make_role) -> None:
    for group in ("dpsql_analyst", "dpsql_admin"):
        _, connect = make_role("r", group)
        with connect() as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SET ROLE dpsql_definer")


def test_citus_setup_definer_refuses_without_citus(conn, make_role) -> None:
    """On a single server the role needs no login: the Citus setup refuses and changes nothing;
    data owners cannot call it at all."""
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="Citus is not installed"):
        conn.execute("SELECT dpsql.citus_setup_definer()")
    definer_role.check_role_attributes(conn)
    _, connect_owner = make_role("olivia", "dpsql_admin")
    with connect_owner() as o, pytest.raises(psycopg.errors.InsufficientPrivilege):
        o.execute("SELECT dpsql.citus_setup_definer()")
