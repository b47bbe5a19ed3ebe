"""The datasets a data owner's private ``fit(X, y)`` registers (dpsql.estimators).

scikit-learn's model selection (``cross_val_score``, ``GridSearchCV``) fits clones of one
estimator on subsets of the same rows. Each such fit is a release of those rows, so all of
them are charged to **one** registered dataset and its one budget. An estimator and its clones
(``sklearn.base.clone`` keeps the group; so do joblib's copies of them) share the dataset named
``dpsql_fit_<group>``, found in the server, so also across processes and connections; and, in
one process, fits whose rows share a row with an earlier fit's reuse that fit's dataset. Merging
budgets is the sound direction: two budgets for the same rows would let their releases spend
twice as much. The dataset's table is reloaded with each fit's rows and emptied after the
release (the model keeps no row); the same rows with other public declarations (labels,
bounds, row normalisation) are refused rather than given a second budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from psycopg import sql

if TYPE_CHECKING:
    from dpsql.connection import Database

__all__ = ["FitDataset", "empty", "fit_dataset"]

# In this process, per server and role: the datasets fits registered and the rows they saw.
_REGISTRY: dict[tuple[str, ...], list[FitDataset]] = {}


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


def _server(db: Database) -> tuple[str, ...]:
    info = db.conn.info
    return (str(info.host), str(info.port), info.dbname, info.user)


def _declared(declarations: dict[str, Any]) -> str:
    return json.dumps(declarations, sort_keys=True, default=float)


def _in_server(db: Database, name: str, declarations: dict[str, Any]) -> FitDataset | None:
    """The live dataset of this group registered by another connection or process."""
    row = db.execute(
        "SELECT n.nspname, obj_description(c.oid, 'pg_class') FROM dpsql.my_datasets d"
        " JOIN pg_class c ON c.relname = d.name JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE d.name = %s AND d.source = format('%%I.%%I', n.nspname, c.relname)",
        (name,),
    ).fetchone()
    if row is None:
        return None
    entry = FitDataset(name, row[0], declarations)
    _check(entry, row[1] or "")
    return entry


def _alive(db: Database, entry: FitDataset) -> bool:
    row = db.execute(
        "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL"
        " AND EXISTS (SELECT 1 FROM dpsql.my_datasets d WHERE d.name = %s)",
        (entry.schema, entry.name, entry.name),
    ).fetchone()
    return bool(row and row[0])


def _check(entry: FitDataset, declared: str) -> None:
    if declared != _declared(entry.declarations):
        raise ValueError(
            f"dpsql: these rows are registered as dataset {entry.name!r} with other public "
            f"declarations ({declared}); one budget per rows: fit with the same declarations, "
            "or register the table yourself and fit('name')"
        )


def fit_dataset(
    db: Database,
    X: np.ndarray,
    y: np.ndarray,
    *,
    group: str,
    schema: str,
    declarations: dict[str, Any],
    budget: tuple[float, float],
) -> FitDataset:
    """The registered dataset this fit's rows belong to, its table holding them now."""
    from dpsql.loading import load_numpy

    registry = _REGISTRY.setdefault(_server(db), [])
    # (a dataset dropped, or its table, since an earlier fit is forgotten)
    registry[:] = [e for e in registry if _alive(db, e)]
    keys = _row_keys(X, y)
    name = f"dpsql_fit_{group}"
    entry = next((e for e in registry if e.name == name or not e.rows.isdisjoint(keys)), None)
    if entry is not None:
        _check(entry, _declared(declarations))
    else:
        entry = _in_server(db, name, declarations)
        if entry is not None:
            registry.append(entry)
    if entry is not None:
        db.execute(sql.SQL("TRUNCATE {}").format(entry.table))
        load_numpy(db.conn, entry.table, X, y, create=False)
        entry.rows |= keys
        return entry
    entry = FitDataset(name, schema, declarations, keys)
    load_numpy(db.conn, name, X, y, schema=schema)
    db.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(
            entry.table, sql.Literal(_declared(declarations))
        )
    )
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
