"""The listing commands of the CLI (``dpsql datasets|budgets|models|ledger|mechanisms``): which
view each reads, the columns its text table shows, and the rendering (aligned text or JSON).

Each listing reads the views analysts are granted (sql/install/29_views.sql), never the catalog
tables: the server's row filter then decides what the caller sees, for analysts and data owners
alike. The text table keeps the columns a person scans; ``--json`` prints every column.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

__all__ = ["LISTINGS", "Listing", "fetch", "render_json", "render_table"]


@dataclass(frozen=True)
class Listing:
    """One listing command: its help, its query and the columns of its text table."""

    help: str
    query: str  # every column; "{where}" takes the --dataset filter (or nothing)
    columns: tuple[str, ...]
    dataset_column: str | None  # the dataset name the --dataset filter compares, if any


LISTINGS: dict[str, Listing] = {
    "datasets": Listing(
        help="datasets you may train on: public schema and remaining budget",
        # a text label's values as the label (its classes are trained as 0, 1, ...), and the
        # categorical features with their category counts (issue 42)
        query="SELECT *, coalesce(label_values::text[], labels::text[]) AS label_set,"
        " (SELECT string_agg(format('%%s(%%s)', k, jsonb_array_length(v)), ',' ORDER BY k)"
        "    FROM jsonb_each(categories) AS c(k, v)) AS categorical"
        " FROM dpsql.my_datasets {where} ORDER BY dataset_id",
        columns=(
            "dataset_id",
            "name",
            "source",
            "features",
            "label",
            "label_set",
            "categorical",
            "epsilon_budget",
            "epsilon_remaining",
            "delta_budget",
            "delta_remaining",
            "privacy_unit",
            "max_rows_per_unit",
        ),
        dataset_column="name",
    ),
    "budgets": Listing(
        help="privacy budgets of your datasets: total, spent, remaining",
        query="SELECT * FROM dpsql.budgets {where} ORDER BY dataset_id",
        columns=(
            "dataset_id",
            "name",
            "epsilon_budget",
            "epsilon_spent",
            "epsilon_remaining",
            "delta_budget",
            "delta_spent",
            "delta_remaining",
            "dropped_at",
        ),
        dataset_column="name",
    ),
    "models": Listing(
        help="stored models you may see (analysts: private releases of their datasets)",
        # dpsql.budgets names the dataset: analysts may not read the dpsql.datasets table, and
        # the budgets view also keeps datasets whose table was dropped.
        query="SELECT m.*, b.name AS dataset, CASE WHEN m.dataset_id IS NULL THEN m.source"
        " ELSE b.name END AS source FROM dpsql.models m"
        " LEFT JOIN dpsql.budgets b ON b.dataset_id = m.dataset_id {where} ORDER BY m.model_id",
        columns=(
            "model_id",
            "model",
            "dataset",
            "privacy",
            "epsilon",
            "delta",
            "epochs_run",
            "created_by",
            "created_at",
            "source",  # last; a private model's is its dataset's name (its query is internal)
        ),
        dataset_column="b.name",
    ),
    "ledger": Listing(
        help="the privacy ledger: every charge to your datasets' budgets",
        query="SELECT * FROM dpsql.ledger {where} ORDER BY entry_id",
        columns=(
            "entry_id",
            "dataset",
            "model_id",
            "mechanism",
            "epsilon",
            "delta",
            "role",
            "charged_at",
            "outcome",
            "note",
        ),
        dataset_column="dataset",
    ),
    "mechanisms": Listing(
        help="the privacy mechanisms the server offers (names for `dpsql train --privacy`)",
        query="SELECT * FROM dpsql.mechanisms() {where}",
        columns=("name", "task", "models", "needs_delta", "distributed", "docs"),
        dataset_column=None,
    ),
}


def fetch(
    conn: psycopg.Connection, listing: Listing, dataset: str | None = None
) -> list[dict[str, Any]]:
    """The listing's rows as dicts (every column), only ``dataset``'s when given."""
    where: sql.Composable = sql.SQL("")
    params: list[Any] = []
    if dataset is not None:
        if listing.dataset_column is None:
            raise ValueError("dpsql: this listing has no --dataset filter")
        where = sql.SQL("WHERE {} = %s").format(
            sql.SQL(".").join(map(sql.Identifier, listing.dataset_column.split(".")))
        )
        params.append(dataset)
    query = sql.SQL(listing.query).format(where=where)
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


def _cell(value: Any) -> str:
    """A value as a person reads it: short numbers, timestamps to the second, lists joined."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | decimal.Decimal):
        return f"{value:g}"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, list | tuple):
        inner = ",".join(_cell(v) for v in value)
        return inner if not any(isinstance(v, list | tuple) for v in value) else f"[{inner}]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool)


# Longer cells are cut (with "..."): one long query or feature list would widen every line.
MAX_CELL = 60


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Aligned columns under a header (numbers right-aligned, as psql does); ``(no rows)``
    under the header when there are none, so an empty answer is not mistaken for a failure.
    Cells longer than MAX_CELL are cut; ``--json`` has them whole."""
    cells = [[_cut(_cell(row.get(c))) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [
        bool(rows) and all(row.get(c) is None or _is_number(row.get(c)) for row in rows)
        for c in columns
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [line(list(columns)), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in cells] if cells else ["(no rows)"]
    return "\n".join(lines)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def render_json(rows: Sequence[dict[str, Any]] | dict[str, Any]) -> str:
    """JSON for scripts: every column, timestamps in ISO 8601."""
    return json.dumps(rows, indent=2, default=_json_value)
