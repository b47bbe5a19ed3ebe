"""Epoch cost of private SGD's sampled batches against a noiseless epoch (issue 17).

For each table (Protein, 145,751 x 74 rows normalised to norm 1, and a synthetic 1,000,000 x 50
table), one ``dpsql.train`` per series and repeat, interleaved so that the drift of a shared
machine hits every series alike. The epoch time is the run's ``train_seconds`` (the epoch
scans, not the shuffle into the training table) over its epochs:

* noiseless logistic SGD, b = 50 and b = 10 (``privacy => 'none'``, clipping off);
* DP-SGD with shuffled batches, b = 10 (clipping and noise in every step);
* DP-SGD with Poisson batches and BST14 (draws with replacement), b = 50, without a sort
  (``sampled_fmgr.c``): Poisson copies each member row into the bucket of its step range at the
  scan and replays the buckets in step order; BST14 files the rows by rid and replays the
  draws; later epochs of the run read the kept rows instead of scanning;
* the same two with ``dpsql.sampling_memory = 0``: Poisson's buckets spilled to temporary
  files ("spilled"), BST14's sorted join of every row to its draws ("sorted join");
* Poisson with ``dpsql.sampling_memory`` at 3/4 of the members' expected bytes, a table just
  past the limit ("3/4 in memory"): the buckets replayed first stay in memory and only the rest
  is written.

Runs of 1 and of ``--epochs`` epochs give the first epoch (scan + filing + replay) and the later
ones (replay only) apart. The noise multiplier is given (1.0), so no accountant runs.

    .venv/bin/python -m bench.sampled_epochs [--epochs 10] [--repeats 3] [--rows 1000000]
    .venv/bin/python -m bench.sampled_epochs --quick      # 100,000 synthetic rows, 1 repeat
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import numpy as np

import dpsql
from dpsql import datasets, server

SERIES = {
    "noiseless b=50": (50, "privacy => 'none'"),
    "noiseless b=10": (10, "privacy => 'none'"),
    "DP-SGD shuffle b=10": (10, "privacy => 'dpsgd', noise_multiplier => 1, delta => 1e-6"),
    "DP-SGD Poisson b=50": (
        50,
        "privacy => 'dpsgd', sampling => 'poisson', noise_multiplier => 1, delta => 1e-6",
    ),
    "BST14 b=50": (50, "privacy => 'bst14', epsilon => 1, delta => 1e-6"),
}
SORTED = ("DP-SGD Poisson b=50", "BST14 b=50")  # also run at dpsql.sampling_memory = 0
HYBRID = "DP-SGD Poisson b=50"  # also run with 3/4 of its members' bytes in memory


def _members_kb(rows: int, dim: int) -> int:
    """A Poisson epoch's expected bucket bytes: rows x q x steps = rows members (q = b / rows,
    rows / b steps), each (step and kind, rid, y, then the row's features) in doubles."""
    return rows * (dim + 3) * 8 // 1024


def _load(db: dpsql.Database, name: str, X: np.ndarray, y: np.ndarray) -> None:
    db.execute(f"CREATE TABLE {name} (rid bigint, x float8[], y float8)")
    db.execute(f"ALTER TABLE {name} ALTER COLUMN x SET STORAGE PLAIN")
    db.load_numpy(name, X, y, schema="public", create=False)
    db.execute(
        f"SELECT dpsql.register_dataset('public.{name}', '{{x}}', 'y', epsilon_budget => 1e9,"
        f" accept => true,"
        f" delta_budget => 0.999, labels => '{{-1,1}}', row_norm => 'clip', name => '{name}')"
    )
    db.execute(f"VACUUM ANALYZE {name}")


def _epoch_seconds(db: dpsql.Database, name: str, series: str, epochs: int) -> float:
    b, privacy = SERIES[series]
    if privacy == "privacy => 'none'":
        (mid,) = db.execute(
            f"SELECT dpsql.train('public.{name}', '{{x}}', 'y', 'logistic', epochs => {epochs},"
            f" batch_size => {b}, labels => '{{-1,1}}', row_norm => 'clip', seed => 1)"
        ).fetchone()
    else:
        (mid,) = db.execute(
            f"SELECT dpsql.train('{name}', NULL, NULL, 'logistic', epochs => {epochs},"
            f" batch_size => {b}, {privacy})"
        ).fetchone()
    (secs,) = db.execute(
        "SELECT train_seconds FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    return float(secs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="synthetic table rows")
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-protein", action="store_true", help="synthetic table only")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats, args.no_protein = 100_000, 1, True
    tables: list[tuple[str, np.ndarray, np.ndarray]] = []
    if not args.no_protein:
        X, y = datasets.load_protein()
        tables.append(("protein", datasets.normalize_rows(X), np.where(y > 0, 1.0, -1.0)))
    X, y = datasets.synthetic_classification(args.rows, args.dim, seed=0)
    tables.append(("synthetic", X, y))
    print(
        f"# sampled_epochs: {args.epochs} epochs per run (and 1), {args.repeats} repeats,"
        f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    with server.temporary_server() as uri, dpsql.connect(uri) as db:
        db.execute("SET client_min_messages = warning")
        print(f"# server: PostgreSQL {db.execute('SHOW server_version').fetchone()[0]}")
        for name, X, y in tables:
            _load(db, name, X, y)
            print(f"\n## {name}: {X.shape[0]:,} rows x {X.shape[1]} features")
            hybrid = f"{_members_kb(X.shape[0], X.shape[1]) * 3 // 4}kB"
            runs = [(s, "1GB") for s in SERIES] + [(s, "0") for s in SORTED] + [(HYBRID, hybrid)]
            times: dict[tuple[str, str, int], list[float]] = {}
            t0 = time.time()
            for _ in range(args.repeats):
                for series, memory in runs:
                    db.execute("SELECT set_config('dpsql.sampling_memory', %s, false)", (memory,))
                    for k in (1, args.epochs):
                        t = _epoch_seconds(db, name, series, k)
                        times.setdefault((series, memory, k), []).append(t)
            print(f"# {time.time() - t0:.0f} s")
            base = {
                b: statistics.median(times[(f"noiseless b={b}", "1GB", args.epochs)]) / args.epochs
                for b in (10, 50)
            }
            print(
                f"{'series':34s} {'epoch s':>9s} {'1st epoch':>10s} {'later':>9s}"
                f" {'/ noiseless':>12s}"
            )
            for series, memory in runs:
                b = SERIES[series][0]
                k_all = statistics.median(times[(series, memory, args.epochs)])
                first = statistics.median(times[(series, memory, 1)])
                later = (k_all - first) / (args.epochs - 1) if args.epochs > 1 else float("nan")
                over = " (spilled)" if "Poisson" in series else " (sorted join)"
                label = series + {"1GB": "", "0": over}.get(memory, " (3/4 in memory)")
                print(
                    f"{label:34s} {k_all / args.epochs:9.4f} {first:10.4f} {later:9.4f}"
                    f" {k_all / args.epochs / base[b]:12.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
