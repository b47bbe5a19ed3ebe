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
import textwrap
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


# The figure's panels: `auto` in each, the other methods by family, at most ~8 lines a panel
# (issue 42). A method in no group gets a panel of its dataset's leftovers.
Groups = dict[str, tuple[tuple[str, tuple[str, ...]], ...]]
PLOT_GROUPS: Groups = {
    "test accuracy": (
        (
            "bolt-on, epsilon-DP",
            (
                "auto",
                "auto (delta = 0)",
                "bolt-on Alg. 1",
                "bolt-on Alg. 2 (lambda 1e-4)",
                "diffprivlib LogisticRegression (eps-DP)",
            ),
        ),
        (
            "noisy SGD",
            (
                "auto",
                "DP-SGD shuffle",
                "DP-SGD Poisson",
                "DPSGD-F",
                "DPSGD-F Alg. 2",
                "SCS13",
                "BST14",
            ),
        ),
        (
            "private ERM",
            (
                "auto",
                "objective perturbation",
                "output perturbation",
                "DP-FTRL",
                "Frank-Wolfe",
                "exponential mechanism",
            ),
        ),
    ),
    "test MSE": (
        (
            "linear regression",
            (
                "auto",
                "auto (delta = 0)",
                "DP-GD",
                "AdaSSP",
                "DP-AMBSSGD",
                "DP-SSGD",
                "diffprivlib LinearRegression (eps-DP)",
            ),
        ),
        ("noisy SGD", ("auto", "DP-SGD", "DPSGD-F", "DP-FTRL")),
        (
            "private ERM",
            (
                "auto",
                "objective perturbation",
                "output perturbation",
                "Frank-Wolfe (LASSO)",
                "exponential mechanism",
            ),
        ),
    ),
}
PER_PANEL = 8


def _panels(
    rows: dict[str, dict[float, list[float]]], groups: Sequence[tuple[str, Sequence[str]]]
) -> list[tuple[str, list[str], list[str]]]:
    """(family, methods, methods without a release) of one dataset's panels: the groups, then
    the methods no group holds, ``PER_PANEL - 1`` to a panel. A group's method missing from
    ``rows`` refused at every epsilon (diffprivlib: not installed)."""
    private = [k for k in rows if "non-private" not in k]
    out: list[tuple[str, list[str], list[str]]] = []
    placed: set[str] = set()
    for family, members in groups:
        present = [m for m in members if m in rows]
        refused = [m for m in members if m not in rows and not m.startswith("diffprivlib")]
        out.append((family, present, refused))
        placed.update(present)
    rest = [m for m in private if m not in placed]
    autos = [m for m in private if m == "auto"]
    for start in range(0, len(rest), PER_PANEL - 1):
        out.append(("others", autos + rest[start : start + PER_PANEL - 1], []))
    return out


def _plot(
    path: Path,
    eps_grid: Sequence[float],
    groups: Groups = PLOT_GROUPS,
) -> None:
    """One row of panels per dataset (dpsql.plot.draw_utility's rules: y from the trivial model
    up, error bars over the seeds, `auto` named with its choice, the legend outside)."""
    from matplotlib.figure import Figure

    from dpsql.plot import draw_utility, series_label

    layout = [(panel, _panels(panel[2], groups.get(panel[1], ()))) for panel in PANELS]
    cols = max(len(p) for _, p in layout)
    fig = Figure(figsize=(7.4 * cols, 3.5 * len(layout)), layout="constrained")
    axes = fig.subplots(len(layout), cols, squeeze=False)
    seeds = 1
    for row_axes, ((title, metric, rows), panels) in zip(axes, layout, strict=True):
        for ax in row_axes[len(panels) :]:
            ax.set_visible(False)
        refs = {
            k: statistics.mean(next(iter(v.values())))
            for k, v in rows.items()
            if "non-private" in k
        }
        trivial = next(k for k in refs if k.startswith(("majority", "training mean")))
        baseline = refs.pop(trivial)
        for ax, (family, methods, refused) in zip(row_axes, panels, strict=False):
            series = {m: rows[m] for m in methods}
            seeds = max([seeds, *(len(v) for r in series.values() for v in r.values())])
            refused = refused + [m for m in methods if not any(rows[m].values())]
            draw_utility(
                ax,
                eps_grid,
                series,
                metric="mse" if metric == "test MSE" else "accuracy",
                baseline=baseline,
                baseline_label=trivial.removesuffix(" (non-private)"),
                references=refs,
                labels={m: series_label(m, CHOSEN.get(title, {}).get(m, {})) for m in methods},
            )
            note = "refused at every epsilon: " + ", ".join(refused) if refused else ""
            note = "\n" + textwrap.fill(note, 60) if note else ""
            ax.set_title(f"{title}: {family}{note}", fontsize=10)
    fig.suptitle(f"mean ± sd over {seeds} seeds per point", fontsize=11)
    fig.savefig(path, dpi=80)


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
        "--eps", help=f"comma-separated epsilons (default {','.join(f'{e:g}' for e in EPS_GRID)})"
    )
    parser.add_argument(
        "--plot", type=Path, default=Path(__file__).parent / "figures" / "auto_defaults.png"
    )
    parser.add_argument("--numbers", type=Path, help="also save the numbers here (JSON)")
    parser.add_argument(
        "--replot", type=Path, metavar="JSON", help="only draw --plot from saved --numbers"
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        return _replot(args.plot, args.replot)
    seeds = [1] if args.quick else list(range(1, args.seeds + 1))
    eps_grid: tuple[float, ...] = QUICK_EPS if args.quick else EPS_GRID
    eps_grid = tuple(float(e) for e in args.eps.split(",")) if args.eps else eps_grid
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
            # (position in --datasets, section): run in the order asked
            sections: list[tuple[int, Callable[[], list[str]]]] = []
            for data in datasets:
                install_data(db, data, "")
                run = functools.partial(classification, db, data, seeds, eps_grid)
                sections.append((wanted.index(data.name), run))
            for name, load in loaders.items():
                if name not in wanted:
                    continue
                try:
                    X, y, note, lower = load()
                except FileNotFoundError as err:
                    skipped.append(f"{name}: skipped ({err})")
                    continue
                run = functools.partial(regression, db, name, X, y, note, lower, seeds, eps_grid)
                sections.append((wanted.index(name), run))
            for _, section in sorted(sections, key=lambda s: s[0]):
                print("\n".join(["", *section()]), flush=True)
                if args.numbers is not None:  # after each section: a stopped run keeps them
                    save_numbers(args.numbers, eps_grid)
    if PANELS:
        _plot(args.plot, eps_grid)
        print(f"# plot: {args.plot}")
    for note in skipped:
        print(f"# {note}")
    return 0


def _replot(path: Path, numbers: Path) -> int:
    _plot(path, load_numbers(numbers))
    print(f"# plot: {path}")
    return 0


def _cal_housing() -> tuple[np.ndarray, np.ndarray, str, float]:
    raw, value = dsets.load_cal_housing()
    note = "California housing, features on [-1, 1] by public bounds, value in 100,000 dollars"
    return dsets.cal_housing_features(raw), value / 100_000.0, note, -1.0


if __name__ == "__main__":
    sys.exit(main())
