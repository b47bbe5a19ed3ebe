"""Bolt-on accuracy: the bolt-on paper's Figure 3 ("tuning using public data"), tests 1-4.

For Protein (KDD Cup 2004, binary) and MNIST projected to 50 dimensions (ten classes,
one-vs-all as in the paper), every model is trained by the server (one aggregate scan per
epoch) and released by it:

* test 1: convex (plain logistic, lambda = 0, unconstrained, eta = 1/sqrt(m)), eps-DP
  (Algorithm 1, Gamma-norm noise);
* test 2: the same, (eps, delta)-DP (Gaussian noise, delta = 1/m^2);
* test 3: strongly convex (lambda = 1e-4, ||w|| <= 1/lambda, steps min(1/beta, 1/(lambda t))),
  eps-DP (Algorithm 2);
* test 4: the same, (eps, delta)-DP;

with b = 50, 10 passes, rows normalised to the unit sphere (``row_norm => 'unit'``) and
eps in {0.05, 0.1, 0.2, 0.5, 1, 2, 4}. The noiseless baselines are the same runs without noise
(``privacy => 'none'``, data owner), and for the strongly convex case also the paper's Table 4
baseline 1/(lambda t) without the 1/beta cap. On MNIST, one-vs-all splits the budget into ten
models of eps/10 (and delta/10); the multinomial model spends the whole budget on one noise
draw, and is run for the four tests too.

Tests 3-4 also get the curve of the *paper's* mini-batch formula Delta = 2L/(gamma m b), which
the server refuses (it is 50x too small at b = 50: Wu et al. 2017, §3.2.3, divide by
b, which fails with decreasing steps): the same noiseless
model is trained in memory with ``dpsql._core`` (the C core of the server, on the server's
permutation; the script checks that the weights are identical) and perturbed in memory with
that sensitivity. It carries no DP guarantee and is labelled so.

Every point is the mean over ``--seeds`` shuffle seeds (with fresh noise each time: the
releases draw their noise from the server's CSPRNG) with its standard deviation. Accuracy comes
from ``dpsql.evaluate`` on the test table; balanced accuracy (mean per-class recall; Protein is
99% negatives) from the released weights in memory. The train/test split of Protein
(72,876/72,875) and the MNIST projection are fixed (seed 0).

Usage::

    .venv/bin/python -m bench.bolton_accuracy [--seeds 5] [--dsn DSN]
    .venv/bin/python -m bench.bolton_accuracy --quick     # 1 seed, eps in {0.1, 1, 4}

Plots: ``bench/figures/bolton_protein.png`` and ``bench/figures/bolton_mnist.png`` (a temporary
directory with ``--quick``, unless ``--figures`` is given). Datasets are read from
``DPSQL_DATASETS`` (default ``../shared/datasets``); a missing one is skipped with a note.
Without ``--dsn`` (or ``DPSQL_DSN``) a throw-away embedded server is used.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dpsql
from dpsql import _core, extension, server
from dpsql import datasets as dsets

EPS_GRID = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0)
QUICK_EPS = (0.1, 1.0, 4.0)
EPOCHS = 10
BATCH = 50
LAMBDA = 1e-4
SCHEMA = "dpsql_bench"
FIGURES = Path(__file__).resolve().parent / "figures"

# test -> (strongly convex?, (eps, delta)-DP?)
TESTS: dict[int, tuple[bool, bool]] = {
    1: (False, False),
    2: (False, True),
    3: (True, False),
    4: (True, True),
}
TEST_TITLES = {
    1: "test 1: convex, eps-DP (Algorithm 1)",
    2: "test 2: convex, (eps, delta)-DP (Algorithm 1, Gaussian)",
    3: "test 3: strongly convex, eps-DP (Algorithm 2)",
    4: "test 4: strongly convex, (eps, delta)-DP (Algorithm 2, Gaussian)",
}
# Noiseless baselines: name -> SQL arguments of dpsql.train (privacy => 'none').
NOISELESS: dict[str, dict[str, Any]] = {
    "convex": {"lambda": 0.0, "schedule": "constant"},  # eta = 1/sqrt(m)
    "sc": {"lambda": LAMBDA, "schedule": "decreasing"},  # min(1/beta, 1/(lambda t)), R = 1/lambda
    # The paper's Table 4 non-private SC baseline: 1/(lambda t), no 1/beta cap.
    "sc_t4": {
        "lambda": LAMBDA,
        "schedule": "inverse",
        "step_size": 1 / LAMBDA,
        "step_offset": 0.0,
        "radius": 1 / LAMBDA,
    },
}
NOISELESS_TITLES = {
    "convex": "convex, eta = 1/sqrt(m)",
    "sc": "SC, min(1/beta, 1/(lambda t)), R = 1/lambda",
    "sc_t4": "SC, 1/(lambda t) (paper Table 4)",
}


# --------------------------------------------------------------------------------------------
# Server, data
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def bench_server(dsn: str | None, pg_version: int | None) -> Iterator[tuple[str, str]]:
    """URI of the server to use and a description of it (a temporary embedded one by default)."""
    dsn = dsn or os.environ.get("DPSQL_DSN") or None
    if dsn:
        yield dsn, "given DSN"
        return
    version = pg_version or server.DEFAULT_PG_VERSION
    with server.temporary_server(version) as uri:
        # The temporary data directory is not the default cluster: make sure the install the
        # server runs from has the current extension build.
        extension.ensure_available(uri, server.pg_config_path(version))
        yield uri, f"embedded PostgreSQL {version}, temporary pgdata"


def header_lines(title: str) -> list[str]:
    return [
        f"# {title}, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"# machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, numpy {np.__version__}",
    ]


@dataclass
class BenchData:
    """One dataset: the arrays as loaded into the server, its tables and its registration."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    labels: list[float]
    note: str
    train_table: str = ""
    test_table: str = ""
    dataset: str = ""  # registered name

    @property
    def m(self) -> int:
        return len(self.y_train)

    @property
    def d(self) -> int:
        return self.X_train.shape[1]

    @property
    def delta(self) -> float:
        return 1.0 / self.m**2

    @property
    def multiclass(self) -> bool:
        return len(self.labels) > 2

    @property
    def majority(self) -> float:
        counts = np.unique(self.y_test, return_counts=True)[1]
        return float(counts.max() / counts.sum())


