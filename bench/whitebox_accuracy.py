"""White-box private SGD accuracy: the bolt-on paper's Figures 3/6, tests 2 and 4, all mechanisms.

For Protein (KDD Cup 2004, binary, d = 74) and MNIST projected to 50 dimensions (ten classes),
every model is trained and released by the server (one aggregate scan per epoch, the noise drawn
inside the server) with each private algorithm of the paper's comparison:

* bolt-on (output perturbation, Algorithms 1/2, Gaussian noise),
* SCS13 (noise in every mini-batch step, eps/k per pass, steps 1/sqrt(t)),
* BST14 (T = km/b steps of b draws with replacement, advanced composition),
* DP-SGD (per-example clipping C = 1, Gaussian noise per step, calibrated by dp-accounting), with
  shuffled disjoint batches (no amplification) and with Poisson sampling (amplification),

plus noiseless SGD (privacy none, data owner), in two regimes, both (eps, delta)-DP with
delta = 1/m^2:

* test 2: convex (plain logistic, lambda = 0);
* test 4: strongly convex (lambda = 1e-4, ||w|| <= 1/lambda);

b = 50, 10 passes, rows normalised to the unit sphere (``row_norm => 'unit'``), eps in
{0.05, 0.1, 0.2, 0.5, 1, 2, 4}. SCS13 and BST14 train binary or multinomial models only, so on
MNIST every mechanism is run as a multinomial model (one noise draw per step / one output draw:
the like-for-like comparison); bolt-on and DP-SGD are also run one-vs-rest (model 'logistic':
bolt-on splits (eps, delta) into ten models; DP-SGD clips the example's 10 x d gradient jointly
and needs no split).

Each mechanism uses its own step schedule, as the server runs it: bolt-on convex eta = 1/sqrt(m)
(SC: min(1/beta, 1/(lambda t))); SCS13 1/sqrt(t); BST14 2R/(G sqrt t) (SC: 1/(lambda t)); DP-SGD a
constant 0.5 (the default) in the convex regime and min(1/beta, 1/(lambda t)) in the SC one (where
``step_size`` has no effect). The noiseless baselines are run with each of these schedules (BST14's
sampling with replacement has no noiseless counterpart in the server). A side table varies the
convex DP-SGD step (0.1, 0.5, 2) for the multinomial / binary model: the choice is made on the test
set, so it is not a private tuning, and the main table keeps the default 0.5.

Every point is the mean over ``--seeds`` shuffle seeds (fresh noise each time: the releases draw
their noise from the server's CSPRNG) with its standard deviation. Accuracy comes from
``dpsql.evaluate`` on the test table; balanced accuracy (Protein is 99% negatives) from the
released weights with the C core in memory. Data preparation follows ``bench/bolton_accuracy.py``
(Protein split in random halves, seed 0; MNIST Gaussian projection, seed 0).

Usage::

    .venv/bin/python -m bench.whitebox_accuracy [--seeds 2]
    .venv/bin/python -m bench.whitebox_accuracy --quick    # 1 seed, eps in {0.1, 1, 4}

Plots: ``bench/figures/whitebox_protein.png``, ``bench/figures/whitebox_mnist.png`` (a temporary
directory with ``--quick``, unless ``--figures`` is given). A throw-away embedded PostgreSQL 18
server is used and stopped at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dpsql
from bench.bolton_accuracy import BenchData, _call_train, install_data, load_bench_data
from dpsql import _core, extension, server

EPS_GRID = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0)
QUICK_EPS = (0.1, 1.0, 4.0)
EPOCHS = 10
BATCH = 50
LAMBDA = 1e-4
PG_VERSION = 18
FIGURES = Path(__file__).resolve().parent / "figures"
DPSGD_STEPS = (0.1, 0.5, 2.0)  # side table, convex regime only

# regime -> (title, lambda)
REGIMES: dict[str, tuple[str, float]] = {
    "convex": ("test 2: convex (lambda = 0), (eps, delta)-DP", 0.0),
    "sc": (f"test 4: strongly convex (lambda = {LAMBDA:g}), (eps, delta)-DP", LAMBDA),
}


@dataclass(frozen=True)
class Series:
    """One private algorithm as run: a label, the model and the dpsql.train privacy arguments."""

    key: str
    label: str
    model: str
    privacy: str
    extra: tuple[tuple[str, Any], ...] = ()


def private_series(multiclass: bool) -> list[Series]:
    model = "multinomial" if multiclass else "logistic"
    suffix = " (multinomial)" if multiclass else ""
    out = [
        Series("bolton", "bolt-on" + suffix, model, "bolton"),
        Series("scs13", "SCS13" + suffix, model, "scs13"),
        Series("bst14", "BST14" + suffix, model, "bst14"),
        Series(
            "dpsgd_shuffle",
            "DP-SGD shuffle" + suffix,
            model,
            "dpsgd",
            (("clip_norm", 1.0), ("sampling", "shuffle")),
        ),
        Series(
            "dpsgd_poisson",
            "DP-SGD Poisson" + suffix,
            model,
            "dpsgd",
            (("clip_norm", 1.0), ("sampling", "poisson")),
        ),
    ]
    if multiclass:
        out += [
            Series("bolton_ovr", "bolt-on one-vs-rest (eps/10 each)", "logistic", "bolton"),
            Series(
                "dpsgd_shuffle_ovr",
                "DP-SGD shuffle one-vs-rest",
                "logistic",
                "dpsgd",
                (("clip_norm", 1.0), ("sampling", "shuffle")),
            ),
        ]
    return out


def noiseless_variants(regime: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Noiseless runs (privacy none) with each private algorithm's step schedule."""
    if regime == "convex":
        return {
            "bolton": ("bolt-on steps: constant 1/sqrt(m)", {"schedule": "constant"}),
            "dpsgd": ("DP-SGD steps: constant 0.5", {"schedule": "constant", "step_size": 0.5}),
            "scs13": ("SCS13 steps: 1/sqrt(t)", {"schedule": "sqrt", "step_size": 1.0}),
        }
    return {
        "bolton": (
            "bolt-on / DP-SGD steps: min(1/beta, 1/(lambda t)), R = 1/lambda",
            {"schedule": "decreasing"},
        ),
        "scs13": (
            "SCS13 steps: 1/sqrt(t), R = 1/lambda",
            {"schedule": "sqrt", "step_size": 1.0, "radius": 1 / LAMBDA},
        ),
    }


