"""Private evaluation (issue 44): the noisy metrics of ``dpsql.evaluate(model, '<dataset>',
epsilon => e)`` against the true metrics on the same rows.

The datasets and their cut are bench/tune_selection.py's: the registered table trains one model
(``auto`` at epsilon 1, delta auto's default; MSE models ``linear``), and the test table is
registered as a dataset of its own (the same declarations: labels and unit rows, or the label
and row bounds) so that it can be evaluated privately. The owner, who can read the test table,
gets the true metrics with ``dpsql.evaluate(model, 'schema.table')``.

At each epsilon in {0.05, 0.1, 0.5} (delta 0: discrete Laplace noise on the statistics, the
default; ``--delta`` for the Gaussian form) the private evaluation runs ``--repeats`` times with
fresh server noise. For the main metric (accuracy or MSE) and a secondary one (ROC AUC or R²)
the tables give the true value, the mean absolute error and the root mean squared error of the
noisy value against it, its mean signed error (bias), the mean of the noise sd that evaluate
reports for it (``metrics->'noise_sd'``), and how often the true value lies within 1.96 reported
sds. ``eps 1e4`` (an evaluation with negligible noise, the same statistics) separates what the
released statistics cannot say even without noise (the ROC AUC from 16 score bins, the clipped
sums) from the noise.

Usage::

    .venv/bin/python -m bench.private_evaluate [--repeats 30] [--datasets protein,hi]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import dpsql
from bench.bolton_accuracy import bench_server, header_lines
from bench.tune_selection import DATASETS, SCHEMA, Task, load_task

EPS_GRID = (0.05, 0.1, 0.5)
NOISELESS_EPS = 1e4
TRAIN_EPS = 1.0


def install(db: dpsql.Database, task: Task, tag: str) -> None:
    """Both tables, each registered as a dataset of its own (data owner)."""
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    task.registered_table = f"{SCHEMA}.eval_{task.name}{tag}"
    task.test_table = f"{SCHEMA}.eval_{task.name}_test{tag}"
    task.dataset = f"eval_{task.name}{tag}"
    db.load_numpy(task.registered_table, task.X, task.y, replace=True)
    db.load_numpy(task.test_table, task.X_test, task.y_test, replace=True)
    for table, name in ((task.registered_table, task.dataset), (task.test_table, test_name(task))):
        db.execute(f"ANALYZE {table}")
        if task.labels is not None:
            db.execute(
                "SELECT dpsql.register_dataset(%s, '{x}', 'y', labels => %s, row_norm => 'unit',"
                " epsilon_budget => 1e9, delta_budget => 0.99, accept => true, name => %s)",
                (table, task.labels, name),
            )
        else:
            db.execute(
                "SELECT dpsql.register_dataset(%s, '{x}', 'y', label_bound => %s, row_bound => %s,"
                " epsilon_budget => 1e9, delta_budget => 0.99, accept => true, name => %s)",
                (table, task.label_bound, float(np.sqrt(task.X.shape[1])), name),
            )


def test_name(task: Task) -> str:
    return f"{task.dataset}_test"


def train_model(db: dpsql.Database, task: Task) -> int:
    model = "linear" if task.labels is None else "logistic"
    row = db.execute(
        "SELECT dpsql.train(%s, NULL, NULL, %s, privacy => 'auto', epsilon => %s)",
        (task.dataset, model, TRAIN_EPS),
    ).fetchone()
    assert row is not None and row[0] is not None
    return int(row[0])


def evaluate(
    db: dpsql.Database, task: Task, model_id: int, eps: float | None, delta: float
) -> tuple[float, float, float | None, float | None]:
    """(main, secondary, main's noise sd, secondary's noise sd): private at ``eps`` on the test
    dataset, or non-private on the test table (``eps`` None, no sds)."""
    if eps is None:
        row = db.execute(
            "SELECT value, metrics FROM dpsql.evaluate(%s, %s)", (model_id, task.test_table)
        ).fetchone()
    else:
        row = db.execute(
            "SELECT value, metrics FROM dpsql.evaluate(%s, %s, epsilon => %s, delta => %s)",
            (model_id, test_name(task), eps, delta),
        ).fetchone()
    assert row is not None
    metrics: dict[str, Any] = row[1]
    sd = metrics.get("noise_sd", {})
    return (
        float(row[0]),
        float(metrics.get(task.secondary, math.nan)),  # R²: none when the variance is <= 0
        sd.get(task.metric),
        sd.get(task.secondary),
    )


def _stats(true: float, values: Sequence[float], sds: Sequence[float]) -> list[str]:
    """MAE, RMSE, mean error, mean and median reported sd, RMSE / mean sd, coverage (releases
    without the metric left out and counted)."""
    kept = [(v, s) for v, s in zip(values, sds, strict=True) if not math.isnan(v)]
    missing = f" ({len(values) - len(kept)} without it)" if len(kept) < len(values) else ""
    if not kept:
        return ["-"] * 6 + [f"0/0{missing}"]
    err = [v - true for v, _ in kept]
    sds = [s for _, s in kept]
    mae = statistics.mean(abs(e) for e in err)
    rmse = math.sqrt(statistics.mean(e * e for e in err))
    sd = statistics.mean(sds)
    covered = sum(abs(e) <= 1.96 * s for e, s in zip(err, sds, strict=True))
    return [
        f"{mae:.4f}",
        f"{rmse:.4f}",
        f"{statistics.mean(err):+.4f}",
        f"{sd:.4f}",
        f"{statistics.median(sds):.4f}",
        f"{rmse / sd:.2f}" if sd > 0 else "-",
        f"{covered}/{len(err)}{missing}",
    ]


def run_task(
    db: dpsql.Database, task: Task, eps_grid: Sequence[float], repeats: int, delta: float
) -> list[str]:
    mid = train_model(db, task)
    true_main, true_second, _, _ = evaluate(db, task, mid, None, delta)
    lines = [
        f"## {task.name}: {task.note}; model: auto at epsilon {TRAIN_EPS:g} on "
        f"{len(task.y):,} registered rows; private evaluation on the {len(task.y_test):,} "
        f"test rows registered as a dataset; delta {delta:g}; {repeats} repetitions per epsilon",
        "",
        f"true test {task.metric} {true_main:.4f}, {task.secondary} {true_second:.4f}",
        "",
        "| metric | eps | MAE | RMSE | mean error | mean reported sd | median reported sd "
        "| RMSE / mean sd | true within 1.96 reported sd |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for eps in (*eps_grid, NOISELESS_EPS):
        n = repeats if eps != NOISELESS_EPS else 3
        draws = [evaluate(db, task, mid, eps, delta) for _ in range(n)]
        for k, (name, true) in enumerate(((task.metric, true_main), (task.secondary, true_second))):
            values = [d[k] for d in draws]
            sds = [float(d[k + 2] or 0.0) for d in draws]
            cols = _stats(true, values, sds)
            lines.append(f"| {name} | {eps:g} | " + " | ".join(cols) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--eps", default=",".join(f"{e:g}" for e in EPS_GRID))
    parser.add_argument("--delta", type=float, default=0.0)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    eps_grid = [float(e) for e in args.eps.split(",")]
    lines = header_lines("private_evaluate")
    lines.append(f"# command: python -m bench.private_evaluate {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    tag = f"_{time.time_ns() % 10**9}" if args.dsn else ""
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            for name in args.datasets.split(","):
                t0 = time.perf_counter()
                try:
                    task = load_task(name)
                except FileNotFoundError as err:
                    print(f"# {name}: skipped ({err})", flush=True)
                    continue
                install(db, task, tag)
                section = run_task(db, task, eps_grid, args.repeats, args.delta)
                print(f"#   {name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
                print("\n".join(["", *section]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