def load_bench_data(names: Sequence[str]) -> tuple[list[BenchData], list[str]]:
    """The requested datasets (raw features; the server normalises rows) and skip notes."""
    out: list[BenchData] = []
    skipped: list[str] = []
    for name in names:
        try:
            if name == "protein":
                X, y = dsets.load_protein()
                tr, te = dsets.train_test_split(len(y), 0.5, seed=0)
                out.append(
                    BenchData(
                        "protein",
                        X[tr],
                        y[tr],
                        X[te],
                        y[te],
                        [0.0, 1.0],
                        "KDD Cup 2004 protein homology, random halves (split seed 0)",
                    )
                )
            elif name == "mnist":
                Xtr, ytr = dsets.load_mnist(split="train")
                Xte, yte = dsets.load_mnist(split="test")
                # The projection matrix depends on (784, 50, seed) only: the same for both.
                out.append(
                    BenchData(
                        "mnist",
                        dsets.random_projection(Xtr, 50, seed=0),
                        ytr.astype(np.float64),
                        dsets.random_projection(Xte, 50, seed=0),
                        yte.astype(np.float64),
                        [float(c) for c in range(10)],
                        "MNIST, Gaussian random projection 784 -> 50 (seed 0)",
                    )
                )
            else:
                raise ValueError(f"unknown dataset {name!r} (protein, mnist)")
        except FileNotFoundError as err:
            skipped.append(f"{name}: skipped ({err})")
    return out, skipped


def install_data(db: dpsql.Database, data: BenchData, tag: str) -> None:
    """Load train and test tables and register the training table (data owner)."""
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    data.train_table = f"{SCHEMA}.{data.name}_train{tag}"
    data.test_table = f"{SCHEMA}.{data.name}_test{tag}"
    data.dataset = f"bench_{data.name}{tag}"
    db.load_numpy(data.train_table, data.X_train, data.y_train, replace=True)
    db.load_numpy(data.test_table, data.X_test, data.y_test, replace=True)
    db.execute(f"ANALYZE {data.train_table}")
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9, accept => true,"
        " delta_budget => 0.999, labels => %s, row_norm => 'unit', name => %s)",
        (data.train_table, data.labels, data.dataset),
    )


