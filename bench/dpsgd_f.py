"""DPSGD-F* against DP-SGD at equal (epsilon, delta) (Sun et al. 2024, Algorithm 3; issue 10).

Both run the same DP-SGD (Poisson sampling, expected batch 50, 10 epochs, clip 1, constant
step 1/(2 beta): 1 for MNIST's multinomial model, 2 for Protein's logistic one, the ``auto``
rule) on the same registrations (rows normalised to the unit sphere). DPSGD-F first centres
the rows on a private mean whose Gaussian the PLD accountant composes with the steps; both are
charged (epsilon, 1e-5). Test accuracy for each shuffle seed.

Usage::

    .venv/bin/python -m bench.dpsgd_f [--seeds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import dpsql
from bench.bolton_accuracy import (
    _call_train,
    bench_server,
    header_lines,
    install_data,
    load_bench_data,
)

EPS_GRID = (0.5, 1.0, 2.0)
DELTA = 1e-5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args(argv)
    print("\n".join(header_lines("dpsgd_f")))
    datasets, skipped = load_bench_data(["mnist", "protein"])
    with bench_server(None, None) as (uri, where), dpsql.connect(uri) as db:
        print(f"# server: {where}")
        for data in datasets:
            install_data(db, data, "")
            model = "multinomial" if data.multiclass else "logistic"
            step = 1.0 if data.multiclass else 2.0
            print(f"\n## {data.name}: m = {data.m:,}, d = {data.d}, model {model}, delta {DELTA:g}")
            print("| eps | DP-SGD | DPSGD-F | gain | DPSGD-F wall s |")
            print("|---|---|---|---|---|")
            for eps in EPS_GRID:
                acc: dict[str, list[float]] = {"dpsgd": [], "dpsgd_f": []}
                wall: list[float] = []
                for privacy in acc:
                    for seed in range(1, args.seeds + 1):
                        t0 = time.perf_counter()
                        mid = _call_train(
                            db,
                            data.dataset,
                            (None, None, model),
                            dict(
                                privacy=privacy,
                                epsilon=eps,
                                delta=DELTA,
                                batch_size=50,
                                epochs=10,
                                step_size=step,
                                sampling="poisson",
                                clip_norm=1.0,
                                seed=seed,
                            ),
                        )
                        if privacy == "dpsgd_f":
                            wall.append(time.perf_counter() - t0)
                        (a,) = db.execute(
                            "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, data.test_table)
                        ).fetchone()
                        acc[privacy].append(a)
                base, centred = (statistics.mean(acc[k]) for k in ("dpsgd", "dpsgd_f"))
                print(
                    f"| {eps:g} | {base:.4f} | {centred:.4f} | {centred - base:+.4f} |"
                    f" {statistics.median(wall):.2f} |",
                    flush=True,
                )
    for note in skipped:
        print(f"# {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
