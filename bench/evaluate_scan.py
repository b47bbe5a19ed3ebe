"""dpsql.evaluate over a table: seconds and ns per row for models with and without a
recorded preprocessing (the row transform, a centre, a clip radius), and with a categorical
column, against the table's scan; and the training table's fill (prepare) of the categorical
release.

A model's preprocessing is built into evaluate's scan as C calls with its numbers as literals
(``_preprocessed_sql``, 54_api.sql), and a categorical column's one-hot coordinates come from a
C function (``_one_hot``); before 0.8.0 both were SQL functions called per row, which dpsql's
pinned settings keep from being inlined (the first parsed the preprocessing's JSON for every
row).

    python -m bench.evaluate_scan [--rows 200000] [--dim 50]

Prints, on a throw-away embedded server, one release per line (epsilon 2) on a regression
dataset (label bound 1, rows clipped to norm 1), a classification one and one of two numbers
and a categorical column of 8 values, then evaluate over the same table (median of 3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import psycopg

from dpsql import server
from dpsql.loading import load_numpy

RELEASES = (
    ("reg", "'linear', privacy => 'adassp', epsilon => 2, delta => 1e-6"),  # centre, row flags
    ("reg", "'linear', privacy => 'dp_ambssgd', epsilon => 2, delta => 1e-6"),
    ("cls", "privacy => 'bolton', epsilon => 2"),  # no preprocessing
    ("cls", "privacy => 'dpsgd_f', epsilon => 2, delta => 1e-6"),  # DPSGD-F's centre
    ("cat", "privacy => 'bolton', epsilon => 2"),  # two numbers and 8 categories one-hot
)
TABLES = {"reg": "t", "cls": "t2", "cat": "t3"}
LEVELS = [f"level{i}" for i in range(8)]


def _seconds(conn: psycopg.Connection, query: str, args: tuple, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        conn.execute(query, args).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _tables(conn: psycopg.Connection, X: np.ndarray, y: np.ndarray) -> None:
    load_numpy(conn, "t", X, y)
    conn.execute("CREATE TABLE t2 AS TABLE t")
    conn.execute(
        "CREATE TABLE t3 AS SELECT x[1] AS a, x[2] AS b, 'level' || (rid % 8) AS c, y FROM t"
    )
    for name, extra in (("reg", "label_bound => 1"), ("cls", "labels => '{0,1}'")):
        conn.execute(
            "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1000,"
            f" delta_budget => 0.5, row_norm => 'clip', accept => true, name => %s, {extra})",
            (TABLES[name], name),
        )
    conn.execute(
        "SELECT dpsql.register_dataset('t3', '{a,b,c}', 'y', epsilon_budget => 1000,"
        " delta_budget => 0.5, labels => '{0,1}', feature_bounds => '{{-1,1},{-1,1}}',"
        " categories => %s, row_norm => 'clip', accept => true, name => 'cat')",
        (json.dumps({"c": LEVELS}),),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.rows, args.dim)) / np.sqrt(args.dim) / 2
    y = (X @ np.linspace(1, -1, args.dim) + 0.1 * rng.normal(size=args.rows) > 0).astype(float)
    with server.temporary_server() as uri, psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute("CREATE EXTENSION dpsql")
        _tables(conn, X, y)
        scan = _seconds(conn, "SELECT count(x), sum(y) FROM t", ())
        print(
            f"PostgreSQL {conn.info.server_version}; {args.rows:,} rows x {args.dim};"
            f" a scan of the table {scan:.3f} s"
        )
        print(f"{'release':<44} {'preprocessing':<28} {'evaluate s':>10} {'ns/row':>8}")
        for ds, call in RELEASES:
            (mid,) = conn.execute(f"SELECT dpsql.train(%s, NULL, NULL, {call})", (ds,)).fetchone()
            pre, prepare = conn.execute(
                "SELECT params->'privacy'->'preprocessing', prepare_seconds"
                "  FROM dpsql.model_store WHERE model_id = %s",
                (mid,),
            ).fetchone()
            s = _seconds(conn, "SELECT * FROM dpsql.evaluate(%s, %s)", (mid, TABLES[ds]))
            kind = "+".join(k for k in ("clip_radius", "centre", "row_flags") if k in (pre or {}))
            kind = ("8 categories, " if ds == "cat" else "") + (kind or "none")
            print(f"{call[:44]:<44} {kind:<28} {s:10.3f} {1e9 * s / args.rows:8.0f}")
            if ds == "cat":
                print(f"  (the categorical release's training table filled in {prepare:.3f} s)")


if __name__ == "__main__":
    main()
