"""Runtime overhead of a bolt-on release over noiseless in-database training.

The bolt-on paper's claim (its Section 4.4 and Fig. 5): output perturbation costs "virtually
nothing" over noiseless Bismarck, because the noise is drawn once, after training. This
benchmark loads a synthetic ``rows x dim`` table ``(rid, x float8[], y float8)`` (labels +-1,
``x`` stored PLAIN as in ``bench.epoch_vs_scan``), registers it, and times, interleaved and in a
rotating order so that the drift of a shared machine hits every figure alike:

* noiseless: ``dpsql.train(table, '{x}', 'y', 'logistic', epochs, batch_size, lambda => 0,
  row_norm => 'clip', seed)`` (data owner, ``privacy => 'none'``);
* bolt-on: ``dpsql.train(dataset, NULL, NULL, 'logistic', epochs, batch_size, lambda => 0,
  privacy => 'bolton', epsilon => 1, seed)`` (Algorithm 1, released by the server: ledger
  charge, sanitised rows, sensitivity, one Gamma-norm noise draw);

for batch sizes 1 and 50, with the same seed (so the same permutation) in each repeat. Both
calls shuffle the table into a training table first (``prepare``), then run the epochs; the
models table records ``prepare_seconds`` and ``train_seconds`` (the epochs), so the epochs-only
ratio is reported as well as the wall-time ratio. The last line is
``bolt-on/noiseless wall ratio: <b=1> (b=1), <b=50> (b=50)``.

Usage::

    .venv/bin/python -m bench.bolton_overhead [--rows 1000000] [--dim 50] [--epochs 3]
                                              [--repeats 7] [--dsn DSN]
    .venv/bin/python -m bench.bolton_overhead --quick    # 100,000 rows, 3 repeats
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
from psycopg import sql

import dpsql
from bench.bolton_accuracy import SCHEMA, bench_server, header_lines, run_tag
from dpsql import server
from dpsql.datasets import synthetic_classification
from dpsql.loading import load_numpy

SEED = 20240601
BATCHES = (1, 50)


def _load(db: dpsql.Database, table: str, X: np.ndarray, y: np.ndarray) -> float:
    conn = db.conn
    schema, name = table.split(".")
    ident = sql.Identifier(schema, name)
    t0 = time.perf_counter()
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (rid bigint, x float8[], y float8) "
                "WITH (autovacuum_enabled = false)"
            ).format(ident)
        )
        # Inline and uncompressed, as in bench.epoch_vs_scan.
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN x SET STORAGE PLAIN").format(ident))
        load_numpy(conn, ident, X, y, create=False)
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(ident))
    return time.perf_counter() - t0


def _train(
    db: dpsql.Database, private: bool, source: str, epochs: int, batch: int, seed: int
) -> tuple[float, float, float, int]:
    """(wall, prepare_seconds, train_seconds, model_id) of one dpsql.train call."""
    if private:
        query = (
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => %s, batch_size => %s, "
            "lambda => 0, privacy => 'bolton', epsilon => 1, seed => %s)"
        )
    else:
        query = (
            "SELECT dpsql.train(%s, '{x}', 'y', 'logistic', epochs => %s, batch_size => %s, "
            "lambda => 0, row_norm => 'clip', seed => %s)"
        )
    t0 = time.perf_counter()
    mid = db.execute(query, (source, epochs, batch, seed)).fetchone()[0]
    wall = time.perf_counter() - t0
    prep, train = db.execute(
        "SELECT prepare_seconds, train_seconds FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    return wall, prep, train, mid


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.bolton_overhead",
        description="Wall time of bolt-on releases vs noiseless in-database training.",
    )
    p.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    p.add_argument("--dim", type=int, default=50, help="features per row (50)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per training (3)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats (7)")
    p.add_argument(
        "--dsn",
        default=None,
        help="server to use (default: $DPSQL_DSN, else a temporary embedded server)",
    )
    p.add_argument("--pg-version", type=int, default=None, choices=server.SUPPORTED_PG_VERSIONS)
    p.add_argument("--quick", action="store_true", help="100,000 rows, 3 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.repeats = 100_000, 3
    if min(args.rows, args.dim, args.epochs, args.repeats) < 1:
        p.error("--rows, --dim, --epochs and --repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rows, dim, epochs, repeats = args.rows, args.dim, args.epochs, args.repeats
    for line in header_lines(
        f"bolton_overhead: {rows:,} rows x {dim} features, {epochs} epochs, {repeats} repeats"
    ):
        print(line)
    X, y = synthetic_classification(rows, dim, seed=SEED)
    dsn_given = bool(args.dsn or os.environ.get("DPSQL_DSN"))
    tag = run_tag(dsn_given)
    table = f"{SCHEMA}.overhead{tag}"
    dataset = f"bench_overhead{tag}"
    with bench_server(args.dsn, args.pg_version) as (uri, where), dpsql.connect(uri) as db:
        version = db.execute("SHOW server_version").fetchone()[0]
        print(
            f"# server: PostgreSQL {version} ({where}); shared_buffers "
            f"{db.execute('SHOW shared_buffers').fetchone()[0]}"
        )
        try:
            t_load = _load(db, table, X, y)
            del X, y
            db.execute(
                "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9,"
                " accept => true, "
                "labels => '{-1,1}', row_norm => 'clip', name => %s)",
                (table, dataset),
            )
            print(f"# load + VACUUM ANALYZE: {t_load:.1f} s", flush=True)
            return _measure(db, table, dataset, rows, epochs, repeats)
        finally:
            db.execute(f"DROP TABLE IF EXISTS {table}")


def _measure(
    db: dpsql.Database, table: str, dataset: str, rows: int, epochs: int, repeats: int
) -> int:
    configs = [(private, batch) for batch in BATCHES for private in (False, True)]
    names = {c: f"{'bolt-on eps=1' if c[0] else 'noiseless'}, b={c[1]}" for c in configs}
    wall: dict[tuple[bool, int], list[float]] = defaultdict(list)
    prep: dict[tuple[bool, int], list[float]] = defaultdict(list)
    train: dict[tuple[bool, int], list[float]] = defaultdict(list)
    sens: dict[int, float] = {}

    # Warm-up (not counted): caches, the extension in this backend, both code paths.
    for private in (False, True):
        _train(db, private, dataset if private else table, 1, 50, SEED)

    for r in range(repeats):
        k = r % len(configs)
        for private, batch in configs[k:] + configs[:k]:
            w, p, t, mid = _train(
                db, private, dataset if private else table, epochs, batch, SEED + r
            )
            wall[(private, batch)].append(w)
            prep[(private, batch)].append(p)
            train[(private, batch)].append(t)
            if private:
                sens[batch] = db.execute(
                    "SELECT sensitivity FROM dpsql.models WHERE model_id = %s", (mid,)
                ).fetchone()[0]
        print(f"#   repeat {r + 1}/{repeats} done", flush=True)

    med = statistics.median
    print()
    width = max(len(n) for n in names.values())
    print(
        f"{'figure':<{width}}  {'wall s':>8}  {'min':>7}  {'max':>7}  {'prepare':>8}  "
        f"{'epochs':>8}  {'other':>6}  {'ns/row/epoch':>12}"
    )
    print("-" * (width + 72))
    for c in configs:
        other = med([w - p - t for w, p, t in zip(wall[c], prep[c], train[c], strict=True)])
        print(
            f"{names[c]:<{width}}  {med(wall[c]):8.3f}  {min(wall[c]):7.3f}  {max(wall[c]):7.3f}  "
            f"{med(prep[c]):8.3f}  {med(train[c]):8.3f}  {other:6.3f}  "
            f"{med(train[c]) / (rows * epochs) * 1e9:12.0f}"
        )
    print()
    print("(prepare = shuffle into the training table; epochs = the aggregate scans; other =")
    print(" wall - prepare - epochs: planning, ledger, sensitivity, noise, storing the model)")
    print()
    ratios_wall = {b: med(wall[(True, b)]) / med(wall[(False, b)]) for b in BATCHES}
    for b in BATCHES:
        paired = [pw / nw for pw, nw in zip(wall[(True, b)], wall[(False, b)], strict=True)]
        print(f"b={b}: bolt-on sensitivity {sens[b]:.4g}")
        print(f"b={b}: wall ratio bolt-on/noiseless (medians)        {ratios_wall[b]:.3f}")
        print(f"b={b}: wall ratio, median of per-repeat ratios       {med(paired):.3f}")
        print(
            f"b={b}: epochs-only ratio (train_seconds medians)      "
            f"{med(train[(True, b)]) / med(train[(False, b)]):.3f}"
        )
        print(
            f"b={b}: prepare ratio (prepare_seconds medians)        "
            f"{med(prep[(True, b)]) / med(prep[(False, b)]):.3f}"
        )
    print(
        "bolt-on/noiseless wall ratio: "
        + ", ".join(f"{ratios_wall[b]:.3f} (b={b})" for b in BATCHES)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