def drop_data(db: dpsql.Database, data: BenchData) -> None:
    for table in (data.train_table, data.test_table):
        if table:
            with contextlib.suppress(Exception):
                db.execute(f"DROP TABLE IF EXISTS {table}")


def run_tag(dsn_given: bool) -> str:
    # A shared server may hold an earlier run's registrations (a relation has one budget and
    # the ledger keeps its datasets): give this run's tables and datasets their own names.
    return f"_{os.getpid()}" if dsn_given else ""


# --------------------------------------------------------------------------------------------
# Training and evaluation through the server
# --------------------------------------------------------------------------------------------


def _call_train(
    db: dpsql.Database, source: str, positional: tuple[Any, Any, str], args: dict[str, Any]
) -> int:
    from psycopg.types.json import Jsonb

    names = ", ".join(f"{k} => %s" for k in args)
    values = [Jsonb(v) if isinstance(v, dict) else v for v in args.values()]
    row = db.execute(
        f"SELECT dpsql.train(%s, %s, %s, %s, {names})", (source, *positional, *values)
    ).fetchone()
    assert row is not None
    if row[0] is None:
        raise dpsql.NothingReleased("the mechanism released nothing (uncertified minimiser)")
    return int(row[0])


def train_noiseless(
    db: dpsql.Database, data: BenchData, model: str, variant: str, seed: int
) -> int:
    """A noiseless model (data owner, privacy none) with the bolt-on runs' k, b and rows."""
    args: dict[str, Any] = {
        "epochs": EPOCHS,
        "batch_size": BATCH,
        **NOISELESS[variant],
        "labels": data.labels,
        "row_norm": "unit",
        "seed": seed,
    }
    return _call_train(db, data.train_table, (["x"], "y", model), args)


def train_bolton(
    db: dpsql.Database,
    data: BenchData,
    model: str,
    test: int,
    eps: float,
    seed: int,
    epochs: int = EPOCHS,
    batch: int = BATCH,
) -> int:
    """A bolt-on release of the registered dataset (server-side noise, charged to the ledger)."""
    sc, gaussian = TESTS[test]
    args: dict[str, Any] = {
        "epochs": epochs,
        "batch_size": batch,
        "lambda": LAMBDA if sc else 0.0,
        "privacy": "bolton",
        "epsilon": eps,
        "delta": data.delta if gaussian else 0.0,
        "seed": seed,
    }
    return _call_train(db, data.dataset, (None, None, model), args)


@dataclass
class Released:
    """What the models table says about a model, and its test metrics."""

    model_id: int
    accuracy: float
    balanced: float
    weights: np.ndarray
    sensitivity: float | None
    noise_scale: float | None
    model_epsilon: float | None
    seconds: float = 0.0


def predict_labels(
    data: BenchData, model: str, flags: int, W: np.ndarray, X: np.ndarray
) -> np.ndarray:
    """Labels predicted by released weights, with the C core (as dpsql.evaluate does)."""
    out = _core.predict(model, flags, W, X)
    classes = np.asarray(data.labels)
    if W.ndim == 2 and W.shape[0] >= 2:
        return classes[out.astype(np.int64)]
    return np.where(out >= 0.5, classes[1], classes[0])


def balanced_accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean([np.mean(pred[y == c] == c) for c in np.unique(y)]))


def evaluate(db: dpsql.Database, data: BenchData, model_id: int) -> Released:
    acc = db.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (model_id, data.test_table)
    ).fetchone()[0]
    model, flags, weights, sens, scale, priv = db.execute(
        "SELECT model, flags, weights, sensitivity, noise_scale, params->'privacy'"
        " FROM dpsql.models WHERE model_id = %s",
        (model_id,),
    ).fetchone()
    W = np.asarray(weights, dtype=np.float64)
    pred = predict_labels(data, model, flags, W, data.X_test)
    mine = float(np.mean(pred == data.y_test))
    if abs(mine - acc) > 1e-12:
        print(
            f"# WARNING: model {model_id}: dpsql.evaluate accuracy {acc} but the released "
            f"weights give {mine} in memory",
            flush=True,
        )
    eps_model = None if priv is None else float(priv.get("model_epsilon", "nan"))
    return Released(
        model_id, float(acc), balanced_accuracy(data.y_test, pred), W, sens, scale, eps_model
    )


