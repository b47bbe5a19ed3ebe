"""The bolt-on's noise-norm target: 8 against min(8, sqrt(k)) and fixed 2 and 4 (issue 25).

Algorithm 1's default step is the one whose release has a target expected noise norm
(docs/defaults.md); the step is linear in the target, so each row rescales the default step
(capped at 1/(2 beta)). HI and its numeric columns (bench/public_tables.py), Protein and
MNIST-50, rows on the unit sphere, delta = 0 (the bolt-on's own epsilon-DP form); mean test
accuracy over shuffle seeds 1-3 with fresh server noise.

Usage::

    .venv/bin/python -m bench.bolton_noise_target [--eps 0.5,1,2]
"""

from __future__ import annotations

import argparse
import sys

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


def _accuracy(db: dpsql.Database, data: BenchData, model: str, args: dict) -> float:
    values = []
    for seed in (1, 2, 3):
        mid = _call_train(
            db, data.dataset, (None, None, model), {"privacy": "bolton", "seed": seed, **args}
        )
        (value,) = db.execute(
            "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, data.test_table)
        ).fetchone()
        values.append(value)
    return float(np.mean(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", default="0.5,1,2")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    lines = header_lines("bolton_noise_target")
    lines.append(f"# command: python -m bench.bolton_noise_target {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    data, skipped = load_bench_data(["protein", "mnist"])
    data = [load_hi(numeric_only=True), load_hi(), *data]
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}\n", flush=True)
        print("| dataset | k | eps | default (noise norm) | 8 | 2 | 4 |")
        print("|---|---|---|---|---|---|---|")
        with dpsql.connect(uri) as db:
            for d in data:
                install_data(db, d, "")
                model = "multinomial" if d.multiclass else "logistic"
                cap = 2.0 if model == "logistic" else 1.0  # 1/(2 beta) on unit rows
                for eps in (float(e) for e in args.eps.split(",")):
                    base = {"epsilon": eps, "delta": 0.0}
                    default = _accuracy(db, d, model, base)
                    mid = _call_train(
                        db, d.dataset, (None, None, model), {"privacy": "bolton", **base}
                    )
                    step, noise = db.execute(
                        "SELECT step_size, (params->'privacy'->>'expected_noise_norm')::float8"
                        " FROM dpsql.models WHERE model_id = %s",
                        (mid,),
                    ).fetchone()
                    k = d.d * (len(d.labels) if model == "multinomial" else 1)
                    cells = []
                    for target in (8.0, 2.0, 4.0):
                        fixed = base | {
                            "step_size": min(step * target / noise, cap),
                            "epochs": 10,
                            "batch_size": 50,
                        }
                        cells.append(f"{_accuracy(db, d, model, fixed):.4f}")
                    print(
                        f"| {d.name} | {k} | {eps:g} | {default:.4f} ({noise:.2f}) | "
                        + " | ".join(cells)
                        + " |",
                        flush=True,
                    )
    for note in skipped:
        print(f"# {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
