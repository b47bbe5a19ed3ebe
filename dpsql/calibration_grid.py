"""Build the Poisson calibration grid that :mod:`dpsql.calibration_cache` reads (issue 30).

    python -m dpsql.calibration_grid [--out dpsql/data/calibration_poisson.json] [--jobs 1]

Every number in the file is a value of dp-accounting's replace-one PLD of the Poisson-subsampled
Gaussian (``PLDAccountant``, ``REPLACE_ONE``, interval ``PLD_DISCRETIZATION``; the charged value
differs only by truncating the Gaussian's tails to the run, under 1e-7 apart): for each node
``(steps, sampling_rate)`` of a log-spaced grid, a log-spaced set of noise multipliers ``z`` and,
for each, the epsilon at every grid delta. Nothing here is charged: the cache only proposes a
candidate ``z`` where :func:`dpsql.accounting.calibrate` starts its search, and every ``z`` it
returns passed the charged evaluation.

The file records what computed it (:func:`dpsql.calibration_cache.provenance`: the layout, the
PLD's interval, the dp-accounting version); a different installed dp-accounting makes the cache
ignore the file (regenerate it with the command above, about 20 minutes on one core; ``--jobs``
runs nodes in parallel processes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from dpsql import accounting, calibration_cache
from dpsql.accountant_requests import quiet

__all__ = ["GRID", "build", "main"]

DEFAULT_OUT = calibration_cache.path()


def _axis(lo: float, hi: float, per_decade: int) -> list[float]:
    n = round((hi - lo) * per_decade)
    return [round(lo + k / per_decade, 6) for k in range(n + 1)]


#: The grid (log10 of each coordinate). Common DP-SGD runs: 100 to 10^6 steps, sampling rates
#: 3e-5 to 0.3 with 0.3 to 1,000 expected epochs, delta 1e-10 to 1e-3, and z spanning targets
#: epsilon 0.1 to 16 at every grid delta.
GRID: dict[str, Any] = {
    "log10_steps": _axis(2.0, 6.0, 3),
    "log10_sampling_rate": _axis(-4.5, -0.5, 3),
    "log10_delta": _axis(-10.0, -3.0, 1),
    "log10_epochs": [-0.5, 3.0],  # steps * sampling_rate: nodes outside are skipped
    "epsilon_range": [0.1, 16.0],
    "z_ratio": 1.25,  # consecutive noise multipliers of a node
}


def _z_range(steps: int, q: float) -> tuple[float, float] | None:
    """Noise multipliers whose epsilons cover GRID's epsilon range at every grid delta."""
    eps_lo, eps_hi = GRID["epsilon_range"]
    deltas = [10.0**d for d in GRID["log10_delta"]]
    try:
        z_lo = accounting.calibrate(
            eps_hi, max(deltas), scheme="poisson", steps=steps, sampling_rate=q
        )
        z_hi = accounting.calibrate(
            eps_lo, min(deltas), scheme="poisson", steps=steps, sampling_rate=q
        )
    except ValueError:
        return None
    return z_lo / GRID["z_ratio"], z_hi * GRID["z_ratio"]


def node(log10_steps: float, log10_q: float) -> dict[str, Any] | None:
    """One node's curve: log z and log epsilon at each grid delta (None: out of range)."""
    quiet()
    steps = round(10.0**log10_steps)
    q = 10.0**log10_q
    span = _z_range(steps, q)
    if span is None:
        return None
    n = math.ceil(math.log(span[1] / span[0]) / math.log(GRID["z_ratio"])) + 1
    zs = np.geomspace(span[0], span[1], n)
    deltas = [10.0**d for d in GRID["log10_delta"]]
    log_eps = []
    for z in zs:
        mech = accounting.mechanism(float(z), scheme="poisson", steps=steps, sampling_rate=q)
        pld = accounting._pld_accountant(mech).compose(mech.event)
        row = [float(pld.get_epsilon(d)) for d in deltas]
        log_eps.append([round(math.log(max(e, 1e-300)), 7) for e in row])
    return {
        "steps": steps,
        "sampling_rate": q,
        "log_z": [round(float(math.log(z)), 7) for z in zs],
        "log_eps": log_eps,
    }


def build(jobs: int = 1) -> dict[str, Any]:
    """The whole grid as the JSON object the cache reads."""
    lo_e, hi_e = GRID["log10_epochs"]
    keys = [
        (i, j)
        for i, t in enumerate(GRID["log10_steps"])
        for j, q in enumerate(GRID["log10_sampling_rate"])
        if lo_e <= t + q <= hi_e
    ]
    args = [(GRID["log10_steps"][i], GRID["log10_sampling_rate"][j]) for i, j in keys]
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(node, *zip(*args, strict=True)))
    cells = {f"{i},{j}": r for (i, j), r in zip(keys, results, strict=True) if r is not None}
    return {
        **calibration_cache.provenance(),
        "generated_by": "python -m dpsql.calibration_grid",
        "generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "build_seconds": round(time.monotonic() - start),
        "grid": GRID,
        "cells": cells,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    grid = build(args.jobs)
    args.out.write_text(json.dumps(grid, separators=(",", ":")) + "\n")
    print(f"{args.out}: {len(grid['cells'])} nodes in {grid['build_seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
