"""The private-ERM toolbox (issue 12) against the mechanisms dpsql already had.

Accuracy (Protein, binary, d = 74; MNIST projected to 50 dimensions, ten classes: one-vs-rest
for the binary mechanisms) and test MSE (California housing, d = 8 + intercept) for epsilon in
{0.1, 0.5, 1, 2, 4}: objective perturbation (epsilon-DP and Gaussian), output perturbation of
the certified minimiser, DP-FTRL, private Frank-Wolfe (L1 ball; LASSO for regression) and the
exponential mechanism (refused beyond p = 5: every dataset here), next to the bolt-on, DP-SGD
(shuffled and Poisson), DP-GD, AdaSSP and diffprivlib, all at their defaults from public
numbers (docs/defaults.md and each mechanism's page). Then LASSO's support recovery on a sparse
synthetic design, a one-feature regression where the exponential mechanism runs, and the
wall time of one release against noiseless training on Protein.

delta = 1e-6 unless a row says delta 0 (epsilon-DP). Each cell is the mean (± sd) over
``--seeds`` runs (shuffle seed and fresh server noise).

Usage::

    .venv/bin/python -m bench.erm_toolbox [--seeds 2] [--quick] [--sections mnist,...]
                                          [--only DP-FTRL]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

import dpsql
from bench import auto_defaults as ad
from bench.bolton_accuracy import (
    _call_train,
    bench_server,
    header_lines,
    install_data,
    load_bench_data,
)
from dpsql import datasets as dsets

NEW_CLASSIFIERS: dict[str, dict[str, Any]] = {
    "objective perturbation (delta 0)": {"privacy": "objective_perturbation", "delta": 0.0},
    "objective perturbation (Gaussian)": {"privacy": "objective_perturbation"},
    "output perturbation (delta 0)": {"privacy": "output_perturbation", "delta": 0.0},
    "DP-FTRL": {"privacy": "dp_ftrl"},
    "Frank-Wolfe (L1 ball)": {"privacy": "frank_wolfe"},
    "exponential mechanism": {"privacy": "exponential_mechanism", "delta": 0.0},
}
BASE_CLASSIFIERS: dict[str, dict[str, Any]] = {
    "bolt-on Alg. 1": {"privacy": "bolton"},
    "DP-SGD shuffle": {"privacy": "dpsgd"},
    "DP-SGD Poisson": {"privacy": "dpsgd", "sampling": "poisson"},
}
NEW_REGRESSORS: dict[str, dict[str, Any]] = {
    "objective perturbation (Huber, delta 0)": {
        "privacy": "objective_perturbation",
        "delta": 0.0,
    },
    "objective perturbation (Huber, Gaussian)": {"privacy": "objective_perturbation"},
    "output perturbation (Huber, delta 0)": {"privacy": "output_perturbation", "delta": 0.0},
    "DP-FTRL": {"privacy": "dp_ftrl"},
    "Frank-Wolfe LASSO": {"privacy": "frank_wolfe", "model": "lasso"},
    "exponential mechanism": {"privacy": "exponential_mechanism", "delta": 0.0},
}
BASE_REGRESSORS: dict[str, dict[str, Any]] = {
    "DP-GD": {"privacy": "dpgd"},
    "AdaSSP": {"privacy": "adassp"},
}
# The figure's panels (at most ~8 lines each, issue 42): the toolbox, then what dpsql had.
PLOT_GROUPS: ad.Groups = {
    "test accuracy": (
        ("private ERM", tuple(NEW_CLASSIFIERS)),
        ("before", (*BASE_CLASSIFIERS, "diffprivlib LogisticRegression (eps-DP)")),
    ),
    "test MSE": (
        ("private ERM", tuple(NEW_REGRESSORS)),
        ("before", (*BASE_REGRESSORS, "diffprivlib LinearRegression (eps-DP)")),
    ),
}


def lasso_support(db: dpsql.Database, seeds: list[int], eps_grid: tuple[float, ...]) -> list[str]:
    """Sparse design: n = 20000, p = 40, 4 non-zero coefficients of 0.5 (||theta*||_1 = 2);
    x uniform on [-1, 1] (public feature bounds), |y| <= 3. Support recovery: the share of the true
    support among the 4 largest |coef| of the release."""
    rng = np.random.default_rng(0)
    n, p = 20000, 40
    X = rng.uniform(-1, 1, size=(n, p))
    theta = np.zeros(p)
    support = [3, 11, 22, 35]
    theta[support] = [0.5, -0.5, 0.5, -0.5]
    y = np.clip(X @ theta + 0.1 * rng.normal(size=n), -3, 3)
    schema = "dpsql_bench_erm"
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    db.load_numpy("sparse", X, y, schema=schema, replace=True)
    name = f"erm_sparse_{time.time_ns()}"
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9, accept => true,"
        " delta_budget => 0.99, label_bound => 3, feature_bounds => %s, name => %s)",
        (f"{schema}.sparse", [[-1.0, 1.0] for _ in range(p)], name),
    )
    out = [
        f"## LASSO support recovery: n {n:,}, p {p}, 4-sparse theta* (||theta*||_1 = 2)",
        "",
        "| method | " + " | ".join(f"eps {e:g}" for e in eps_grid) + " |",
        "|---" * (len(eps_grid) + 1) + "|",
    ]
    methods: dict[str, dict[str, Any]] = {
        "Frank-Wolfe LASSO (l1_radius 2)": {
            "privacy": "frank_wolfe",
            "model": "lasso",
            "options": {"l1_radius": 2.0},
        },
        "Frank-Wolfe LASSO (l1_radius 2, 30 steps)": {
            "privacy": "frank_wolfe",
            "model": "lasso",
            "options": {"l1_radius": 2.0, "steps": 30},
        },
        "AdaSSP": {"privacy": "adassp"},
    }
    for label, kw in methods.items():
        cells = []
        for eps in eps_grid:
            hits: list[float] = []
            for seed in seeds:
                try:
                    mid = _call_train(
                        db,
                        name,
                        (None, None, kw.get("model", "linear")),
                        {
                            "epsilon": eps,
                            "delta": ad.DELTA,
                            "seed": seed,
                            **{k: v for k, v in kw.items() if k != "model"},
                        },
                    )
                except psycopg.Error as err:
                    cells.append(f"refused ({err.diag.message_primary or err})")
                    break
                (coef,) = db.execute(
                    "SELECT coef FROM dpsql.models WHERE model_id = %s", (mid,)
                ).fetchone()
                top = set(np.argsort(-np.abs(np.asarray(coef)))[:4])
                hits.append(len(top & set(support)) / 4)
            else:
                cells.append(f"{statistics.mean(hits):.2f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*out, ""]


def small_p(db: dpsql.Database, seeds: list[int], eps_grid: tuple[float, ...]) -> list[str]:
    """Where the exponential mechanism runs: California housing on median income alone
    (p = 2 with the intercept), test MSE."""
    raw, value = dsets.load_cal_housing()
    X = dsets.cal_housing_features(raw)[:, 7:8]
    y = value / 100_000.0
    train, test = dsets.train_test_split(len(y), test_fraction=0.2, seed=0)
    schema = "dpsql_bench_erm"
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    db.load_numpy("income", X[train], y[train], schema=schema, replace=True)
    db.load_numpy("income_test", X[test], y[test], schema=schema, replace=True)
    name = f"erm_income_{time.time_ns()}"
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9, accept => true,"
        " delta_budget => 0.99, label_bound => 5.00001, row_bound => 1, name => %s)",
        (f"{schema}.income", name),
    )
    methods: dict[str, dict[str, Any]] = {
        "exponential mechanism (radius 5)": {
            "privacy": "exponential_mechanism",
            "delta": 0.0,
            "options": {"radius": 5.0},
        },
        "objective perturbation (delta 0)": {"privacy": "objective_perturbation", "delta": 0.0},
        "DP-GD": {"privacy": "dpgd"},
        "AdaSSP": {"privacy": "adassp"},
    }
    out = [
        f"## small p: California housing on median income (p = 2 with intercept), "
        f"n_train {len(train):,}, test MSE",
        "",
        "| method | " + " | ".join(f"eps {e:g}" for e in eps_grid) + " |",
        "|---" * (len(eps_grid) + 1) + "|",
    ]
    for label, kw in methods.items():
        cells = []
        for eps in eps_grid:
            mses: list[float] = []
            for seed in seeds:
                try:
                    mid = _call_train(
                        db,
                        name,
                        (None, None, "linear"),
                        {"epsilon": eps, "delta": ad.DELTA, "seed": seed, "intercept": True} | kw,
                    )
                except psycopg.Error as err:
                    cells.append(f"refused ({err.diag.message_primary or err})")
                    break
                (mse,) = db.execute(
                    "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, f"{schema}.income_test")
                ).fetchone()
                mses.append(mse)
            else:
                cells.append(f"{statistics.mean(mses):.4f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    baseline = float(np.mean((y[test] - np.mean(y[train])) ** 2))
    means = " | ".join(f"{baseline:.4f}" for _ in eps_grid)
    return [*out, f"| training mean (non-private) | {means} |", ""]


def runtime(db: dpsql.Database, data: Any) -> list[str]:
    """Wall time of one release at eps = 1 against the data owner's noiseless 10-epoch run
    with the same shuffle (one run each, same server)."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    db.execute(
        "SELECT dpsql.train(%s, '{x}', 'y', 'logistic', epochs => 10, row_norm => 'unit',"
        " labels => %s, seed => 1)",
        (data.train_table, data.labels),
    )
    times["noiseless SGD, 10 epochs"] = time.perf_counter() - t0
    for label, kw in {**NEW_CLASSIFIERS, **BASE_CLASSIFIERS}.items():
        t0 = time.perf_counter()
        try:
            _call_train(
                db,
                data.dataset,
                (None, None, "logistic"),
                {"epsilon": 1.0, "delta": ad.DELTA, "seed": 1, **kw},
            )
        except psycopg.Error:
            continue
        times[label] = time.perf_counter() - t0
    base = times["noiseless SGD, 10 epochs"]
    return [
        f"## wall time of one release, {data.name} (m = {data.m:,}, d = {data.d}), eps 1",
        "",
        "| method | seconds | / noiseless |",
        "|---|---|---|",
        *(f"| {k} | {v:.2f} | {v / base:.2f} |" for k, v in times.items()),
        "",
    ]


