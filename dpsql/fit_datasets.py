"""The datasets a data owner's private ``fit(X, y)`` registers (dpsql.estimators).

scikit-learn's model selection (``cross_val_score``, ``GridSearchCV``) fits clones of one
estimator on subsets of the same rows. Each such fit is a release of those rows, so all of
them are charged to **one** registered dataset and its one budget. An estimator and its clones
(``sklearn.base.clone`` keeps the group; so do joblib's copies of them) share the dataset named
``dpsql_fit_<group>``; and fits whose rows share a row with an earlier fit's reuse that fit's
dataset. Both are found in the server, so the rule holds across connections and processes: each
fit dataset's row fingerprints (16-byte BLAKE2b digests of the rows, never the rows) are kept
in the data owner's table ``<schema>.dpsql_row_keys``, which only they can read. Merging budgets
is the sound direction: two budgets for the same rows would let their releases spend twice as
much. The dataset's table is reloaded with each fit's rows and emptied after the release (the
model keeps no row); the same rows with other public declarations (labels, bounds, row
normalisation) are refused rather than given a second budget.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from psycopg import sql

if TYPE_CHECKING:
    from dpsql.connection import Database

__all__ = ["FitDataset", "empty", "fit_dataset"]

KEYS_TABLE = "dpsql_row_keys"


@dataclass
class FitDataset:
    """One registered dataset of estimator fits: its table and declarations."""

    name: str
    schema: str
    declarations: dict[str, Any]
    reused: bool = False  # registered by an earlier fit (of this process or another)

    @property
    def table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


def _row_keys(X: np.ndarray, y: np.ndarray) -> list[bytes]:
    rows = np.ascontiguousarray(np.column_stack([X, y]), dtype=np.float64)
    return sorted({hashlib.blake2b(r.tobytes(), digest_size=16).digest() for r in rows})


def _declared(declarations: dict[str, Any]) -> str:
    return json.dumps(declarations, sort_keys=True, default=float)


# The caller's live fit datasets: name, schema, declarations (the table's comment), and
# whether the schema holds the caller's fingerprints.
_FITS = r"""
SELECT d.name, n.nspname, obj_description(c.oid, 'pg_class'),
       coalesce(has_table_privilege(to_regclass(format('%%I.%%I', n.nspname, %s::text)),
                                    'SELECT, INSERT'), false)
  FROM dpsql.my_datasets d
  JOIN pg_class c ON c.relname = d.name JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE d.name LIKE 'dpsql\_fit\_%%' AND d.source = format('%%I.%%I', n.nspname, c.relname)
   AND pg_get_userbyid(c.relowner) = session_user
"""


def _existing(
    db: Database, name: str, keys: list[bytes], declarations: dict[str, Any]
) -> FitDataset | None:
    """The dataset of this group, else the one whose rows share a row with these."""
    fits = db.execute(_FITS, (KEYS_TABLE,)).fetchall()
    found = next((f for f in fits if f[0] == name), None)
    shares = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE dataset = %s AND key = ANY(%s))")
    for fit in fits if found is None else []:
        if fit[3]:
            hit = db.execute(shares.format(sql.Identifier(fit[1], KEYS_TABLE)), (fit[0], keys))
            if (hit.fetchone() or (False,))[0]:
                found = fit
                break
    if found is None:
        return None
    entry = FitDataset(found[0], found[1], declarations, reused=True)
    _check(entry, found[2] or "")
    return entry


def _check(entry: FitDataset, declared: str) -> None:
    if declared != _declared(entry.declarations):
        raise ValueError(
            f"dpsql: these rows are registered as dataset {entry.name!r} with other public "
            f"declarations ({declared}); one budget per rows: fit with the same declarations, "
            "or register the table yourself and fit('name')"
        )


def _keep_keys(db: Database, entry: FitDataset, keys: list[bytes]) -> None:
    table = sql.Identifier(entry.schema, KEYS_TABLE)
    db.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (dataset text NOT NULL, key bytea NOT NULL,"
            " PRIMARY KEY (dataset, key))"
        ).format(table)
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {} (dataset, key) SELECT %s, unnest(%s::bytea[]) ON CONFLICT DO NOTHING"
        ).format(table),
        (entry.name, keys),
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
    categories: dict[str, list[Any]] | None = None,
) -> FitDataset:
    """The registered dataset this fit's rows belong to, its table holding them now.

    ``X`` is already encoded (one array column); ``categories`` says how its text columns
    were (column name or position -> public values): part of the rows' public declarations,
    compared with an earlier fit's like the others, but not registered (the table has no text
    column left).
    """
    from dpsql.loading import load_numpy

    registered = declarations
    if categories:
        declarations = {**declarations, "categories": categories}
    keys = _row_keys(X, y)
    name = f"dpsql_fit_{group}"
    # One fit at a time per role decides which dataset the rows are (two processes fitting
    # the same new rows at once would otherwise register two).
    lock = (
        "SELECT pg_advisory_lock(hashtext('dpsql fit datasets ' || session_user))",
        "SELECT pg_advisory_unlock(hashtext('dpsql fit datasets ' || session_user))",
    )
    db.execute(lock[0])
    try:
        entry = _existing(db, name, keys, declarations)
        if entry is not None:
            db.execute(sql.SQL("TRUNCATE {}").format(entry.table))
            load_numpy(db.conn, entry.table, X, y, create=False)
            _keep_keys(db, entry, keys)
            return entry
        entry = FitDataset(name, schema, declarations)
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
            **registered,
        )
        _keep_keys(db, entry, keys)
        return entry
    finally:
        db.execute(lock[1])


def empty(db: Database, entry: FitDataset) -> None:
    """The released model keeps no row: the table is emptied (the dataset, its ledger and the
    rows' fingerprints stay for the next fit of the same rows)."""
    db.execute(sql.SQL("TRUNCATE {}").format(entry.table))
