"""Privacy units (issue 46): accuracy of unit-level DP-SGD, DPSGD-F and ``auto`` against
row-level training on the same table, for k (``max_rows_per_unit``) in {1, 5, 20}.

Data: California housing (StatLib, the vendored copy), the 8 public-bound features of
``dpsql.datasets.cal_housing_features`` divided by sqrt(8) (so ||x|| <= 1, registered with
``row_norm => 'clip'``: nothing is clipped), made binary by a public threshold: median house
value above $200,000 (label 1, 42% of the block groups). A fixed split (seed 0) keeps 25% of
the block groups as the test table: 5,160 rows, each a person of its own, none of them in any
training table (the test persons are held out, not some of their rows). The other 15,480 rows
make two training tables:

* ``one-row``: one row per person (``person = rid``);
* ``many-rows``: the same 15,480 rows grouped into persons of similar rows by a seeded rule
  (``group_persons``, numpy seed 0): four heavy persons of 120, 200, 300 and 450 rows, then
  sizes drawn from a Zipf law of exponent 1.7 truncated to 1..30 until the rows are used up
  (the last size cut to what is left). Persons are filled in that order, each with a random
  unassigned block group and its nearest unassigned neighbours by (longitude, latitude), so
  one person's rows are nearby block groups with similar features and mostly the same label.

Each table is copied four times and registered four times (a relation has one dataset): once
without a unit (row level: a row is a unit, which over-states privacy when a person has many
rows) and once per k with ``privacy_unit => 'person', max_rows_per_unit => k``. Every
(epsilon, mechanism, registration) is trained ``--seeds`` times with
``dpsql.train(name, NULL, NULL, privacy => p, epsilon => e, delta => 1e-6, seed => s)``
(everything else at the mechanism's defaults; fresh server noise every time) and its released
model scored by the owner on the test table (``dpsql.evaluate(model, 'schema.table')``,
non-private). A cell is the mean test accuracy and its standard error (sd / sqrt(seeds)); the
recorded row-level plan of each unit-level release (``params->'privacy_unit'->>'row_epsilon'``
and ``row_delta``) is printed next to the table. A non-private logistic model (privacy none,
10 epochs, batch 50, step 2) on the training rows gives the reference.

On the one-row table the bench also trains each mechanism once at row level and once at
k = 1 with the same ``seed`` and ``noise_seed``: the same release but for the order in which
the rows are read (units in their secret-keyed hash order), so the weights should be close.

Usage::

    .venv/bin/python bench/privacy_units.py [--seeds 3] [--dsn DSN]
    .venv/bin/python bench/privacy_units.py --quick    # 1 seed, eps 1, k in {1, 5}
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

if __package__ in (None, ""):  # run as a script: the repository root for ``bench``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dpsql  # noqa: E402
from bench.bolton_accuracy import _call_train, bench_server, header_lines, run_tag  # noqa: E402
from dpsql import datasets as dsets  # noqa: E402

SCHEMA = "dpsql_bench_privacy_units"
EPS_GRID = (0.5, 1.0, 2.0)
KS = (1, 5, 20)
DELTA = 1e-6
MECHANISMS = {"DP-SGD": "dpsgd", "DPSGD-F": "dpsgd_f", "auto": "auto"}
THRESHOLD = 200_000.0  # public: median house value above $200,000 is label 1
TEST_SHARE = 0.25
HEAVY = (120, 200, 300, 450)  # the few persons with hundreds of rows
ZIPF_A = 1.7
MAX_LIGHT = 30


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, lonlat_train, X_test, y_test): binary California housing, seed-0
    split; rows in the unit ball."""
    raw, value = dsets.load_cal_housing()
    X = dsets.cal_housing_features(raw) / np.sqrt(8.0)
    y = (value > THRESHOLD).astype(np.float64)
    tr, te = dsets.train_test_split(len(y), TEST_SHARE, seed=0)
    return X[tr], y[tr], raw[tr, :2], X[te], y[te]


