"""DP-GD with and without the private preconditioner on California housing (issue 10).

The same registration as ``bench.linear_cal_housing`` (features rescaled onto [-1, 1], |y| <=
5, ||x|| <= sqrt(8)), intercept on, epsilon 1, delta 1e-6, DP-GD's defaults (batch means,
420 steps; step 0.2 plain, 1 whitened). Per run: test MSE, whether the 95% intervals of the 9
coefficients cover the training set's OLS solution, and the ``mixed`` diagnostic.

Usage::

    .venv/bin/python -m bench.dpgd_precondition [--runs 20]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from psycopg.types.json import Jsonb

import dpsql
from bench.bolton_accuracy import bench_server, header_lines
from dpsql import datasets as dsets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    print("\n".join(header_lines("dpgd_precondition")))
    raw, value = dsets.load_cal_housing()
    X = dsets.cal_housing_features(raw)
    y = value / 100_000.0
    tr, te = dsets.train_test_split(len(y), test_fraction=0.2, seed=0)
    A = np.column_stack([X[tr], np.ones(len(tr))])
    ols = np.linalg.lstsq(A, y[tr], rcond=None)[0]
    print(f"# OLS test MSE {np.mean((X[te] @ ols[:-1] + ols[-1] - y[te]) ** 2):.4f}")
    with bench_server(None, None) as (uri, where), dpsql.connect(uri) as db:
        print(f"# server: {where}")
        db.load_numpy("houses", X[tr], y[tr], schema="public")
        db.execute(
            "SELECT dpsql.register_dataset('houses', '{x}', 'y', 1e9, 0.99,"
            " label_bound => 5.00001, row_bound => %s, accept => true)",
            (float(np.sqrt(X.shape[1])),),
        )
        print("| preconditioner | test MSE | coverage of OLS (95% intervals) | mixed |")
        print("|---|---|---|---|")
        for pre in (False, True):
            mse, cover, mixed = [], [], []
            for seed in range(1, args.runs + 1):
                (mid,) = db.execute(
                    "SELECT dpsql.train('houses', NULL, NULL, 'linear', intercept => true,"
                    " privacy => 'dpgd', epsilon => 1, delta => 1e-6, seed => %s,"
                    " options => %s)",
                    (seed, Jsonb({"precondition": pre})),
                ).fetchone()
                model = db.model(mid)
                w = np.append(model.coef_, model.intercept_)
                mse.append(np.mean((X[te] @ w[:-1] + w[-1] - y[te]) ** 2))
                ci = np.array(
                    db.execute(
                        "SELECT lower, upper FROM dpsql.confint(%s, 0.05) ORDER BY coef_index",
                        (mid,),
                    ).fetchall()
                )
                cover.append(np.mean((ci[:, 0] <= ols) & (ols <= ci[:, 1])))
                mixed.append(bool(model.row["params"]["privacy"]["ci"]["mixed"]))
            print(
                f"| {'on' if pre else 'off'} | {np.mean(mse):.4f} ± {np.std(mse):.4f} |"
                f" {np.mean(cover):.3f} | {np.mean(mixed):.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
