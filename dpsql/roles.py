"""Login roles for dpsql's two groups: data owners (``dpsql_admin``) and analysts
(``dpsql_analyst``), each with a generated password (every server dpsql starts requires one)."""

from __future__ import annotations

import secrets
from typing import Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["GROUPS", "create_role", "role_uri"]

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
    return password


def role_uri(uri: str, name: str, password: str) -> str:
    """``uri`` (a server's URI or DSN) for another role: its user and password, no passfile."""
    params = conninfo_to_dict(uri)
    params.pop("passfile", None)
    params.update(user=name, password=password)
    return make_conninfo("", **params)
