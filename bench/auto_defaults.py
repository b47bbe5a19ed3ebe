"""``privacy => 'auto'`` against every mechanism at its defaults, diffprivlib and scikit-learn
(issues 10 and 25).

What a new user gets with only epsilon (and delta) given. Every model is trained and released by
the server with the SQL defaults of ``dpsql.train`` except the privacy arguments (the intercept
too: its default is true since 0.8.0):

* classification: Protein (KDD Cup 2004, binary, d = 74), MNIST projected to 50 dimensions (ten
  classes, model ``multinomial``; the private-ERM mechanisms, which take no multinomial model,
  train one-vs-rest ``logistic``) and HI (a public census-style table with five categorical
  columns one-hot encoded, bench/public_tables.py), rows normalised to the unit sphere at
  registration, and HI's five numeric columns alone (a low-dimensional numeric task): every
  classification mechanism of ``dpsql.mechanisms()`` at its defaults;
* regression: California housing (d = 8) and diamonds (log price, three categorical columns
  one-hot, d = 26), features scaled by public bounds: every regression mechanism at its defaults.

Each mechanism runs in its own form: delta = 1e-6 for those that need a delta, delta = 0
(pure epsilon-DP) for the others (bolt-on, SCS13, objective and output perturbation,
Frank-Wolfe, the exponential mechanism); ``auto`` runs with both. diffprivlib
(``LogisticRegression`` with ``data_norm=1`` on unit rows, ``LinearRegression`` with the public
bounds) is epsilon-DP
(delta = 0), a stricter guarantee, on the exported table. scikit-learn is the non-private
reference on the same rows; the trivial models are the majority class and the training mean.
Each cell is the mean (± sd) over ``--seeds`` runs (shuffle seed and fresh server noise); a
mechanism that refuses says why, below its table.

Usage::

    .venv/bin/python -m bench.auto_defaults [--seeds 2] [--quick] [--datasets protein,hi]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

import dpsql
from bench.bolton_accuracy import (
    BenchData,
    _call_train,
    bench_server,
    header_lines,
    install_data,
    load_bench_data,
)
from bench.public_tables import load_diamonds, load_hi
from dpsql import datasets as dsets
from dpsql.loading import fetch_numpy

EPS_GRID = (0.1, 0.5, 1.0, 2.0, 4.0)
# Public bounds on |y|: house values are capped at 500,001 dollars (in units of 100,000); a
# diamond's log price, 10, is 22,000 dollars.
LABEL_BOUNDS = {"cal_housing": 5.00001, "diamonds": 10.0}
QUICK_EPS = (0.5, 1.0)
DELTA = 1e-6
CLASSIFIERS: dict[str, dict[str, Any]] = {
    "auto": {"privacy": "auto"},
    "auto (delta = 0)": {"privacy": "auto", "delta": 0.0},
    "bolt-on Alg. 1": {"privacy": "bolton"},
    "bolt-on Alg. 2 (lambda 1e-4)": {"privacy": "bolton", "lambda": 1e-4},
    "DP-SGD shuffle": {"privacy": "dpsgd"},
    "DP-SGD Poisson": {"privacy": "dpsgd", "sampling": "poisson"},
    "DPSGD-F": {"privacy": "dpsgd_f"},
    "DPSGD-F Alg. 2": {"privacy": "dpsgd_f_alg2"},
    "SCS13": {"privacy": "scs13"},
    "BST14": {"privacy": "bst14"},
    # the private-ERM toolbox takes no multinomial model: one-vs-rest logistic
    "objective perturbation": {"privacy": "objective_perturbation", "model": "logistic"},
    "output perturbation": {"privacy": "output_perturbation", "model": "logistic"},
    "DP-FTRL": {"privacy": "dp_ftrl", "model": "logistic"},
    "Frank-Wolfe": {"privacy": "frank_wolfe", "model": "logistic"},
    "exponential mechanism": {"privacy": "exponential_mechanism", "model": "logistic"},
}
REGRESSORS: dict[str, dict[str, Any]] = {
    "auto": {"privacy": "auto"},
    "auto (delta = 0)": {"privacy": "auto", "delta": 0.0},
    "DP-GD": {"privacy": "dpgd"},
    "AdaSSP": {"privacy": "adassp"},
    "DP-AMBSSGD": {"privacy": "dp_ambssgd"},
    "DP-SSGD": {"privacy": "dp_ssgd"},
    "DP-SGD": {"privacy": "dpsgd"},
    "DPSGD-F": {"privacy": "dpsgd_f"},
    "objective perturbation": {"privacy": "objective_perturbation"},
    "output perturbation": {"privacy": "output_perturbation"},
    "DP-FTRL": {"privacy": "dp_ftrl"},
    "Frank-Wolfe (LASSO)": {"privacy": "frank_wolfe", "model": "lasso"},
    "exponential mechanism": {"privacy": "exponential_mechanism"},
}


def _delta(db: dpsql.Database, kw: dict[str, Any]) -> float:
    """The mechanism's own form: 1e-6 if it needs a delta, else 0 (pure epsilon-DP)."""
    if "delta" in kw or kw["privacy"] == "auto":
        return float(kw.get("delta", DELTA))
    (needs,) = db.execute(
        "SELECT needs_delta FROM dpsql.mechanisms() WHERE name = %s", (kw["privacy"],)
    ).fetchone()
    return DELTA if needs else 0.0


