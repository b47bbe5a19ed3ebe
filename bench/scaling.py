"""How epoch time grows with the rows: 1M to 32M rows, past shared_buffers (issue 17).

A synthetic ``(rid, x float8[50], y)`` table of 1,000,000 rows is loaded, then doubled in place
(rids continued, rows repeated: the timing does not depend on the values) up to ``--max-rows``.
At each size, interleaved over ``--repeats``:

* a plain scan, ``SELECT sum(array_length(x, 1))`` (Bismarck's yardstick);
* one noiseless logistic SGD epoch, b = 1 (``dpsql.sgd_epoch``);
* one DP-SGD epoch with shuffled batches, b = 50 (clipping and Gaussian noise in every step);
* Poisson DP-SGD, b = 50, without a sort (``_sgd_epoch_sampled``: up to
  ``dpsql.sampling_in_place_memory`` of rows by rid, ``--in-place-memory``, the scan files the
  rows by rid and each member is read where its row lies; over it the scan copies each member
  row into the bucket of its step range, the buckets are replayed in step order): a first
  epoch (which also keeps the rows by rid when they fit), a later one in the same transaction
  (``_sgd_epoch_replayed``: the kept rows read in place, or in rid order into the buckets,
  instead of a scan), and one with ``dpsql.sampling_memory`` at ``--spill-memory`` (buckets
  spilled to temporary files, nothing kept). The first epoch of a transaction also
  pays for its memory; on a virtual machine memory the guest never touched before costs the
  host's page faults too.

The table is unlogged (like dpsql's training tables) and vacuumed after each doubling. Prints
seconds, ns per row, and ns per row relative to the first size: a linear cost stays near 1.

    .venv/bin/python -m bench.scaling [--max-rows 32000000] [--repeats 3] [--sampling-memory 8GB]
        [--in-place-memory 512MB]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import dpsql
from dpsql import datasets, server

DIM = 50
START = 1_000_000
NAMES = (
    "scan",
    "epoch b=1",
    "DP-SGD shuffle b=50",
    "Poisson b=50",
    "Poisson later",
    "Poisson spilled",
)


def main(argv: Sequence[str] | None = None) -> int:  # noqa: C901, PLR0915
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, default=32_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampling-memory", default="8GB")
    parser.add_argument("--spill-memory", default="64MB")
    parser.add_argument(
        "--in-place-memory", default=None, help="dpsql.sampling_in_place_memory (0: buckets only)"
    )
    parser.add_argument("--start", type=int, default=START)
    args = parser.parse_args(argv)
    with server.temporary_server() as uri, dpsql.connect(uri) as db:
        db.execute("SET max_parallel_workers_per_gather = 0")
        db.execute("SELECT set_config('dpsql.sampling_memory', %s, false)", (args.sampling_memory,))
        if args.in_place_memory is not None:
            db.execute(
                "SELECT set_config('dpsql.sampling_in_place_memory', %s, false)",
                (args.in_place_memory,),
            )
        print(
            f"# scaling: {args.start:,} -> {args.max_rows:,} rows x {DIM}, {args.repeats} repeats,"
            f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        print(
            f"# server: PostgreSQL {db.execute('SHOW server_version').fetchone()[0]},"
            f" shared_buffers {db.execute('SHOW shared_buffers').fetchone()[0]},"
            f" dpsql.sampling_memory {args.sampling_memory} (spilled: {args.spill_memory})"
        )
        X, y = datasets.synthetic_classification(args.start, DIM, seed=0)
        db.execute("CREATE UNLOGGED TABLE s (rid bigint, x float8[], y float8)")
        db.execute("ALTER TABLE s ALTER COLUMN x SET STORAGE PLAIN")
        db.load_numpy("s", X, y, schema="public", create=False)
        del X, y
        db.execute("UPDATE s SET rid = rid + 1")  # row ids 1..m, as in a training table
        db.execute("VACUUM FULL s")

        def state(batch: int, steps: int, noise: bool) -> list[float]:
            return db.execute(
                "SELECT dpsql_internal._sgd_init('logistic', %s, 1, 0.0, 'constant', 0.01, 0, 0,"
                " 0.1, %s, %s, %s, %s, %s, %s, %s, 5)",
                (
                    DIM,
                    batch,
                    8 if noise else 0,
                    1.0 if noise else 0.0,
                    "gaussian" if noise else "none",
                    1.0 if noise else 0.0,
                    float(batch) if noise else 0.0,
                    steps,
                ),
            ).fetchone()[0]

        plain, shuffled = state(1, 0, False), state(50, 0, True)
        (in_place,) = db.execute(
            "SELECT current_setting('dpsql.sampling_in_place_memory', true)"
        ).fetchone()
        print(f"# dpsql.sampling_in_place_memory {in_place}")
        header = f"{'rows':>12s} {'heap GB':>8s}  " + "  ".join(f"{n:>22s}" for n in NAMES)
        rows, first = args.start, None
        while rows <= args.max_rows:
            db.execute("VACUUM ANALYZE s")
            heap = db.execute("SELECT pg_table_size('s') / 1e9").fetchone()[0]
            poisson = state(50, rows // 50, True)
            queries = {
                "scan": ("SELECT sum(array_length(x, 1)) IS NULL FROM s", ()),
                "epoch b=1": ("SELECT dpsql.sgd_epoch(x, y, %s) IS NULL FROM s", (plain,)),
                "DP-SGD shuffle b=50": (
                    "SELECT dpsql.sgd_epoch(x, y, %s) IS NULL FROM s",
                    (shuffled,),
                ),
            }
            queries["Poisson b=50"] = (
                "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 7, %s, %s,"
                " 1, 's'::regclass) IS NULL FROM s",
                (poisson, rows, 50 / rows),
            )
            queries["Poisson later"] = (
                "SELECT dpsql_internal._sgd_epoch_replayed(%s, 1, 's'::regclass, 'poisson', 8,"
                " %s, %s) IS NULL",
                (poisson, rows, 50 / rows),
            )
            queries["Poisson spilled"] = (
                "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 9, %s, %s,"
                " NULL, NULL) IS NULL FROM s",
                (poisson, rows, 50 / rows),
            )
            times: dict[str, list[float]] = {name: [] for name in queries}
            for _ in range(args.repeats):
                with db.conn.transaction():  # the later Poisson epoch reads the first one's rows
                    for name, (query, params) in queries.items():
                        memory = args.spill_memory if name == "Poisson spilled" else None
                        if memory:
                            db.execute(
                                "SELECT set_config('dpsql.sampling_memory', %s, true)", (memory,)
                            )
                        t = time.perf_counter()
                        (missing,) = db.execute(query, params).fetchone()
                        if missing:  # the rows were not kept (over the memory limit)
                            assert name == "Poisson later"
                        else:
                            times[name].append(time.perf_counter() - t)
                        if memory:
                            db.execute(
                                "SELECT set_config('dpsql.sampling_memory', %s, true)",
                                (args.sampling_memory,),
                            )
            med = {name: statistics.median(ts) for name, ts in times.items() if ts}
            if first is None:
                first = {name: med[name] / rows for name in NAMES}
                print(header)
            cells = []
            for name in NAMES:
                if name not in med:
                    cells.append(f"{'(not kept)':>22s}")
                    continue
                per_row = med[name] / rows
                cells.append(
                    f"{med[name]:8.2f} s {per_row * 1e9:4.0f} ns x{per_row / first[name]:4.2f}"
                )
            print(f"{rows:12,d} {heap:8.2f}  " + "  ".join(cells), flush=True)
            if rows * 2 > args.max_rows:
                break
            db.execute("INSERT INTO s SELECT rid + %s, x, y FROM s", (rows,))
            rows *= 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
