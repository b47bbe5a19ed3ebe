"""The SGD family's classifiers with and without an intercept, at their defaults (issue 25).

The SGD family appends the intercept's 1 before the row transform, so (x, 1) shares the
rows' norm bound: this measures what that costs, and is the evidence behind the intercept
rule of docs/defaults.md (DPSGD-F always has one: it centres the rows). MNIST projected to
50 dimensions (first 30,000 training rows, model multinomial) and Protein (random halves),
rows normalised to the unit sphere at registration; delta = 1e-6; each cell is the mean test
accuracy over two noise seeds (shuffle seed 3).

Usage::

    .venv/bin/python -m bench.intercept_default [--eps 0.5,1,4] [--datasets mnist,protein]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import dpsql
from bench.bolton_accuracy import _call_train, bench_server, header_lines
from dpsql import datasets as dsets

MECHANISMS: dict[str, dict[str, Any]] = {
    "bolton": {},
    "dpsgd": {},
    "dpsgd (poisson)": {"privacy": "dpsgd", "sampling": "poisson"},
    "scs13": {},
    "bst14": {},
}


def _load(db: dpsql.Database, which: str) -> tuple[str, str]:
    if which == "mnist":
        Xtr, ytr = dsets.load_mnist(split="train")
        Xte, yte = dsets.load_mnist(split="test")
        Xtr = dsets.random_projection(Xtr, 50, 0)[:30000]
        Xte = dsets.random_projection(Xte, 50, 0)
        ytr, labels, model = ytr[:30000], [float(c) for c in range(10)], "multinomial"
    else:
        X, y = dsets.load_protein()
        tr, te = dsets.train_test_split(len(y), 0.5, seed=0)
        Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
        labels, model = [0.0, 1.0], "logistic"
    db.execute("CREATE SCHEMA IF NOT EXISTS dpsql_bench_icpt")
    db.load_numpy(f"dpsql_bench_icpt.{which}_tr", Xtr, ytr.astype(float), replace=True)
    db.load_numpy(
        f"dpsql_bench_icpt.{which}_te", dsets.normalize_rows(Xte), yte.astype(float), replace=True
    )
    db.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9,"
        " delta_budget => 0.9, labels => %s, row_norm => 'unit', name => %s)",
        (f"dpsql_bench_icpt.{which}_tr", labels, f"icpt_{which}"),
    )
    return f"icpt_{which}", model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", default="0.5,1,4")
    parser.add_argument("--datasets", default="mnist,protein")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    lines = header_lines("intercept_default")
    lines.append(f"# command: python -m bench.intercept_default {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}\n", flush=True)
        print("| dataset | eps | mechanism | no intercept | intercept |\n|---|---|---|---|---|")
        with dpsql.connect(uri) as db:
            for which in args.datasets.split(","):
                name, model = _load(db, which)
                for eps in (float(e) for e in args.eps.split(",")):
                    for label, kw in MECHANISMS.items():
                        acc = {}
                        for intercept in (False, True):
                            values = []
                            for noise_seed in (11, 12):
                                mid = _call_train(
                                    db,
                                    name,
                                    (None, None, model),
                                    {"privacy": label, **kw, "epsilon": eps, "delta": 1e-6}
                                    | {"seed": 3, "noise_seed": noise_seed}
                                    | {"intercept": intercept},
                                )
                                (value,) = db.execute(
                                    "SELECT value FROM dpsql.evaluate(%s, %s)",
                                    (mid, f"dpsql_bench_icpt.{which}_te"),
                                ).fetchone()
                                values.append(value)
                            acc[intercept] = float(np.mean(values))
                        print(
                            f"| {which} | {eps:g} | {label} | {acc[False]:.4f} | {acc[True]:.4f} |",
                            flush=True,
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
