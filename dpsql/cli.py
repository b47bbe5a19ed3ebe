"""Command line interface: ``dpsql server ...``, ``dpsql role create``, ``dpsql install-extension``,
``dpsql demo``, the listings (``datasets``, ``budgets``, ``models``, ``ledger``, ``mechanisms``;
see dpsql.cli_tables), ``dpsql train``, ``dpsql plot``, ``dpsql load`` (dpsql.cli_load),
``dpsql evaluate|predict`` (dpsql.cli_models), ``dpsql describe`` (dpsql.cli_describe),
``dpsql tune`` (dpsql.cli_tune) and ``dpsql --version``.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpsql.connection import Database
    from dpsql.models import Model

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOT_RUNNING = 3


class _NoServer(Exception):
    """No --dsn, no $DPSQL_DSN and no embedded server running: exit 3, as ``server status``."""


def _server_dsn(dsn: str | None) -> str:
    """The server a command talks to: ``--dsn``, else ``$DPSQL_DSN``, else the running embedded
    server (never started here: a one-off command must not leave a server running)."""
    from dpsql import server

    found = dsn or os.environ.get("DPSQL_DSN") or server.status()
    if found is None:
        raise _NoServer(
            "dpsql: error: no server: pass --dsn, set DPSQL_DSN or run `dpsql server start`"
        )
    return found


def _connect(dsn: str | None) -> Database:
    """A :class:`dpsql.Database` without installing anything: analysts cannot create the
    extension, and a listing should not change the server; a missing extension is one clear
    error rather than "relation dpsql.... does not exist"."""
    from dpsql.connection import connect

    db = connect(_server_dsn(dsn), install=False)
    if db.execute("SELECT 1 FROM pg_extension WHERE extname = 'dpsql'").fetchone() is None:
        where = db.conn.info.dbname
        db.close()
        raise RuntimeError(
            f"dpsql: the dpsql extension is not created in database {where!r}: "
            "run `CREATE EXTENSION dpsql` there as a superuser (or call dpsql.connect() once)"
        )
    return db


def _error_lines(err: BaseException) -> list[str]:
    """An error as one line ``dpsql: ...`` (the server's message as it wrote it, else ours with
    ``dpsql: error:``) and its hint: what a shell user needs, without the CONTEXT or a
    traceback."""
    diag = getattr(err, "diag", None)  # psycopg's errors (dpsql's included): the server's parts
    message = getattr(diag, "message_primary", None)
    if not message:  # not the server's (a failed connection, ours): its lines as sentences
        parts = [line.strip().rstrip(".") for line in str(err).splitlines() if line.strip()]
        message = ". ".join(parts) or type(err).__name__
    lines = [message if message.startswith("dpsql:") else f"dpsql: error: {message}"]
    hint = getattr(diag, "message_hint", None)
    if hint:
        lines.append(f"hint: {hint}")
    return lines


def _reported(err: Exception) -> bool:
    """Whether main() reports the error as a message (ours and the server's) rather than a
    traceback (a bug)."""
    if isinstance(err, RuntimeError | OSError | ValueError):
        return True
    psycopg = sys.modules.get("psycopg")  # dpsql's own errors subclass psycopg.Error too
    return psycopg is not None and isinstance(err, psycopg.Error)


def _version_text(dsn: str | None = None) -> str:
    """Versions of the package, of the extension this install can build and of the extension in
    the server it would talk to (``--dsn``, else as every command finds it): what a bug report
    needs, and whether an upgrade is pending."""
    import dpsql
    from dpsql import extension

    lines = [f"dpsql {dpsql.__version__}"]
    try:
        lines.append(
            f"extension: {extension.control_default_version()} available to build "
            f"({extension.source_dir()})"
        )
    except (OSError, RuntimeError):
        lines.append("extension: no sources to build (not a source checkout or sdist)")
    try:
        dsn = _server_dsn(dsn)
    except (_NoServer, RuntimeError, OSError):
        lines.append("server: not running (`dpsql server start`, or set DPSQL_DSN)")
        return "\n".join(lines)
    import psycopg

    try:
        from dpsql.connection import _libpq_url  # DPSQL_DSN may be a SQLAlchemy URL

        with psycopg.connect(_libpq_url(dsn), connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'),"
                " (SELECT extversion FROM pg_extension WHERE extname = 'dpsql'),"
                " (SELECT default_version FROM pg_available_extensions WHERE name = 'dpsql')"
            ).fetchone()
            info = conn.info
            where = f"{info.dbname} at {info.host}:{info.port}"
    except psycopg.Error as err:
        lines.append(
            f"server: not reachable ({_error_lines(err)[0].removeprefix('dpsql: error: ')})"
        )
        return "\n".join(lines)
    assert row is not None
    pg, installed, available = row
    if installed is None:
        state = "dpsql extension not created" + (
            f" (version {available} installed in the server)" if available else ""
        )
    else:
        state = f"dpsql extension {installed}"
        if available and available != installed:
            state += f" (update to {available}: ALTER EXTENSION dpsql UPDATE)"
    lines.append(f"server: {state}; PostgreSQL {pg}, database {where}")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """``--version``: argparse's own action prints a fixed string; this one asks the server."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        # the whole command line: `dpsql --version --dsn URI` asks that server (issue 42)
        self.argv: list[str] = list(kwargs.pop("argv", ()))
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        dsn = None
        for i, arg in enumerate(self.argv):
            if arg == "--dsn" and i + 1 < len(self.argv):
                dsn = self.argv[i + 1]
            elif arg.startswith("--dsn="):
                dsn = arg.removeprefix("--dsn=")
        print(_version_text(dsn))
        parser.exit()


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


def _parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsql", description="Differentially private machine learning inside PostgreSQL."
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        argv=argv,
        help="print the versions of dpsql, of the extension it builds and of the server's "
        "(the server of --dsn URI when given)",
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
    kind = create.add_mutually_exclusive_group()
    kind.add_argument(
        "--analyst",
        dest="kind",
        action="store_const",
        const="analyst",
        help="an analyst (dpsql_analyst): private training on granted datasets (the default)",
    )
    kind.add_argument(
        "--owner",
        dest="kind",
        action="store_const",
        const="owner",
        help="a data owner (dpsql_admin): registers datasets and grants them",
    )
    create.set_defaults(kind="analyst")
    create.add_argument("--dsn", help="server to create it on (default: $DPSQL_DSN or embedded)")
    lister = role_actions.add_parser(
        "list",
        help="the login roles of dpsql's groups: kind, login, schema, granted datasets",
        description="List the data owners and analysts, with their own schema and the datasets "
        "granted to them.",
    )
    lister.add_argument("--json", action="store_true", help="print JSON")
    lister.add_argument("--dsn", help="server (default: $DPSQL_DSN or embedded)")
    reset = role_actions.add_parser(
        "reset",
        help="give a role a new generated password and print its new connection URI",
        description="Set a new generated password for a data owner or an analyst and print the "
        "connection URI with it (the old password stops working).",
    )
    reset.add_argument("name", help="the role's name")
    reset.add_argument("--dsn", help="server (default: $DPSQL_DSN or embedded)")
    drop = role_actions.add_parser(
        "drop",
        help="drop a data owner or an analyst (the ledger keeps their charges)",
        description="Drop a login role of dpsql's groups and its dataset grants. Refused while "
        "the role owns tables or other objects, unless --force, which drops them first (DROP "
        "OWNED). The ledger keeps the role's name on every charge it made.",
    )
    drop.add_argument("name", help="the role's name")
    drop.add_argument("--force", action="store_true", help="drop what the role owns first")
    drop.add_argument("--dsn", help="server (default: $DPSQL_DSN or embedded)")

    from dpsql import cli_datasets, cli_describe, cli_load, cli_models, cli_tune

    cli_datasets.add_parser(commands)
    cli_load.add_parser(commands)
    cli_models.add_parsers(commands)
    for module in (cli_describe, cli_tune):
        module.add_parser(commands)

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

    accountant = commands.add_parser(
        "configure-accountant",
        help="point a server at this installation's accountant (after a package install)",
        description="Set the server's dpsql.accountant_command to this Python's "
        "`-m dpsql.accounting` (ALTER SYSTEM; needs a superuser) and check that the server "
        "runs it. The embedded server needs no such step.",
    )
    accountant.add_argument("--dsn", help="a superuser's connection (default: $DPSQL_DSN)")
    accountant.add_argument(
        "--accountant-command", help="another command to set (default: this Python's)"
    )

    # Only listed here for --help; its arguments are parsed by dpsql.demo (see main()).
    commands.add_parser("demo", help="run the demo (see `dpsql demo --help`)", add_help=False)

    from dpsql.cli_tables import LISTINGS

    for name, listing in LISTINGS.items():
        lister = commands.add_parser(
            name,
            help=listing.help,
            description=f"List {listing.help} (aligned columns; --json: every column).",
        )
        lister.add_argument("--json", action="store_true", help="print JSON (every column)")
        if listing.dataset_column is not None:
            lister.add_argument("--dataset", metavar="NAME", help="only this dataset's rows")
        lister.add_argument("--dsn", help=_DSN_HELP)

    _add_train_parser(commands)
    _add_plot_parser(commands)
    return parser


_DSN_HELP = "server to connect to (default: $DPSQL_DSN, else the running embedded server)"


def _comma_list(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _float_list(text: str) -> list[float]:
    try:
        return [float(item) for item in _comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None


def _mechanism_names() -> list[str]:
    from dpsql.privacy import MECHANISMS

    return ["none", "auto", *MECHANISMS]


def _add_mechanism_flags(train: argparse.ArgumentParser) -> None:
    """One flag per field of the mechanisms' classes, from their specs (dpsql._mechanisms):
    ``--clip-norm 2``, ``--sampling poisson``, ``--options '{"radius": 5}'``. A flag the
    chosen mechanism does not take is refused (_mechanism)."""
    import json

    from dpsql._mechanisms import FIELDS

    types: dict[str, Callable[[str], Any]] = {
        "float": float,
        "int": int,
        "str": str,
        "dict[str, Any]": json.loads,
    }
    group = train.add_argument_group("mechanism parameters (sql/mechanisms/*.toml)")
    for attribute, (kind, choices, doc) in FIELDS.items():
        flag = "--" + attribute.replace("_", "-")
        if flag in train._option_string_actions:  # a training keyword too (--step-size)
            continue
        group.add_argument(
            flag,
            dest=f"mechanism_{attribute}",
            type=types[kind],
            choices=choices or None,
            metavar=None if choices else {"dict[str, Any]": "JSON"}.get(kind, kind.upper()),
            help=doc,
        )


def _add_train_parser(commands: Any) -> None:
    train = commands.add_parser(
        "train",
        help="train a model: private on a registered dataset, or a data owner's non-private run",
        description="Train a model in the server. Private: `dpsql train DATASET --privacy "
        "bolton --epsilon 1` charges the dataset's budget and releases a noisy model "
        "(`dpsql mechanisms` lists the mechanisms). Non-private (data owners): `dpsql train "
        "--privacy none --source TABLE --features a,b --label y`. Prints the model id and what "
        "was spent.",
    )
    train.add_argument("dataset", nargs="?", help="registered dataset (private runs)")
    train.add_argument(
        "--privacy",
        required=True,
        choices=_mechanism_names(),
        metavar="MECHANISM",
        help="a mechanism of `dpsql mechanisms`, auto (the server chooses) or none",
    )
    train.add_argument(
        "--epsilon", type=float, metavar="EPS", help="privacy budget epsilon of this run"
    )
    train.add_argument("--delta", type=float, help="delta (default: the mechanism's)")
    train.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another parameter of the mechanism (its dpsql.privacy class), e.g. clip_norm=2 "
        "or options='{\"radius\": 5}'; the value is read as JSON, else as text; repeatable",
    )
    train.add_argument(
        "--model", default="logistic", metavar="KIND", help="model kind (default: logistic)"
    )
    train.add_argument(
        "--source", metavar="TABLE", help="table, view or query of a non-private run"
    )
    train.add_argument(
        "--features", type=_comma_list, metavar="A,B", help="feature columns, comma-separated"
    )
    train.add_argument("--label", metavar="COLUMN", help="label column")
    train.add_argument(
        "--labels",
        type=_float_list,
        metavar="NEG,POS",
        help="label set of a non-private classifier (default: -1,1)",
    )
    train.add_argument(
        "--epochs", type=int, metavar="N", help="epochs (private default: the server's plan)"
    )
    train.add_argument("--batch-size", type=int, metavar="B", help="batch size")
    train.add_argument(
        "--lambda", dest="lambda_", type=float, default=0.0, metavar="L", help="L2 penalty"
    )
    train.add_argument("--step-size", type=float, metavar="ETA", help="step size")
    train.add_argument("--seed", type=int, metavar="S", help="shuffle seed (not the noise's)")
    train.add_argument(
        "--intercept",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fit an intercept (default: yes, but for dpsgd_f_alg2, which learns its bias itself)",
    )
    train.add_argument(
        "--validation",
        metavar="DATASET",
        help="with --privacy auto: choose among auto's candidates by private selection, scored "
        "on this validation dataset (e.g. NAME_holdout; see `dpsql tune`)",
    )
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="preview a private run (dpsql.preview): the plan, what it would charge, warnings "
        "and refusals, without charging and without reading rows; exits 1 if it would be refused",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--json", action="store_true", help="print the summary as JSON")
    train.add_argument("--dsn", help=_DSN_HELP)
    _add_mechanism_flags(train)  # last: the training flags above keep their names


def _add_plot_parser(commands: Any) -> None:
    plot = commands.add_parser(
        "plot",
        help="plot test accuracy against epsilon for some mechanisms (spends budget)",
        description="Train --runs private models per (mechanism, epsilon) on DATASET, evaluate "
        "each on the TEST table, print the numbers and plot utility against epsilon. Every run "
        "is charged to the dataset's budget: the total is the sum of the epsilons times the "
        "mechanisms times the runs.",
    )
    plot.add_argument("dataset", help="registered dataset")
    plot.add_argument(
        "--mechanisms", type=_comma_list, required=True, help="comma-separated, e.g. bolton,dpsgd"
    )
    plot.add_argument(
        "--epsilons", type=_float_list, required=True, help="comma-separated, e.g. 0.5,1,2"
    )
    plot.add_argument("--test", required=True, metavar="TABLE", help="held-out table to evaluate")
    plot.add_argument(
        "--model", metavar="KIND", help="model kind (default: logistic, or linear for regression)"
    )
    plot.add_argument("--delta", type=float, help="delta of every run (default: each mechanism's)")
    plot.add_argument("--epochs", type=int, metavar="N", help="epochs of every run")
    plot.add_argument("--seed", type=int, metavar="S", help="shuffle seed of the first run")
    plot.add_argument(
        "--runs", type=int, metavar="N", help="models per point: error bars over N runs"
    )
    plot.add_argument(
        "--metric", choices=("accuracy", "mse", "r2"), help="default: accuracy, or mse"
    )
    plot.add_argument(
        "--out", type=Path, help="image file to write (default: DATASET_privacy_utility.png)"
    )
    plot.add_argument("--dsn", help=_DSN_HELP)


def _configure_accountant_command(args: argparse.Namespace) -> int:
    from dpsql import accountant_config

    dsn = args.dsn or os.environ.get("DPSQL_DSN")
    if not dsn:
        print("dpsql configure-accountant: give --dsn (or set DPSQL_DSN)", file=sys.stderr)
        return EXIT_ERROR
    done = accountant_config.configure(dsn, args.accountant_command)
    print(f"dpsql.accountant_command = '{done['command']}' (the server ran it)")
    return EXIT_OK


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
    import psycopg

    from dpsql import roles

    dsn = _server_dsn(args.dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if args.action == "list":
            from dpsql.cli_tables import render_json, render_table

            rows = roles.list_roles(conn)
            columns = ["name", "kind", "login", "schema", "datasets"]
            print(render_json(rows) if args.json else render_table(rows, columns))
            return EXIT_OK
        if args.action == "drop":
            roles.drop_role(conn, args.name, force=args.force)
            print(f"dropped role {args.name}")
            return EXIT_OK
        if args.action == "reset":
            password = roles.reset_password(conn, args.name)
        else:
            password = roles.create_role(conn, args.name, args.kind)
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


def _listing_command(args: argparse.Namespace) -> int:
    from dpsql.cli_tables import LISTINGS, fetch, render_json, render_table

    listing = LISTINGS[args.command]
    with _connect(args.dsn) as db:
        rows = fetch(db.conn, listing, getattr(args, "dataset", None))
    print(render_json(rows) if args.json else render_table(rows, listing.columns))
    return EXIT_OK


def _mechanism(args: argparse.Namespace) -> Any:
    """The mechanism object of ``--privacy`` (dpsql.privacy's registry), built from --epsilon,
    --delta and --param: the same objects the Python API takes, so both check alike."""
    import dataclasses
    import json

    from dpsql.privacy import mechanism_class

    cls = mechanism_class(args.privacy)
    fields = {f.name for f in dataclasses.fields(cls)}
    params: dict[str, Any] = {}
    for item in args.param:
        key, sep, text = item.partition("=")
        if not sep or key not in fields or key in ("epsilon", "delta"):
            accepted = ", ".join(sorted(fields - {"epsilon", "delta"}))
            raise ValueError(
                f"dpsql: --param {item!r}: {args.privacy} takes KEY=VALUE with KEY one of "
                f"{accepted} (epsilon and delta have their own options)"
            )
        try:
            params[key] = json.loads(text)
        except json.JSONDecodeError:
            params[key] = text
    for name, value in vars(args).items():
        attribute = name.removeprefix("mechanism_")
        if attribute == name or value is None:
            continue
        if attribute not in fields:
            raise ValueError(
                f"dpsql: --{attribute.replace('_', '-')}: {args.privacy} does not take it "
                "(docs/mechanisms.md lists what each mechanism takes)"
            )
        params[attribute] = value
    if args.epsilon is not None:
        params["epsilon"] = args.epsilon
    if args.delta is not None:
        params["delta"] = args.delta
    try:
        return cls(**params)
    except TypeError as err:  # a required field (epsilon) left out
        raise ValueError(f"dpsql: --privacy {args.privacy}: {err}") from None


def _train_summary(db: Database, model: Model) -> dict[str, Any]:
    """What the run spent and what is left of its dataset's budget (None for non-private)."""
    from dpsql.cli_tables import LISTINGS, fetch

    row = model.row
    budget = None
    if row["dataset_id"] is not None:
        budgets = fetch(db.conn, LISTINGS["budgets"])
        budget = next((b for b in budgets if b["dataset_id"] == row["dataset_id"]), None)
    return {
        "model_id": model.model_id,
        "model": model.model,
        "source": row["source"],
        "dataset": None if budget is None else budget["name"],
        "privacy": row["privacy"],
        "epsilon": row["epsilon"],
        "delta": row["delta"],
        "epochs_run": row["epochs_run"],
        "train_loss": row["train_loss"],
        "budget": budget,
    }


def _train_target(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, Any]:
    """The source and the privacy of ``dpsql train``'s arguments (``"none"``: non-private)."""
    if args.privacy != "none":
        if args.dataset is None or args.source is not None:
            parser.error("a private run names its registered DATASET (not --source)")
        if args.epsilon is None and not any(p.startswith("noise_multiplier=") for p in args.param):
            parser.error(f"--privacy {args.privacy} needs --epsilon")
        return args.dataset, _mechanism(args)
    source = args.source or args.dataset
    if source is None or args.features is None or args.label is None:
        parser.error("--privacy none needs --source TABLE, --features and --label")
    if args.epsilon is not None or args.delta is not None or args.param:
        parser.error("--epsilon, --delta and --param are for private runs")
    return source, "none"


def _train_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    private = args.privacy != "none"
    source, privacy = _train_target(args, parser)
    if args.validation is not None:
        if args.privacy != "auto":
            parser.error("--validation chooses among auto's candidates: --privacy auto")
        from dpsql import cli_tune

        return cli_tune.validated(args, source, privacy.epsilon, privacy.delta, _connect)
    if args.dry_run:
        if not private:
            parser.error("--dry-run previews private runs")
        return _preview_command(args, source, privacy)
    with _connect(args.dsn) as db:
        model = db.train(
            source,
            args.features,
            args.label,
            args.model,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lambda_=args.lambda_,
            step_size=args.step_size,
            seed=args.seed,
            intercept=args.intercept,
            labels=args.labels,
            privacy=privacy,
            progress=not args.no_progress,
        )
        summary = _train_summary(db, model)
    if args.json:
        from dpsql.cli_tables import render_json

        print(render_json(summary))
        return EXIT_OK
    if not private:
        loss = summary["train_loss"]
        print(
            f"model {model.model_id}: {model.model} on {summary['source']}, not private "
            f"({summary['epochs_run']} epochs"
            + ("" if loss is None else f", training loss {loss:.6g}")
            + ")"
        )
        return EXIT_OK
    print(
        f"model {model.model_id}: {model.model} on {summary['dataset'] or source}, "
        f"{summary['privacy']} (epsilon {summary['epsilon']:g}, delta {summary['delta']:g})"
    )
    budget = summary["budget"]
    if budget is not None:
        print(
            f"budget left on {budget['name']}: epsilon {budget['epsilon_remaining']:g} of "
            f"{budget['epsilon_budget']:g}, delta {budget['delta_remaining']:g} of "
            f"{budget['delta_budget']:g}"
        )
    return EXIT_OK


def _preview_command(args: argparse.Namespace, source: str, privacy: Any) -> int:
    """``dpsql train --dry-run``: the release's preview, printed; 1 if it would be refused."""
    from dpsql.cli_tables import render_json

    with _connect(args.dsn) as db:
        plan = db.preview(
            source,
            privacy,
            args.model,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lambda_=args.lambda_,
            step_size=args.step_size,
            seed=args.seed,
            intercept=args.intercept,
        )
    refused = plan.get("refused")
    if args.json:
        print(render_json(plan))
    elif refused is None or "mechanism" in plan:
        budget = plan["budget"]
        print(
            f"{plan['mechanism']} on {plan['dataset']} ({plan['rows']} rows, {plan['dim']} "
            f"features) would charge epsilon {plan['epsilon']:g}, delta {plan['delta']:g}: "
            f"left {budget['epsilon_remaining']:g} of {budget['epsilon_budget']:g} epsilon, "
            f"{budget['delta_remaining']:g} of {budget['delta_budget']:g} delta"
        )
        for key in ("defaults", "auto", "plan") if refused is None else ():
            # (a refused run's details would bury its refusal: issue 42; --json has them)
            if plan.get(key):
                print(f"{key}: {render_json(plan[key])}")
        for warning in plan.get("warnings", []):
            print(f"warning: {warning['warning']}", file=sys.stderr)
    if refused is not None:
        if not args.json:
            print(refused["message"], file=sys.stderr)
            if refused.get("hint"):
                print(f"hint: {refused['hint']}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _plot_command(args: argparse.Namespace) -> int:
    import importlib

    try:
        # Imported by name: the module needs matplotlib, an extra (dpsql[plot]).
        plot = importlib.import_module("dpsql.plot")
    except ModuleNotFoundError as err:
        if err.name == "dpsql.plot":
            raise RuntimeError("dpsql plot is not available in this version") from None
        raise RuntimeError(f"dpsql plot needs {err.name}: pip install 'dpsql[plot]'") from None
    out = args.out or Path(f"{args.dataset}_privacy_utility.png")
    options: dict[str, Any] = {"mechanisms": args.mechanisms, "epsilons": args.epsilons}
    options["report"] = sys.stdout  # the numbers and the epsilon spent, then the file
    for key in ("model", "delta", "epochs", "seed", "runs", "metric"):  # else: the plot's own
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    with _connect(args.dsn) as db:
        try:
            plot.privacy_utility(db, args.dataset, test=args.test, path=str(out), **options)
        except ImportError as err:  # matplotlib, imported when the figure is made
            raise RuntimeError(str(err)) from None
    print(f"wrote {out}")
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


def main(argv: Sequence[str] | None = None) -> int:  # noqa: C901
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
        parser = _parser(argv)
        try:
            args = parser.parse_args(argv)
            if args.command == "train":  # its checks across options are usage errors too
                return _train_command(args, parser)
        except SystemExit as exit_:  # argparse exits on --help, --version and usage errors
            return exit_.code if isinstance(exit_.code, int) else EXIT_ERROR
        if args.command == "server":
            return _server_command(args)
        if args.command == "role":
            return _role_command(args)
        if args.command == "dataset":
            from dpsql import cli_datasets

            return cli_datasets.command(args, _connect)
        if args.command == "load":
            from dpsql import cli_load

            return cli_load.command(args, _connect)
        if args.command == "describe":
            from dpsql import cli_describe

            return cli_describe.command(args, _connect)
        if args.command == "tune":
            from dpsql import cli_tune

            return cli_tune.command(args, _connect)
        if args.command in ("evaluate", "predict"):
            from dpsql import cli_models

            run = cli_models.evaluate_command if args.command == "evaluate" else None
            return (run or cli_models.predict_command)(args, _connect)
        if args.command == "install-extension":
            return _install_command(args)
        if args.command == "configure-accountant":
            return _configure_accountant_command(args)
        if args.command == "plot":
            return _plot_command(args)
        return _listing_command(args)
    except _NoServer as err:
        print(err, file=sys.stderr)
        return EXIT_NOT_RUNNING
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`dpsql budgets --json | head`): no traceback, and no second
        # error when Python flushes stdout at exit (the Python docs' recipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as err:
        if not _reported(err):
            raise
        lines = _error_lines(err)
        # the CLI's flags
        if argv[:1] in (["dataset"], ["load"], ["evaluate"], ["predict"], ["describe"]):
            from dpsql.cli_datasets import cli_spelling

            lines = [cli_spelling(line) for line in lines]
        print("\n".join(lines), file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
