"""The datasets a data owner's private ``fit(X, y)`` registers (dpsql.estimators).

scikit-learn's model selection (``cross_val_score``, ``GridSearchCV``) fits clones of one
estimator on overlapping subsets of the same rows. Each such fit is a release of those rows, so
all of them are charged to **one** registered dataset and its one budget: the fits of one
:class:`dpsql.Database` whose rows share any row with an earlier fit's reuse that fit's
dataset, its table reloaded with the new rows (merging budgets is the sound direction: two
budgets for the same rows would let their releases spend twice as much). The table is emptied
after each fit, since the released model keeps no row. Rows registered with other public
declarations (labels, bounds, row normalisation) are refused rather than given a second
budget.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from psycopg import sql

if TYPE_CHECKING:
    from dpsql.connection import Database

__all__ = ["FitDataset", "fit_dataset"]


@dataclass
class FitDataset:
    """One registered dataset of estimator fits: its table, declarations and rows seen."""

    name: str
    schema: str
    declarations: dict[str, Any]
    rows: set[bytes] = field(default_factory=set)

    @property
    def table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


def _row_keys(X: np.ndarray, y: np.ndarray) -> set[bytes]:
    rows = np.ascontiguousarray(np.column_stack([X, y]), dtype=np.float64)
    return {r.tobytes() for r in rows}


def fit_dataset(
    db: Database,
    X: np.ndarray,
    y: np.ndarray,
    *,
    schema: str,
    declarations: dict[str, Any],
    budget: tuple[float, float],
) -> FitDataset:
    """The registered dataset this fit's rows belong to, its table holding them now."""
    from dpsql.loading import load_numpy

    registry: list[FitDataset] = db.__dict__.setdefault("_fit_datasets", [])
    keys = _row_keys(X, y)
    for known in registry:
        if known.rows.isdisjoint(keys):
            continue
        if known.declarations != declarations:
            raise ValueError(
                f"dpsql: these rows are registered as dataset {known.name!r} with other public "
                f"declarations ({known.declarations}); one budget per rows: fit with the same "
                "declarations, or register the table yourself and fit('name')"
            )
        db.execute(sql.SQL("TRUNCATE {}").format(known.table))
        load_numpy(db.conn, known.table, X, y, create=False)
        known.rows |= keys
        return known
    name = f"dpsql_fit_{uuid.uuid4().hex[:12]}"
    entry = FitDataset(name, schema, declarations, keys)
    load_numpy(db.conn, name, X, y, schema=schema)
    epsilon_budget, delta_budget = budget
    db.register_dataset(
        f"{schema}.{name}",
        "x",
        "y",
        name=name,
        epsilon_budget=epsilon_budget,
        delta_budget=delta_budget,
        accept=True,  # the estimator's declarations: rows outside them are clipped or dropped
        **declarations,
    )
    registry.append(entry)
    return entry


def empty(db: Database, entry: FitDataset) -> None:
    """The released model keeps no row: the table is emptied (the dataset and its ledger stay
    for the next fit of the same rows)."""
    db.execute(sql.SQL("TRUNCATE {}").format(entry.table))