def train_private(
    db: dpsql.Database,
    data: BenchData,
    s: Series,
    lam: float,
    eps: float,
    seed: int,
    step_size: float | None = None,
) -> int:
    args: dict[str, Any] = {
        "epochs": EPOCHS,
        "batch_size": BATCH,
        "lambda": lam,
        "privacy": s.privacy,
        "epsilon": eps,
        "delta": data.delta,
        "seed": seed,
        **dict(s.extra),
    }
    if step_size is not None:
        args["step_size"] = step_size
    return _call_train(db, data.dataset, (None, None, s.model), args)


def train_noiseless(
    db: dpsql.Database, data: BenchData, model: str, lam: float, opts: dict[str, Any], seed: int
) -> int:
    args: dict[str, Any] = {
        "epochs": EPOCHS,
        "batch_size": BATCH,
        "lambda": lam,
        **opts,
        "labels": data.labels,
        "row_norm": "unit",
        "seed": seed,
    }
    return _call_train(db, data.train_table, (["x"], "y", model), args)


def predict_labels(data: BenchData, model: str, flags: int, W: np.ndarray) -> np.ndarray:
    """Labels predicted by released weights, with the C core (as dpsql.evaluate does)."""
    out = _core.predict(model, flags, W, data.X_test)
    classes = np.asarray(data.labels)
    if W.ndim == 2 and W.shape[0] >= 2:
        return classes[out.astype(np.int64)]
    return np.where(out >= 0.5, classes[1], classes[0])


def balanced_accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean([np.mean(pred[y == c] == c) for c in np.unique(y)]))


@dataclass
class Released:
    accuracy: float
    balanced: float
    train_seconds: float
    wall: float
    privacy: dict[str, Any] | None


def evaluate(db: dpsql.Database, data: BenchData, model_id: int, wall: float) -> Released:
    acc = db.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (model_id, data.test_table)
    ).fetchone()[0]
    model, flags, weights, secs, priv = db.execute(
        "SELECT model, flags, weights, train_seconds, params->'privacy'"
        " FROM dpsql.models WHERE model_id = %s",
        (model_id,),
    ).fetchone()
    W = np.asarray(weights, dtype=np.float64)
    pred = predict_labels(data, model, flags, W)
    mine = float(np.mean(pred == data.y_test))
    if abs(mine - acc) > 1e-12:
        print(
            f"# WARNING: model {model_id}: dpsql.evaluate accuracy {acc} but the released "
            f"weights give {mine} in memory",
            flush=True,
        )
    return Released(float(acc), balanced_accuracy(data.y_test, pred), float(secs), wall, priv)


