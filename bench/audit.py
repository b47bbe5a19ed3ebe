"""``make audit``: the thorough tier of the privacy audits (issue 16, docs/audit.md).

Every mechanism at epsilon in {0.5, 1, 2, 4} is audited with ``dpsql.audit(...,
method => 'distinguish')`` on its worst-case dataset: 100 rows with x = 0 (no gradient on the
weights) and one canary slot, so the canary moves the released model by as much as the
mechanism allows. Classification mechanisms train the Huber SVM (its gradient is the full
Lipschitz bound wherever the margin is small; logistic regression for those that do not train
it) on labels {0, 1}; regression mechanisms train least squares with |y| <= 1 and ||x|| <= 1
(DP-AMBSSGD on 3,000 rows: its statistics need them). Then the deliberately broken variants
(the superuser-only mutation switch): each should be refuted (epsilon_lower > claimed).

The mechanisms and their runs come from their specs (sql/mechanisms/*.toml, ``[[audit]]``: a
label, the claimed delta, the dataset's rows and dpsql.train's arguments; a spec without one is
audited once at its defaults): a new mechanism is audited without an edit here. The task
(classification unless the spec's is regression), the model and the default delta (1e-5 for a
mechanism that needs delta > 0, else 0) follow from the spec.

Prints markdown tables (claimed epsilon, the 95% lower bound, runs per dataset, the ratio,
seconds) and draws ``bench/figures/audit.png``.

Usage::

    .venv/bin/python -m bench.audit [--runs 100] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

import dpsql
from dpsql import mechanism_spec

EPSILONS = [0.5, 1.0, 2.0, 4.0]
DELTA = 1e-5
ROWS = 100  # the worst-case datasets' rows, unless a spec's [[audit]] says otherwise


def _configs() -> list[tuple[str, str, str, str, float, dict[str, Any]]]:
    """(label, privacy, dataset, model, delta, train parameters) of every spec's [[audit]]
    runs: classification mechanisms first, then regression ones, each by name."""
    specs = sorted(mechanism_spec.load_specs().values(), key=lambda s: s.task == "regression")
    configs = []
    for spec in specs:
        task = "reg" if spec.task == "regression" else "cls"
        models = spec.trained_models
        model = "linear" if task == "reg" else "huber" if "huber" in models else "logistic"
        for run in spec.audit or [{}]:
            rows = run.get("rows", ROWS)
            dataset = task if rows == ROWS else f"{task}_{rows}"
            delta = float(run.get("delta", DELTA if spec.needs_delta else 0.0))
            train = dict(run.get("train", {}))
            configs.append((run.get("label", spec.name), spec.name, dataset, model, delta, train))
    return configs


# (label, privacy, dataset, model, delta, train parameters)
CONFIGS = _configs()


def _train(label: str) -> dict[str, Any]:
    """The train parameters of a mechanism's audit (the mutations break those runs)."""
    return next(c[5] for c in CONFIGS if c[0] == label)


BOLTON_A1 = _train("bolton (epsilon-DP)")
ONE_BATCH = _train("dpsgd shuffle")
# (mutation, privacy, model, delta, train parameters, test, runs per dataset): DP-SGD's halved
# noise and Poisson accounting of shuffled batches only show in the middle of the
# distributions (the GDP test, valid for these Gaussian compositions) and need many runs.
MUTATIONS: list[tuple[str, str, str, float, dict[str, Any], str, int]] = [
    ("half_noise", "bolton", "huber", 0.0, BOLTON_A1, "dp", 1000),
    (
        "paper_minibatch",
        "bolton",
        "huber",
        0.0,
        {"epochs": 10, "batch_size": 10, "lambda": 0.1},
        "dp",
        500,
    ),
    ("no_clipping", "dpsgd", "huber", DELTA, ONE_BATCH, "dp", 500),
    ("half_noise", "dpsgd", "huber", DELTA, ONE_BATCH, "gdp", 4000),
    ("poisson_on_shuffle", "dpsgd", "huber", DELTA, {**ONE_BATCH, "batch_size": 50}, "gdp", 4000),
]


def _datasets(db: dpsql.Database, schema: str) -> dict[str, str]:
    """The worst-case datasets the configurations audit (and the mutations' "cls"), by key:
    "cls", "reg", or with a spec's own rows "cls_<rows>", "reg_<rows>"."""
    rng = np.random.default_rng(0)
    db.execute(f"CREATE SCHEMA {schema}")
    tag = uuid.uuid4().hex[:6]
    names = {}
    for table in sorted({"cls", *(c[2] for c in CONFIGS)}):
        task, _, rows_ = table.partition("_")
        rows = int(rows_ or ROWS)
        names[table] = f"audit_{table}_{tag}"
        if task == "cls":
            y = (rng.random(rows) < 0.5).astype(float)
            db.load_numpy(table, np.zeros((rows, 1)), y, schema=schema)
            db.register_dataset(
                f"{schema}.{table}",
                "x",
                "y",
                epsilon_budget=1,
                labels=[0, 1],
                name=names[table],
                accept=True,
            )
        else:
            # DP-AMBSSGD's private statistics need a few thousand rows; the others take 100
            db.load_numpy(table, np.zeros((rows, 1)), np.zeros(rows), schema=schema)
            db.register_dataset(
                f"{schema}.{table}",
                "x",
                "y",
                epsilon_budget=1,
                delta_budget=1e-3,
                accept=True,
                label_bound=1.0,
                row_bound=1.0,
                name=names[table],
            )
    return names


