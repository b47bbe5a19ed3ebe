"""A model's metrics from Python: ``dpsql.evaluate`` and ``dpsql.preview_evaluate``.

Two paths, as in SQL (docs/privacy.md, "Private evaluation"):

- on a table or query the caller can read, the exact metrics (no ``epsilon``);
- on a registered dataset, with ``epsilon`` (and ``delta``), noisy metrics computed in the
  server from statistics released once and charged to that dataset's budget: an analyst needs
  no SELECT on its table. Each metric's noise standard deviation is under ``"noise_sd"``, the
  released statistics under ``"private"``.

:class:`dpsql.Database` exposes both as methods; the functions here take a connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

__all__ = ["evaluate", "preview_evaluate", "result_of_row"]


def result_of_row(row: Sequence[Any]) -> dict[str, Any]:
    """The dict of one ``dpsql.evaluate`` row (``metric, value, rows, baseline, metrics``): every
    metric by name, ``rows``, ``baseline`` (the main metric's), the baseline's metrics under
    ``"baselines"`` and, for a private evaluation, ``"noise_sd"`` and ``"private"``."""
    metric, value, rows, baseline, metrics = row
    out = dict(metrics or {})
    baselines = out.pop("baseline", {})
    return {**out, metric: value, "rows": rows, "baseline": baseline, "baselines": baselines}


def evaluate(
    conn: psycopg.Connection[Any],
    model_id: int,
    source: str,
    features: Sequence[str] | str | None = None,
    label: str | None = None,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    noise_seed: int | None = None,
) -> dict[str, Any]:
    """``dpsql.evaluate``: exact metrics on a readable ``source``, or private ones on a
    registered dataset when ``epsilon`` is given (one charge of ``(epsilon, delta)``).
    ``noise_seed`` is for tests by roles that can read the rows (the result is not private)."""
    feats = [features] if isinstance(features, str) else features
    row = conn.execute(
        "SELECT metric, value, rows, baseline, metrics FROM dpsql.evaluate(%s, %s, %s, %s,"
        " epsilon => %s, delta => %s, noise_seed => %s)",
        (
            int(model_id),
            source,
            None if feats is None else list(feats),
            label,
            epsilon,
            delta,
            noise_seed,
        ),
    ).fetchone()
    assert row is not None
    return result_of_row(row)


def preview_evaluate(
    conn: psycopg.Connection[Any],
    model_id: int,
    dataset: str,
    epsilon: float,
    delta: float = 0.0,
) -> dict[str, Any]:
    """``dpsql.preview_evaluate``: what a private evaluation would charge (``epsilon``,
    ``delta``, ``dp_event``, ``budget``) or its refusal under ``"refused"``; nothing is
    charged and no row is read."""
    row = conn.execute(
        "SELECT dpsql.preview_evaluate(%s, %s, %s, %s)", (int(model_id), dataset, epsilon, delta)
    ).fetchone()
    assert row is not None
    result: dict[str, Any] = row[0]
    return result