# --------------------------------------------------------------------------------------------
# Experiment
# --------------------------------------------------------------------------------------------


@dataclass
class Results:
    """acc/bal[(regime, series key, eps)] and [(regime, 'noiseless:'+model+':'+variant, None)]."""

    acc: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))
    bal: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))
    wall: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    epoch: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    noise: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    calib_seconds: list[float] = field(default_factory=list)

    def add(self, key: tuple, r: Released) -> None:
        self.acc[key].append(r.accuracy)
        self.bal[key].append(r.balanced)


def noise_summary(s: Series, priv: dict[str, Any] | None) -> dict[str, Any]:
    """The figures that say how much noise a release carries (from the model's provenance)."""
    p = priv or {}
    out: dict[str, Any] = {"noise_scale": p.get("noise_scale")}
    if s.privacy == "dpsgd":
        out["z"] = p.get("noise_multiplier")
        acct = p.get("accountant") or {}
        out["rdp_eps"] = acct.get("rdp_epsilon")
    elif s.privacy == "bst14":
        out["epsilon_1"] = p.get("epsilon_1")
        out["epsilon_2"] = p.get("epsilon_2")
        out["G"] = p.get("G")
    elif s.privacy == "scs13":
        out["eps_pass"] = p.get("epsilon_per_pass")
    elif s.privacy == "bolton":
        out["sensitivity"] = p.get("sensitivity")
        out["model_epsilon"] = p.get("model_epsilon")
    return out


def accountant_answers(db: dpsql.Database) -> int:
    """Cached accountant answers: grows when a DP-SGD call ran the accountant."""
    return int(db.execute("SELECT count(*) FROM dpsql.accountant_answers").fetchone()[0])