SECTIONS = ("protein", "mnist", "cal_housing", "lasso", "small_p", "runtime")


def _only(table: dict[str, dict[str, Any]], only: str | None) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in table.items() if only is None or only.lower() in k.lower()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help=f"eps in {ad.QUICK_EPS}, 1 seed")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}"
    )
    parser.add_argument("--only", help="the accuracy tables' methods whose label contains this")
    parser.add_argument(
        "--plot", type=Path, default=Path(__file__).parent / "figures" / "erm_toolbox.png"
    )
    parser.add_argument("--numbers", type=Path, help="also save the numbers here (JSON)")
    parser.add_argument(
        "--replot", type=Path, metavar="JSON", help="only draw --plot from saved --numbers"
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        ad._plot(args.plot, ad.load_numbers(args.replot), PLOT_GROUPS)
        print(f"# plot: {args.plot}")
        return 0
    seeds = [1] if args.quick else list(range(1, args.seeds + 1))
    eps_grid = ad.QUICK_EPS if args.quick else ad.EPS_GRID
    sections = set(args.sections.split(","))
    lines = header_lines("erm_toolbox")
    lines.append(f"# command: {' '.join(['python -m bench.erm_toolbox', *(argv or sys.argv[1:])])}")
    print("\n".join(lines), flush=True)
    datasets, skipped = load_bench_data([d for d in ("protein", "mnist") if d in sections])
    classifiers = _only({**NEW_CLASSIFIERS, **BASE_CLASSIFIERS}, args.only)
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            db.execute("SET client_min_messages = error")
            for data in datasets:
                install_data(db, data, "")
                # MNIST: one-vs-rest logistic for every mechanism (the binary ones' only way)
                rows = ad.classification(db, data, seeds, eps_grid, classifiers, "logistic")
                print("\n".join(["", *rows]), flush=True)
            with contextlib.suppress(FileNotFoundError):
                if "cal_housing" in sections:
                    X, y, note, lower = ad._cal_housing()
                    regressors = _only({**NEW_REGRESSORS, **BASE_REGRESSORS}, args.only)
                    rows = ad.regression(
                        db, "cal_housing", X, y, note, lower, seeds, eps_grid, regressors
                    )
                    print("\n".join(["", *rows]), flush=True)
            if "lasso" in sections:
                print("\n".join(["", *lasso_support(db, seeds, eps_grid)]), flush=True)
            with contextlib.suppress(FileNotFoundError):
                if "small_p" in sections:
                    print("\n".join(["", *small_p(db, seeds, eps_grid)]), flush=True)
            if datasets and "runtime" in sections:
                print("\n".join(["", *runtime(db, datasets[0])]), flush=True)
    if ad.PANELS and args.numbers is not None:
        ad.save_numbers(args.numbers, eps_grid)
    if ad.PANELS and sections == set(SECTIONS) and args.only is None:
        ad._plot(args.plot, eps_grid, PLOT_GROUPS)
        print(f"# plot: {args.plot}")
    for note in skipped:
        print(f"# {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
