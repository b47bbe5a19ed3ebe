"""``dpsql evaluate MODEL_ID TABLE`` and ``dpsql predict MODEL_ID TABLE``: a stored model's
metrics on a table and its predictions row by row, from the shell (the SQL functions
``dpsql.evaluate``, ``dpsql.predict_label`` and ``dpsql.predict_row``).

Both read the rows with the caller's rights, as the SQL functions do: an analyst evaluates and
predicts on a table granted to them (a held-out test table). ``dpsql evaluate MODEL_ID DATASET
--epsilon E`` evaluates privately on a registered dataset instead: noisy metrics charged to its
budget, no SELECT needed (``--dry-run``: what it would charge, nothing charged).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

__all__ = ["add_parsers", "evaluate_command", "predict_command"]

_DSN_HELP = "server (default: $DPSQL_DSN or the running embedded one)"


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_parsers(commands: Any) -> None:
    """The ``evaluate`` and ``predict`` commands."""
    evaluate = commands.add_parser(
        "evaluate",
        help="a model's metrics on a table, next to the baseline's (majority class or mean)",
        description="Compute a stored model's metrics over the rows of a table or view "
        "(dpsql.evaluate, in the server): accuracy, balanced accuracy, ROC AUC, log loss and "
        "F1 for classifiers, MSE, MAE and R2 for regression, each next to the baseline's "
        "(predicting the majority class, or the mean, on the same rows). Without --epsilon "
        "the rows are read with your rights (a test table); with --epsilon TABLE names a "
        "registered dataset, evaluated privately: noisy metrics, each with its noise sd, "
        "charged to the dataset's budget (docs/privacy.md, 'Private evaluation').",
    )
    evaluate.add_argument("model_id", type=int, metavar="MODEL_ID", help="the model's id")
    evaluate.add_argument(
        "table",
        help="the table or view of test rows ([schema.]table), or with --epsilon a registered "
        "dataset's name",
    )
    evaluate.add_argument(
        "--epsilon",
        type=float,
        metavar="E",
        help="evaluate the registered dataset TABLE privately, charging E to its budget",
    )
    evaluate.add_argument(
        "--delta",
        type=float,
        metavar="D",
        help="with --epsilon: > 0 for Gaussian noise (default 0: discrete Laplace)",
    )
    evaluate.add_argument(
        "--dry-run",
        action="store_true",
        help="with --epsilon: show what the evaluation would charge; nothing is charged",
    )
    evaluate.add_argument(
        "--features",
        type=_list,
        metavar="A,B",
        help="the table's feature columns, if not named as the model's",
    )
    evaluate.add_argument("--label", metavar="COLUMN", help="the label column, if not the model's")
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.add_argument("--dsn", help=_DSN_HELP)

    predict = commands.add_parser(
        "predict",
        help="a model's predictions for the rows of a table",
        description="Predict every row of a table or view with a stored model "
        "(dpsql.predict_label, dpsql.predict_row): the predicted label (classifiers; binary "
        "ones also the probability or score of the positive class) or value (regression), "
        "with the row's label when the table has the model's label column. The rows are read "
        "with your rights.",
    )
    predict.add_argument("model_id", type=int, metavar="MODEL_ID", help="the model's id")
    predict.add_argument("table", help="the table or view of rows to predict ([schema.]table)")
    predict.add_argument(
        "--key", metavar="COLUMN", help="a column to print first, to match rows (e.g. an id)"
    )
    predict.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    output = predict.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON")
    output.add_argument("--csv", action="store_true", help="print CSV (with a header)")
    predict.add_argument("--dsn", help=_DSN_HELP)


@contextmanager
def warnings_to_stderr(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The server's warnings ("no better than the baseline") as ``warning:`` lines."""

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "WARNING":
            print(f"warning: {diag.message_primary}", file=sys.stderr)

    conn.add_notice_handler(on_notice)
    try:
        yield
    finally:
        conn.remove_notice_handler(on_notice)


