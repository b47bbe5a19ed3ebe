"""Private exploratory statistics of a registered dataset (``dpsql.describe``, docs/describe.md).

The server computes and noises everything (sql/install/60_describe.sql) and charges the
dataset's ledger once; here the answer is only fetched and shaped: as records (dicts), as a
pandas DataFrame (pandas is optional: ``pip install pandas``), or as the CLI's table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

__all__ = ["COLUMNS", "describe_records", "preview_describe", "render", "to_frame"]

#: The columns of ``dpsql.describe``'s answer, in order.
COLUMNS = ("feature", "statistic", "key", "value", "noise_sd")


def _features(features: Sequence[str] | str | None) -> list[str] | None:
    if features is None:
        return None
    return [features] if isinstance(features, str) else [str(f) for f in features]


def describe_records(
    conn: psycopg.Connection[Any],
    dataset: str,
    epsilon: float,
    delta: float = 0.0,
    features: Sequence[str] | str | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``dpsql.describe(dataset, epsilon, delta, features)`` as dicts (keys
    :data:`COLUMNS`). Charges ``(epsilon, delta)`` to the dataset's ledger, once."""
    rows = conn.execute(
        "SELECT feature, statistic, key, value, noise_sd FROM dpsql.describe(%s, %s, %s, %s)",
        (dataset, epsilon, delta, _features(features)),
    ).fetchall()
    return [dict(zip(COLUMNS, row, strict=True)) for row in rows]


def preview_describe(
    conn: psycopg.Connection[Any],
    dataset: str,
    epsilon: float,
    delta: float = 0.0,
    features: Sequence[str] | str | None = None,
) -> dict[str, Any]:
    """What :func:`describe_records` would charge (``dpsql.preview_describe``): the epsilon
    split (``plan``), the ``dp_event``, the budget before and after, and under ``"refused"``
    the refusal it would meet. Charges nothing and reads no value."""
    row = conn.execute(
        "SELECT dpsql.preview_describe(%s, %s, %s, %s)",
        (dataset, epsilon, delta, _features(features)),
    ).fetchone()
    assert row is not None
    result: dict[str, Any] = row[0]
    return result


def to_frame(records: Sequence[dict[str, Any]]) -> Any:
    """The records as a pandas DataFrame with the columns :data:`COLUMNS`."""
    try:
        import pandas as pd  # type: ignore[import-untyped,unused-ignore]
    except ModuleNotFoundError:
        raise ImportError(
            "dpsql: describe returns a pandas DataFrame: pip install pandas (or 'dpsql[sklearn]'); "
            "dpsql.describe.describe_records(db.conn, ...) gives the same rows as dicts"
        ) from None
    return pd.DataFrame(list(records), columns=list(COLUMNS))


def render(records: Sequence[dict[str, Any]]) -> str:
    """The records as a person reads them: the row count, then the statistics
    in one table (numbers at 4 significant digits, with the noise standard deviation)."""
    from dpsql.cli_tables import render_table

    def number(value: Any) -> str:
        return "" if value is None else f"{value:.4g}"

    rows = [r for r in records if r["statistic"] != "rows"]
    count = next((r["value"] for r in records if r["statistic"] == "rows"), None)
    lines = [] if count is None else [f"{int(count)} rows (public)"]
    summary = [
        {
            "feature": r["feature"],
            "statistic": r["statistic"] if r["key"] is None else f"{r['statistic']} {r['key']}",
            "value": number(r["value"]),
            "± noise sd": number(r["noise_sd"]),
        }
        for r in rows
    ]
    lines.append(render_table(summary, ["feature", "statistic", "value", "± noise sd"]))
    return "\n".join(lines)