def _cell(values: Sequence[float]) -> str:
    if not values:
        return "refused"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def _table(
    title: str, rows: dict[str, dict[float, list[float]]], eps: Sequence[float]
) -> list[str]:
    out = [f"### {title}", "", "| method | " + " | ".join(f"eps {e:g}" for e in eps) + " |"]
    out.append("|---" * (len(eps) + 1) + "|")
    for label, by_eps in rows.items():
        out.append(f"| {label} | " + " | ".join(_cell(by_eps.get(e, [])) for e in eps) + " |")
    return [*out, ""]


# (dataset title, metric, method -> eps -> values) of every section, for the plot.
PANELS: list[tuple[str, str, dict[str, dict[float, list[float]]]]] = []
# (dataset title -> method -> eps -> the mechanisms `auto` chose): the plot's legend names them
CHOSEN: dict[str, dict[str, dict[float, list[str]]]] = defaultdict(
    lambda: defaultdict(lambda: defaultdict(list))
)


def _chosen(db: dpsql.Database, model_id: int) -> str | None:
    """The mechanism ``auto`` chose for this model (``params->'privacy'->'auto'->'chosen'``)."""
    from dpsql.plot import chosen_mechanism

    (params,) = db.execute(
        "SELECT params FROM dpsql.models WHERE model_id = %s", (model_id,)
    ).fetchone()
    return chosen_mechanism(params)


def save_numbers(path: Path, eps_grid: Sequence[float]) -> None:
    """PANELS and CHOSEN as JSON: ``--replot`` draws the figure again without training."""
    import json

    panels = [
        {
            "title": title,
            "metric": metric,
            "rows": {k: {str(e): v for e, v in r.items()} for k, r in rows.items()},
            "chosen": {
                k: {str(e): v for e, v in c.items()} for k, c in CHOSEN.get(title, {}).items()
            },
        }
        for title, metric, rows in PANELS
    ]
    path.write_text(json.dumps({"epsilons": list(eps_grid), "panels": panels}, indent=1))


def load_numbers(path: Path) -> list[float]:
    """Fill PANELS and CHOSEN from :func:`save_numbers`'s file; the epsilon grid."""
    import json

    saved = json.loads(path.read_text())
    for panel in saved["panels"]:
        rows = {k: {float(e): v for e, v in r.items()} for k, r in panel["rows"].items()}
        PANELS.append((panel["title"], panel["metric"], rows))
        for label, by_eps in panel["chosen"].items():
            for e, names in by_eps.items():
                CHOSEN[panel["title"]][label][float(e)] = names
    return [float(e) for e in saved["epsilons"]]