# --------------------------------------------------------------------------------------------
# In memory: the noiseless SC model on the server's permutation, and the paper formula
# --------------------------------------------------------------------------------------------


def server_order(m: int, seed: int) -> np.ndarray:
    """Row order of a server training run: rows by (splitmix64(seed, position), position)."""
    pos = np.arange(1, m + 1, dtype=np.int64)
    keys = np.fromiter((_core.shuffle_key(seed, int(p)) for p in pos), dtype=np.int64, count=m)
    return np.lexsort((pos, keys))


def core_labels(data: BenchData) -> np.ndarray:
    """Training labels as the C core takes them: +-1 (binary) or the class index."""
    if data.multiclass:
        return np.searchsorted(np.asarray(data.labels), data.y_train).astype(np.float64)
    return np.where(data.y_train == data.labels[1], 1.0, -1.0)


def core_sc_model(data: BenchData, seed: int) -> np.ndarray:
    """Algorithm 2's noiseless PSGD (one-vs-all for MNIST) in memory, server row order."""
    order = server_order(data.m, seed)
    X = np.ascontiguousarray(data.X_train[order])
    y = core_labels(data)[order]
    state = _core.init_state(
        "logistic",
        data.d,
        n_classes=len(data.labels),
        lambda_=LAMBDA,
        schedule="decreasing",
        radius=1 / LAMBDA,
        batch_size=BATCH,
        flags=_core.FLAG_UNIT_ROWS,
    )
    for _ in range(EPOCHS):
        state = _core.run_epoch(state, X, y)
    return _core.weights(state)


def sc_sensitivity(data: BenchData, paper: bool) -> float:
    c = _core.loss_constants("logistic", LAMBDA, 1 / LAMBDA)
    return _core.bolton_sensitivity(
        "decreasing",
        lipschitz=c["lipschitz"],
        smoothness=c["smoothness"],
        strong_convexity=c["strong_convexity"],
        rows=data.m,
        batch_size=BATCH,
        epochs=EPOCHS,
        paper_minibatch=paper,
    )


# --------------------------------------------------------------------------------------------
# Experiment
# --------------------------------------------------------------------------------------------


@dataclass
class Results:
    """acc[key] and bal[key] are per-seed lists; key = (model, series, test, eps)."""

    acc: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))
    bal: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))
    norms: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))
    noise: dict[tuple, tuple[float | None, float | None, float | None]] = field(
        default_factory=dict
    )
    parity: list[float] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, key: tuple, r: Released) -> None:
        self.acc[key].append(r.accuracy)
        self.bal[key].append(r.balanced)


def models_for(data: BenchData) -> list[str]:
    return ["logistic", "multinomial"] if data.multiclass else ["logistic"]


def run_dataset(
    db: dpsql.Database, data: BenchData, seeds: Sequence[int], eps_grid: Sequence[float]
) -> Results:
    res = Results()
    paper_sens = sc_sensitivity(data, paper=True)
    for s_i, seed in enumerate(seeds):
        t_seed = time.perf_counter()
        for model in models_for(data):
            sc_weights = None
            for variant in NOISELESS:
                t0 = time.perf_counter()
                r = evaluate(db, data, train_noiseless(db, data, model, variant, seed))
                res.seconds[f"noiseless {model}"].append(time.perf_counter() - t0)
                res.add((model, "noiseless", variant, None), r)
                res.norms[(model, variant)].append(
                    float(np.mean(np.linalg.norm(np.atleast_2d(r.weights), axis=1)))
                )
                if variant == "sc":
                    sc_weights = r.weights
            for test in TESTS:
                for eps in eps_grid:
                    t0 = time.perf_counter()
                    r = evaluate(db, data, train_bolton(db, data, model, test, eps, seed))
                    res.seconds[f"bolt-on {model}"].append(time.perf_counter() - t0)
                    res.add((model, "bolton", test, eps), r)
                    res.noise[(model, test, eps)] = (r.sensitivity, r.noise_scale, r.model_epsilon)
            if model != "logistic":
                continue
            # The paper's mini-batch formula, in memory (no DP guarantee).
            t0 = time.perf_counter()
            W = core_sc_model(data, seed)
            assert sc_weights is not None
            res.parity.append(float(np.max(np.abs(W - np.atleast_2d(sc_weights)))))
            per_output = data.multiclass
            for test in (3, 4):
                gaussian = TESTS[test][1]
                for e_i, eps in enumerate(eps_grid):
                    share = len(data.labels) if per_output else 1
                    noisy, scale = _core.output_perturbation(
                        W,
                        paper_sens,
                        eps / share,
                        data.delta / share if gaussian else 0.0,
                        seed=1_000_003 * seed + 1009 * test + e_i,
                        per_output=per_output,
                    )
                    flags = _core.FLAG_UNIT_ROWS
                    W_rel = noisy if per_output else noisy[0]
                    pred = predict_labels(data, "logistic", flags, W_rel, data.X_test)
                    key = ("logistic", "paper", test, eps)
                    res.acc[key].append(float(np.mean(pred == data.y_test)))
                    res.bal[key].append(balanced_accuracy(data.y_test, pred))
                    res.noise[("paper", test, eps)] = (paper_sens, scale, eps / share)
            res.seconds["paper formula (in memory)"].append(time.perf_counter() - t0)
        print(
            f"#   {data.name}: seed {seed} done ({s_i + 1}/{len(seeds)}, "
            f"{time.perf_counter() - t_seed:.1f} s)",
            flush=True,
        )
    return res