def group_persons(lonlat: np.ndarray, seed: int = 0) -> np.ndarray:
    """Person ids (0..U-1) for the rows: the heavy sizes, then Zipf(1.7) sizes in 1..30 until
    the rows are used up; each person, in that order, is a random unassigned row and its
    nearest unassigned rows by (longitude, latitude)."""
    n = len(lonlat)
    rng = np.random.default_rng(seed)
    sizes = list(HEAVY)
    total = sum(sizes)
    while total < n:
        c = int(rng.zipf(ZIPF_A))
        if c > MAX_LIGHT:
            continue
        c = min(c, n - total)
        sizes.append(c)
        total += c
    person = np.full(n, -1, dtype=np.int64)
    for pid, c in enumerate(sizes):
        free = np.flatnonzero(person < 0)
        centre = lonlat[rng.choice(free)]
        dist = np.sum((lonlat[free] - centre) ** 2, axis=1)
        take = free[np.argpartition(dist, c - 1)[:c]] if c < len(free) else free
        person[take] = pid
    assert (person >= 0).all()
    return person


def person_stats(person: np.ndarray, y: np.ndarray) -> str:
    counts = np.bincount(person)
    majority = np.array(
        [max(np.mean(y[person == p]), 1 - np.mean(y[person == p])) for p in range(len(counts))]
    )
    agree = float(np.sum(majority * counts) / counts.sum())
    kept = {k: np.minimum(counts, k).sum() / counts.sum() for k in KS}
    return (
        f"{len(counts):,} persons, rows per person: median {np.median(counts):g}, "
        f"mean {counts.mean():.2f}, 90th percentile {np.percentile(counts, 90):g}, "
        f"max {counts.max()}; {np.sum(counts > 5):,} persons have > 5 rows, "
        f"{np.sum(counts > 20):,} > 20; distinct rows read at k = "
        + ", ".join(f"{k}: {kept[k]:.1%}" for k in KS)
        + f"; rows with their person's majority label {agree:.1%} (overall majority "
        f"{max(y.mean(), 1 - y.mean()):.1%})"
    )


@dataclass
class Table:
    """One training table: its rows' persons and its registrations (label -> dataset name)."""

    name: str
    person: np.ndarray
    note: str
    base: str = ""
    datasets: dict[str, str] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return self.name.replace("-", "_")


def variant_label(k: int | None) -> str:
    return "row level" if k is None else f"unit k = {k}"


def install(
    db: dpsql.Database,
    table: Table,
    X: np.ndarray,
    y: np.ndarray,
    ks: Sequence[int],
    tag: str,
) -> None:
    """The base table, a copy with the person column per registration, each registered."""
    table.base = f"{SCHEMA}.{table.slug}{tag}"
    db.load_numpy(table.base, X, y, replace=True)
    for k in (None, *ks):
        suffix = "row" if k is None else f"k{k}"
        copy = f"{table.base}_{suffix}"
        name = f"pu_{table.slug}{tag}_{suffix}"
        db.execute(f"DROP TABLE IF EXISTS {copy}")
        db.execute(
            f"CREATE TABLE {copy} AS SELECT b.rid, p.person, b.x, b.y FROM {table.base} b"
            " JOIN unnest(%s::bigint[], %s::bigint[]) AS p(rid, person) USING (rid)",
            (list(range(len(y))), table.person.tolist()),
        )
        db.execute(f"ANALYZE {copy}")
        unit = "" if k is None else f", privacy_unit => 'person', max_rows_per_unit => {k}"
        db.execute(
            "SELECT dpsql.register_dataset(%s, '{x}', 'y', labels => '{0,1}',"
            " row_norm => 'clip', epsilon_budget => 1e9, delta_budget => 0.99,"
            f" accept => true, name => %s{unit})",
            (copy, name),
        )
        table.datasets[variant_label(k)] = name


def train(db: dpsql.Database, dataset: str, args: dict[str, Any]) -> int:
    names = ", ".join(f"{k} => %s" for k in args)
    row = db.execute(
        f"SELECT dpsql.train(%s, NULL, NULL, {names})", (dataset, *args.values())
    ).fetchone()
    if row is None or row[0] is None:
        raise dpsql.NothingReleased("the mechanism released nothing")
    return int(row[0])


def accuracy(db: dpsql.Database, model_id: int, test_table: str) -> float:
    row = db.execute("SELECT value FROM dpsql.evaluate(%s, %s)", (model_id, test_table)).fetchone()
    assert row is not None
    return float(row[0])


def model_info(db: dpsql.Database, model_id: int) -> tuple[str, dict[str, Any], list[float]]:
    row = db.execute(
        "SELECT privacy, params, weights FROM dpsql.model_store WHERE model_id = %s",
        (model_id,),
    ).fetchone()
    assert row is not None
    return str(row[0]), dict(row[1]), list(row[2])