def run_dataset(  # noqa: C901
    db: dpsql.Database,
    data: BenchData,
    seeds: Sequence[int],
    eps_grid: Sequence[float],
    steps: Sequence[float],
) -> Results:
    res = Results()
    series = private_series(data.multiclass)
    models = ["logistic", "multinomial"] if data.multiclass else ["logistic"]
    side_model = "multinomial" if data.multiclass else "logistic"
    side = Series(
        "dpsgd_step", "", side_model, "dpsgd", (("clip_norm", 1.0), ("sampling", "shuffle"))
    )
    for s_i, seed in enumerate(seeds):
        t_seed = time.perf_counter()
        for regime, (_, lam) in REGIMES.items():
            for model in models:
                for variant, (_, opts) in noiseless_variants(regime).items():
                    t0 = time.perf_counter()
                    mid = train_noiseless(db, data, model, lam, opts, seed)
                    r = evaluate(db, data, mid, time.perf_counter() - t0)
                    res.add((regime, f"noiseless:{model}:{variant}", None), r)
                    res.wall[f"noiseless {model}"].append(r.wall)
                    res.epoch[f"noiseless {model}"].append(r.train_seconds / EPOCHS)
            for s in series:
                for eps in eps_grid:
                    answers = accountant_answers(db) if s.privacy == "dpsgd" else 0
                    t0 = time.perf_counter()
                    mid = train_private(db, data, s, lam, eps, seed)
                    wall = time.perf_counter() - t0
                    r = evaluate(db, data, mid, wall)
                    if s.privacy == "dpsgd" and accountant_answers(db) > answers:
                        # the first call of a configuration runs the accountant (seconds)
                        res.calib_seconds.append(wall)
                    else:
                        res.wall[s.label].append(wall)
                    res.epoch[s.label].append(r.train_seconds / EPOCHS)
                    res.add((regime, s.key, eps), r)
                    res.noise[(regime, s.key, eps)] = noise_summary(s, r.privacy)
            if regime == "convex":
                for step in steps:
                    for eps in eps_grid:
                        t0 = time.perf_counter()
                        mid = train_private(db, data, side, lam, eps, seed, step_size=step)
                        r = evaluate(db, data, mid, time.perf_counter() - t0)
                        res.add((regime, f"dpsgd_step:{step:g}", eps), r)
            print(
                f"#   {data.name}: seed {seed}, {regime} done ({s_i + 1}/{len(seeds)}, "
                f"{time.perf_counter() - t_seed:.1f} s)",
                flush=True,
            )
    return res


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def ms(values: Sequence[float], digits: int = 4) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        cells = [
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if j == 0:
            out.append("-" * len(out[-1]))
    return out


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "-" if v is None else format(float(v), spec)


def report(  # noqa: C901, PLR0915
    data: BenchData,
    res: Results,
    eps_grid: Sequence[float],
    n_seeds: int,
    steps: Sequence[float],
) -> list[str]:
    lines: list[str] = []
    series = private_series(data.multiclass)
    models = ["logistic", "multinomial"] if data.multiclass else ["logistic"]
    lines.append(
        f"## {data.name}: {data.note}; m = {data.m:,} train / {len(data.y_test):,} test, "
        f"d = {data.d}, b = {BATCH}, {EPOCHS} passes, delta = 1/m^2 = {data.delta:.3g}; "
        f"{n_seeds} seed(s) (mean ± std)"
    )
    lines.append(f"majority class of the test set: {data.majority:.4f}")
    metrics = [("accuracy", res.acc)]
    if not data.multiclass:
        metrics.append(("balanced accuracy", res.bal))
    for regime, (title, _) in REGIMES.items():
        lines.append("")
        lines.append(f"### {data.name}, {title}")
        rows = [["noiseless (privacy none)", "model", "accuracy", "balanced acc"]]
        for model in models:
            for variant, (vtitle, _) in noiseless_variants(regime).items():
                key = (regime, f"noiseless:{model}:{variant}", None)
                rows.append([vtitle, model, ms(res.acc[key]), ms(res.bal[key])])
        lines += _table(rows)
        for mname, store in metrics:
            lines.append("")
            lines.append(f"{mname}:")
            rows = [["eps"] + [s.label for s in series]]
            for eps in eps_grid:
                rows.append([f"{eps:g}"] + [ms(store[(regime, s.key, eps)]) for s in series])
            lines += _table(rows)
        # Noise figures (deterministic functions of eps, delta, m, b, k).
        lines.append("")
        lines.append(
            "noise: bolt-on sigma on w (per model) | SCS13 eps/pass, sigma on the batch sum | "
            "BST14 eps_1, sigma on the batch sum | DP-SGD noise multiplier z (sigma = z C on "
            "the batch sum), shuffle / Poisson"
        )
        main = series[0]
        rows = [
            [
                "eps",
                f"{main.label} sigma",
                "Delta",
                "SCS13 eps/pass",
                "SCS13 sigma",
                "BST14 eps_1",
                "BST14 sigma",
                "z shuffle",
                "z Poisson",
            ]
        ]
        for eps in eps_grid:
            nb = res.noise.get((regime, main.key, eps), {})
            nsc = res.noise.get((regime, "scs13", eps), {})
            nbst = res.noise.get((regime, "bst14", eps), {})
            nds = res.noise.get((regime, "dpsgd_shuffle", eps), {})
            ndp = res.noise.get((regime, "dpsgd_poisson", eps), {})
            rows.append(
                [
                    f"{eps:g}",
                    _fmt(nb.get("noise_scale")),
                    _fmt(nb.get("sensitivity")),
                    _fmt(nsc.get("eps_pass")),
                    _fmt(nsc.get("noise_scale")),
                    _fmt(nbst.get("epsilon_1")),
                    _fmt(nbst.get("noise_scale")),
                    _fmt(nds.get("z")),
                    _fmt(ndp.get("z")),
                ]
            )
        lines += _table(rows)
    # DP-SGD vs bolt-on at equal (eps, delta).
    lines.append("")
    lines.append(f"### {data.name}: DP-SGD vs bolt-on at equal (eps, delta = 1/m^2)")
    pairs = [("bolton", "dpsgd_shuffle", "dpsgd_poisson")]
    if data.multiclass:
        pairs.append(("bolton_ovr", "dpsgd_shuffle_ovr", None))
    labels = {s.key: s.label for s in series}
    for regime, (title, _) in REGIMES.items():
        for mname, store in metrics:
            for bkey, skey, pkey in pairs:
                head = ["eps", labels[bkey], labels[skey], "shuffle - bolt-on"]
                if pkey:
                    head += [labels[pkey], "Poisson - bolt-on"]
                rows = [head]
                for eps in eps_grid:
                    b = statistics.fmean(store[(regime, bkey, eps)])
                    sh = statistics.fmean(store[(regime, skey, eps)])
                    row = [f"{eps:g}", f"{b:.4f}", f"{sh:.4f}", f"{sh - b:+.4f}"]
                    if pkey:
                        po = statistics.fmean(store[(regime, pkey, eps)])
                        row += [f"{po:.4f}", f"{po - b:+.4f}"]
                    rows.append(row)
                lines.append("")
                lines.append(f"{title.split(':')[0]} ({regime}), {mname}, mean:")
                lines += _table(rows)
    # DP-SGD step size (convex).
    if steps:
        lines.append("")
        model = "multinomial" if data.multiclass else "logistic"
        lines.append(
            f"### {data.name}: DP-SGD shuffle, convex, {model}, constant step size "
            "(chosen on the test set: NOT a private tuning; main tables use 0.5)"
        )
        for mname, store in metrics:
            rows = [["eps"] + [f"step {st:g}" for st in steps]]
            for eps in eps_grid:
                rows.append(
                    [f"{eps:g}"]
                    + [ms(store[("convex", f"dpsgd_step:{st:g}", eps)]) for st in steps]
                )
            lines.append(f"{mname}:")
            lines += _table(rows)
    # Time.
    lines.append("")
    lines.append(
        "wall time per model (dpsql.train call: shuffle + 10 epochs + release; DP-SGD "
        "excluding the accountant's first calibration) and epoch time (train_seconds / 10)"
    )
    rows = [["series", "median wall s", "median epoch s", "epoch / noiseless epoch"]]
    base = {m: statistics.median(res.epoch[f"noiseless {m}"]) for m in models}
    for name in [f"noiseless {m}" for m in models] + [s.label for s in series]:
        model = next((s.model for s in series if s.label == name), name.split()[-1])
        ep = statistics.median(res.epoch[name])
        rows.append(
            [
                name,
                f"{statistics.median(res.wall[name]):.2f}" if res.wall[name] else "-",
                f"{ep:.4f}",
                f"{ep / base[model]:.1f}",
            ]
        )
    lines += _table(rows)
    if res.calib_seconds:
        lines.append(
            f"DP-SGD calls that ran the accountant (first call per configuration, then "
            f"cached): {len(res.calib_seconds)}, wall median "
            f"{statistics.median(res.calib_seconds):.1f} s, total {sum(res.calib_seconds):.0f} s"
        )
    return lines


COLORS = {
    "bolton": "tab:blue",
    "scs13": "tab:orange",
    "bst14": "tab:green",
    "dpsgd_shuffle": "tab:red",
    "dpsgd_poisson": "tab:purple",
    "bolton_ovr": "tab:blue",
    "dpsgd_shuffle_ovr": "tab:red",
}


def plot(data: BenchData, res: Results, eps_grid: Sequence[float], path: Path) -> None:  # noqa: C901
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = private_series(data.multiclass)
    panels = [("accuracy", res.acc)]
    if not data.multiclass:
        panels.append(("balanced accuracy", res.bal))
    fig, axes = plt.subplots(
        len(panels), 2, figsize=(12, 4.6 * len(panels)), sharex=True, squeeze=False
    )
    x = np.asarray(eps_grid)
    base_model = "multinomial" if data.multiclass else "logistic"
    for row, (mname, store) in enumerate(panels):
        for col, regime in enumerate(REGIMES):
            ax = axes[row][col]
            styles = ["--", ":", "-."]
            for i, (variant, (vtitle, _)) in enumerate(noiseless_variants(regime).items()):
                key = (regime, f"noiseless:{base_model}:{variant}", None)
                ax.axhline(
                    statistics.fmean(store[key]),
                    color="black" if i == 0 else "grey",
                    linestyle=styles[i],
                    linewidth=1,
                    label=f"noiseless, {vtitle}",
                )
            if not data.multiclass and mname == "accuracy":
                ax.axhline(
                    data.majority,
                    color="tab:brown",
                    linestyle=":",
                    linewidth=1,
                    label="majority class",
                )
            # Protein's accuracy lives in [0.95, 1] (majority class 0.9917): means below the
            # axis are drawn as a triangle on its floor, with their value.
            zoom = mname == "accuracy" and not data.multiclass
            floor = 0.95 if zoom else 0.0
            for s in series:
                vals = [store[(regime, s.key, e)] for e in eps_grid]
                mean = np.array([statistics.fmean(v) for v in vals])
                std = np.array([statistics.stdev(v) if len(v) > 1 else 0.0 for v in vals])
                ovr = s.model == "logistic" and data.multiclass
                ax.errorbar(
                    x,
                    mean,
                    yerr=std,
                    fmt=("--" if ovr else "-") + ("s" if ovr else "o"),
                    color=COLORS[s.key],
                    label=s.label,
                    capsize=3,
                    markersize=4,
                    linewidth=1.0 if ovr else 1.3,
                    alpha=0.6 if ovr else 1.0,
                )
                for xi, mi in zip(x, mean, strict=True):
                    if zoom and mi < floor:
                        ax.plot([xi], [floor + 0.001], "v", color=COLORS[s.key], markersize=7)
                        ax.annotate(
                            f"{mi:.2f}",
                            (xi, floor + 0.001),
                            textcoords="offset points",
                            xytext=(4, 2 + 7 * list(COLORS).index(s.key)),
                            fontsize=6,
                            color=COLORS[s.key],
                        )
            ax.set_xscale("log")
            ax.set_xticks(list(x))
            ax.set_xticklabels([f"{e:g}" for e in x])
            ax.set_ylim(floor, 1.0 if zoom else 1.02)
            short = "test 2, convex" if regime == "convex" else f"test 4, SC (lambda = {LAMBDA:g})"
            ax.set_title(
                f"{short}, (eps, delta)-DP: {mname}"
                + (" (means below 0.95: triangles)" if zoom else ""),
                fontsize=9,
            )
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6.5, loc="best")
            if row == len(panels) - 1:
                ax.set_xlabel("epsilon (total), delta = 1/m^2")
            if col == 0:
                ax.set_ylabel(f"test {mname}")
    n = len(next(iter(res.acc.values())))
    fig.suptitle(
        f"{data.name}: bolt-on, SCS13, BST14, DP-SGD vs noiseless; b = {BATCH}, {EPOCHS} passes, "
        f"{n} seed(s) (mean ± std)",
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
        prog="python -m bench.whitebox_accuracy",
        description="White-box private SGD accuracy (bolt-on paper Figs. 3/6, tests 2 and 4).",
    )
    p.add_argument("--seeds", type=int, default=2, help="shuffle seeds per point (default 2)")
    p.add_argument("--eps", type=float, nargs="+", default=None, help="total epsilons")
    p.add_argument("--datasets", default="protein,mnist", help="comma list (protein,mnist)")
    p.add_argument(
        "--dpsgd-steps",
        type=float,
        nargs="*",
        default=list(DPSGD_STEPS),
        help="convex DP-SGD step sizes of the side table (none: skip it)",
    )
    p.add_argument("--figures", type=Path, default=None, help="directory for the PNGs")
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
    print(f"# whitebox_accuracy, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    print(
        f"# machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, numpy {np.__version__}"
    )
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
    out: list[str] = []
    with server.temporary_server(PG_VERSION) as uri:
        extension.ensure_available(uri, server.pg_config_path(PG_VERSION))
        with dpsql.connect(uri) as db:
            version = db.execute("SHOW server_version").fetchone()[0]
            print(f"# server: PostgreSQL {version} (embedded, temporary pgdata)")
            print(
                f"# seeds {seeds}, eps {args.eps}, DP-SGD side steps {args.dpsgd_steps}",
                flush=True,
            )
            for d in data:
                t0 = time.perf_counter()
                install_data(db, d, "_wb")
                print(
                    f"#   {d.name}: loaded and registered in {time.perf_counter() - t0:.1f} s",
                    flush=True,
                )
                t1 = time.perf_counter()
                res = run_dataset(db, d, seeds, args.eps, args.dpsgd_steps)
                out += report(d, res, args.eps, len(seeds), args.dpsgd_steps)
                out.append(f"{d.name}: {time.perf_counter() - t1:.0f} s")
                png = figures / f"whitebox_{d.name}.png"
                plot(d, res, args.eps, png)
                out.append(f"figure: {png}")
                out.append("")
    print()
    for line in out:
        print(line)
    print(f"total time: {time.perf_counter() - t_start:.0f} s")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
