"""Audits on natural data (issue 47, docs/audit.md): Dirac canaries against real datasets.

Three public datasets of ``../shared/datasets`` (skipped when absent), 5,000 rows each drawn
with seed 0, binary labels, features mapped onto [-1, 1] by declared bounds and rows clipped
to the unit ball:

- California housing: the 8 derived features of ``cal_housing_features``; label: value above
  $200,000;
- KDD Cup 2004 Protein: 74 features (bounds: the full file's range); label: homologous;
- MNIST: 784 pixels on [0, 255]; label: digit >= 5.

``dpsql.audit(..., method => 'dirac')`` on each (the default for these mechanisms):

1. honest DP-SGD at epsilon in {1, 2, 4} (delta 1e-5) in **one run**;
2. the half-noise mutation (a true epsilon of about 2 claimed as 1) of DP-SGD and of the
   Gaussian bolt-on, and the honest mechanisms in the same configuration, pooled over a few
   runs.

DP-SGD trains shuffled full batches (batch = the copy's rows, 5 epochs: each epoch one
Gaussian, so the claim is exactly mu-GDP and the GDP statistics apply); the bolt-on trains 5
epochs with batch 1 and Gaussian output noise. Prints markdown tables.

``--part minimisers``: output and objective perturbation (no SGD step: the canaries are
crafted rows, +-e_k on a coordinate of their own with the positive label, and the audit's
model is the Huber SVM), honest and with the half-noise mutation, at a claimed epsilon of 1
(``--minimiser-runs`` runs x ``--minimiser-canaries`` canaries).

Usage::

    .venv/bin/python -m bench.audit_natural [--rows 5000] [--runs 100] [--canaries 1000]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

import dpsql
from dpsql import datasets as dsets

DELTA = 1e-5


def _cal_housing() -> tuple[np.ndarray, np.ndarray, list[list[float]]]:
    raw, value = dsets.load_cal_housing(
        dsets.datasets_dir() / "cal_housing" / "cal_housing.data.gz"
    )
    X = dsets.cal_housing_features(raw)
    return X, (value > 200_000).astype(float), [[-1.0, 1.0]] * X.shape[1]


def _protein() -> tuple[np.ndarray, np.ndarray, list[list[float]]]:
    X, y = dsets.load_protein()
    bounds = [
        [float(lo), float(hi) if hi > lo else float(lo) + 1]
        for lo, hi in zip(X.min(0), X.max(0), strict=True)
    ]
    return X, (y > 0).astype(float), bounds


def _mnist() -> tuple[np.ndarray, np.ndarray, list[list[float]]]:
    X, y = dsets.load_mnist(split="train")
    return X, (y >= 5).astype(float), [[0.0, 255.0]] * X.shape[1]


LOADERS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray, list[list[float]]]]] = {
    "cal_housing": _cal_housing,
    "protein": _protein,
    "mnist": _mnist,
}


def _register(db: dpsql.Database, schema: str, name: str, rows: int) -> tuple[str, int] | None:
    try:
        X, y, bounds = LOADERS[name]()
    except (FileNotFoundError, OSError) as err:
        print(f"skipped {name}: {err}")
        return None
    pick = np.random.default_rng(0).choice(len(y), size=rows, replace=False)
    db.load_numpy(name, X[pick], y[pick], schema=schema)
    registered = f"audit_{name}_{uuid.uuid4().hex[:6]}"
    db.register_dataset(
        f"{schema}.{name}",
        "x",
        "y",
        epsilon_budget=1,
        delta_budget=1e-3,
        labels=[0, 1],
        feature_bounds=bounds,
        row_norm="clip",
        name=registered,
        accept=True,
    )
    return registered, X.shape[1]


def _audit(
    db: dpsql.Database,
    dataset: str,
    privacy: str,
    epsilon: float,
    runs: int,
    options: dict[str, Any],
) -> tuple[float, dict[str, Any], float]:
    t0 = time.perf_counter()
    row = db.execute(
        "SELECT epsilon_lower, method FROM dpsql.audit(%s, %s, %s, %s, %s, NULL, %s)",
        (dataset, privacy, epsilon, DELTA, runs, json.dumps(options)),
    ).fetchone()
    assert row is not None and row[1] == "dirac", row
    details = db.execute(
        "SELECT details FROM dpsql.audits ORDER BY audit_id DESC LIMIT 1"
    ).fetchone()
    assert details is not None
    return float(row[0]), details[0], time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=100, help="runs of the pooled audits")
    parser.add_argument("--canaries", type=int, default=1000, help="canaries per run")
    parser.add_argument("--one-run-canaries", type=int, default=3000)
    parser.add_argument("--datasets", default="cal_housing,protein,mnist")
    parser.add_argument("--minimiser-runs", type=int, default=2000)
    parser.add_argument("--minimiser-canaries", type=int, default=50)
    parser.add_argument("--minimisers", default="output_perturbation,objective_perturbation")
    parser.add_argument(
        "--part", choices=["all", "honest", "mutations", "family", "minimisers"], default="all"
    )
    args = parser.parse_args()
    schema = f"bench_audit_nat_{uuid.uuid4().hex[:6]}"
    with dpsql.connect() as db:
        db.execute(f"CREATE SCHEMA {schema}")
        names = {}
        for name in args.datasets.split(","):
            got = _register(db, schema, name, args.rows)
            if got is not None:
                names[name] = got
        if args.part in ("all", "honest"):
            _honest_one_run(db, names, args.rows, args.one_run_canaries)
        if args.part in ("all", "mutations"):
            _mutations(db, names, args.rows, args.runs, args.canaries)
        if args.part in ("all", "family"):
            _family(db, names, args.rows, args.runs, args.canaries)
        if args.part in ("all", "minimisers"):
            _minimisers(
                db, names, args.minimisers.split(","), args.minimiser_runs, args.minimiser_canaries
            )
        db.execute(f"DROP SCHEMA {schema} CASCADE")


def _dpsgd(rows: int, canaries: int) -> dict[str, Any]:
    # shuffled full batches: the copy holds the rows and the canary slots
    return {"epochs": 5, "batch_size": rows + canaries}


def _honest_one_run(
    db: dpsql.Database, names: dict[str, tuple[str, int]], rows: int, canaries: int
) -> None:
    print(
        f"## honest DP-SGD, one run, {canaries} Dirac canaries, delta {DELTA:g}, 95% confidence\n"
    )
    print("| dataset | d | claimed ε | ε lower | lower / claimed | μ lower | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, (dataset, dim) in names.items():
        for eps in (1.0, 2.0, 4.0):
            options = {"train": _dpsgd(rows, canaries), "canaries": canaries, "seed": 1}
            lower, details, secs = _audit(db, dataset, "dpsgd", eps, 1, options)
            print(
                f"| {name} | {dim} | {eps:g} | {lower:.3f} | {lower / eps:.2f} "
                f"| {details.get('mu_lower', 0):.3f} | {secs:.1f} |",
                flush=True,
            )


def _mutations(
    db: dpsql.Database, names: dict[str, tuple[str, int]], rows: int, runs: int, canaries: int
) -> None:
    print(
        f"\n## claimed ε = 1, delta {DELTA:g}: {runs} runs x {canaries} Dirac canaries, "
        "95% confidence\n"
    )
    print("| dataset | d | mechanism | mutation | ε lower | refuted (lower > 1) | seconds |")
    print("|---|---|---|---|---|---|---|")
    configs = [
        ("dpsgd", _dpsgd(rows, canaries)),
        ("bolton", {"epochs": 5, "batch_size": 1}),
    ]
    for name, (dataset, dim) in names.items():
        for privacy, train in configs:
            for mutation in (None, "half_noise"):
                options: dict[str, Any] = {"train": train, "canaries": canaries, "seed": 2}
                if mutation:
                    options["mutation"] = mutation
                lower, _, secs = _audit(db, dataset, privacy, 1.0, runs, options)
                caught = "yes" if lower > 1.0 else "no"
                print(
                    f"| {name} | {dim} | {privacy} | {mutation or 'none (honest)'} | {lower:.3f} "
                    f"| {caught} | {secs:.1f} |",
                    flush=True,
                )


# The rest of the SGD family with its default statistics (dp: Steinke et al.'s, for claims
# that are not exact Gaussian compositions), and DP-SGD with Poisson sampling.
FAMILY: list[tuple[str, str, dict[str, Any]]] = [
    ("dpsgd (Poisson)", "dpsgd", {"epochs": 5, "batch_size": 500, "sampling": "poisson"}),
    ("scs13", "scs13", {"epochs": 2, "batch_size": 50}),
    ("bst14", "bst14", {"epochs": 2, "batch_size": 50}),
    ("dpsgd_f", "dpsgd_f", {"epochs": 5, "batch_size": 500}),
]


def _family(
    db: dpsql.Database, names: dict[str, tuple[str, int]], rows: int, runs: int, canaries: int
) -> None:
    print(f"\n## the SGD family, claimed ε = 1 and 4, {runs} runs x {canaries} canaries\n")
    print("| dataset | mechanism | test | mutation | ε = 1: lower | ε = 4: lower | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, (dataset, _) in names.items():
        for label, privacy, train in FAMILY:
            for mutation in (None, "half_noise"):
                if mutation and privacy == "dpsgd_f":
                    continue  # (its plan does not take the switch)
                lowers, test, secs = [], "", 0.0
                for eps in (1.0, 4.0):
                    options: dict[str, Any] = {"train": train, "canaries": canaries, "seed": 3}
                    if mutation:
                        options["mutation"] = mutation
                    lower, details, took = _audit(db, dataset, privacy, eps, runs, options)
                    lowers.append(f"{lower:.3f}")
                    test, secs = details["test"], secs + took
                print(
                    f"| {name} | {label} | {test} | {mutation or 'none (honest)'} "
                    f"| {lowers[0]} | {lowers[1]} | {secs:.1f} |",
                    flush=True,
                )


def _minimisers(
    db: dpsql.Database,
    names: dict[str, tuple[str, int]],
    mechanisms: list[str],
    runs: int,
    canaries: int,
) -> None:
    print(
        f"\n## output and objective perturbation, claimed ε = 1, delta {DELTA:g}: {runs} runs x "
        f"{canaries} crafted row canaries, 95% confidence\n"
    )
    print("| dataset | d | mechanism | test | mutation | ε lower | μ lower | refuted | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (dataset, dim) in names.items():
        for privacy in mechanisms:
            for mutation in (None, "half_noise"):
                options: dict[str, Any] = {"canaries": canaries, "seed": 6}
                if mutation:
                    options["mutation"] = mutation
                lower, details, secs = _audit(db, dataset, privacy, 1.0, runs, options)
                print(
                    f"| {name} | {dim} | {privacy} | {details['test']} "
                    f"| {mutation or 'none (honest)'} | {lower:.3f} "
                    f"| {details.get('mu_lower', float('nan')):.3f} "
                    f"| {'yes' if lower > 1.0 else 'no'} | {secs:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