def _plot(path: Path, eps_grid: Sequence[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(PANELS))
    grid_rows = -(-len(PANELS) // cols)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(6 * cols, 4.8 * grid_rows), squeeze=False)
    for ax in axes.flat[len(PANELS) :]:
        ax.set_visible(False)
    for ax, (title, metric, rows) in zip(axes.flat, PANELS, strict=False):
        for label, by_eps in rows.items():
            xs = [e for e in eps_grid if by_eps.get(e)]
            ys = [statistics.mean(by_eps[e]) for e in xs]
            if not xs:
                continue
            style = "k--" if "non-private" in label else ("o-" if label == "auto" else ".-")
            if "scikit-learn" in label:
                style = "k:"
            ax.plot(xs, ys, style, label=label, linewidth=2.5 if label == "auto" else 1.2)
        ax.set_xscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel(metric)
        if metric == "test MSE":
            ax.set_yscale("log")
            floor = min(statistics.mean(v) for r in rows.values() for v in r.values() if v)
            trivial = next(v for k, r in rows.items() if "mean" in k for v in r.values())
            ax.set_ylim(0.8 * floor, 10 * statistics.mean(trivial))
        else:
            # the majority class near the bottom: Protein's differences are in the third digit
            majority = statistics.mean(next(iter(rows["majority class (non-private)"].values())))
            ax.set_ylim(bottom=max(0.0, majority - 3 * (1 - majority)))
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _diffprivlib(kind: str) -> Any:
    try:
        from diffprivlib import models
    except ImportError:
        return None
    return getattr(models, kind)


def classification(
    db: dpsql.Database,
    data: BenchData,
    seeds: Sequence[int],
    eps_grid: Sequence[float],
    mechanisms: dict[str, dict[str, Any]] = CLASSIFIERS,
    model: str | None = None,
) -> list[str]:
    model = model or ("multinomial" if data.multiclass else "logistic")
    rows: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    notes: list[str] = []
    seconds: dict[str, list[float]] = defaultdict(list)
    for eps in eps_grid:
        for label, kw in mechanisms.items():
            mech_model = kw.get("model", model)
            args = {k: v for k, v in kw.items() if k != "model"} | {"delta": _delta(db, kw)}
            for seed in seeds:
                t0 = time.perf_counter()
                try:
                    mid = _call_train(
                        db,
                        data.dataset,
                        (None, None, mech_model),
                        {"epsilon": eps, "seed": seed, **args},
                    )
                except psycopg.Error as err:
                    notes.append(f"- {label}, eps {eps:g}: {err.diag.message_primary or err}")
                    break
                seconds[label].append(time.perf_counter() - t0)
                (acc,) = db.execute(
                    "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, data.test_table)
                ).fetchone()
                rows[label][eps].append(acc)
                if kw["privacy"] == "auto":
                    CHOSEN[data.name][label][eps].append(_chosen(db, mid) or "?")
        print(f"#   {data.name}: eps {eps:g} done", flush=True)
    X, y = fetch_numpy(db.conn, data.train_table, ordered=True)
    Xt, yt = fetch_numpy(db.conn, data.test_table, ordered=True)
    X, Xt = dsets.normalize_rows(X), dsets.normalize_rows(Xt)
    dpl = _diffprivlib("LogisticRegression")
    if dpl is not None:
        for eps in eps_grid:
            for _ in seeds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    clf = dpl(epsilon=eps, data_norm=1.0, fit_intercept=False).fit(X, y)
                rows["diffprivlib LogisticRegression (eps-DP)"][eps].append(
                    float(np.mean(clf.predict(Xt) == yt))
                )
    with contextlib.suppress(ImportError):
        from sklearn.linear_model import LogisticRegression

        acc = float(np.mean(LogisticRegression(max_iter=2000).fit(X, y).predict(Xt) == yt))
        rows["scikit-learn LogisticRegression (non-private)"] = {e: [acc] for e in eps_grid}
    rows["majority class (non-private)"] = {e: [data.majority] for e in eps_grid}
    PANELS.append((data.name, "test accuracy", rows))
    out = [
        f"## {data.name}: {data.note}; m = {data.m:,}, d = {data.d}, model {model}, "
        f"delta = {DELTA:g} or 0 (see above); {len(seeds)} seed(s)",
        "",
        *_table("test accuracy", rows, eps_grid),
        "median wall time per release (s): "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in seconds.items()),
        "",
        *notes,
    ]
    return out


def regression(
    db: dpsql.Database,
    name: str,
    X: np.ndarray,
    y: np.ndarray,
    note: str,
    lower: float,
    seeds: Sequence[int],
    eps_grid: Sequence[float],
    mechanisms: dict[str, dict[str, Any]] = REGRESSORS,
) -> list[str]:
    """A regression section: X holds features scaled by public bounds onto [lower, 1]."""
    train, test = dsets.train_test_split(len(y), test_fraction=0.2, seed=0)
    schema = "dpsql_bench_auto"
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    db.load_numpy(f"{name}_train", X[train], y[train], schema=schema, replace=True)
    db.load_numpy(f"{name}_test", X[test], y[test], schema=schema, replace=True)
    dataset = f"auto_{name}_{time.time_ns()}"
    d = X.shape[1]
    bound = LABEL_BOUNDS[name]
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9, accept => true,"
        " delta_budget => 0.99, label_bound => %s, row_bound => %s, name => %s)",
        (f"{schema}.{name}_train", bound, float(np.sqrt(d)), dataset),
    )
    rows: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    notes: list[str] = []
    seconds: dict[str, list[float]] = defaultdict(list)
    for eps in eps_grid:
        for label, kw in mechanisms.items():
            for seed in seeds:
                t0 = time.perf_counter()
                try:
                    mid = _call_train(
                        db,
                        dataset,
                        (None, None, kw.get("model", "linear")),
                        {"epsilon": eps, "seed": seed, "delta": _delta(db, kw)}
                        | {k: v for k, v in kw.items() if k not in ("model", "delta")},
                    )
                except psycopg.Error as err:
                    notes.append(f"- {label}, eps {eps:g}: {err.diag.message_primary or err}")
                    break
                seconds[label].append(time.perf_counter() - t0)
                (mse,) = db.execute(
                    "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, f"{schema}.{name}_test")
                ).fetchone()
                rows[label][eps].append(mse)
                if kw["privacy"] == "auto":
                    CHOSEN[name][label][eps].append(_chosen(db, mid) or "?")
        print(f"#   {name}: eps {eps:g} done", flush=True)
    dpl = _diffprivlib("LinearRegression")
    if dpl is not None:
        for eps in eps_grid:
            for _ in seeds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    reg = dpl(epsilon=eps, bounds_X=(lower, 1), bounds_y=(-bound, bound)).fit(
                        X[train], y[train]
                    )
                rows["diffprivlib LinearRegression (eps-DP)"][eps].append(
                    float(np.mean((reg.predict(X[test]) - y[test]) ** 2))
                )
    with contextlib.suppress(ImportError):
        from sklearn.linear_model import LinearRegression

        pred = LinearRegression().fit(X[train], y[train]).predict(X[test])
        mse = float(np.mean((pred - y[test]) ** 2))
        rows["scikit-learn LinearRegression (non-private)"] = {e: [mse] for e in eps_grid}
    mean_mse = float(np.mean((y[test] - np.mean(y[train])) ** 2))
    rows["training mean (non-private)"] = {e: [mean_mse] for e in eps_grid}
    PANELS.append((name, "test MSE", rows))
    return [
        f"## {name}: {note}; n_train {len(train):,}, d {d} + intercept, label bound {bound:g}, "
        f"delta = {DELTA:g} or 0 (see above); {len(seeds)} seed(s)",
        "",
        *_table("test MSE", rows, eps_grid),
        "median wall time per release (s): "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in seconds.items()),
        "",
        *notes,
    ]


