"""``privacy => 'auto'`` against every mechanism at its defaults, and diffprivlib (issue 10).

What a new user gets with only epsilon (and delta) given. Every model is trained and released by
the server with the SQL defaults of ``dpsql.train`` except the privacy arguments:

* Protein (KDD Cup 2004, binary, d = 74) and MNIST projected to 50 dimensions (ten classes,
  model ``multinomial``), rows normalised to the unit sphere at registration: ``auto``, bolt-on
  (Algorithm 1; and Algorithm 2 with lambda = 1e-4), DP-SGD with shuffled and with Poisson
  batches, DPSGD-F, SCS13 and BST14, each at its defaults (docs/defaults.md);
* California housing (regression, d = 8 + intercept, features rescaled onto [-1, 1] by public
  bounds): ``auto``, DP-GD, AdaSSP, DP-AMBSSGD, DP-SSGD and DP-SGD (model ``linear``) at their
  defaults.

delta = 1e-6 for every mechanism (the bolt-on and SCS13 then use Gaussian noise).
diffprivlib (``LogisticRegression(data_norm=1)`` on unit rows, ``LinearRegression`` with the
public bounds) is epsilon-DP (delta = 0), a stricter guarantee, on the exported table. The
trivial models are the majority class and the training mean. Each cell is the mean (± sd) over
``--seeds`` runs (shuffle seed and fresh server noise).

Usage::

    .venv/bin/python -m bench.auto_defaults [--seeds 2] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
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
from dpsql import datasets as dsets
from dpsql.loading import fetch_numpy

EPS_GRID = (0.1, 0.5, 1.0, 2.0, 4.0)
QUICK_EPS = (0.5, 1.0)
DELTA = 1e-6
CLASSIFIERS: dict[str, dict[str, Any]] = {
    "auto": {"privacy": "auto"},
    "bolt-on Alg. 1": {"privacy": "bolton"},
    "bolt-on Alg. 2 (lambda 1e-4)": {"privacy": "bolton", "lambda": 1e-4},
    "DP-SGD shuffle": {"privacy": "dpsgd"},
    "DP-SGD Poisson": {"privacy": "dpsgd", "sampling": "poisson"},
    "DPSGD-F": {"privacy": "dpsgd_f"},
    "SCS13": {"privacy": "scs13"},
    "BST14": {"privacy": "bst14"},
}
REGRESSORS: dict[str, dict[str, Any]] = {
    "auto": {"privacy": "auto"},
    "DP-GD": {"privacy": "dpgd"},
    "AdaSSP": {"privacy": "adassp"},
    "DP-AMBSSGD": {"privacy": "dp_ambssgd"},
    "DP-SSGD": {"privacy": "dp_ssgd"},
    "DP-SGD": {"privacy": "dpsgd"},
}


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


def _plot(path: Path, eps_grid: Sequence[float], accuracy_floor: float = 0.98) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.5), squeeze=False)
    for ax, (title, metric, rows) in zip(axes[0], PANELS, strict=True):
        for label, by_eps in rows.items():
            xs = [e for e in eps_grid if by_eps.get(e)]
            ys = [statistics.mean(by_eps[e]) for e in xs]
            if not xs:
                continue
            style = "k--" if "non-private" in label else ("o-" if label == "auto" else ".-")
            ax.plot(xs, ys, style, label=label, linewidth=2.5 if label == "auto" else 1.2)
        ax.set_xscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel(metric)
        if metric == "test MSE":
            ax.set_yscale("log")
            ax.set_ylim(0.3, 10)
        else:
            ax.set_ylim(bottom=0.0 if "mnist" in title else accuracy_floor)
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
            for seed in seeds:
                t0 = time.perf_counter()
                try:
                    mid = _call_train(
                        db,
                        data.dataset,
                        (None, None, model),
                        {"epsilon": eps, "delta": DELTA, "seed": seed, **kw},
                    )
                except psycopg.Error as err:
                    notes.append(f"- {label}, eps {eps:g}: {err.diag.message_primary or err}")
                    break
                seconds[label].append(time.perf_counter() - t0)
                (acc,) = db.execute(
                    "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, data.test_table)
                ).fetchone()
                rows[label][eps].append(acc)
        print(f"#   {data.name}: eps {eps:g} done", flush=True)
    dpl = _diffprivlib("LogisticRegression")
    if dpl is not None:
        X, y = fetch_numpy(db.conn, data.train_table, ordered=True)
        Xt, yt = fetch_numpy(db.conn, data.test_table, ordered=True)
        X, Xt = dsets.normalize_rows(X), dsets.normalize_rows(Xt)
        for eps in eps_grid:
            for _ in seeds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    clf = dpl(epsilon=eps, data_norm=1.0, fit_intercept=False).fit(X, y)
                rows["diffprivlib LogisticRegression (eps-DP)"][eps].append(
                    float(np.mean(clf.predict(Xt) == yt))
                )
    rows["majority class (non-private)"] = {e: [data.majority] for e in eps_grid}
    PANELS.append((data.name, "test accuracy", rows))
    out = [
        f"## {data.name}: {data.note}; m = {data.m:,}, d = {data.d}, model {model}, "
        f"delta = {DELTA:g}; {len(seeds)} seed(s)",
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
    seeds: Sequence[int],
    eps_grid: Sequence[float],
    mechanisms: dict[str, dict[str, Any]] = REGRESSORS,
) -> list[str]:
    raw, value = dsets.load_cal_housing()
    X = dsets.cal_housing_features(raw)
    y = value / 100_000.0
    train, test = dsets.train_test_split(len(y), test_fraction=0.2, seed=0)
    schema = "dpsql_bench_auto"
    db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    db.execute(f"CREATE SCHEMA {schema}")
    db.load_numpy("houses", X[train], y[train], schema=schema)
    db.load_numpy("houses_test", X[test], y[test], schema=schema)
    name = f"auto_houses_{time.time_ns()}"
    d = X.shape[1]
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9,"
        " delta_budget => 0.99, label_bound => 5.00001, row_bound => %s, name => %s)",
        (f"{schema}.houses", float(np.sqrt(d)), name),
    )
    rows: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    notes: list[str] = []
    for eps in eps_grid:
        for label, kw in mechanisms.items():
            for seed in seeds:
                try:
                    mid = _call_train(
                        db,
                        name,
                        (None, None, kw.get("model", "linear")),
                        {"epsilon": eps, "delta": DELTA, "seed": seed, "intercept": True}
                        | {k: v for k, v in kw.items() if k != "model"},
                    )
                except psycopg.Error as err:
                    notes.append(f"- {label}, eps {eps:g}: {err.diag.message_primary or err}")
                    break
                (mse,) = db.execute(
                    "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, f"{schema}.houses_test")
                ).fetchone()
                rows[label][eps].append(mse)
        print(f"#   cal_housing: eps {eps:g} done", flush=True)
    dpl = _diffprivlib("LinearRegression")
    if dpl is not None:
        for eps in eps_grid:
            for _ in seeds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    reg = dpl(epsilon=eps, bounds_X=(-1, 1), bounds_y=(0, 5.00001)).fit(
                        X[train], y[train]
                    )
                rows["diffprivlib LinearRegression (eps-DP)"][eps].append(
                    float(np.mean((reg.predict(X[test]) - y[test]) ** 2))
                )
    mean_mse = float(np.mean((y[test] - np.mean(y[train])) ** 2))
    rows["training mean (non-private)"] = {e: [mean_mse] for e in eps_grid}
    PANELS.append(("cal_housing", "test MSE", rows))
    return [
        f"## cal_housing: California housing, n_train {len(train):,}, d {d} + intercept, "
        f"delta = {DELTA:g}; {len(seeds)} seed(s)",
        "",
        *_table("test MSE", rows, eps_grid),
        *notes,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help=f"eps in {QUICK_EPS}, 1 seed")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    parser.add_argument(
        "--plot", type=Path, default=Path(__file__).parent / "figures" / "auto_defaults.png"
    )
    args = parser.parse_args(argv)
    seeds = [1] if args.quick else list(range(1, args.seeds + 1))
    eps_grid = QUICK_EPS if args.quick else EPS_GRID
    lines = header_lines("auto_defaults")
    lines.append(
        f"# command: {' '.join(['python -m bench.auto_defaults', *(argv or sys.argv[1:])])}"
    )
    print("\n".join(lines), flush=True)
    datasets, skipped = load_bench_data(["protein", "mnist"])
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            sections: list[Callable[[], list[str]]] = []
            for data in datasets:
                install_data(db, data, "")
                sections.append(lambda data=data: classification(db, data, seeds, eps_grid))
            with contextlib.suppress(FileNotFoundError):
                dsets.load_cal_housing()
                sections.append(lambda: regression(db, seeds, eps_grid))
            for section in sections:
                print("\n".join(["", *section()]), flush=True)
    if PANELS:
        _plot(args.plot, eps_grid)
        print(f"# plot: {args.plot}")
    for note in skipped:
        print(f"# {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