def _audit(
    db: dpsql.Database,
    dataset: str,
    privacy: str,
    epsilon: float,
    delta: float,
    runs: int,
    options: dict[str, Any],
) -> tuple[float | None, float, str]:
    t0 = time.perf_counter()
    try:
        row = db.execute(
            "SELECT epsilon_lower FROM dpsql.audit(%s, %s, %s, %s, %s, 'distinguish', %s)",
            (dataset, privacy, epsilon, delta, runs, json.dumps(options)),
        ).fetchone()
    except dpsql.DpsqlError as err:
        return None, time.perf_counter() - t0, str(err).splitlines()[0]
    assert row is not None
    return float(row[0]), time.perf_counter() - t0, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per dataset (D0 and D1)")
    parser.add_argument("--quick", action="store_true", help="epsilon 1 only, 40 runs")
    parser.add_argument("--figure", default="bench/figures/audit.png")
    parser.add_argument("--part", choices=["all", "mechanisms", "mutations"], default="all")
    parser.add_argument("--only", help="comma-separated mechanism labels (default: all)")
    args = parser.parse_args()
    runs = 40 if args.quick else args.runs
    epsilons = [1.0] if args.quick else EPSILONS
    schema = f"bench_audit_{uuid.uuid4().hex[:6]}"
    results: list[tuple[str, float, float | None, float, str]] = []
    with dpsql.connect() as db:
        names = _datasets(db, schema)
        if args.part != "mutations":
            only = None if args.only is None else set(args.only.split(","))
            _mechanisms(db, names, runs, epsilons, results, only)
        if args.part != "mechanisms":
            _mutations(db, names)
        db.execute(f"DROP SCHEMA {schema} CASCADE")
    if results:
        _plot(results, args.figure)
        print(f"\nfigure: {args.figure}")


def _mechanisms(
    db: dpsql.Database,
    names: dict[str, str],
    runs: int,
    epsilons: list[float],
    results: list[tuple[str, float, float | None, float, str]],
    only: set[str] | None,
) -> None:
    print(f"## audit: distinguishing audits, {runs} runs per dataset, 95% confidence\n")
    print("| mechanism | claimed ε | δ | ε lower (95%) | lower / claimed | seconds |")
    print("|---|---|---|---|---|---|")
    for label, privacy, dataset, model, delta, train in CONFIGS:
        if only is not None and label not in only:
            continue
        for eps in epsilons:
            lower, secs, error = _audit(
                db,
                names[dataset],
                privacy,
                eps,
                delta,
                runs,
                {"train": train, "model": model, "seed": 1},
            )
            results.append((label, eps, lower, secs, error))
            shown = "refused: " + error if lower is None else f"{lower:.3f}"
            ratio = "" if lower is None else f"{lower / eps:.2f}"
            print(
                f"| {label} | {eps:g} | {delta:g} | {shown} | {ratio} | {secs:.1f} |",
                flush=True,
            )


def _mutations(db: dpsql.Database, names: dict[str, str]) -> None:
    print("\n## audit: mutations at claimed ε = 1 (δ as listed), 95% confidence\n")
    print("| mutation | mechanism | test | runs | ε lower (95%) | refuted (lower > 1) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for mutation, privacy, model, delta, train, test, runs in MUTATIONS:
        options = {"train": train, "model": model, "seed": 2, "mutation": mutation, "test": test}
        lower, secs, error = _audit(db, names["cls"], privacy, 1.0, delta, runs, options)
        shown = "refused: " + error if lower is None else f"{lower:.3f}"
        caught = "" if lower is None else ("yes" if lower > 1.0 else "**no**")
        print(
            f"| {mutation} | {privacy} | {test} | {runs} | {shown} | {caught} | {secs:.1f} |",
            flush=True,
        )


def _plot(results: list[tuple[str, float, float | None, float, str]], path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5), layout="constrained")
    ax = fig.add_subplot()
    labels = sorted({r[0] for r in results}, key=[c[0] for c in CONFIGS].index)
    for n, label in enumerate(labels):
        points = [(e, lo) for name, e, lo, _, _ in results if name == label and lo is not None]
        if points:  # past the ten colours, dashed lines tell the mechanisms apart
            style = "-" if n < 10 else "--"
            ax.plot(*zip(*points, strict=True), marker="o", linestyle=style, label=label)
    eps = sorted({r[1] for r in results})
    ax.plot(eps, eps, color="black", linestyle=":", label="claimed ε")
    ax.set_xscale("log")
    ax.set_xticks(eps, [f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("claimed ε")
    ax.set_ylabel("audited ε lower bound (95%)")
    ax.set_title("Distinguishing audits on worst-case datasets")
    ax.legend(fontsize="small", ncols=2)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
