"""Private model selection from Python: ``dpsql.tune`` and ``dpsql.preview_tune``.

``tune`` trains candidates (``dpsql.train`` arguments without epsilon and delta, or ``auto``'s
own set) on a registered dataset, scores each privately on a validation dataset (a holdout:
``register_dataset(..., holdout=0.2)``), and releases only the best model; each dataset is
charged once, at most ``epsilon`` (and ``delta``), before any row is read
(docs/privacy.md, "Private selection"). :class:`dpsql.Database` exposes both as methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

__all__ = ["preview_tune", "tune"]


def _candidates(candidates: Sequence[Mapping[str, Any]] | None) -> Jsonb | None:
    if candidates is None:
        return None
    out = []
    for c in candidates:
        args = dict(c)
        privacy = args.get("privacy")
        if privacy is not None and not isinstance(privacy, str):
            # a mechanism object (dpsql.privacy): its name and settings
            sql_args = {k: v for k, v in privacy.sql_args().items() if v is not None}
            sql_args.pop("epsilon", None)
            sql_args.pop("delta", None)
            args = {**sql_args, **{k: v for k, v in args.items() if k != "privacy"}}
        if "lambda_" in args:
            args["lambda"] = args.pop("lambda_")
        out.append(args)
    return Jsonb(out)


def tune(
    conn: psycopg.Connection[Any],
    dataset: str,
    validation: str,
    epsilon: float,
    delta: float | None = None,
    candidates: Sequence[Mapping[str, Any]] | None = None,
    metric: str | None = None,
    noise_seed: int | None = None,
) -> int | None:
    """``dpsql.tune``: the released model's id (None: no run released a model; the charges
    stand)."""
    row = conn.execute(
        "SELECT dpsql.tune(%s, %s, %s, %s, candidates => %s, metric => %s, noise_seed => %s)",
        (dataset, validation, epsilon, delta, _candidates(candidates), metric, noise_seed),
    ).fetchone()
    assert row is not None
    return None if row[0] is None else int(row[0])


def preview_tune(
    conn: psycopg.Connection[Any],
    dataset: str,
    validation: str,
    epsilon: float,
    delta: float | None = None,
    candidates: Sequence[Mapping[str, Any]] | None = None,
    metric: str | None = None,
) -> dict[str, Any]:
    """``dpsql.preview_tune``: the candidates, the per-run budgets, what each dataset would be
    charged and its budget, or ``{"refused": {...}}``; nothing is charged or read."""
    row = conn.execute(
        "SELECT dpsql.preview_tune(%s, %s, %s, %s, candidates => %s, metric => %s)",
        (dataset, validation, epsilon, delta, _candidates(candidates), metric),
    ).fetchone()
    assert row is not None
    result: dict[str, Any] = row[0]
    return result