def run_shape(db: dpsql.Database, model_id: int) -> str:
    """The released run's batch size, epochs and Gaussian noise scale (sigma)."""
    row = db.execute(
        "SELECT batch_size, epochs_run, noise_scale FROM dpsql.model_store WHERE model_id = %s",
        (model_id,),
    ).fetchone()
    assert row is not None
    batch, epochs, sigma = row
    return f"b {batch}, {epochs} ep, σ {sigma:.3g}" if sigma is not None else f"b {batch}"


@dataclass
class Cells:
    """(mechanism, variant, eps) -> test accuracies; row-level plans; auto's picks; times."""

    acc: dict[tuple[str, str, float], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    row_plan: dict[tuple[str, str, float], tuple[float, float]] = field(default_factory=dict)
    picked: dict[tuple[str, float], set[str]] = field(default_factory=lambda: defaultdict(set))
    shape: dict[tuple[str, str, float], set[str]] = field(default_factory=lambda: defaultdict(set))
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    refused: dict[tuple[str, str, float], str] = field(default_factory=dict)


def run_table(
    db: dpsql.Database,
    table: Table,
    test_table: str,
    eps_grid: Sequence[float],
    seeds: Sequence[int],
) -> Cells:
    cells = Cells()
    for eps in eps_grid:
        for mech, privacy in MECHANISMS.items():
            for variant, dataset in table.datasets.items():
                key = (mech, variant, eps)
                for seed in seeds:
                    t0 = time.perf_counter()
                    try:
                        mid = train(
                            db,
                            dataset,
                            {"privacy": privacy, "epsilon": eps, "delta": DELTA, "seed": seed},
                        )
                    except psycopg.Error as err:
                        cells.refused[key] = str(err).splitlines()[0]
                        break
                    cells.seconds[f"{mech} {variant}"].append(time.perf_counter() - t0)
                    cells.acc[key].append(accuracy(db, mid, test_table))
                    released, params, _ = model_info(db, mid)
                    cells.shape[key].add(run_shape(db, mid))
                    if "privacy_unit" in params:
                        unit = params["privacy_unit"]
                        cells.row_plan[key] = (
                            float(unit["row_epsilon"]),
                            float(unit["row_delta"]),
                        )
                    if privacy == "auto":
                        sampling = params.get("sampling")
                        cells.picked[(variant, eps)].add(
                            released + (f" ({sampling})" if sampling else "")
                        )
            print(f"#   {table.name}: eps {eps:g}, {mech} done", flush=True)
    return cells


def noiseless(db: dpsql.Database, table: Table, test_table: str) -> float:
    """Non-private reference: logistic SGD on the training rows (privacy none; 10 epochs,
    batch 50, constant step 2 = 1/(2 beta), the private runs' rule)."""
    mid = _call_train(
        db,
        table.base,
        (["x"], "y", "logistic"),
        {
            "labels": [0.0, 1.0],
            "row_norm": "clip",
            "epochs": 10,
            "batch_size": 50,
            "step_size": 2.0,
            "seed": 1,
        },
    )
    return accuracy(db, mid, test_table)


def same_seed_check(db: dpsql.Database, table: Table) -> list[str]:
    """Row level and k = 1 on the one-row table with the same seed and noise_seed."""
    lines = []
    for mech, privacy in MECHANISMS.items():
        weights = []
        for variant in ("row level", "unit k = 1"):
            mid = train(
                db,
                table.datasets[variant],
                {
                    "privacy": privacy,
                    "epsilon": 1.0,
                    "delta": DELTA,
                    "seed": 7,
                    "noise_seed": 11,
                },
            )
            weights.append(np.array(model_info(db, mid)[2]))
        w_row, w_unit = weights
        lines.append(
            f"- {mech}, eps 1, seed 7, noise_seed 11: ||w_row|| = {np.linalg.norm(w_row):.4f}, "
            f"||w_unit - w_row|| = {np.linalg.norm(w_unit - w_row):.4f} "
            f"(relative {np.linalg.norm(w_unit - w_row) / np.linalg.norm(w_row):.2%})"
        )
    return lines


def _ms(values: Sequence[float]) -> str:
    if not values:
        return "refused"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values) / len(values) ** 0.5:.4f}"