def sklearn_reference(data: BenchData) -> tuple[float, float] | None:
    """Non-private full-batch logistic regression on the same rows (the linear model's ceiling)."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        return None
    import warnings

    Xtr = dsets.normalize_rows(data.X_train)
    Xte = dsets.normalize_rows(data.X_test)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = LogisticRegression(C=1e4, fit_intercept=False, max_iter=2000).fit(Xtr, data.y_train)
    pred = clf.predict(Xte)
    return float(np.mean(pred == data.y_test)), balanced_accuracy(data.y_test, pred)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def ms(values: Sequence[float], digits: int = 4) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def expected_noise_norm(d: int, scale: float, gaussian: bool) -> float:
    # Gamma(d, scale) radius for eps-DP; ||N(0, sigma^2 I_d)|| has mean ~ sigma sqrt(d).
    return scale * math.sqrt(d) if gaussian else scale * d


def report(  # noqa: C901
    data: BenchData,
    res: Results,
    eps_grid: Sequence[float],
    n_seeds: int,
    ref: tuple[float, float] | None,
) -> list[str]:
    lines: list[str] = []
    counts = np.unique(data.y_test, return_counts=True)[1]
    majority = counts.max() / counts.sum()
    lines.append(
        f"## {data.name}: {data.note}; m = {data.m:,} train / {len(data.y_test):,} test, "
        f"d = {data.d}, b = {BATCH}, {EPOCHS} passes, lambda = {LAMBDA:g} (SC), "
        f"delta = 1/m^2 = {data.delta:.3g}; {n_seeds} seeds (mean ± std)"
    )
    lines.append(f"majority class of the test set: {majority:.4f}")
    if ref is not None:
        lines.append(
            f"reference, non-private full-batch sklearn LogisticRegression (C = 1e4, no "
            f"intercept, unit rows): acc {ref[0]:.4f}, balanced {ref[1]:.4f}"
        )
    if res.parity:
        lines.append(
            "in-memory SC model (paper-formula curve) vs the server's noiseless SC model, "
            f"same permutation: max |w diff| = {max(res.parity):.3g}"
        )
    lines.append("")
    lines.append(
        f"{'noiseless':<46} {'model':<12} {'accuracy':>17} {'balanced acc':>17}  {'mean |w|':>8}"
    )
    for model in models_for(data):
        for variant in NOISELESS:
            key: tuple = (model, "noiseless", variant, None)
            lines.append(
                f"{NOISELESS_TITLES[variant]:<46} {model:<12} {ms(res.acc[key]):>17} "
                f"{ms(res.bal[key]):>17}  "
                f"{statistics.fmean(res.norms[(model, variant)]):8.2f}"
            )
    multi = data.multiclass
    for test in TESTS:
        sc, gaussian = TESTS[test]
        lines.append("")
        lines.append(f"### {data.name}, {TEST_TITLES[test]}")
        cols = [
            "eps",
            "eps/model",
            "bolt-on" + (" (one-vs-all)" if multi else ""),
            "bal. acc",
            "Delta2",
            "E|noise|/model",
        ]
        if gaussian:
            cols.append("classic/analytic")
        if multi:
            cols += ["multinomial", "E|noise|"]
        if sc:
            cols += ["paper formula (not DP)", "bal. acc", "E|noise| paper"]
        rows = [cols]
        for eps in eps_grid:
            sens, scale, eps_model = res.noise[("logistic", test, eps)]
            assert sens is not None and scale is not None and eps_model is not None
            key = ("logistic", "bolton", test, eps)
            row = [
                f"{eps:g}",
                f"{eps_model:g}",
                ms(res.acc[key]),
                ms(res.bal[key]),
                f"{sens:.4g}",
                f"{expected_noise_norm(data.d, scale, gaussian):.3g}",
            ]
            if gaussian:
                delta_model = data.delta / (len(data.labels) if multi else 1)
                if eps_model < 1:
                    classic = _core.gaussian_sigma(sens, eps_model, delta_model, "classic")
                    row.append(f"{classic / scale:.2f}")
                else:
                    row.append("n/a (eps>=1)")
            if multi:
                mkey = ("multinomial", "bolton", test, eps)
                _, mscale, _ = res.noise[("multinomial", test, eps)]
                assert mscale is not None
                row += [
                    ms(res.acc[mkey]),
                    f"{expected_noise_norm(data.d * len(data.labels), mscale, gaussian):.3g}",
                ]
            if sc:
                pkey = ("logistic", "paper", test, eps)
                _, pscale, _ = res.noise[("paper", test, eps)]
                assert pscale is not None
                row += [
                    ms(res.acc[pkey]),
                    ms(res.bal[pkey]),
                    f"{expected_noise_norm(data.d, pscale, gaussian):.3g}",
                ]
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        for r in rows:
            lines.append("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    return lines


def plot(data: BenchData, res: Results, eps_grid: Sequence[float], path: Path) -> None:  # noqa: C901
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5), sharex=True)
    x = np.asarray(eps_grid)
    multi = data.multiclass
    binary = not multi
    counts = np.unique(data.y_test, return_counts=True)[1]
    majority = counts.max() / counts.sum()

    def series(
        ax: Any, key: tuple, label: str, color: str, style: str = "-o", balanced: bool = False
    ) -> None:
        store = res.bal if balanced else res.acc
        mean = np.array([statistics.fmean(store[key[:3] + (e,)]) for e in eps_grid])
        std = np.array(
            [
                statistics.stdev(store[key[:3] + (e,)]) if len(store[key[:3] + (e,)]) > 1 else 0.0
                for e in eps_grid
            ]
        )
        ax.errorbar(
            x,
            mean,
            yerr=std,
            fmt=style,
            color=color,
            label=label,
            capsize=3,
            markersize=4,
            linewidth=1.2 if not balanced else 0.9,
            alpha=1.0 if not balanced else 0.7,
        )

    def hline(
        ax: Any, key: tuple, label: str, color: str, style: Any, balanced: bool = False
    ) -> None:
        store = res.bal if balanced else res.acc
        ax.axhline(
            statistics.fmean(store[key]), color=color, linestyle=style, linewidth=1, label=label
        )

    for test, ax in zip(TESTS, axes.flat, strict=True):
        sc, _ = TESTS[test]
        variant = "sc" if sc else "convex"
        ovr = " one-vs-all" if multi else ""
        hline(ax, ("logistic", "noiseless", variant, None), "noiseless" + ovr, "black", "--")
        if sc:
            hline(
                ax,
                ("logistic", "noiseless", "sc_t4", None),
                "noiseless, 1/(lambda t) (Table 4)",
                "grey",
                ":",
            )
        series(
            ax,
            ("logistic", "bolton", test),
            "bolt-on" + (" one-vs-all (eps/10 each)" if multi else ""),
            "tab:blue",
        )
        if multi:
            hline(
                ax,
                ("multinomial", "noiseless", variant, None),
                "noiseless multinomial",
                "tab:green",
                "-.",
            )
            series(
                ax,
                ("multinomial", "bolton", test),
                "bolt-on multinomial (one draw)",
                "tab:green",
                "-s",
            )
        if sc:
            series(
                ax,
                ("logistic", "paper", test),
                "paper formula 2L/(gamma m b) (NOT DP)",
                "tab:red",
                "--^",
            )
        if binary:
            ax.axhline(
                majority, color="tab:orange", linestyle=":", linewidth=1, label="majority class"
            )
            series(
                ax,
                ("logistic", "bolton", test),
                "bolt-on, balanced acc.",
                "tab:blue",
                ":o",
                balanced=True,
            )
            if sc:
                series(
                    ax,
                    ("logistic", "paper", test),
                    "paper formula, balanced acc.",
                    "tab:red",
                    ":^",
                    balanced=True,
                )
            hline(
                ax,
                ("logistic", "noiseless", variant, None),
                "noiseless, balanced acc.",
                "black",
                (0, (1, 3)),
                balanced=True,
            )
        ax.set_xscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{e:g}" for e in x])
        ax.set_ylim(0.0, 1.02)
        ax.set_title(TEST_TITLES[test], fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[1]:
        ax.set_xlabel("epsilon (total)")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    n = len(next(iter(res.acc.values())))
    fig.suptitle(
        f"{data.name}: bolt-on vs noiseless, b = {BATCH}, {EPOCHS} passes, "
        f"lambda = {LAMBDA:g} (SC), delta = 1/m^2, {n} seeds (mean ± std)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.bolton_accuracy",
        description="Bolt-on accuracy (the paper's Figure 3, tests 1-4).",
    )
    p.add_argument("--seeds", type=int, default=5, help="shuffle seeds per point (default 5)")
    p.add_argument("--eps", type=float, nargs="+", default=None, help="total epsilons")
    p.add_argument("--datasets", default="protein,mnist", help="comma list (protein,mnist)")
    p.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="directory for the PNGs (default bench/figures; a temporary one with --quick)",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="server to use (default: $DPSQL_DSN, else a temporary embedded server)",
    )
    p.add_argument("--pg-version", type=int, default=None, choices=server.SUPPORTED_PG_VERSIONS)
    p.add_argument("--quick", action="store_true", help="1 seed, eps in {0.1, 1, 4}")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds = 1
        args.eps = args.eps or list(QUICK_EPS)
    args.eps = sorted(args.eps or EPS_GRID)
    if args.seeds < 1 or any(e <= 0 for e in args.eps):
        p.error("--seeds must be >= 1 and every eps > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    t_start = time.perf_counter()
    for line in header_lines("bolton_accuracy"):
        print(line)
    seeds = list(range(1, args.seeds + 1))
    data, skipped = load_bench_data(args.datasets.split(","))
    for note in skipped:
        print(f"# {note}")
    if not data:
        print("# no dataset available: nothing to do")
        return 0
    tmp = None
    figures = args.figures
    if figures is None and args.quick:
        tmp = tempfile.TemporaryDirectory(prefix="dpsql-bench-")
        figures = Path(tmp.name)
    figures = figures or FIGURES
    dsn_given = bool(args.dsn or os.environ.get("DPSQL_DSN"))
    out: list[str] = []
    with bench_server(args.dsn, args.pg_version) as (uri, where), dpsql.connect(uri) as db:
        version = db.execute("SHOW server_version").fetchone()[0]
        print(f"# server: PostgreSQL {version} ({where})")
        print(f"# seeds {seeds}, eps {args.eps}", flush=True)
        tag = run_tag(dsn_given)
        try:
            for d in data:
                t0 = time.perf_counter()
                install_data(db, d, tag)
                print(
                    f"#   {d.name}: loaded and registered in {time.perf_counter() - t0:.1f} s",
                    flush=True,
                )
                res = run_dataset(db, d, seeds, args.eps)
                ref = sklearn_reference(d)
                out += report(d, res, args.eps, len(seeds), ref)
                timing = ", ".join(
                    f"{k} {statistics.median(v):.2f} s" for k, v in res.seconds.items()
                )
                out.append(f"median wall time per model (train + evaluate): {timing}")
                out.append("")
                png = figures / f"bolton_{d.name}.png"
                plot(d, res, args.eps, png)
                out.append(f"figure: {png}")
                out.append("")
        finally:
            for d in data:
                drop_data(db, d)
    print()
    for line in out:
        print(line)
    print(f"total time: {time.perf_counter() - t_start:.0f} s")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
