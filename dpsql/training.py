"""The Python controller: drives a training run's server-side steps with a progress bar.

The server does the work (``dpsql_internal._prepare`` shuffles the source into a training table,
``dpsql_internal._run_epoch`` runs one aggregate scan, ``dpsql_internal._finish`` stores the
model); this module only calls them in order, so SQL's ``dpsql.train`` and Python's
``Database.train`` share one implementation. Model states stay in the server.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from tqdm import tqdm

try:  # a notebook's bar needs ipywidgets: without it tqdm.auto warns on every bar
    import ipywidgets  # type: ignore[import-not-found]  # noqa: F401
    from tqdm.auto import tqdm
except ImportError:
    pass

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


# dpsql_internal._progress (sql/install/30_runs.sql): "dpsql: <unit> <done>/<total>".
_PROGRESS = re.compile(r"dpsql: (\w+) (\d+)/(\d+)$")
_CALIBRATING = "dpsql: calibrating"


@contextlib.contextmanager
def server_progress(
    conn: psycopg.Connection, desc: str, *, enabled: bool
) -> Iterator[list[tuple[str, int, int]]]:
    """A tqdm bar (on a terminal) fed by the progress NOTICEs of the server-side run inside
    the block: libpq hands them over as they arrive, while the statement runs. Yields the
    (unit, done, total) events seen."""
    events: list[tuple[str, int, int]] = []
    if not enabled:
        yield events
        return
    bars: dict[str, tqdm[Any]] = {}

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith(_CALIBRATING):
            tqdm.write(message, file=sys.stderr)
            return
        match = _PROGRESS.match(message)
        if match is None:
            return
        unit, done, total = match.group(1), int(match.group(2)), int(match.group(3))
        events.append((unit, done, total))
        bar = bars.get(unit)
        if bar is None or bar.total != total or done < bar.n:
            if bar is not None:
                bar.close()
            bar = bars[unit] = tqdm(total=total, desc=desc, unit=unit, disable=None)
        bar.update(done - bar.n)

    conn.add_notice_handler(on_notice)
    try:
        yield events
    finally:
        conn.remove_notice_handler(on_notice)
        for bar in bars.values():
            bar.close()


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
        query = sql.SQL("SELECT (dpsql_internal._prepare({})).run_id").format(
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
