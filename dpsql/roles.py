"""Login roles for dpsql's two groups: data owners (``dpsql_admin``) and analysts
(``dpsql_analyst``), each with a generated password (every server dpsql starts requires one)."""

from __future__ import annotations

import secrets
from typing import Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

__all__ = ["GROUPS", "create_role", "drop_role", "list_roles", "reset_password", "role_uri"]

GROUPS: dict[str, str] = {"analyst": "dpsql_analyst", "owner": "dpsql_admin"}

# Settings (superuser-only) that keep a statement's text out of the server log.
_UNLOGGED = (
    "log_min_error_statement = panic",
    "log_statement = none",
    "log_min_duration_statement = -1",
    "log_min_duration_sample = -1",
)


def create_role(
    conn: psycopg.Connection,
    name: str,
    kind: Literal["analyst", "owner"] = "analyst",
    password: str | None = None,
) -> str:
    """Create a login role in the analysts' or the data owners' group; return its password.

    Parameters
    ----------
    conn : psycopg.Connection
        A connection of a role that may create roles (a superuser, or one with CREATEROLE and
        ADMIN on the group).
    name : str
        The new role's name (any identifier: it is quoted).
    kind : {"analyst", "owner"}
        ``analyst``: member of ``dpsql_analyst`` (private training on granted datasets);
        ``owner``: member of ``dpsql_admin`` (registers datasets, grants them).
    password : str, optional
        Defaults to 32 random URL-safe characters.

    Returns
    -------
    str
        The password (stored by the server only as a scram-sha-256 verifier).
    """
    if kind not in GROUPS:
        raise ValueError(f"dpsql: a role is an analyst or an owner, not {kind!r}")
    password = password or secrets.token_urlsafe(24)
    # Only the SCRAM verifier goes to the server: a statement that fails is logged with its text.
    verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
    with conn.transaction():
        if conn.info.parameter_status("is_superuser") == "on":
            # and a superuser keeps even the verifier (a hash one can guess against) out of it
            for setting in _UNLOGGED:
                conn.execute(f"SET LOCAL {setting}")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                sql.Identifier(name), sql.Literal(verifier.decode()), sql.Identifier(GROUPS[kind])
            )
        )
        if kind == "owner":
            _owner_schema(conn, name)
    return password


def _owner_schema(conn: psycopg.Connection, name: str) -> None:
    """A data owner's own schema, first on their search_path: PostgreSQL >= 15 gives PUBLIC no
    CREATE on schema public, and an owner loads tables before registering them. (The same two
    statements run in Docker's first start: docker/initdb/10-dpsql.sh.)"""
    role = sql.Identifier(name)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(role, role))
    conn.execute(sql.SQL("ALTER ROLE {} SET search_path = {}, public").format(role, role))


def reset_password(conn: psycopg.Connection, name: str, password: str | None = None) -> str:
    """A new generated password for a dpsql login role; returns it."""
    _require_dpsql_role(conn, name)
    password = password or secrets.token_urlsafe(24)
    verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
    with conn.transaction():
        if conn.info.parameter_status("is_superuser") == "on":
            for setting in _UNLOGGED:
                conn.execute(f"SET LOCAL {setting}")
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(verifier.decode())
            )
        )
    return password


def list_roles(conn: psycopg.Connection) -> list[dict[str, object]]:
    """The login roles in dpsql's groups: name, kind (owner, analyst), whether they can log in,
    their own schema (owners) and the datasets granted to them."""
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT r.rolname AS name,
                      CASE WHEN pg_has_role(r.oid, 'dpsql_admin', 'MEMBER') THEN 'owner'
                           ELSE 'analyst' END AS kind,
                      r.rolcanlogin AS login,
                      (SELECT n.nspname FROM pg_namespace n
                        WHERE n.nspname = r.rolname AND n.nspowner = r.oid) AS schema,
                      ARRAY(SELECT d.name FROM dpsql.dataset_grants g
                              JOIN dpsql.datasets d USING (dataset_id)
                             WHERE g.role = r.rolname ORDER BY d.name) AS datasets
                 FROM pg_roles r
                WHERE r.rolname NOT IN ('dpsql_admin', 'dpsql_analyst', 'dpsql_reader')
                  AND (pg_has_role(r.oid, 'dpsql_admin', 'MEMBER')
                       OR pg_has_role(r.oid, 'dpsql_analyst', 'MEMBER'))
                  AND NOT r.rolsuper
                ORDER BY 1"""
        ).fetchall()


def drop_role(conn: psycopg.Connection, name: str, *, force: bool = False) -> None:
    """Drop a dpsql login role. Refused while it owns objects (a data owner's tables) unless
    ``force``, which drops what it owns first (DROP OWNED). Its grants go; the ledger keeps the
    role's name on every charge it made (history is never rewritten)."""
    _require_dpsql_role(conn, name)
    role = sql.Identifier(name)
    try:
        with conn.transaction():
            if force:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
            conn.execute("DELETE FROM dpsql.dataset_grants WHERE role = %s", (name,))
            conn.execute(sql.SQL("DROP ROLE {}").format(role))
    except psycopg.errors.DependentObjectsStillExist as err:
        raise ValueError(
            f"dpsql: role {name!r} still owns objects (its schema, tables): "
            f"{err.diag.message_detail or err}; pass --force (force=True) to drop them first"
        ) from None


def _require_dpsql_role(conn: psycopg.Connection, name: str) -> None:
    row = conn.execute(
        "SELECT NOT r.rolsuper AND (pg_has_role(r.oid, 'dpsql_admin', 'MEMBER')"
        " OR pg_has_role(r.oid, 'dpsql_analyst', 'MEMBER'))"
        " AND r.rolname NOT IN ('dpsql_admin', 'dpsql_analyst', 'dpsql_reader')"
        " FROM pg_roles r WHERE r.rolname = %s",
        (name,),
    ).fetchone()
    if row is None or not row[0]:
        raise ValueError(f"dpsql: {name!r} is not a dpsql login role (an owner or an analyst)")


def role_uri(uri: str, name: str, password: str) -> str:
    """``uri`` (a server's URI or DSN) for another role, as a ``postgresql://`` URI with its
    user and password and no passfile: what psql, psycopg and SQLAlchemy
    (``postgresql+psycopg://...``) accept. A Unix-socket directory goes in ``host=``."""
    from urllib.parse import quote, urlencode

    params = {k: v for k, v in conninfo_to_dict(uri).items() if v is not None}
    params.pop("passfile", None)
    params.pop("password", None)
    params.pop("user", None)
    host = str(params.pop("host", ""))
    port = params.pop("port", None)
    dbname = str(params.pop("dbname", "postgres"))
    netloc = f"{quote(name, safe='')}:{quote(password, safe='')}@"
    if host and not host.startswith("/") and "," not in host:
        netloc += host + (f":{port}" if port else "")
    else:
        if host:
            params["host"] = host
        if port:
            params["port"] = port
    query = urlencode({k: str(v) for k, v in params.items()})
    return f"postgresql://{netloc}/{quote(dbname, safe='')}" + (f"?{query}" if query else "")
