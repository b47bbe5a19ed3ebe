"""Command line interface: ``dpsql server ...``, ``dpsql role create``, ``dpsql install-extension``,
``dpsql demo``, the listings (``datasets``, ``budgets``, ``models``, ``ledger``, ``mechanisms``;
see dpsql.cli_tables), ``dpsql train``, ``dpsql plot`` and ``dpsql --version``.

Commands that talk to a server take ``--dsn``, else ``$DPSQL_DSN``, else the running embedded
server: the CLI never starts one on its own (``dpsql server start`` does), so a listing cannot
leave a server behind. Errors are one line on stderr, ``dpsql: ...`` (the server's own message
when it refused), plus its hint, never a traceback.

Exit codes: 0 success, 1 error, 2 usage error, 3 server not running (as ``pg_ctl status``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpsql.connection import Database

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOT_RUNNING = 3


def _pg_version(text: str) -> int:
    from dpsql.server import SUPPORTED_PG_VERSIONS

    try:
        version = int(text)
    except ValueError:
        version = -1
    if version not in SUPPORTED_PG_VERSIONS:
        choices = ", ".join(map(str, SUPPORTED_PG_VERSIONS))
        raise argparse.ArgumentTypeError(f"{text!r} is not an embedded version ({choices})")
    return version


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsql", description="Differentially private machine learning inside PostgreSQL."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    server = commands.add_parser(
        "server",
        help="manage the embedded PostgreSQL server",
        description="Manage the embedded PostgreSQL server (data directory: $DPSQL_PGDATA, "
        "else a per-user directory per PostgreSQL version).",
    )
    actions = server.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in [
        ("start", "start the server if needed (it keeps running) and print its URI"),
        ("stop", "stop the server"),
        ("status", "print the URI if the server runs (exit 3 if not)"),
        ("uri", "print the URI of the running server (exit 3 if not running)"),
        (
            "env",
            "print shell exports (PGHOST, PGPORT, PGUSER, PGPASSFILE, PATH with its psql) "
            'for the running server: eval "$(dpsql server env)" (exit 3 if not running)',
        ),
    ]:
        action = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        action.add_argument(
            "--pg-version",
            type=_pg_version,
            help="PostgreSQL major version (default: 18, or "
            "$DPSQL_PG_VERSION; an existing cluster's own version otherwise)",
        )
        action.add_argument(
            "--pgdata",
            type=Path,
            help="data directory (default: $DPSQL_PGDATA or the per-user one)",
        )

    role = commands.add_parser(
        "role",
        help="create analysts and data owners",
        description="Create login roles of dpsql's groups on the server ($DPSQL_DSN, else the "
        "running embedded one), with a generated password.",
    )
    role_actions = role.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = role_actions.add_parser(
        "create",
        help="create a login role and print its connection string (with its password)",
        description="Create a login role in dpsql_analyst (default) or dpsql_admin and print "
        "a connection string with its generated password: keep it, it is not shown again.",
    )
    create.add_argument("name", help="the role's name")
    create.add_argument(
        "--owner", action="store_true", help="a data owner (dpsql_admin), not an analyst"
    )
    create.add_argument("--dsn", help="server to create it on (default: $DPSQL_DSN or embedded)")

    install = commands.add_parser(
        "install-extension",
        help="build and install the dpsql PostgreSQL extension",
        description="Build the dpsql extension from the source checkout (PGXS) and install it "
        "into a PostgreSQL install, by default the embedded one.",
    )
    target = install.add_mutually_exclusive_group()
    target.add_argument("--pg-config", type=Path, help="pg_config of the target PostgreSQL")
    target.add_argument(
        "--pg-version",
        type=_pg_version,
        help="embedded PostgreSQL version (default: 18, or $DPSQL_PG_VERSION)",
    )
    install.add_argument("--clean", action="store_true", help="rebuild from scratch")
    install.add_argument("-v", "--verbose", action="store_true", help="show make's output")

    # Only listed here for --help; its arguments are parsed by dpsql.demo (see main()).
    commands.add_parser("demo", help="run the demo (see `dpsql demo --help`)", add_help=False)
    return parser


def _server_command(args: argparse.Namespace) -> int:
    from dpsql import server

    if args.action == "start":
        print(server.start(args.pg_version, args.pgdata, keep_running=True))
        return EXIT_OK
    if args.action == "stop":
        was_running = server.stop(args.pg_version, args.pgdata)
        print("server stopped" if was_running else "server was not running")
        return EXIT_OK
    uri = server.status(args.pg_version, args.pgdata)
    if uri is None:
        print(
            "server is not running (start it with `dpsql server start`)",
            file=sys.stdout if args.action == "status" else sys.stderr,
        )
        return EXIT_NOT_RUNNING
    if args.action == "env":
        import os
        import shlex

        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(uri)
        exports = {
            "PGHOST": info.get("host"),
            "PGPORT": info.get("port"),
            "PGUSER": info.get("user"),
            "PGDATABASE": info.get("dbname"),
            "PGPASSFILE": info.get("passfile"),
            "PATH": f"{server.bin_dir(server._resolve(args.pg_version, args.pgdata)[0])}:"
            + os.environ.get("PATH", ""),
        }
        for key, value in exports.items():
            if value:
                print(f"export {key}={shlex.quote(str(value))}")
        return EXIT_OK
    print(uri)
    return EXIT_OK


def _role_command(args: argparse.Namespace) -> int:
    import os

    import psycopg

    from dpsql import roles, server

    dsn = args.dsn or os.environ.get("DPSQL_DSN") or server.status()
    if dsn is None:
        print("dpsql: error: no server: set DPSQL_DSN or run `dpsql server start`", file=sys.stderr)
        return EXIT_NOT_RUNNING
    with psycopg.connect(dsn, autocommit=True) as conn:
        password = roles.create_role(conn, args.name, "owner" if args.owner else "analyst")
    print(roles.role_uri(dsn, args.name, password))
    return EXIT_OK


def _install_command(args: argparse.Namespace) -> int:
    from dpsql import extension, server

    pg_config = (
        args.pg_config if args.pg_config is not None else server.pg_config_path(args.pg_version)
    )
    extension.build_and_install(pg_config, verbose=args.verbose, clean=args.clean)
    print(f"dpsql extension installed with {pg_config}")
    return EXIT_OK


def _demo_command(argv: list[str]) -> int:
    try:
        import dpsql.demo as demo
    except ModuleNotFoundError as err:
        if err.name != "dpsql.demo":
            raise
        print("dpsql: error: the demo is not available in this version", file=sys.stderr)
        return EXIT_ERROR
    result = demo.main(argv)
    return int(result or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dpsql`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit code: 0 success, 1 error, 2 usage error, 3 server not running.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # The demo owns its options (including --help), so it bypasses this parser.
        if argv[:1] == ["demo"]:
            return _demo_command(argv[1:])
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exit_:  # argparse exits on --help and usage errors
            return exit_.code if isinstance(exit_.code, int) else EXIT_ERROR
        if args.command == "server":
            return _server_command(args)
        if args.command == "role":
            return _role_command(args)
        return _install_command(args)
    except (RuntimeError, OSError, ValueError) as err:
        print(f"dpsql: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as err:  # psycopg.Error (imported lazily): the server's message
        if type(err).__module__.split(".")[0] != "psycopg":
            raise
        print(f"dpsql: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
