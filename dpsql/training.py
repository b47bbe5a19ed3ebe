"""The Python controller: drives a training run's server-side steps with a progress bar.

The server does the work (``dpsql_internal._prepare`` shuffles the source into a training table,
``dpsql_internal._run_epoch`` runs one aggregate scan, ``dpsql_internal._finish`` stores the
model); this module only calls them in order, so SQL's ``dpsql.train`` and Python's
``Database.train`` share one implementation. Model states stay in the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from tqdm.auto import tqdm

# Argument order and names of dpsql_internal._prepare (sql/install/30_runs.sql).
_PREPARE_ARGS = (
    "source",
    "features",
    "label",
    "model",
    "epochs",
    "batch_size",
    "lambda",
    "step_size",
    "schedule",
    "step_offset",
    "radius",
    "shuffle",
    "seed",
    "labels",
    "intercept",
    "row_norm",
    "huber_h",
    "tolerance",
    "parallel_workers",
    "shard_parallel",
)


def train_args(
    *, features: Sequence[str] | str, lambda_: float, labels: Sequence[float] | None, **kwargs: Any
) -> dict[str, Any]:
    """Arguments of ``dpsql_internal._prepare`` from Python keyword arguments (checked by the
    server)."""
    args = dict(kwargs)
    args["features"] = [features] if isinstance(features, str) else list(features)
    args["lambda"] = float(lambda_)
    args["labels"] = None if labels is None else [float(v) for v in labels]
    missing = set(_PREPARE_ARGS) - set(args)
    unknown = set(args) - set(_PREPARE_ARGS)
    if missing or unknown:
        raise TypeError(f"dpsql: bad training arguments (missing {missing}, unknown {unknown})")
    return args


@dataclass
class TrainingRun:
    """A run in progress on the server, identified by its ``run_id``."""

    conn: psycopg.Connection
    run_id: int
    epochs: int
    history: list[float] = field(default_factory=list)

    @classmethod
    def prepare(cls, conn: psycopg.Connection, args: dict[str, Any]) -> TrainingRun:
        """Shuffle the source into a training table and create the run's initial state."""
        query = sql.SQL("SELECT dpsql_internal._prepare({})").format(
            sql.SQL(", ").join(
                sql.SQL("{} => {}").format(sql.Identifier(name), sql.Placeholder())
                for name in _PREPARE_ARGS
            )
        )
        row = conn.execute(query, [args[name] for name in _PREPARE_ARGS]).fetchone()
        assert row is not None
        return cls(conn, int(row[0]), int(args["epochs"]))

    def run_epoch(self) -> tuple[int, float, bool]:
        """One epoch; returns (epoch, training objective, done)."""
        row = self.conn.execute(
            "SELECT epoch, objective, done FROM dpsql_internal._run_epoch(%s)", (self.run_id,)
        ).fetchone()
        assert row is not None
        self.history.append(row[1])
        return int(row[0]), float(row[1]), bool(row[2])

    def run_epochs(self, *, progress: bool = True) -> list[float]:
        """Epochs until the run is done (its epoch count or its tolerance)."""
        with tqdm(
            total=self.epochs, desc="dpsql epochs", unit="epoch", disable=None if progress else True
        ) as bar:
            done = False
            while not done:
                _, objective, done = self.run_epoch()
                bar.set_postfix(objective=f"{objective:.6g}")
                bar.update(1)
        return self.history

    def finish(self) -> int:
        """Store the model; returns its ``model_id``."""
        row = self.conn.execute("SELECT dpsql_internal._finish(%s)", (self.run_id,)).fetchone()
        assert row is not None
        return int(row[0])

    def abort(self) -> None:
        """Drop the run's training table and state."""
        self.conn.execute("SELECT dpsql_internal._abort(%s)", (self.run_id,))
