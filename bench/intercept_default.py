"""Private classifiers with and without an intercept, at their defaults (issue 25).

The evidence behind the intercept rule of docs/defaults.md. The SGD family appends the 1
before the row transform, so (x, 1) shares the rows' norm bound; the private-ERM fits append
it after, and their regulariser and noise act on the bias too. DPSGD-F always has one (it
centres the rows) and is not measured. Datasets: HI and its five numeric columns
(bench/public_tables.py), Protein (random halves) and MNIST projected to 50 dimensions (first
30,000 training rows, model multinomial; the ERM fits, which take no multinomial model, are
not run there), rows normalised to the unit sphere at registration. Each mechanism runs in its
own form (delta = 1e-6 if it needs one, else 0); each cell is the mean test accuracy over two
noise seeds (shuffle seed 3).

Usage::

    .venv/bin/python -m bench.intercept_default [--eps 1,4] [--datasets hi,hi_numeric,protein,mnist]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import dpsql
from bench.bolton_accuracy import (
    BenchData,
    _call_train,
    bench_server,
    header_lines,
    install_data,
    load_bench_data,
)
from bench.public_tables import load_hi

MECHANISMS: dict[str, dict[str, Any]] = {
    "bolton": {"delta": 0.0},
    "dpsgd": {},
    "dpsgd (poisson)": {"privacy": "dpsgd", "sampling": "poisson"},
    "scs13": {"delta": 0.0},
    "bst14": {},
    "objective_perturbation": {"delta": 0.0, "erm": True},
    "output_perturbation": {"delta": 0.0, "erm": True},
    "dp_ftrl": {"erm": True},
}


def _accuracy(db: dpsql.Database, data: BenchData, model: str, args: dict[str, Any]) -> str:
    values = []
    for noise_seed in (11, 12):
        try:
            mid = _call_train(
                db, data.dataset, (None, None, model), args | {"seed": 3, "noise_seed": noise_seed}
            )
        except dpsql.errors.DpsqlError as err:
            return f"refused ({str(err).splitlines()[0][7:60]}...)"
        (value,) = db.execute(
            "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, data.test_table)
        ).fetchone()
        values.append(value)
    return f"{np.mean(values):.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", default="1,4")
    parser.add_argument("--datasets", default="hi,hi_numeric,protein,mnist")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    wanted = args.datasets.split(",")
    lines = header_lines("intercept_default")
    lines.append(f"# command: python -m bench.intercept_default {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    data = [load_hi(numeric_only=n == "hi_numeric") for n in ("hi", "hi_numeric") if n in wanted]
    data += load_bench_data([n for n in wanted if n in ("protein", "mnist")])[0]
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}\n", flush=True)
        print("| dataset | majority | eps | mechanism | no intercept | intercept |")
        print("|---|---|---|---|---|---|")
        with dpsql.connect(uri) as db:
            for d in data:
                install_data(db, d, "")
                model = "multinomial" if d.multiclass else "logistic"
                for eps in (float(e) for e in args.eps.split(",")):
                    for label, kw in MECHANISMS.items():
                        if kw.get("erm") and d.multiclass:
                            continue
                        train = {"privacy": label, "epsilon": eps, "delta": 1e-6}
                        train |= {k: v for k, v in kw.items() if k != "erm"}
                        cells = [
                            _accuracy(db, d, model, train | {"intercept": icpt})
                            for icpt in (False, True)
                        ]
                        print(
                            f"| {d.name} | {d.majority:.4f} | {eps:g} | {label} | "
                            + " | ".join(cells)
                            + " |",
                            flush=True,
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