def evaluate_command(args: argparse.Namespace, connect: Callable[[str | None], Any]) -> int:
    """Run ``dpsql evaluate``: a table of metrics (model, baseline), or JSON."""
    from dpsql.cli_tables import render_json, render_table

    if args.epsilon is None and (args.delta is not None or args.dry_run):
        print(
            "error: --delta and --dry-run go with --epsilon (a private evaluation)", file=sys.stderr
        )
        return 2
    with connect(args.dsn) as db, warnings_to_stderr(db.conn):
        if args.dry_run:
            preview = db.preview_evaluate(
                args.model_id, args.table, args.epsilon, args.delta or 0.0
            )
            print(render_json({"model_id": args.model_id, "dataset": args.table, **preview}))
            return 1 if "refused" in preview else 0
        model = db.model(args.model_id)
        result = db.evaluate(
            model, args.table, args.features, args.label, epsilon=args.epsilon, delta=args.delta
        )
    if args.json:
        print(render_json({"model_id": args.model_id, "source": args.table, **result}))
        return 0
    baselines = result.get("baselines") or {}
    noise = result.get("noise_sd") or {}
    main = "accuracy" if "accuracy" in result else "mse"
    rows = [
        {
            "metric": name,
            "model": value,
            "baseline": baselines.get(name),
            **({"noise_sd": noise.get(name)} if noise else {}),
        }
        for name, value in sorted(result.items(), key=lambda kv: (kv[0] != main, kv[0]))
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and name != "rows"
        and name != "baseline"
    ]
    print(f"model {model.model_id} ({model.model}) on {args.table}: {result['rows']} rows")
    print(render_table(rows, ["metric", "model", "baseline", *(["noise_sd"] if noise else [])]))
    predictor = baselines.get("predictor")
    if predictor:
        print(f"baseline: predicting the {predictor}")
    if noise:
        private = result.get("private") or {}
        print(
            f"private: epsilon {private.get('epsilon')}, delta {private.get('delta')}, "
            f"{private.get('mechanism')} noise (model and baseline both noisy)"
        )
    return 0


def _relation(conn: psycopg.Connection[Any], table: str) -> sql.Identifier:
    """The table named as SQL reads an identifier ([schema.]table, unquoted parts
    lowercased): never a query."""
    from dpsql.load_table import table_identifier

    return table_identifier(conn, table)


def predict_command(args: argparse.Namespace, connect: Callable[[str | None], Any]) -> int:
    """Run ``dpsql predict``: one line per row (a text table, JSON or CSV)."""
    from dpsql.cli_tables import render_json, render_table

    if args.limit is not None and args.limit < 0:
        raise ValueError(f"dpsql: --limit must be >= 0, got {args.limit}")
    with connect(args.dsn) as db:
        model = db.model(args.model_id)
        relation = _relation(db.conn, args.table)
        columns = _columns(db.conn, relation)
        if args.key is not None and args.key not in columns:
            raise ValueError(
                f"dpsql: {args.table} has no column {args.key!r} (--key): its columns are "
                + ", ".join(columns)
            )
        query, names = _predict_query(model, relation, columns, args.key, args.limit)
        with db.conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(query).fetchall()
    if args.json:
        print(render_json(rows))
    elif args.csv:
        out = io.StringIO()
        writer = csv.DictWriter(out, names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        print(out.getvalue(), end="")
    else:
        print(render_table(rows, names))
    return 0


def _columns(conn: psycopg.Connection[Any], relation: sql.Identifier) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(relation))
        return [c.name for c in cur.description or ()]


def _predict_query(
    model: Any, relation: sql.Identifier, columns: list[str], key: str | None, limit: int | None
) -> tuple[sql.Composed, list[str]]:
    """The query of the predictions and its column names: ``row`` (the table's order), the
    key, the label (when the table has it), ``predicted`` and, for a binary classifier, the
    probability (logistic) or score of the positive class."""
    m = sql.Literal(model.model_id)
    label = model.row.get("label")
    parts: list[sql.Composable] = [sql.SQL("row_number() OVER () AS row")]
    names = ["row"]
    for column in (key, label if label in columns and label != key else None):
        if column is not None:
            parts.append(
                sql.SQL("r -> {} AS {}").format(sql.Literal(column), sql.Identifier(column))
            )
            names.append(column)
    if model.classes_ is None:  # regression
        parts.append(sql.SQL("dpsql.predict_row({}, r) AS predicted").format(m))
        names.append("predicted")
    else:
        parts.append(sql.SQL("dpsql.predict_label({}, r) AS predicted").format(m))
        names.append("predicted")
        if model.weights_.ndim == 1:  # binary: the probability or score of the positive class
            score = "probability" if model.model == "logistic" else "score"
            parts.append(sql.SQL("dpsql.predict_row({}, r) AS {}").format(m, sql.Identifier(score)))
            names.append(score)
    query = sql.SQL("SELECT {} FROM (SELECT to_jsonb(t) AS r FROM {} t{}) s").format(
        sql.SQL(", ").join(parts),
        relation,
        sql.SQL("") if limit is None else sql.SQL(" LIMIT {}").format(sql.Literal(limit)),
    )
    return query, names
