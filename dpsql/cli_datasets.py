"""``dpsql dataset register|alter|drop|grant|revoke|estimate-bounds``: a data owner's
registrations from the shell (the SQL functions of the same names; docs/registration.md)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

__all__ = ["add_parser", "cli_spelling", "command"]

_DSN_HELP = "server (default: $DPSQL_DSN or the running embedded one)"


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_parser(commands: Any) -> None:
    """The ``dataset`` command and its actions."""
    dataset = commands.add_parser(
        "dataset",
        help="register, alter, drop, grant and revoke datasets; estimate their bounds (data "
        "owners)",
        description="A data owner's registrations: `dpsql dataset register TABLE --features "
        "a,b --label y --epsilon-budget 5`, then grant it to analysts.",
    )
    actions = dataset.add_subparsers(dest="action", required=True, metavar="ACTION")
    register = actions.add_parser(
        "register",
        help="register a table with its public declarations and budget",
        description="Register a table (dpsql.register_dataset). Registration reads the rows "
        "once and refuses, with counts, rows that training would drop, zero-encode or clip "
        "unless --accept.",
    )
    register.add_argument("table", help="the table (schema-qualified if needed)")
    register.add_argument(
        "--features",
        type=_list,
        required=True,
        metavar="A,B",
        help="feature columns, comma-separated",
    )
    register.add_argument("--label", required=True, metavar="COLUMN", help="label column")
    register.add_argument("--epsilon-budget", type=float, required=True, metavar="EPS")
    register.add_argument("--delta-budget", type=float, default=0.0, metavar="DELTA")
    register.add_argument("--name", help="dataset name (default: the table's)")
    register.add_argument(
        "--labels",
        type=_list,
        metavar="NEG,POS",
        help="the label column's public values (binary: negative first)",
    )
    register.add_argument(
        "--categories",
        type=_json,
        metavar="JSON",
        help='categorical columns\' public values, e.g. \'{"colour": ["red", "blue"]}\'',
    )
    register.add_argument(
        "--feature-bounds",
        type=_json,
        metavar="JSON",
        help="public (lo, hi) per numeric feature, e.g. '[[0, 100], [0, 1]]'",
    )
    register.add_argument("--label-bound", type=float, help="regression: public bound on |y|")
    register.add_argument(
        "--holdout",
        type=float,
        metavar="FRACTION",
        help="also register this share of the rows as DATASET_holdout (validation and test: "
        "private evaluation and tuning), by a secret-keyed hash of --key",
    )
    register.add_argument(
        "--key",
        metavar="COLUMN",
        help="the holdout's row id column (integer, text or uuid; default: the primary key)",
    )
    register.add_argument(
        "--privacy-unit",
        metavar="COLUMN",
        help="the column naming the person a row belongs to: budgets then protect people, "
        "not rows (needs --max-rows-per-unit)",
    )
    register.add_argument(
        "--max-rows-per-unit",
        type=int,
        metavar="K",
        help="the rows each unit keeps (public): every read takes exactly K per unit",
    )
    register.add_argument(
        "--accept",
        action="store_true",
        help="register even if rows would be dropped, zero-encoded or clipped",
    )
    alter = actions.add_parser(
        "alter",
        help="change a dataset's budgets (never below what is spent), name or privacy unit",
        description="dpsql.alter_dataset: the registering owner (or a superuser); recorded in "
        "dpsql.dataset_history.",
    )
    alter.add_argument("dataset", help="dataset name or id")
    alter.add_argument("--epsilon-budget", type=float, metavar="EPS")
    alter.add_argument("--delta-budget", type=float, metavar="DELTA")
    alter.add_argument("--new-name", metavar="NAME")
    alter.add_argument(
        "--privacy-unit",
        metavar="COLUMN",
        help="while nothing is spent: the unit column ('' makes a row a unit again)",
    )
    alter.add_argument("--max-rows-per-unit", type=int, metavar="K")
    drop = actions.add_parser(
        "drop",
        help="retire a dataset: its name and table are free again; ledger and history stay",
    )
    drop.add_argument("dataset", help="dataset name or id")
    for verb, text in (
        ("grant", "allow a role to train on a dataset"),
        ("revoke", "withdraw a role's grant (its ledger entries stay)"),
    ):
        grant = actions.add_parser(verb, help=text)
        grant.add_argument("dataset", help="dataset name or id")
        grant.add_argument("role", help="the role")
    _add_estimate_bounds(actions)
    for action in (register, alter, drop, *actions.choices.values()):
        if not any(a.dest == "dsn" for a in action._actions):
            action.add_argument("--dsn", help=_DSN_HELP)


def _range(text: str) -> list[float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO,HI") from None
    return [lo, hi]


def _add_estimate_bounds(actions: Any) -> None:
    estimate = actions.add_parser(
        "estimate-bounds",
        help="private feature bounds of a dataset registered without them (charges epsilon)",
        description="Estimate each feature's lower and upper quantiles privately "
        "(dpsql.estimate_bounds) and register them as the dataset's feature bounds: for a "
        "dataset of numeric features registered without --feature-bounds. Charges EPS to the "
        "dataset's budget (delta 0), once; prints the bounds and what is left.",
    )
    estimate.add_argument("dataset", help="dataset name or id")
    estimate.add_argument(
        "--epsilon", type=float, required=True, metavar="EPS", help="epsilon to spend"
    )
    estimate.add_argument(
        "--search-range",
        type=_range,
        metavar="LO,HI",
        help="a public range that surely holds the quantiles (default -2^40,2^40; a wide "
        "range costs little); a negative LO needs the =: --search-range=-100,100",
    )
    estimate.add_argument(
        "--lower-quantile", type=float, metavar="Q", help="lower quantile (default 0.01)"
    )
    estimate.add_argument(
        "--upper-quantile", type=float, metavar="Q", help="upper quantile (default 0.99)"
    )


def _estimate_bounds(db: Any, args: argparse.Namespace) -> None:
    """``dataset estimate-bounds``: the bounds, the charge and the budget left."""
    from dpsql.cli_tables import LISTINGS, fetch, render_table

    bounds = db.estimate_bounds(
        args.dataset,
        args.epsilon,
        args.search_range,
        lower_quantile=args.lower_quantile,
        upper_quantile=args.upper_quantile,
    )
    named = [
        r
        for r in fetch(db.conn, LISTINGS["datasets"])
        if args.dataset in (r["name"], str(r["dataset_id"]))
    ]
    row = named[0] if named else {"name": args.dataset, "features": []}
    features = row["features"] if len(row["features"]) == len(bounds) else range(1, len(bounds) + 1)
    table = [
        {"feature": f, "lower": lo, "upper": hi}
        for f, (lo, hi) in zip(features, bounds, strict=True)
    ]
    print(f"registered feature bounds of {row['name']}:")
    print(render_table(table, ["feature", "lower", "upper"]))
    charged = f"charged epsilon {args.epsilon:g} (delta 0)"
    if "epsilon_remaining" in row:
        charged += (
            f"; left on {row['name']}: epsilon {row['epsilon_remaining']:g} of "
            f"{row['epsilon_budget']:g}"
        )
    print(charged)


def command(args: argparse.Namespace, connect: Callable[[str | None], Any]) -> int:
    """Run ``dpsql dataset ACTION``; prints what was done."""
    with connect(args.dsn) as db:
        if args.action == "estimate-bounds":
            _estimate_bounds(db, args)
        elif args.action == "register":
            from dpsql.cli_models import warnings_to_stderr

            with warnings_to_stderr(db.conn):
                dataset_id = db.register_dataset(
                    args.table,
                    args.features,
                    args.label,
                    epsilon_budget=args.epsilon_budget,
                    delta_budget=args.delta_budget,
                    labels=args.labels,
                    feature_bounds=args.feature_bounds,
                    name=args.name,
                    label_bound=args.label_bound,
                    categories=args.categories,
                    accept=args.accept,
                    holdout=args.holdout,
                    key=args.key,
                    privacy_unit=args.privacy_unit,
                    max_rows_per_unit=args.max_rows_per_unit,
                )
            print(f"registered dataset {args.name or args.table} (id {dataset_id})")
            if args.holdout is not None:
                held = f"{args.name or args.table.split('.')[-1]}_holdout"
                print(f"registered dataset {held}: {args.holdout:g} of the rows, its own budget")
        elif args.action == "alter":
            db.alter_dataset(
                args.dataset,
                epsilon_budget=args.epsilon_budget,
                delta_budget=args.delta_budget,
                new_name=args.new_name,
                privacy_unit=args.privacy_unit,
                max_rows_per_unit=args.max_rows_per_unit,
            )
            print(f"altered dataset {args.new_name or args.dataset}")
        elif args.action == "drop":
            db.drop_dataset(args.dataset)
            print(f"dropped dataset {args.dataset}")
        else:
            getattr(db, f"{args.action}_dataset")(args.dataset, args.role)
            print(
                f"{args.action} {args.dataset} {'to' if args.action == 'grant' else 'from'} "
                f"{args.role}"
            )
    return 0


def cli_spelling(text: str) -> str:
    """The server's SQL spellings in a message or hint, as this command's flags (issue 42: the
    CLI printed "pass accept => true" and "labels => ARRAY['no', 'yes']")."""

    def flag(match: re.Match[str]) -> str:
        return "--" + match.group(1).replace("_", "-") + " "

    text = re.sub(
        r"labels => ARRAY\[([^\]]*)\]",
        lambda m: "--labels " + ",".join(v.strip().strip("'") for v in m.group(1).split(",")),
        text,
    )
    text = re.sub(r"\baccept => true\b", "--accept", text)
    return re.sub(r"\b([a-z_]+) => ", flag, text)
