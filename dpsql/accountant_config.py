"""Point a server at an accountant: the one step after installing the extension from a package.

The server runs DP-SGD's accountant (dp-accounting, Python) as the command in the superuser
setting ``dpsql.accountant_command``. The embedded server sets it when it creates a cluster; a
server that got the extension from a package (``postgresql-NN-dpsql``, PGXN, PGXS) needs it set
once: ``dpsql configure-accountant --dsn ...`` from the Python environment that should answer.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

from dpsql import server

# A small request every accountant answers: proves the server can run the command.
_PROBE = {
    "op": "epsilon", "noise_multiplier": 1.0, "scheme": "poisson", "steps": 10,
    "sampling_rate": 0.01, "delta": 1e-5,
}  # fmt: skip


def configure(dsn: str, command: str | None = None) -> dict[str, object]:
    """Set ``dpsql.accountant_command`` (ALTER SYSTEM, then a reload) and check that the server
    runs it.

    Parameters
    ----------
    dsn : str
        A superuser's connection to the server (ALTER SYSTEM).
    command : str, optional
        The command; defaults to this interpreter's ``-m dpsql.accounting``
        (:func:`dpsql.server.accountant_command`).

    Returns
    -------
    dict
        ``command`` and the probe's ``answer`` (the accountant's JSON).

    Raises
    ------
    RuntimeError
        If the connection is no superuser's, or the server could not run the command (the
        setting is then reset to what it was).
    """
    command = command or server.accountant_command()
    with _connect(dsn) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (row and row[0]):
            raise RuntimeError(
                "dpsql: configuring the accountant needs a superuser's connection (ALTER SYSTEM)"
            )
        conn.execute("LOAD 'dpsql'")  # the setting is the library's
        before = conn.execute("SELECT current_setting('dpsql.accountant_command')").fetchone()
        set_command(conn, command)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _wait_for_reload(conn, command)
            answer = conn.execute(
                "SELECT dpsql_internal._accountant(%s)", (json.dumps(_PROBE),)
            ).fetchone()
    except (psycopg.Error, RuntimeError) as err:  # refused, or the reload never came
        with psycopg.connect(dsn, autocommit=True) as conn:
            set_command(conn, before[0] if before else "")
        raise RuntimeError(
            f"dpsql: the server could not run the accountant `{command}`: {err}. The server's "
            "operating-system user must be able to run it: install dpsql into a virtualenv that "
            "user can read (e.g. /opt/dpsql), and run this command from there. The setting is "
            "unchanged."
        ) from err
    return {"command": command, "answer": json.loads(answer[0]) if answer else None}


def _connect(dsn: str) -> psycopg.Connection:
    """The superuser's connection; a peer-authentication refusal says how to run as that user
    (Debian's clusters trust the operating-system user on the local socket, and root is not
    ``postgres``)."""
    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.OperationalError as err:
        if "Peer authentication failed" not in str(err):
            raise
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params.pop("password", None)  # peer needs none; never echoed
        user = str(params.pop("user", None) or "postgres")
        as_user = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
        dpsql = Path(sys.executable).with_name("dpsql")
        raise RuntimeError(
            f"dpsql: the server lets only the operating-system user {user!r} log in as {user!r} "
            f"on its local socket (peer authentication), and this command runs as "
            f"{getpass.getuser()!r}: run it as that user, e.g. `sudo -u {user} {dpsql} "
            f"configure-accountant --dsn '{as_user}'` (or `runuser -u {user} -- ...` as root)"
        ) from err


def _wait_for_reload(conn: psycopg.Connection, command: str, seconds: float = 10) -> None:
    # pg_reload_conf() only signals the postmaster: a session may start before it re-reads.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = conn.execute("SELECT current_setting('dpsql.accountant_command')").fetchone()
        if row and row[0] == command:
            return
        time.sleep(0.1)
    raise RuntimeError(f"dpsql: the server did not take the new setting within {seconds} s")


def set_command(conn: psycopg.Connection, command: str) -> None:
    """ALTER SYSTEM the setting (RESET for an empty command) and reload the configuration."""
    if command:
        conn.execute(
            sql.SQL("ALTER SYSTEM SET dpsql.accountant_command = {}").format(sql.Literal(command))
        )
    else:
        conn.execute("ALTER SYSTEM RESET dpsql.accountant_command")
    conn.execute("SELECT pg_reload_conf()")
