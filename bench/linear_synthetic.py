"""DP linear regression on synthetic data, trained by the server: error vs n, error vs d, and
DP-GD confidence intervals (Varshney et al. 2022 has no experiments: error vs n and vs d check the
rates of its Theorem 10; Brown et al. 2024, §4, Figs. 1, 2, 5, 6 and 8).

Data (as Brown et al. 2024, §4): x ~ N(0, I_d), w* uniform on the unit sphere,
y = <x, w*> + N(0, sigma^2) with sigma = 1; a fresh data set per seed. Public bounds, declared at
registration: ``row_bound = sqrt(d) + 4`` (||x|| concentrates at sqrt(d) with sd ~0.7;
P(||x|| > bound) = 1.5e-7 a row at d = 10: rows are practically never clipped) and
``label_bound = 6 sqrt(||w*||^2 + sigma^2) = 6 sqrt(2)`` from the public ||w*|| <= 1, sigma = 1
(y ~ N(0, 2): P(|y| > bound) = 2e-9 a row).

Every private model is trained *by the server* through SQL (``dpsql.train`` on a registered
regression dataset, charged to its ledger; ``dpsql.confint`` for the intervals), at delta = 1e-6:

* DP-AMBSSGD (``dp_ambssgd``) with ``options => {"h_norm": 1}`` (H = I is the known public
  second moment here) and its default blocks; when the server refuses the plan (DP-STAT's
  stat samples too small for the epsilon) the table says "infeasible" and the rows it needs;
  also with ``r_x = sqrt(d + 2)`` (Varshney et al. 2022, §2: R_x^2 = Tr(H) + 2||H||, exact for
  Gaussian x) instead of the server's default R_x = the registered row bound sqrt(d) + 4: R_x
  sets the clip norms zeta_t = R_x gamma_t sqrt(ln N) and the step, not the privacy;
* DP-SSGD (``dp_ssgd``), the server's defaults (clip R_x label_bound, eta = 1/(2 R_x^2), no
  shuffling amplification claimed);
* DP-GD (``dpgd``): ``ci => 'none'`` (20 steps, the final iterate) and, for n up to
  ``--bm-max-log2n``, ``ci => 'batch_means'`` (420 steps, the mean of the 10 draws);
* AdaSSP (``adassp``);

and OLS in numpy as the non-private reference. Metric: ||w - w*|| (excess risk 0.5 ||w - w*||^2
for H = I), mean ± sd over seeds; also ||w - theta_hat|| (the privacy error, theta_hat the OLS of
the training rows).

Experiments:

1. error vs n: d = 10, eps in {1, 4}, n = 2^13 .. 2^20;
2. error vs d: n = 2^18, d in {5, 10, 20, 40}, eps in {1, 4}; and Brown et al. 2024 Fig. 1's setting
   n = 100 p, p in {5, .., 160}, rho = 0.05 (eps = dpsql.zcdp_epsilon(0.05, 1e-6) = 1.71);
3. DP-GD confidence intervals (Brown et al. 2024, Figs. 5-6, as a function of eps): one data set
   (p = 10, n = 10,000), eps in {0.5, 1, 2, 4}, the three constructions at the same N = 400 steps
   (m = 10 draws, burn-in 20), R runs each: coverage of theta_hat (mean over coordinates,
   standard error sqrt(cov (1 - cov) / (R p))) and mean width, against the non-private OLS
   interval t_{n-p} s sqrt((X^T X)^-1_jj).

Reproducibility: the shuffle takes ``seed =>`` and, by default, the noise ``noise_seed =>``
(data owner only; such models are marked "NOT private" and hidden from analysts), both derived
from the point's identity, so a run is deterministic. ``--strong-random`` leaves the noise to
pg_strong_random (the product's path).

The work runs on ``--workers`` connections (default 2, one per core); each data set is its own
registration, so the ledger's row lock never serialises them.

Usage::

    .venv/bin/python -m bench.linear_synthetic [--seeds 5] [--ci-runs 80] [--dsn DSN]
    .venv/bin/python -m bench.linear_synthetic --quick    # smaller grids, 2 seeds, R = 10

Plots: ``bench/figures/linear_error_vs_n.png``, ``linear_error_vs_d.png`` and ``linear_ci.png``
(a temporary directory with ``--quick`` unless ``--figures`` is given). Without ``--dsn`` (or
``DPSQL_DSN``) a throw-away embedded server is used.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb
from scipy import stats

import dpsql
from bench.bolton_accuracy import bench_server, header_lines, run_tag
from dpsql import server

SIGMA = 1.0
W_NORM = 1.0  # ||w*||, public
DELTA = 1e-6
SCHEMA = "dpsql_bench_linear"
FIGURES = Path(__file__).resolve().parent / "figures"
LABEL_BOUND = 6.0 * math.sqrt(W_NORM**2 + SIGMA**2)

# key -> (label, privacy, extra dpsql.train arguments)
METHODS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "ambssgd": ("DP-AMBSSGD", "dp_ambssgd", {"options": {"h_norm": 1}}),
    # The same with the exact R_x^2 = Tr(H) + 2||H|| = d + 2 (E||x||^2 x x^T = (d + 2) I for
    # Gaussian x) instead of the registered row bound: options added in run_point.
    "ambssgd_rx": ("DP-AMBSSGD r_x=sqrt(d+2)", "dp_ambssgd", {}),
    "ssgd": ("DP-SSGD", "dp_ssgd", {"options": {"baseline": True}}),
    "dpgd": ("DP-GD final (20 steps)", "dpgd", {"ci": "none"}),
    "dpgd_bm": ("DP-GD batch means (420)", "dpgd", {"ci": "batch_means"}),
    "adassp": ("AdaSSP", "adassp", {}),
}
COLORS = {
    "ols": "black",
    "ambssgd": "tab:blue",
    "ambssgd_rx": "tab:cyan",
    "ssgd": "tab:purple",
    "dpgd": "tab:red",
    "dpgd_bm": "tab:orange",
    "adassp": "tab:green",
}
MARKERS = {
    "ols": "s",
    "ambssgd": "o",
    "ambssgd_rx": "P",
    "ssgd": "v",
    "dpgd": "^",
    "dpgd_bm": "D",
    "adassp": "x",
}
CI_METHODS = ("batch_means", "checkpoints", "independent_runs")


@dataclass(frozen=True)
class Config:
    seeds: list[int]
    e1_log2n: list[int]
    e1_eps: list[float]
    bm_max_log2n: int
    e2_n: int
    e2_d: list[int]
    e2_eps: list[float]
    e2b_p: list[int]
    e2b_rho: float
    ci_eps: list[float]
    ci_runs: int
    ci_steps: int
    ci_n: int
    ci_p: int
    noise_seeds: bool


# --------------------------------------------------------------------------------------------
# Data and the server
# --------------------------------------------------------------------------------------------


def synthetic(key: Sequence[int], n: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x ~ N(0, I_d), w* uniform on the unit sphere, y = <x, w*> + N(0, sigma^2)."""
    rng = np.random.default_rng(list(key))
    w = rng.normal(size=d)
    w *= W_NORM / np.linalg.norm(w)
    X = rng.normal(size=(n, d))
    y = X @ w + SIGMA * rng.normal(size=n)
    return X, y, w


