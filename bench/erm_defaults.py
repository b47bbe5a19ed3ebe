"""The private-ERM toolbox at its defaults on data nobody tuned for (issue 25, item 3).

Each of objective perturbation, output perturbation, DP-FTRL, Frank-Wolfe and the exponential
mechanism is called with epsilon, delta (1e-6; 0 for the pure-DP exponential mechanism) and
intercept only, on scikit-learn's bundled breast_cancer (binary), digits (ten classes, one-vs-rest),
digits binarised (0/1 pixels, a one-hot-like design, binary task "digit < 5"), a seeded synthetic
one-hot design (8 categorical columns of 6 levels, binary), diabetes (regression), and, when
/work/shared/datasets is there, Protein, MNIST-50 and California housing. Next to each: the
majority class of the test set (accuracy) or the training mean (test MSE). Features are mapped
onto [-1, 1] by public per-feature bounds (the declared domain of each column) except the 0/1
designs, registered as they are; rows are clipped to norm 1 (classification) or to sqrt(d)
(regression, label_bound the declared range of y).

Usage::

    .venv/bin/python -m bench.erm_defaults [--seeds 2] [--eps 0.1,1,4] [--only dp_ftrl]
                                           [--data breast_cancer,digits,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg

import dpsql
from bench.bolton_accuracy import _call_train, bench_server, header_lines
from dpsql import datasets as dsets

DELTA = 1e-6
SCHEMA = "dpsql_bench_ermdef"
MECHANISMS = (
    "objective_perturbation",
    "output_perturbation",
    "dp_ftrl",
    "frank_wolfe",
    "exponential_mechanism",
)


@dataclass
class Task:
    name: str
    X: np.ndarray
    y: np.ndarray
    labels: list[float] | None  # None: regression
    bounds: np.ndarray | None  # d x 2 public feature bounds, or None (rows as they are)
    label_bound: float | None = None

    @property
    def regression(self) -> bool:
        return self.labels is None


def _split(X: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return dsets.train_test_split(len(y), test_fraction=0.3, seed=seed)


def _sklearn(name: str) -> Task:
    from sklearn import datasets as skd

    if name == "breast_cancer":
        X, y = skd.load_breast_cancer(return_X_y=True)
        # declared domain: [0, 1.5 x the largest value] per column (a data owner's round bound)
        return Task(
            name, X, y.astype(float), [0.0, 1.0], np.c_[np.zeros(X.shape[1]), 1.5 * X.max(0)]
        )
    if name == "digits":
        X, y = skd.load_digits(return_X_y=True)
        return Task(
            name,
            X,
            y.astype(float),
            [float(c) for c in range(10)],
            np.tile([0.0, 16.0], (X.shape[1], 1)),
        )
    if name == "digits_binary":
        X, y = skd.load_digits(return_X_y=True)
        return Task(name, (X > 7).astype(float), (y < 5).astype(float), [0.0, 1.0], None)
    if name == "diabetes":
        X, y = skd.load_diabetes(return_X_y=True, scaled=False)
        lo, hi = np.floor(X.min(0)) - 1, np.ceil(X.max(0)) + 1
        return Task(name, X, y, None, np.c_[lo, hi], label_bound=400.0)
    raise ValueError(name)


def one_hot_task(n: int = 6000, columns: int = 8, levels: int = 6, seed: int = 0) -> Task:
    """Seeded categorical design, one-hot encoded (each row has `columns` ones): the label is
    the sign of a sum of per-level effects plus logistic noise."""
    rng = np.random.default_rng(seed)
    cats = rng.integers(0, levels, size=(n, columns))
    effects = rng.normal(size=(columns, levels))
    score = effects[np.arange(columns), cats].sum(1)
    y = (score + rng.logistic(size=n) > 0).astype(float)
    X = np.zeros((n, columns * levels))
    X[np.arange(n)[:, None], np.arange(columns) * levels + cats] = 1.0
    return Task("one_hot", X, y, [0.0, 1.0], None)


def _shared(name: str) -> Task:
    if name == "protein":
        X, y = dsets.load_protein()
        return Task(name, X, y.astype(float), [0.0, 1.0], None)
    if name == "mnist":
        X, y = dsets.load_mnist(split="train")
        X = dsets.random_projection(X, 50, seed=0)
        return Task(name, X, y.astype(float), [float(c) for c in range(10)], None)
    if name == "cal_housing":
        raw, value = dsets.load_cal_housing()
        X = dsets.cal_housing_features(raw)
        return Task(
            name, X, value / 100_000.0, None, np.tile([-1.0, 1.0], (X.shape[1], 1)), 5.00001
        )
    raise ValueError(name)


LOADERS: dict[str, Callable[[], Task]] = {
    "breast_cancer": lambda: _sklearn("breast_cancer"),
    "digits": lambda: _sklearn("digits"),
    "digits_binary": lambda: _sklearn("digits_binary"),
    "one_hot": one_hot_task,
    "diabetes": lambda: _sklearn("diabetes"),
    "protein": lambda: _shared("protein"),
    "mnist": lambda: _shared("mnist"),
    "cal_housing": lambda: _shared("cal_housing"),
}


def install(db: dpsql.Database, task: Task) -> tuple[str, str, float]:
    """Load and register the train split; return (dataset, test table, trivial score)."""
    tr, te = _split(task.X, task.y)
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    train, test = f"{SCHEMA}.{task.name}_train", f"{SCHEMA}.{task.name}_test"
    db.load_numpy(train, task.X[tr], task.y[tr], replace=True)
    db.load_numpy(test, task.X[te], task.y[te], replace=True)
    name = f"ermdef_{task.name}_{time.time_ns()}"
    bounds = None if task.bounds is None else task.bounds.tolist()
    if task.regression:
        db.execute(
            "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9, accept => true,"
            " delta_budget => 0.99, label_bound => %s, feature_bounds => %s, row_bound => %s,"
            " name => %s)",
            (
                train,
                task.label_bound,
                bounds,
                None if bounds else float(np.sqrt(task.X.shape[1])),
                name,
            ),
        )
        trivial = float(np.mean((task.y[te] - task.y[tr].mean()) ** 2))
    else:
        db.execute(
            "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9, accept => true,"
            " delta_budget => 0.99, labels => %s, feature_bounds => %s, name => %s)",
            (train, task.labels, bounds, name),
        )
        counts = np.unique(task.y[te], return_counts=True)[1]
        trivial = float(counts.max() / counts.sum())
    return name, test, trivial


def run(
    db: dpsql.Database, task: Task, mechanisms: list[str], eps_grid: list[float], seeds: list[int]
) -> list[str]:
    dataset, test, trivial = install(db, task)
    metric = "test MSE" if task.regression else "test accuracy"
    out = [
        f"### {task.name}: n {len(task.y):,} (70% train), d {task.X.shape[1]}, {metric}; "
        f"{'training mean' if task.regression else 'majority class'} {trivial:.4f}",
        "",
        "| mechanism | intercept | " + " | ".join(f"eps {e:g}" for e in eps_grid) + " |",
        "|---|---" + "|---" * len(eps_grid) + "|",
    ]
    notes: list[str] = []
    for mech in mechanisms:
        for intercept in (False, True):
            cells = []
            for eps in eps_grid:
                vals: list[float] = []
                for seed in seeds:
                    model = (
                        ("lasso" if mech == "frank_wolfe" else "linear")
                        if task.regression
                        else "logistic"
                    )
                    args: dict[str, Any] = {
                        "privacy": mech,
                        "epsilon": eps,
                        "delta": 0.0 if mech == "exponential_mechanism" else DELTA,
                        "intercept": intercept,
                        "seed": seed,
                    }
                    try:
                        mid = _call_train(db, dataset, (None, None, model), args)
                    except (psycopg.Error, dpsql.NothingReleased) as err:
                        msg = getattr(getattr(err, "diag", None), "message_primary", None) or str(
                            err
                        )
                        notes.append(f"- {mech} (intercept {intercept}), eps {eps:g}: {msg}")
                        break
                    (val,) = db.execute(
                        "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, test)
                    ).fetchone()
                    vals.append(float(val))
                if not vals:
                    cells.append("refused")
                    continue
                worse = (
                    (statistics.mean(vals) > trivial)
                    if task.regression
                    else (statistics.mean(vals) <= trivial + 1e-9)
                )
                cells.append(f"{statistics.mean(vals):.4g}{' ✗' if worse else ''}")
            out.append(f"| {mech} | {intercept} | " + " | ".join(cells) + " |")
            print(out[-1], file=sys.stderr, flush=True)
    return [*out, "", *sorted(set(notes)), ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--eps", default="0.1,1,4")
    parser.add_argument("--only", help="comma list of mechanisms")
    parser.add_argument("--data", default="breast_cancer,digits,digits_binary,one_hot,diabetes")
    parser.add_argument("--dsn")
    args = parser.parse_args(argv)
    eps_grid = [float(e) for e in args.eps.split(",")]
    seeds = list(range(1, args.seeds + 1))
    mechanisms = args.only.split(",") if args.only else list(MECHANISMS)
    lines = header_lines("erm_defaults")
    lines.append(f"# command: python -m bench.erm_defaults {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            db.execute("SET client_min_messages = error")
            for name in args.data.split(","):
                try:
                    task = LOADERS[name]()
                except FileNotFoundError as err:
                    print(f"# {name}: skipped ({err})")
                    continue
                print("\n".join(["", *run(db, task, mechanisms, eps_grid, seeds)]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
