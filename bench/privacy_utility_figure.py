"""The README's figure: ``dpsql.plot.privacy_utility`` on California housing (vendored).

The classification task of the demo (median value above $200,000), features rescaled onto
[-1, 1] by the public bounds of ``dpsql.datasets.cal_housing_features``, rows clipped to the
unit ball, registered in a throw-away schema of the embedded server. Each mechanism runs at its
defaults with delta = 1e-6 at every epsilon; the test accuracy is measured on the held-out 25%
by ``dpsql.evaluate``. ``--runs`` runs per point (shuffle seeds seed, seed + 1, ...; fresh
server noise): the figure shows their mean ± sd, ``auto`` with the mechanism it chose, the y axis
from the majority class up to 1; the numbers and the epsilon spent are printed.

Usage::

    .venv/bin/python -m bench.privacy_utility_figure [--runs 3] [--out FILE.png]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import numpy as np

import dpsql
from dpsql import datasets
from dpsql.plot import privacy_utility

SCHEMA = "bench_privacy_utility"
MECHANISMS = ["auto", "bolton", "dpsgd", "objective_perturbation"]
EPSILONS = [0.25, 0.5, 1.0, 2.0, 4.0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/figures/privacy_utility.png")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    raw, value = datasets.load_cal_housing()
    X = datasets.cal_housing_features(raw)
    y = np.where(value > 200_000, 1.0, 0.0)
    train, test = datasets.train_test_split(len(y), 0.25, seed=args.seed)
    name = f"cal_housing_plot_{uuid.uuid4().hex[:8]}"  # a registration outlives its table
    with dpsql.connect() as db:
        db.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        db.execute(f"CREATE SCHEMA {SCHEMA}")
        db.load_numpy("train", X[train], y[train], schema=SCHEMA)
        db.load_numpy("test", X[test], y[test], schema=SCHEMA)
        db.register_dataset(
            f"{SCHEMA}.train",
            "x",
            "y",
            epsilon_budget=100,
            accept=True,  # the benchmark's rows as they are
            delta_budget=1e-3,
            labels=[0, 1],
            name=name,
        )
        t0 = time.perf_counter()
        fig = privacy_utility(
            db,
            name,
            MECHANISMS,
            EPSILONS,
            test=f"{SCHEMA}.test",
            delta=1e-6,
            seed=args.seed,
            runs=args.runs,
            report=sys.stdout,
        )
        fig.axes[0].set_title(
            f"California housing (value > $200k), δ = 1e-6: mean ± sd of {args.runs} runs",
            fontsize=10,
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=100)
        print(
            f"train {len(train):,} / test {len(test):,} rows; {time.perf_counter() - t0:.0f} s;"
            f" figure {args.out}"
        )
        db.execute(f"DROP SCHEMA {SCHEMA} CASCADE")


if __name__ == "__main__":
    main()