def ols(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(X, y, rcond=None)[0]


def stable_seed(*key: Any) -> int:
    """A bigint seed from a point's identity (independent of scheduling)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


class Workers:
    """One dpsql connection per worker thread, opened on first use."""

    def __init__(self, uri: str, n: int) -> None:
        self.uri = uri
        self.n = n
        self.local = threading.local()
        self.all: list[dpsql.Database] = []
        self.lock = threading.Lock()

    def db(self) -> dpsql.Database:
        db = getattr(self.local, "db", None)
        if db is None:
            db = dpsql.connect(self.uri)
            self.local.db = db
            self.local.state = {}
            with self.lock:
                self.all.append(db)
        return db

    def state(self) -> dict[str, Any]:
        self.db()
        return self.local.state

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        with ThreadPoolExecutor(max_workers=self.n) as pool:
            return list(pool.map(fn, items))

    def close(self) -> None:
        # Each worker drops the tables it kept (the CI data set's copies).
        for db in self.all:
            for table in getattr(db, "_bench_tables", []):
                drop(db, table)
            with contextlib.suppress(Exception):
                db.close()


def install(db: dpsql.Database, table: str, X: np.ndarray, y: np.ndarray) -> str:
    """Load a table and register it as a regression dataset (data owner); returns its name."""
    d = X.shape[1]
    db.load_numpy(table, X, y, replace=True)
    name = table.replace(".", "_")
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e6, accept => true,"
        " delta_budget => 0.9, label_bound => %s, row_bound => %s, name => %s)",
        (table, LABEL_BOUND, math.sqrt(d) + 4.0, name),
    )
    return name


def drop(db: dpsql.Database, table: str) -> None:
    with contextlib.suppress(Exception):
        db.execute(f"DROP TABLE IF EXISTS {table}")


@dataclass
class Fit:
    coef: np.ndarray | None  # None: refused as infeasible
    privacy: dict[str, Any]
    seconds: float
    model_id: int | None = None
    needs: int | None = None  # refused: rows the server says DP-AMBSSGD needs (0: not said)


_NEEDS = re.compile(r"Needs about (\d+) rows")


def train(
    db: dpsql.Database,
    dataset: str,
    privacy: str,
    eps: float,
    seed: int,
    noise_seed: int | None,
    extra: dict[str, Any],
) -> Fit:
    """One private release by the server; 'infeasible' only for DP-STAT's V3 refusal."""
    args: dict[str, Any] = {
        "privacy": privacy,
        "epsilon": eps,
        "delta": DELTA,
        "seed": seed,
        **{k: Jsonb(v) if isinstance(v, dict) else v for k, v in extra.items()},
    }
    if noise_seed is not None:
        args["noise_seed"] = noise_seed
    names = "".join(f", {k} => %s" for k in args)
    t0 = time.perf_counter()
    try:
        row = db.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'linear'{names})", (dataset, *args.values())
        ).fetchone()
    except psycopg.Error as err:
        primary = err.diag.message_primary or ""
        # The plan refusals of DP-AMBSSGD (before any charge): DP-STAT's V3, or blocks with
        # no room for a stat sample and a batch. Anything else is reported as it is.
        if privacy == "dp_ambssgd" and (
            "DP-STAT is infeasible" in primary or "make no blocks" in primary
        ):
            m = _NEEDS.search(err.diag.message_hint or "")
            return Fit(
                None,
                {"refusal": primary},
                time.perf_counter() - t0,
                needs=int(m.group(1)) if m else 0,
            )
        raise
    assert row is not None
    mid = int(row[0])
    coef, priv = db.execute(
        "SELECT coef, params->'privacy' FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    return Fit(np.asarray(coef, dtype=np.float64), priv or {}, time.perf_counter() - t0, mid)


# --------------------------------------------------------------------------------------------
# Experiments 1 and 2: error of each method on one data set
# --------------------------------------------------------------------------------------------


@dataclass
class Point:
    """One data set (experiment, seed, n, d) and every method's release on it."""

    exp: str
    seed: int
    n: int
    d: int
    w_star: np.ndarray = field(default_factory=lambda: np.zeros(0))
    theta_hat: np.ndarray = field(default_factory=lambda: np.zeros(0))
    fits: dict[tuple[str, float], Fit] = field(default_factory=dict)


def run_point(
    workers: Workers, tag: str, cfg: Config, exp: str, seed: int, n: int, d: int,
    eps_list: Sequence[float], methods: Sequence[str],
) -> Point:  # fmt: skip
    db = workers.db()
    X, y, w = synthetic((hash_exp(exp), seed, n, d), n, d)
    pt = Point(exp, seed, n, d, w, ols(X, y))
    table = f"{SCHEMA}.{exp}_s{seed}_n{n}_d{d}{tag}"
    dataset = install(db, table, X, y)
    del X, y
    try:
        for eps in eps_list:
            for key in methods:
                _, privacy, extra = METHODS[key]
                if key == "ambssgd_rx":
                    base = pt.fits.get(("ambssgd", eps))
                    if base is not None and base.coef is None:
                        pt.fits[(key, eps)] = base  # the same plan: refused the same way
                        continue
                    extra = {"options": {"h_norm": 1, "r_x": math.sqrt(d + 2)}}
                noise = stable_seed(exp, seed, n, d, eps, key) if cfg.noise_seeds else None
                pt.fits[(key, eps)] = train(db, dataset, privacy, eps, seed, noise, extra)
    finally:
        drop(db, table)
    return pt


def hash_exp(exp: str) -> int:
    return {"e1": 1, "e2": 2, "e2b": 3, "e3": 4}[exp]


def methods_for(exp: str, n: int, cfg: Config) -> list[str]:
    keys = (
        ["ambssgd", "ssgd", "dpgd"] if exp == "e2b" else ["ambssgd", "ambssgd_rx", "ssgd", "dpgd"]
    )
    if exp == "e1" and n <= 2**cfg.bm_max_log2n:
        keys.append("dpgd_bm")
    return [*keys, "adassp"]


def run_grid(
    workers: Workers, tag: str, cfg: Config, exp: str, ns_ds: Sequence[tuple[int, int]],
    eps_of: Callable[[int, int], Sequence[float]],
) -> list[Point]:  # fmt: skip
    tasks = [(seed, n, d) for (n, d) in ns_ds for seed in cfg.seeds]
    # Largest first: the pool then ends with the small ones.
    tasks.sort(key=lambda t: -t[1] * (t[2] + 10))

    def one(task: tuple[int, int, int]) -> Point:
        seed, n, d = task
        return run_point(workers, tag, cfg, exp, seed, n, d, eps_of(n, d), methods_for(exp, n, cfg))

    return workers.map(one, tasks)


def errors(
    points: Sequence[Point], key: str, eps: float | None, n: int, d: int, target: str = "w"
) -> tuple[list[float], int | None]:
    """||w - w*|| (or ||w - theta_hat||) over seeds; and the rows needed when refused."""
    out: list[float] = []
    needs = None
    for pt in points:
        if pt.n != n or pt.d != d:
            continue
        ref = pt.w_star if target == "w" else pt.theta_hat
        if key == "ols":
            out.append(float(np.linalg.norm(pt.theta_hat - ref)))
            continue
        fit = pt.fits.get((key, eps))
        if fit is None:
            continue
        if fit.coef is None:
            needs = fit.needs
            continue
        out.append(float(np.linalg.norm(fit.coef - ref)))
    return out, needs


def cell(values: Sequence[float], needs: int | None, present: bool = True) -> str:
    if values:
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{mean:.3g} ± {sd:.2g}"
    if needs is not None or not present:
        if needs is None:
            return "-"
        return f"infeasible (needs {needs:,})" if needs else "infeasible (no blocks)"
    return "-"


def markdown(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["| " + " | ".join(v.ljust(w) for v, w in zip(rows[0], widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows[1:]:
        out.append("| " + " | ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) + " |")
    return out


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and y > 0]
    if len(pts) < 2:
        return None
    lx = np.log([p[0] for p in pts])
    ly = np.log([p[1] for p in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def mean_or_none(v: Sequence[float]) -> float | None:
    return statistics.fmean(v) if v else None


def table_vs(
    points: Sequence[Point], eps: float, axis: str, grid: Sequence[tuple[int, int]],
    keys: Sequence[str], target: str = "w", excess: bool = False,
) -> list[str]:  # fmt: skip
    """Markdown table of one eps: a row per (n, d), a column per method, and fitted slopes."""
    head = ["n" if axis == "n" else "d", "OLS" if target == "w" else "OLS (= 0)"]
    head += [METHODS[k][0] for k in keys]
    rows = [head]
    series: dict[str, list[float | None]] = defaultdict(list)
    for n, d in grid:
        r = [f"2^{int(math.log2(n))}" if axis == "n" else f"{d}"]
        for k in ("ols", *keys):
            vals, needs = errors(points, k, eps, n, d, target)
            if excess:
                vals = [0.5 * v * v for v in vals]
            if k == "ols" and target != "w":
                r.append("0")
                continue
            present = any(pt.fits.get((k, eps)) for pt in points if pt.n == n and pt.d == d)
            r.append(cell(vals, needs, present) if k != "ols" else cell(vals, None))
            series[k].append(mean_or_none(vals))
        rows.append(r)
    xs = [n if axis == "n" else d for n, d in grid]
    srow = ["slope (log-log)"]
    for k in ("ols", *keys):
        if k == "ols" and target != "w":
            srow.append("")
            continue
        ys = series[k]
        s = slope([x for x, y in zip(xs, ys, strict=True) if y], [y for y in ys if y])
        srow.append("" if s is None else f"{s:+.2f}")
    rows.append(srow)
    return markdown(rows)


# --------------------------------------------------------------------------------------------
# Experiment 3: confidence intervals
# --------------------------------------------------------------------------------------------


@dataclass
class CIData:
    X: np.ndarray
    y: np.ndarray
    w_star: np.ndarray
    theta_hat: np.ndarray
    ols_width: float  # mean over coordinates of 2 t_{n-p} s sqrt((X^T X)^-1_jj)


def ci_data(cfg: Config) -> CIData:
    X, y, w = synthetic((hash_exp("e3"), 0, cfg.ci_n, cfg.ci_p), cfg.ci_n, cfg.ci_p)
    th = ols(X, y)
    n, p = X.shape
    s = math.sqrt(float(np.sum((y - X @ th) ** 2)) / (n - p))
    diag = np.diag(np.linalg.inv(X.T @ X))
    t = stats.t.ppf(0.975, n - p)
    return CIData(X, y, w, th, float(np.mean(2 * t * s * np.sqrt(diag))))


@dataclass
class CIRun:
    lower: np.ndarray
    upper: np.ndarray
    target: str | None
    noise_std: float
    seconds: float


def run_ci(
    workers: Workers, tag: str, cfg: Config, data: CIData, task: tuple[float, str, int]
) -> CIRun:
    eps, method, r = task
    db = workers.db()
    st = workers.state()
    if "ci_dataset" not in st:
        # Every worker registers its own copy of the same rows (its own ledger row).
        table = f"{SCHEMA}.ci_w{threading.get_ident() % 100000}{tag}"
        st["ci_dataset"] = install(db, table, data.X, data.y)
        db._bench_tables = [table]  # type: ignore[attr-defined]
    noise = stable_seed("e3", eps, method, r) if cfg.noise_seeds else None
    fit = train(
        db, st["ci_dataset"], "dpgd", eps, r + 1, noise, {"ci": method, "steps": cfg.ci_steps}
    )
    rows = db.execute(
        "SELECT lower, upper FROM dpsql.confint(%s, 0.05) ORDER BY coef_index", (fit.model_id,)
    ).fetchall()
    lo = np.array([r_[0] for r_ in rows])
    hi = np.array([r_[1] for r_ in rows])
    ci = fit.privacy.get("ci", {})
    return CIRun(lo, hi, ci.get("target"), float(fit.privacy["noise_std"]), fit.seconds)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


Y_TOP = 3.0  # ||w - w*|| above this (w = 0 scores ||w*|| = 1) is off the plots


def _finish(ax: Any) -> None:
    """Log axes, the w = 0 line, the off-scale notes and the legend."""
    ax.axhline(W_NORM, color="grey", ls="-.", lw=0.8, label="||w*|| (the error of w = 0)")
    ax.set_yscale("log")
    ax.set_ylim(top=Y_TOP)
    ax.grid(True, which="both", alpha=0.3)
    notes = ax.__dict__.get("_off_scale", [])
    if notes:
        ax.text(0.02, 0.98, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="top")


def _figure_legend(fig: Any, axes: Any) -> None:
    """One legend under the panels for every curve drawn in any of them."""
    seen: dict[str, Any] = {}
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    ncol = 5
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=ncol, fontsize=8)
    rows = -(-len(seen) // ncol)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.25 * rows + 0.1) / height, 1, 1 - 0.3 / height))


def _series(
    ax: Any, points: Sequence[Point], key: str, eps: float, grid: Sequence[tuple[int, int]],
    axis: str, target: str,
) -> None:  # fmt: skip
    xs, ms, sds = [], [], []
    for n, d in grid:
        vals, _ = errors(points, key, eps, n, d, target)
        if vals:
            xs.append(n if axis == "n" else d)
            ms.append(statistics.fmean(vals))
            sds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    if not xs:
        return
    label = "OLS" if key == "ols" else METHODS[key][0]
    if max(ms) > Y_TOP:
        # Off the scale (DP-SSGD): named in a note instead of squashing the other curves.
        notes = ax.__dict__.setdefault("_off_scale", [])
        notes.append(f"{label}: {min(ms):.3g} .. {max(ms):.3g}, off scale (see the tables)")
        return
    ax.errorbar(
        xs, ms, yerr=sds, fmt="-" + MARKERS[key], color=COLORS[key], label=label,
        capsize=2, markersize=4, linewidth=1.1,
    )  # fmt: skip


def plot_vs_n(points: Sequence[Point], cfg: Config, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(2, len(cfg.e1_eps), figsize=(5.5 * len(cfg.e1_eps), 9), squeeze=False)
    d = 10
    grid = [(2**k, d) for k in cfg.e1_log2n]
    ns = np.array([n for n, _ in grid], dtype=float)
    for j, eps in enumerate(cfg.e1_eps):
        for i, target in enumerate(("w", "theta")):
            ax = axes[i, j]
            keys = ["ols", *METHODS] if target == "w" else list(METHODS)
            for k in keys:
                _series(ax, points, k, eps, grid, "n", target)
            if target == "w":
                ax.plot(ns, SIGMA * np.sqrt(d / ns), "k:", lw=1, label="sigma sqrt(d / n)")
                ax.set_title(f"E1: ||w - w*||, d = {d}, eps = {eps:g}", fontsize=10)
            else:
                first, _ = errors(points, "dpgd", eps, grid[0][0], d, "theta")
                if first:
                    c = statistics.fmean(first) * ns[0]
                    ax.plot(ns, c / ns, "k--", lw=0.8, label="slope -1 (guide)")
                ax.set_title(f"E1: privacy error ||w - theta_hat||, eps = {eps:g}", fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("n")
            _finish(ax)
    fig.suptitle(
        f"dpsql DP linear regression through the server, delta = {DELTA:g}, "
        f"{len(cfg.seeds)} seeds (mean ± sd); DP-AMBSSGD missing = infeasible (DP-STAT V3)",
        fontsize=10,
    )
    _figure_legend(fig, axes)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs_d(points: Sequence[Point], pts_b: Sequence[Point], cfg: Config, eps_b: float,
              path: Path) -> None:  # fmt: skip
    plt = _plt()
    panels = len(cfg.e2_eps) + 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.6), squeeze=False)
    grid = [(cfg.e2_n, d) for d in cfg.e2_d]
    for j, eps in enumerate(cfg.e2_eps):
        ax = axes[0, j]
        for k in ("ols", *METHODS):
            _series(ax, points, k, eps, grid, "d", "w")
        ds = np.array(cfg.e2_d, dtype=float)
        ax.plot(ds, SIGMA * np.sqrt(ds / cfg.e2_n), "k:", lw=1, label="sigma sqrt(d / n)")
        ax.set_title(f"E2: n = 2^{int(math.log2(cfg.e2_n))}, eps = {eps:g}", fontsize=10)
    ax = axes[0, -1]
    grid_b = [(100 * p, p) for p in cfg.e2b_p]
    for k in ("ols", *METHODS):
        _series(ax, pts_b, k, eps_b, grid_b, "d", "w")
    ax.set_title(
        f"E2b (Brown et al. 2024, Fig. 1): n = 100 p, rho = {cfg.e2b_rho:g} (eps = {eps_b:.3g})",
        fontsize=10,
    )
    for j, ax in enumerate(axes[0]):
        ticks = cfg.e2b_p if j == panels - 1 else cfg.e2_d
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("d (= p)")
        _finish(ax)
    axes[0, 0].set_ylabel("||w - w*||")
    fig.suptitle(
        f"error vs dimension, delta = {DELTA:g}, {len(cfg.seeds)} seeds (mean ± sd)", fontsize=10
    )
    _figure_legend(fig, axes)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ci(summary: dict[tuple[float, str], dict[str, float]], cfg: Config, ols_width: float,
            path: Path) -> None:  # fmt: skip
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    x = np.asarray(cfg.ci_eps)
    colors = {"batch_means": "tab:blue", "checkpoints": "tab:red", "independent_runs": "tab:green"}
    for i, m in enumerate(CI_METHODS):
        cov = np.array([summary[(e, m)]["coverage"] for e in cfg.ci_eps])
        se = np.array([summary[(e, m)]["se"] for e in cfg.ci_eps])
        wid = np.array([summary[(e, m)]["width"] for e in cfg.ci_eps])
        wsd = np.array([summary[(e, m)]["width_sd"] for e in cfg.ci_eps])
        shift = 1 + 0.03 * (i - 1)
        a1.errorbar(x * shift, cov, yerr=1.96 * se, fmt="-o", color=colors[m], label=m, capsize=3)
        a2.errorbar(x * shift, wid, yerr=wsd, fmt="-o", color=colors[m], label=m, capsize=3)
    a1.axhline(0.95, color="black", ls="--", lw=1, label="nominal 0.95")
    a2.axhline(ols_width, color="black", ls="--", lw=1, label="non-private OLS CI (for theta*)")
    for ax in (a1, a2):
        ax.set_xscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{e:g}" for e in x])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("epsilon (delta = 1e-6)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    a1.set_ylabel("coverage of theta_hat (mean over coords, ± 1.96 se)")
    a1.set_ylim(max(0.0, min(0.8, a1.get_ylim()[0])), 1.0)
    a2.set_yscale("log")
    a2.set_ylabel("mean CI width (± sd over runs)")
    fig.suptitle(
        f"DP-GD 95% intervals (dpsql.confint): p = {cfg.ci_p}, n = {cfg.ci_n:,}, "
        f"N = {cfg.ci_steps} steps, m = 10, burn-in 20, R = {cfg.ci_runs} runs per point",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(
        prog="python -m bench.linear_synthetic",
        description="DP linear regression on synthetic data, through the server.",
    )
    p.add_argument("--seeds", type=int, default=None, help="data sets per point (default 5)")
    p.add_argument("--e1-max-log2n", type=int, default=None, help="largest n of E1 (default 20)")
    p.add_argument(
        "--bm-max-log2n",
        type=int,
        default=None,
        help="DP-GD batch means in E1 up to this n (default 17: 420 scans a model)",
    )
    p.add_argument("--ci-runs", type=int, default=None, help="runs per CI point (default 80)")
    p.add_argument("--workers", type=int, default=2, help="server connections (default 2)")
    p.add_argument(
        "--strong-random",
        action="store_true",
        help="no noise_seed: noise from pg_strong_random (not reproducible)",
    )
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
    p.add_argument("--quick", action="store_true", help="smaller grids, 2 seeds, R = 10")
    a = p.parse_args(argv)
    q = a.quick
    seeds = a.seeds or (2 if q else 5)
    max_n = a.e1_max_log2n or (17 if q else 20)
    cfg = Config(
        seeds=list(range(1, seeds + 1)),
        e1_log2n=list(range(13, max_n + 1)),
        e1_eps=[1.0, 4.0],
        bm_max_log2n=a.bm_max_log2n if a.bm_max_log2n is not None else (15 if q else 17),
        e2_n=2**16 if q else 2**18,
        e2_d=[5, 10, 20] if q else [5, 10, 20, 40],
        e2_eps=[1.0, 4.0],
        e2b_p=[5, 10, 20, 40] if q else [5, 10, 20, 40, 80, 160],
        e2b_rho=0.05,
        ci_eps=[1.0, 4.0] if q else [0.5, 1.0, 2.0, 4.0],
        ci_runs=a.ci_runs or (10 if q else 80),
        ci_steps=400,
        ci_n=10_000,
        ci_p=10,
        noise_seeds=not a.strong_random,
    )
    if seeds < 1 or cfg.ci_runs < 2 or a.workers < 1:
        p.error("--seeds >= 1, --ci-runs >= 2 and --workers >= 1")
    return a, cfg


def main(argv: list[str] | None = None) -> int:
    args, cfg = _parse(argv)
    t_start = time.perf_counter()
    command = "python -m bench.linear_synthetic " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    for line in header_lines("linear_synthetic"):
        print(line)
    print(f"# command: {command.strip()}")
    tmp = None
    figures = args.figures
    if figures is None and args.quick:
        tmp = tempfile.TemporaryDirectory(prefix="dpsql-bench-")
        figures = Path(tmp.name)
    figures = figures or FIGURES
    dsn_given = bool(args.dsn or os.environ.get("DPSQL_DSN"))
    tag = run_tag(dsn_given)
    out: list[str] = []
    with bench_server(args.dsn, args.pg_version) as (uri, where):
        workers = Workers(uri, args.workers)
        try:
            db = workers.db()
            version = db.execute("SHOW server_version").fetchone()[0]
            eps_b = float(
                db.execute("SELECT dpsql.zcdp_epsilon(%s, %s)", (cfg.e2b_rho, DELTA)).fetchone()[0]
            )
            db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            print(f"# server: PostgreSQL {version} ({where}), {args.workers} connections")
            print(
                f"# seeds {cfg.seeds}; noise: "
                + (
                    "noise_seed => derived from each point (reproducible; models marked NOT "
                    "private)"
                    if cfg.noise_seeds
                    else "pg_strong_random"
                ),
                flush=True,
            )
            out += experiment_1(workers, tag, cfg, figures)
            out += experiment_2(workers, tag, cfg, eps_b, figures)
            out += experiment_3(workers, tag, cfg, figures)
        finally:
            workers.close()
    print()
    for line in out:
        print(line)
    print(f"total time: {time.perf_counter() - t_start:.0f} s")
    if tmp is not None:
        tmp.cleanup()
    return 0


def experiment_1(workers: Workers, tag: str, cfg: Config, figures: Path) -> list[str]:
    t0 = time.perf_counter()
    d = 10
    grid = [(2**k, d) for k in cfg.e1_log2n]
    points = run_grid(workers, tag, cfg, "e1", grid, lambda n, d_: cfg.e1_eps)
    print(f"#   E1 done in {time.perf_counter() - t0:.0f} s", flush=True)
    keys = list(METHODS)
    out = [
        "## E1: error vs n (d = 10, sigma = 1, delta = 1e-6; row_bound = sqrt(d) + 4, "
        f"label_bound = 6 sqrt(2) = {LABEL_BOUND:.3f}; {len(cfg.seeds)} seeds, mean ± sd)",
        "",
        f"DP-GD batch means only for n <= 2^{cfg.bm_max_log2n} (420 scans a model). "
        "Slopes: least squares of log(mean) on log(n) over the points shown.",
        "",
    ]
    for eps in cfg.e1_eps:
        out += [f"### E1, eps = {eps:g}: ||w - w*||", ""]
        out += table_vs(points, eps, "n", grid, keys)
        out += ["", f"### E1, eps = {eps:g}: excess risk 0.5 ||w - w*||^2 (H = I)", ""]
        out += table_vs(points, eps, "n", grid, keys, excess=True)
        out += ["", f"### E1, eps = {eps:g}: privacy error ||w - theta_hat|| (theta_hat = OLS)", ""]
        out += table_vs(points, eps, "n", grid, keys, target="theta")
        out.append("")
    out += ambssgd_plans(points, cfg.e1_eps, grid)
    out += timing_lines(points)
    png = figures / "linear_error_vs_n.png"
    plot_vs_n(points, cfg, png)
    out += [f"figure: {png}", ""]
    return out


def ambssgd_plans(
    points: Sequence[Point], eps_list: Sequence[float], grid: Sequence[tuple[int, int]]
) -> list[str]:
    """What the server planned (or refused) for DP-AMBSSGD at each point (seed-independent)."""
    rows = [["n", "d", "eps", "blocks T", "batch b", "stat s", "unused rows", "server says"]]
    for n, d in grid:
        for eps in eps_list:
            fit = next(
                (pt.fits.get(("ambssgd", eps)) for pt in points if pt.n == n and pt.d == d),
                None,
            )
            if fit is None:
                continue
            if fit.coef is None:
                says = (
                    f"infeasible (DP-STAT V3), needs ~{fit.needs:,} rows"
                    if fit.needs
                    else "refused: " + fit.privacy["refusal"].removeprefix("dpsql: ")
                )
                rows.append([f"{n:,}", f"{d}", f"{eps:g}", "", "", "", "", says])
                continue
            pr = fit.privacy
            rows.append(
                [
                    f"{n:,}",
                    f"{d}",
                    f"{eps:g}",
                    f"{pr.get('blocks')}",
                    f"{pr.get('batch_size')}",
                    f"{pr.get('stat_size')}",
                    f"{pr.get('unused_rows')}",
                    "ok",
                ]
            )
    return ["### DP-AMBSSGD plans (h_norm = 1, default blocks)", "", *markdown(rows), ""]


def timing_lines(points: Sequence[Point]) -> list[str]:
    per: dict[tuple[str, int], list[float]] = defaultdict(list)
    for pt in points:
        for (k, _), fit in pt.fits.items():
            if fit.coef is not None:
                per[(k, pt.n)].append(fit.seconds)
    ns = sorted({n for _, n in per})
    parts = []
    for n in (ns[0], ns[-1]) if len(ns) > 1 else ns:
        parts.append(
            f"n = {n:,}: "
            + ", ".join(
                f"{METHODS[k][0]} {statistics.median(per[(k, n)]):.2f} s"
                for k in METHODS
                if per.get((k, n))
            )
        )
    return [
        "median seconds per dpsql.train call (incl. reading the model): " + "; ".join(parts),
        "",
    ]


def experiment_2(workers: Workers, tag: str, cfg: Config, eps_b: float, figures: Path) -> list[str]:
    t0 = time.perf_counter()
    grid = [(cfg.e2_n, d) for d in cfg.e2_d]
    points = run_grid(workers, tag, cfg, "e2", grid, lambda n, d: cfg.e2_eps)
    grid_b = [(100 * p, p) for p in cfg.e2b_p]
    pts_b = run_grid(workers, tag, cfg, "e2b", grid_b, lambda n, d: [eps_b])
    print(f"#   E2 done in {time.perf_counter() - t0:.0f} s", flush=True)
    keys = ["ambssgd", "ambssgd_rx", "ssgd", "dpgd", "adassp"]
    out = [
        f"## E2: error vs d at n = 2^{int(math.log2(cfg.e2_n))} ({len(cfg.seeds)} seeds, "
        "mean ± sd; ||w - w*||; slope = log-log in d)",
        "",
    ]
    for eps in cfg.e2_eps:
        out += [f"### E2, n = {cfg.e2_n:,}, eps = {eps:g}", ""]
        out += table_vs(points, eps, "d", grid, keys)
        out.append("")
    out += ambssgd_plans(points, cfg.e2_eps, grid)
    out += [
        f"### E2b (Brown et al. 2024, Fig. 1): n = 100 p, rho = {cfg.e2b_rho:g} zCDP "
        f"(eps = {eps_b:.4g} at delta = 1e-6), DP-GD 20 steps (the paper's figure uses 10)",
        "",
    ]
    out += table_vs(pts_b, eps_b, "d", grid_b, [k for k in keys if k != "ambssgd_rx"])
    out += [
        "",
        "E2b DP-AMBSSGD: "
        + "; ".join(
            f"p = {p}: " + cell([], errors(pts_b, "ambssgd", eps_b, 100 * p, p)[1], present=False)
            for p in cfg.e2b_p
            if not errors(pts_b, "ambssgd", eps_b, 100 * p, p)[0]
        ),
        "",
    ]
    png = figures / "linear_error_vs_d.png"
    plot_vs_d(points, pts_b, cfg, eps_b, png)
    out += [f"figure: {png}", ""]
    return out


def experiment_3(workers: Workers, tag: str, cfg: Config, figures: Path) -> list[str]:
    t0 = time.perf_counter()
    data = ci_data(cfg)
    tasks = [(e, m, r) for e in cfg.ci_eps for m in CI_METHODS for r in range(cfg.ci_runs)]
    runs = workers.map(lambda t: run_ci(workers, tag, cfg, data, t), tasks)
    print(f"#   E3 done in {time.perf_counter() - t0:.0f} s", flush=True)
    by: dict[tuple[float, str], list[CIRun]] = defaultdict(list)
    for (e, m, _), run in zip(tasks, runs, strict=True):
        by[(e, m)].append(run)
    p = cfg.ci_p
    R = cfg.ci_runs
    summary: dict[tuple[float, str], dict[str, float]] = {}
    rows = [
        [
            "eps",
            "method",
            "noise std lambda",
            "coverage theta_hat ± se",
            "per-coord min..max",
            "coverage theta*",
            "mean width ± sd",
            "target ols",
            "s / run",
        ]
    ]
    for e in cfg.ci_eps:
        for m in CI_METHODS:
            rs = by[(e, m)]
            lo = np.stack([r.lower for r in rs])
            hi = np.stack([r.upper for r in rs])
            cov_j = np.mean((lo <= data.theta_hat) & (data.theta_hat <= hi), axis=0)
            cov = float(np.mean(cov_j))
            se = math.sqrt(cov * (1 - cov) / (R * p))
            cov_star = float(np.mean((lo <= data.w_star) & (data.w_star <= hi)))
            widths = np.mean(hi - lo, axis=1)
            summary[(e, m)] = {
                "coverage": cov,
                "se": se,
                "width": float(np.mean(widths)),
                "width_sd": float(np.std(widths, ddof=1)),
            }
            rows.append(
                [
                    f"{e:g}",
                    m,
                    f"{rs[0].noise_std:.4g}",
                    f"{cov:.3f} ± {se:.3f}",
                    f"{cov_j.min():.2f}..{cov_j.max():.2f}",
                    f"{cov_star:.3f}",
                    f"{np.mean(widths):.4f} ± {np.std(widths, ddof=1):.4f}",
                    f"{sum(r.target == 'ols' for r in rs)}/{len(rs)}",
                    f"{statistics.median(r.seconds for r in rs):.2f}",
                ]
            )
    out = [
        f"## E3: DP-GD confidence intervals (p = {p}, n = {cfg.ci_n:,}, one data set; "
        f"N = {cfg.ci_steps} steps for every construction, m = 10 draws, burn-in 20, "
        f"alpha = 0.05; R = {R} runs per point)",
        "",
        f"theta_hat = OLS of the training rows (||theta_hat - w*|| = "
        f"{np.linalg.norm(data.theta_hat - data.w_star):.4f}); non-private OLS 95% interval "
        f"width (for theta*, mean over coordinates): {data.ols_width:.4f}. "
        "'target ols': runs whose provenance says ci.target = ols (the noisy clipped-row check).",
        "",
        *markdown(rows),
        "",
    ]
    png = figures / "linear_ci.png"
    plot_ci(summary, cfg, data.ols_width, png)
    out += [f"figure: {png}", ""]
    return out


if __name__ == "__main__":
    sys.exit(main())
