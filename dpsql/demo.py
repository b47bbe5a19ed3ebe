"""``dpsql demo``: train models inside the embedded PostgreSQL on California housing.

The dataset (20,640 census block groups, StatLib) is vendored in ``dpsql/data``. Features are
scaled with public, data-independent bounds (``dpsql.datasets.CAL_HOUSING_BOUNDS``); the task
is "is the median house value above $200,000?" (logistic regression) and the value itself
(linear regression, in units of $100,000).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import dpsql
from dpsql import datasets

SCHEMA = "dpsql_demo"
THRESHOLD = 200_000.0  # public: a round price, not a statistic of the data


def _say(text: str) -> None:
    print(text, flush=True)


def _value(db: dpsql.Database, query: str, params: Sequence[Any] | None = None) -> Any:
    """The one value a query returns."""
    row = db.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(prog="dpsql demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: DPSQL_DSN or the embedded server)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    db = dpsql.connect(args.dsn)
    version = _value(db, "SHOW server_version")
    extversion = _value(db, "SELECT extversion FROM pg_extension WHERE extname = 'dpsql'")
    _say(f"connected: {db!r}, PostgreSQL {version}, extension dpsql {extversion}")

    raw, value = datasets.load_cal_housing()
    X = datasets.cal_housing_features(raw)
    train, test = datasets.train_test_split(len(value), 0.25, seed=args.seed)
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    # Kept between runs: the private dataset registered on houses_train keeps its budget.
    for name, idx in (("train", train), ("test", test)):
        y_cls = np.where(value[idx] > THRESHOLD, 1.0, 0.0)
        for table, y in ((f"houses_{name}", y_cls), (f"values_{name}", value[idx] / 100_000.0)):
            exists = _value(db, "SELECT to_regclass(%s)", (f"{SCHEMA}.{table}",))
            if exists is None:
                db.load_numpy(table, X[idx], y, schema=SCHEMA)
    _say(
        f"loaded California housing: {len(train)} training and {len(test)} test rows, "
        f"{X.shape[1]} features scaled by public bounds into {SCHEMA}.houses_* / values_*"
    )

    _say("\n1) logistic regression: median value > $200,000 (labels {0, 1})")
    clf = db.train(
        f"{SCHEMA}.houses_train",
        features="x",
        label="y",
        model="logistic",
        epochs=args.epochs,
        batch_size=10,
        lambda_=1e-4,
        schedule="decreasing",
        labels=[0, 1],
        intercept=True,
        row_norm="clip",
        seed=args.seed,
    )
    acc = clf.evaluate(f"{SCHEMA}.houses_test")["accuracy"]
    base = float(np.mean(value[test] <= THRESHOLD))
    _say(
        f"   model {clf.model_id}: {clf.row['epochs_run']} epochs in "
        f"{clf.row['train_seconds']:.2f} s (+{clf.row['prepare_seconds']:.2f} s shuffle), "
        f"training loss {clf.loss_history_[0]:.4f} -> {clf.loss_history_[-1]:.4f}"
    )
    _say(f"   test accuracy {acc:.3f} (majority class: {max(base, 1 - base):.3f})")

    _say("\n2) linear regression: median value in $100,000")
    reg = db.train(
        f"{SCHEMA}.values_train",
        features="x",
        label="y",
        model="linear",
        epochs=args.epochs,
        batch_size=10,
        step_size=0.05,
        intercept=True,
        row_norm="clip",
        seed=args.seed,
    )
    mse = reg.evaluate(f"{SCHEMA}.values_test")["mse"]
    var = float(np.var(value[test] / 100_000.0))
    _say(f"   model {reg.model_id}: test MSE {mse:.3f} ($100k^2), R^2 {1 - mse / var:.3f}")

    _say("\n3) the same logistic model with differential privacy (bolt-on, released by the server)")
    found = db.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = 'demo_houses'"
    ).fetchone()
    ds = (
        found[0]
        if found
        else db.register_dataset(
            f"{SCHEMA}.houses_train",
            "x",
            "y",
            epsilon_budget=20.0,
            delta_budget=1e-4,
            labels=[0, 1],
            row_norm="clip",
            name="demo_houses",
        )
    )
    budget = next(b for b in db.budgets() if b["dataset_id"] == ds)
    if budget["epsilon_remaining"] < 1.0:
        _say(
            f"   dataset demo_houses has spent its budget ({budget['epsilon_spent']:g} of "
            f"{budget['epsilon_budget']:g}): the server refuses further releases"
        )
        private = None
    else:
        private = db.train(
            "demo_houses",
            None,
            None,
            model="logistic",
            epochs=args.epochs,
            batch_size=50,
            step_size=0.1,
            intercept=True,
            seed=args.seed,
            privacy=dpsql.BoltOn(epsilon=1.0, delta=1e-6),
        )
        p_acc = private.evaluate(f"{SCHEMA}.houses_test")["accuracy"]
        row = private.row
        left = next(b for b in db.budgets() if b["dataset_id"] == ds)
        _say(
            f"   model {private.model_id}: (eps, delta) = ({row['epsilon']:g}, {row['delta']:g}),"
            f" {row['params']['privacy']['algorithm']}, L2 sensitivity {row['sensitivity']:.4g},"
            f" Gaussian sigma {row['noise_scale']:.4g}"
        )
        _say(
            f"   test accuracy {p_acc:.3f} (non-private: {acc:.3f}); budget left on demo_houses: "
            f"epsilon {left['epsilon_remaining']:g} of {left['epsilon_budget']:g}"
        )

    _say("\n4) the linear model with differential privacy (DP-GD, 95% confidence intervals)")
    found = db.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = 'demo_values'"
    ).fetchone()
    ds_lin = (
        found[0]
        if found
        else db.register_dataset(
            f"{SCHEMA}.values_train",
            "x",
            "y",
            epsilon_budget=20.0,
            delta_budget=1e-4,
            label_bound=5.00001,  # the census top-code, in $100,000
            row_bound=float(np.sqrt(X.shape[1])),  # features in [-1, 1]
            name="demo_values",
        )
    )
    left = next(b for b in db.budgets() if b["dataset_id"] == ds_lin)
    if left["epsilon_remaining"] < 1.0:
        _say("   dataset demo_values has spent its budget: the server refuses further releases")
    else:
        lin = db.train(
            "demo_values",
            None,
            None,
            model="linear",
            intercept=True,
            seed=args.seed,
            privacy=dpsql.DPGD(epsilon=1.0, delta=1e-6),
        )
        p_mse = lin.evaluate(f"{SCHEMA}.values_test")["mse"]
        ci = lin.confint(0.05)
        info = lin.row["params"]["privacy"]
        _say(
            f"   model {lin.model_id}: (eps, delta) = (1, 1e-6), {info['steps']} steps of clip "
            f"norm {info['clip_norm']:.3g} and noise {info['noise_std']:.3g}; test MSE "
            f"{p_mse:.3f} (non-private SGD: {mse:.3f})"
        )
        mixing = (
            "the run mixed"
            if ci.mixed
            else f"NOT mixed (draw autocorrelation {ci.draw_autocorrelation:.2f}: these features "
            "are ill-conditioned, so the intervals are biased; see docs/linear.md)"
        )
        _say(f"   95% intervals ({ci.method}, {ci.draws} draws, target {ci.target}); {mixing}:")
        lin_names = [k for k in datasets.CAL_HOUSING_BOUNDS if k != "medianHouseValue"]
        for name, e, lo, hi in zip(
            [*lin_names, "intercept"], ci.estimate, ci.lower, ci.upper, strict=True
        ):
            _say(f"   {name:>24s} {e:+8.3f}  [{lo:+8.3f}, {hi:+8.3f}]")

    names = [k for k in datasets.CAL_HOUSING_BOUNDS if k != "medianHouseValue"]
    _say("\n   coefficients (logistic | linear):")
    for name, a, b in zip(names, clf.coef_, reg.coef_, strict=True):
        _say(f"   {name:>24s} {a:+8.3f} | {b:+8.3f}")

    _say("\nThe same in SQL (`dpsql server start` keeps the server up and prints a psql URI):")
    _say(
        f"   SELECT dpsql.train('{SCHEMA}.houses_train', '{{x}}', 'y', 'logistic', epochs => "
        f"{args.epochs}, batch_size => 10, lambda => 1e-4, schedule => 'decreasing', "
        "labels => '{0,1}', intercept => true, row_norm => 'clip');"
    )
    _say(f"   SELECT * FROM dpsql.evaluate({clf.model_id}, '{SCHEMA}.houses_test');")
    _say("   -- and privately, as an analyst granted the dataset:")
    _say(
        "   SELECT dpsql.train('demo_houses', NULL, NULL, 'logistic', epochs => 10, "
        "batch_size => 50, step_size => 0.1, intercept => true, privacy => 'bolton', "
        "epsilon => 1, delta => 1e-6);"
    )
    _say(
        "   SELECT dpsql.train('demo_values', NULL, NULL, 'linear', intercept => true, "
        "privacy => 'dpgd', epsilon => 1, delta => 1e-6);  -- then dpsql.confint(model_id, 0.05)"
    )
    _say(f"done in {time.perf_counter() - t0:.1f} s")
    db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