def main(argv: list[str] | None = None) -> int:  # noqa: C901
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help=f"eps in {QUICK_EPS}, 1 seed")
    parser.add_argument(
        "--datasets",
        default="protein,mnist,hi,hi_numeric,cal_housing,diamonds",
        help="comma-separated subset of the default",
    )
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    parser.add_argument(
        "--plot", type=Path, default=Path(__file__).parent / "figures" / "auto_defaults.png"
    )
    parser.add_argument("--numbers", type=Path, help="also save the numbers here (JSON)")
    parser.add_argument(
        "--replot", type=Path, metavar="JSON", help="only draw --plot from saved --numbers"
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        _plot(args.plot, load_numbers(args.replot))
        print(f"# plot: {args.plot}")
        return 0
    seeds = [1] if args.quick else list(range(1, args.seeds + 1))
    eps_grid = QUICK_EPS if args.quick else EPS_GRID
    wanted = args.datasets.split(",")
    lines = header_lines("auto_defaults")
    lines.append(
        f"# command: {' '.join(['python -m bench.auto_defaults', *(argv or sys.argv[1:])])}"
    )
    print("\n".join(lines), flush=True)
    datasets, skipped = load_bench_data([n for n in wanted if n in ("protein", "mnist")])
    for name in ("hi", "hi_numeric"):
        if name in wanted:
            try:
                datasets.append(load_hi(numeric_only=name == "hi_numeric"))
            except FileNotFoundError as err:
                skipped.append(f"{name}: skipped ({err})")
    loaders: dict[str, Callable[[], tuple[np.ndarray, np.ndarray, str, float]]] = {
        "cal_housing": _cal_housing,
        "diamonds": lambda: (*load_diamonds(), 0.0),
    }
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            sections: list[Callable[[], list[str]]] = []
            for data in datasets:
                install_data(db, data, "")
                sections.append(functools.partial(classification, db, data, seeds, eps_grid))
            for name, load in loaders.items():
                if name not in wanted:
                    continue
                try:
                    X, y, note, lower = load()
                except FileNotFoundError as err:
                    skipped.append(f"{name}: skipped ({err})")
                    continue
                sections.append(
                    functools.partial(regression, db, name, X, y, note, lower, seeds, eps_grid)
                )
            for section in sections:
                print("\n".join(["", *section()]), flush=True)
    if PANELS and args.numbers is not None:
        save_numbers(args.numbers, eps_grid)
    if PANELS:
        _plot(args.plot, eps_grid)
        print(f"# plot: {args.plot}")
    for note in skipped:
        print(f"# {note}")
    return 0


def _cal_housing() -> tuple[np.ndarray, np.ndarray, str, float]:
    raw, value = dsets.load_cal_housing()
    note = "California housing, features on [-1, 1] by public bounds, value in 100,000 dollars"
    return dsets.cal_housing_features(raw), value / 100_000.0, note, -1.0


if __name__ == "__main__":
    sys.exit(main())
