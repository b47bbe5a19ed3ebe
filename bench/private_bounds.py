"""Private bounds on features of very different scales (issue 25, item 6): the scan of the grid
of magnitudes (0.8.0) against the exponential mechanism on a linear grid of m^2 points it
replaced, both run by the server on the same tables with the same epsilon.

* a synthetic table: three features uniform on [0, 1], [0, 300] and [0, 1e5] (sharp upper
  edges, the hardest case for an upper quantile), m = 4000;
* California housing with its raw, unscaled features (longitude .. medianIncome: scales from
  1 to 35,682) and |y| (median house value, up to 500,001), m = 20,640.

The old mechanism is replayed with the very SQL it used (dpsql_internal._grid_sql and
_private_quantile, kept for DPSGD-F): values clamped and rounded to the grid of step
(b - a) / m^2, the exponential mechanism at epsilon / (2d) per quantile. The new one is
dpsql.estimate_bounds itself (fresh CSPRNG noise, each run rolled back; its charge is durable,
so the bench datasets get a large budget). Reported per feature: the true 0.01 and 0.99
quantiles, the median estimates over the runs, and the share of upper bounds within 2x of the
true 0.99 quantile.

Usage::

    .venv/bin/python -m bench.private_bounds [--runs 20] [--epsilon 1] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence

import numpy as np
import psycopg

from bench.bolton_accuracy import bench_server, header_lines
from dpsql import datasets as dsets

WIDE = (-1e7, 1e7)


def _load(conn: psycopg.Connection, table: str, x: np.ndarray, y: np.ndarray) -> list[str]:
    cols = [f"f{j}" for j in range(x.shape[1])]
    conn.execute(f"CREATE TABLE {table} ({', '.join(c + ' float8' for c in cols)}, y float8)")
    with conn.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN") as copy:
        for row, label in zip(x.tolist(), y.tolist(), strict=True):
            copy.write_row([*row, label])
    return cols


def _old_quantile(
    conn: psycopg.Connection, table: str, value_sql: str, q: float, rng: Sequence[float], eps: float
) -> float:
    """One draw of the 0.7.0 estimate: the linear grid of m^2 points, the rank utility."""
    (m,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    a, b = rng
    step = (b - a) / (m * m)
    (grid_sql,) = conn.execute("SELECT dpsql_internal._grid_sql(%s)", (value_sql,)).fetchone()
    for k, v in ((1, a), (2, b), (3, step)):  # the grid's parameters, as float8 literals
        grid_sql = grid_sql.replace(f"${k}", f"'{v!r}'::float8")
    (value,) = conn.execute(
        f"WITH v AS (SELECT {grid_sql} AS w, count(*) AS c FROM {table} GROUP BY 1)"
        " SELECT dpsql_internal._private_quantile(array_agg(w ORDER BY w),"
        "   array_agg(c ORDER BY w), ceil(%s * %s)::bigint, %s, %s, %s, %s, NULL) FROM v",
        (q, m, a, b, step, eps),
    ).fetchone()
    return float(value)


def _compare(
    conn: psycopg.Connection,
    title: str,
    x: np.ndarray,
    y: np.ndarray,
    names: Sequence[str],
    eps: float,
    runs: int,
    search_range: Sequence[float] | None,
) -> list[str]:
    table = f"bench_bounds_{uuid.uuid4().hex[:8]}"
    cols = _load(conn, table, x, y)
    name = table
    conn.execute(
        "SELECT dpsql.register_dataset(%s, %s, 'y', 1e9, name => %s, regression => true,"
        " accept => true)",
        (table, cols, name),
    )
    d = x.shape[1]
    old_range = search_range or WIDE
    new_hi, new_lo, old_hi = [], [], []
    seconds = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        with conn.transaction(force_rollback=True):
            (bounds,) = conn.execute(
                "SELECT dpsql.estimate_bounds(%s, %s, %s)",
                (name, eps, None if search_range is None else list(search_range)),
            ).fetchone()
        seconds += time.perf_counter() - start
        new_lo.append([lo for lo, _ in bounds])
        new_hi.append([hi for _, hi in bounds])
        old_hi.append([_old_quantile(conn, table, c, 0.99, old_range, eps / (2 * d)) for c in cols])
    new_label = []
    old_label = []
    for _ in range(runs):
        with conn.transaction(force_rollback=True):
            new_label.append(
                conn.execute(
                    "SELECT dpsql.estimate_label_bound(%s, %s, %s)",
                    (name, eps, None if search_range is None else [0.0, old_range[1]]),
                ).fetchone()[0]
            )
        old_label.append(_old_quantile(conn, table, "abs(y)", 0.99, (0, old_range[1]), eps))
    conn.execute(f"DROP TABLE {table}")
    nh, nl, oh = np.array(new_hi), np.array(new_lo), np.array(old_hi)
    rng_text = "default {-2^40, 2^40}" if search_range is None else str(list(search_range))
    out = [
        f"## {title}: m = {len(y)}, d = {d}, epsilon {eps} ({eps / (2 * d):.4g} per quantile),"
        f" new range {rng_text}, old range {list(old_range)}, {runs} runs;"
        f" estimate_bounds {seconds / runs:.2f} s a call",
        f"{'feature':>22} {'p01':>10} {'p99':>10} | {'new lo':>10} {'new hi':>10} {'in 2x':>6}"
        f" | {'old hi':>10} {'in 2x':>6}",
    ]

    def within(v: np.ndarray, t: float) -> float:  # v / t in [1/2, 2] (t < 0 too)
        return float(np.mean((v / t >= 0.5) & (v / t <= 2)))

    for j, label in enumerate(names):
        p01, p99 = np.quantile(x[:, j], [0.01, 0.99])
        out.append(
            f"{label:>22} {p01:10.4g} {p99:10.4g} | {np.median(nl[:, j]):10.4g}"
            f" {np.median(nh[:, j]):10.4g} {within(nh[:, j], p99):6.2f}"
            f" | {np.median(oh[:, j]):10.4g} {within(oh[:, j], p99):6.2f}"
        )
    q = float(np.quantile(np.abs(y), 0.99))
    out.append(
        f"{'|y| (label bound)':>22} {'':>10} {q:10.4g} | {'':>10}"
        f" {np.median(new_label):10.4g} {within(np.array(new_label), q):6.2f}"
        f" | {np.median(old_label):10.4g} {within(np.array(old_label), q):6.2f}"
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--dsn")
    parser.add_argument("--pg-version", type=int)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(25)
    synth = rng.uniform(0, 1, size=(4000, 3)) * np.array([1.0, 300.0, 1e5])
    synth_y = synth[:, 2] / 1e5
    housing_x, housing_y = dsets.load_cal_housing()
    lines = header_lines("Private bounds: scan of a grid of magnitudes vs linear-grid EM")
    with bench_server(args.dsn, args.pg_version) as (uri, where):
        lines.append(f"# server: {where}")
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS dpsql")
            for search_range in (WIDE, None):
                lines += _compare(
                    conn, "synthetic", synth, synth_y, ["U[0,1]", "U[0,300]", "U[0,1e5]"],
                    args.epsilon, args.runs, search_range,
                )  # fmt: skip
            lines += _compare(
                conn, "California housing, raw features", housing_x, housing_y,
                dsets.CAL_HOUSING_COLUMNS[:8], args.epsilon, args.runs, WIDE,
            )  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
