"""Does every mechanism learn at its defaults, or refuse? (issue 42, item 9)

Each mechanism of ``dpsql.mechanisms()`` is named with nothing but epsilon (and its own delta:
1e-6 where it needs one, else 0) and trained by the server on tables generated here, which
nobody tuned a default for:

* ``onehot``: 12 categorical columns one-hot encoded into d = 105 columns, registered with
  ``feature_bounds`` [0, 1] on every column (the shape of the census finding: each column is
  mapped onto [-1, 1], so a row is mostly -1 entries, then clipped to norm 1); majority class
  about 0.75;
* ``numeric``: six skewed positive columns divided by public maxima and by sqrt(6), so the rows
  lie in the unit ball, registered without feature bounds; majority class about 0.76;
  ``numeric4`` is its first four columns (the exponential mechanism takes p <= 5);
* ``regression``: 36,000 rows, 8 features on [-1, 1] by public bounds, labels with mean 20 and
  a label bound of 60 (the mean predictor's MSE about 37, as in the finding);
* ``mnist`` (optional, ``--datasets``): MNIST projected to 50 dimensions, 20,000 training rows,
  rows normalised (image data; one-vs-rest logistic for the private-ERM toolbox).

The baseline is the majority class of the training rows (accuracy) or the training mean (MSE),
both non-private. A cell is the mean ± sd over the seeds (shuffle seed and server noise); a
mechanism that refuses says why below its table, and a refusal charges nothing. "learns" means
the mean beats the baseline by more than 0.005 (accuracy) or 1% (MSE).

Usage::

    .venv/bin/python -m bench.default_learning [--seeds 3] [--eps 1,4] [--datasets onehot,numeric]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg

import dpsql
from bench.bolton_accuracy import _call_train, bench_server, header_lines

SCHEMA = "dpsql_bench_default_learning"
DELTA = 1e-6
CLASSIFIERS: dict[str, dict[str, Any]] = {
    "auto": {"privacy": "auto"},
    "bolt-on": {"privacy": "bolton"},
    "DP-SGD shuffle": {"privacy": "dpsgd"},
    "DP-SGD Poisson": {"privacy": "dpsgd", "sampling": "poisson"},
    "DPSGD-F": {"privacy": "dpsgd_f"},
    "DPSGD-F Alg. 2": {"privacy": "dpsgd_f_alg2"},
    "SCS13": {"privacy": "scs13"},
    "BST14": {"privacy": "bst14"},
    "objective perturbation": {"privacy": "objective_perturbation"},
    "output perturbation": {"privacy": "output_perturbation"},
    "DP-FTRL": {"privacy": "dp_ftrl"},
    "Frank-Wolfe": {"privacy": "frank_wolfe"},
    "exponential mechanism": {"privacy": "exponential_mechanism"},
}
REGRESSORS: dict[str, dict[str, Any]] = {
    "auto": {"privacy": "auto"},
    "DP-GD": {"privacy": "dpgd"},
    "AdaSSP": {"privacy": "adassp"},
    "DP-SGD": {"privacy": "dpsgd"},
    "DPSGD-F": {"privacy": "dpsgd_f"},
    "objective perturbation": {"privacy": "objective_perturbation"},
    "output perturbation": {"privacy": "output_perturbation"},
    "DP-FTRL": {"privacy": "dp_ftrl"},
    "Frank-Wolfe (LASSO)": {"privacy": "frank_wolfe", "model": "lasso"},
}


@dataclass
class Task:
    name: str
    note: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    registration: dict[str, Any]
    regression: bool = False
    model: str = "logistic"
    only: set[str] = field(default_factory=set)  # mechanisms to run (empty: all)
    dataset: str = ""
    test_table: str = ""

    @property
    def baseline(self) -> float:
        if self.regression:
            return float(np.mean((self.y_test - self.y.mean()) ** 2))
        values, counts = np.unique(self.y, return_counts=True)
        return float(np.mean(self.y_test == values[np.argmax(counts)]))


def _split(
    X: np.ndarray, y: np.ndarray, n_test: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return X[n_test:], y[n_test:], X[:n_test], y[:n_test]


def onehot_task(seed: int = 0, n: int = 30_000) -> Task:
    """12 categorical columns, 105 levels in all, one-hot; logit = sum of level effects."""
    rng = np.random.default_rng(seed)
    levels = [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 23]
    assert sum(levels) == 105
    cols: list[np.ndarray] = []
    logit = np.full(n, -2.3)
    for k in levels:
        p = rng.dirichlet(np.full(k, 2.0))  # unbalanced level frequencies
        z = rng.choice(k, size=n, p=p)
        effect = rng.normal(0.0, 0.6, size=k)
        logit += effect[z]
        cols.append(np.eye(k)[z])
    X = np.hstack(cols)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    bounds = [[0.0, 1.0]] * X.shape[1]
    return Task(
        "onehot",
        "12 categorical columns one-hot (d = 105), feature_bounds [0, 1] each",
        *_split(X, y, n // 5),
        registration={"labels": [0.0, 1.0], "feature_bounds": bounds},
    )


def _numeric(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = np.column_stack(
        [
            rng.gamma(2.0, 10.0, n),  # an age-like column
            rng.lognormal(3.0, 1.0, n),  # an income-like column
            rng.poisson(3.0, n).astype(float),
            rng.normal(40.0, 12.0, n).clip(0),  # hours
            rng.exponential(5.0, n),
            rng.integers(1, 17, n).astype(float),  # education years
        ]
    )
    maxima = np.array([100.0, 1000.0, 20.0, 99.0, 60.0, 16.0])  # public maxima of the columns
    X = np.minimum(raw, maxima) / maxima / np.sqrt(raw.shape[1])
    zs = (raw - raw.mean(0)) / raw.std(0)  # the truth, not anything a mechanism sees
    logit = -1.5 + zs @ np.array([0.8, 0.7, -0.3, 0.6, 0.0, 0.9])
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    return X, y


def numeric_task(seed: int = 0, n: int = 30_000, columns: int = 6) -> Task:
    X, y = _numeric(seed, n)
    X = X[:, :columns]
    return Task(
        "numeric" if columns == 6 else f"numeric{columns}",
        f"{columns} skewed positive columns / public maxima / sqrt(6), no feature bounds",
        *_split(X, y, n // 5),
        registration={"labels": [0.0, 1.0]},
        only=set() if columns == 6 else {"exponential mechanism"},
    )


def regression_task(seed: int = 0, n: int = 45_000) -> Task:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, 8)) * rng.uniform(0.3, 1.0, size=8)
    y = 20.0 + X @ rng.normal(0.0, 5.0, size=8) + rng.normal(0.0, 4.0, size=n)
    y = np.clip(y, -60.0, 60.0)
    bounds = [[-1.0, 1.0]] * 8
    return Task(
        "regression",
        "36,000 rows, 8 features on [-1, 1] (feature_bounds), label mean 20, label bound 60",
        *_split(X, y, n // 5),
        registration={"label_bound": 60.0, "feature_bounds": bounds},
        regression=True,
        model="linear",
    )


def mnist_task(n: int = 20_000) -> Task:
    from dpsql import datasets as dsets

    Xtr, ytr = dsets.load_mnist(split="train")
    Xte, yte = dsets.load_mnist(split="test")
    Xtr = dsets.normalize_rows(dsets.random_projection(Xtr, 50, seed=0))[:n]
    Xte = dsets.normalize_rows(dsets.random_projection(Xte, 50, seed=0))[: n // 4]
    return Task(
        "mnist",
        "MNIST projected to 50 dimensions, rows normalised, 10 classes",
        Xtr,
        ytr[:n].astype(np.float64),
        Xte,
        yte[: n // 4].astype(np.float64),
        registration={"labels": [float(c) for c in range(10)], "row_norm": "unit"},
        model="multinomial",
    )


TASKS = {
    "onehot": onehot_task,
    "numeric": numeric_task,
    "numeric4": lambda: numeric_task(columns=4),
    "regression": regression_task,
    "mnist": mnist_task,
}


def install(db: dpsql.Database, task: Task) -> None:
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    tag = time.time_ns()
    train = f"{SCHEMA}.{task.name}_train_{tag}"
    task.test_table = f"{SCHEMA}.{task.name}_test_{tag}"
    db.load_numpy(train, task.X, task.y, replace=True)
    db.load_numpy(task.test_table, task.X_test, task.y_test, replace=True)
    task.dataset = f"dl_{task.name}_{tag}"
    values = [
        "{" + ",".join(f"{{{b[0]!r},{b[1]!r}}}" for b in v) + "}" if k == "feature_bounds" else v
        for k, v in task.registration.items()
    ]
    args = ", ".join(
        f"{k} => %s::float8[]" if k == "feature_bounds" else f"{k} => %s" for k in task.registration
    )
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9,"
        f" delta_budget => 0.99, accept => true, name => %s, {args})",
        (train, task.dataset, *values),
    )


def _delta(db: dpsql.Database, privacy: str) -> float | None:
    if privacy == "auto":
        return None
    (needs,) = db.execute(
        "SELECT needs_delta FROM dpsql.mechanisms() WHERE name = %s", (privacy,)
    ).fetchone()
    return DELTA if needs else 0.0


SGD_FAMILY = ("auto", "bolton", "dpsgd", "scs13", "bst14", "dpsgd_f", "dpsgd_f_alg2")


def _model(task: Task, kw: dict[str, Any]) -> str:
    model: str = kw.get("model", task.model)
    if model == "multinomial" and kw["privacy"] not in SGD_FAMILY:
        return "logistic"  # the private-ERM toolbox: one-vs-rest
    return model


def run_task(  # noqa: C901
    db: dpsql.Database, task: Task, seeds: Sequence[int], eps_grid: Sequence[float]
) -> list[str]:
    mechanisms = REGRESSORS if task.regression else CLASSIFIERS
    if task.only:
        mechanisms = {k: v for k, v in mechanisms.items() if k in task.only}
    rows: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    notes: list[str] = []
    for eps in eps_grid:
        for label, kw in mechanisms.items():
            model = _model(task, kw)
            args: dict[str, Any] = {"privacy": kw["privacy"], "epsilon": eps}
            args |= {k: v for k, v in kw.items() if k not in ("model", "privacy")}
            delta = _delta(db, kw["privacy"])
            if delta is not None:
                args["delta"] = delta
            for seed in seeds:
                try:
                    mid = _call_train(db, task.dataset, (None, None, model), args | {"seed": seed})
                except (psycopg.Error, dpsql.NothingReleased) as err:
                    msg = getattr(getattr(err, "diag", None), "message_primary", None) or str(err)
                    notes.append(f"- {label}, eps {eps:g}: refused: {msg}")
                    break
                (value,) = db.execute(
                    "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, task.test_table)
                ).fetchone()
                rows[label][eps].append(float(value))
        print(f"#   {task.name}: eps {eps:g} done", flush=True)
    base = task.baseline
    metric = "test MSE" if task.regression else "test accuracy"
    out = [
        f"### {task.name}: {task.note}; n_train {len(task.y):,}, model {task.model}; "
        f"{len(seeds)} seed(s)",
        "",
        f"baseline ({'training mean' if task.regression else 'majority class'}): {base:.4f}",
        "",
        f"| mechanism ({metric}) | " + " | ".join(f"eps {e:g}" for e in eps_grid) + " |",
        "|---" * (len(eps_grid) + 1) + "|",
    ]
    for label in mechanisms:
        cells = []
        for e in eps_grid:
            vals = rows[label].get(e, [])
            if not vals:
                cells.append("refused")
                continue
            m = statistics.mean(vals)
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            learns = m < 0.99 * base if task.regression else m > base + 0.005
            cells.append(f"{m:.4f} ± {sd:.4f}{'' if learns else ' **no**'}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*out, "", *notes, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eps", default="1,4")
    parser.add_argument("--datasets", default="onehot,numeric,numeric4,regression")
    parser.add_argument("--mechanisms", default="", help="comma-separated labels (default all)")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    seeds = list(range(1, args.seeds + 1))
    eps_grid = [float(e) for e in args.eps.split(",")]
    lines = header_lines("default_learning")
    lines.append(f"# command: python -m bench.default_learning {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    wanted = set(filter(None, args.mechanisms.split(",")))
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            for name in args.datasets.split(","):
                task = TASKS[name]()
                if wanted:
                    task.only = (task.only & wanted) if task.only else wanted
                install(db, task)
                print("\n".join(["", *run_task(db, task, seeds, eps_grid)]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