def report(
    table: Table, cells: Cells, eps_grid: Sequence[float], seeds: int, reference: float
) -> list[str]:
    head = " | ".join(f"eps {e:g}" for e in eps_grid)
    lines = [
        f"## {table.name}: {table.note}",
        "",
        f"test accuracy, mean ± standard error over {seeds} seeds; delta {DELTA:g}; "
        f"non-private reference {reference:.4f}",
        "",
        f"| mechanism | registration | {head} | recorded row-level epsilon (delta) |",
        "|---|---|" + "---|" * len(eps_grid) + "---|",
    ]
    for mech in MECHANISMS:
        for variant in table.datasets:
            cols = [_ms(cells.acc.get((mech, variant, e), [])) for e in eps_grid]
            plans = [cells.row_plan.get((mech, variant, e)) for e in eps_grid]
            plan = (
                " / ".join(f"{p[0]:.4g} ({p[1]:.3g})" for p in plans if p is not None)
                if any(plans)
                else "(row level: as asked)"
            )
            lines.append(f"| {mech} | {variant} | " + " | ".join(cols) + f" | {plan} |")
    picks = sorted({p for ps in cells.picked.values() for p in ps})
    if len(picks) == 1:
        lines += ["", f"auto released {picks[0]} at every registration and epsilon."]
    else:
        lines += ["", "auto released:"]
        for (variant, eps), ps in cells.picked.items():
            lines.append(f"- {variant}, eps {eps:g}: {', '.join(sorted(ps))}")
    lines += [
        "",
        "the released runs (batch size, epochs run, the model's noise_scale: the Gaussian sigma; "
        "the batch and sigma follow the row-level plan):",
        "",
        f"| mechanism | registration | {head} |",
        "|---|---|" + "---|" * len(eps_grid),
    ]
    for mech in MECHANISMS:
        for variant in table.datasets:
            cols = ["; ".join(sorted(cells.shape.get((mech, variant, e), set()))) for e in eps_grid]
            lines.append(f"| {mech} | {variant} | " + " | ".join(cols) + " |")
    lines.append("")
    for (mech, variant, eps), msg in cells.refused.items():
        lines.append(f"- {mech}, {variant}, eps {eps:g} refused: {msg}")
    lines += [
        "",
        "median wall time per release (s): "
        + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in cells.seconds.items()),
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 seed, eps 1, k in {1, 5}")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    seeds = list(range(1, (1 if args.quick else args.seeds) + 1))
    eps_grid = (1.0,) if args.quick else EPS_GRID
    ks = (1, 5) if args.quick else KS
    lines = header_lines("privacy_units")
    lines.append(f"# command: python bench/privacy_units.py {' '.join(argv or sys.argv[1:])}")
    lines.append(f"# seeds {seeds}, eps {list(eps_grid)}, k {list(ks)}")
    print("\n".join(lines), flush=True)
    X, y, lonlat, X_test, y_test = load()
    person = group_persons(lonlat)
    tables = [
        Table(
            "one-row",
            np.arange(len(y)),
            f"{len(y):,} rows, one per person (person = rid)",
        ),
        Table("many-rows", person, f"the same {len(y):,} rows; " + person_stats(person, y)),
    ]
    start = time.perf_counter()
    tag = run_tag(bool(args.dsn))
    with bench_server(args.dsn, None) as (uri, where), dpsql.connect(uri) as db:
        print(f"# server: {where}", flush=True)
        db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        test_table = f"{SCHEMA}.test{tag}"
        db.load_numpy(test_table, X_test, y_test, replace=True)
        print(
            f"# test table: {len(y_test):,} held-out persons (one row each), majority class "
            f"{max(y_test.mean(), 1 - y_test.mean()):.4f}",
            flush=True,
        )
        for table in tables:
            install(db, table, X, y, ks, tag)
            reference = noiseless(db, table, test_table)
            cells = run_table(db, table, test_table, eps_grid, seeds)
            out = ["", *report(table, cells, eps_grid, len(seeds), reference)]
            if table.name == "one-row":
                out += [
                    "same release check (row level against k = 1, same seed and noise_seed):",
                    "",
                    *same_seed_check(db, table),
                    "",
                ]
            print("\n".join(out), flush=True)
    print(f"# total {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
