"""How much does one in-database SGD epoch cost next to a plain scan of the same table?

Bismarck's claim is that an SGD epoch written as a user-defined aggregate runs at nearly the
speed of a table scan. This benchmark loads a synthetic ``rows x dim`` table
``(rid bigint, x float8[], y float8)`` and measures, interleaved in one run (scan, epoch b=1,
epoch b=50, ... then again) so that the drift of a noisy shared machine hits every figure alike:

* a plain scan, ``SELECT sum(array_length(x, 1)) FROM t``, and ``SELECT count(x) FROM t``;
* one logistic SGD epoch, ``SELECT dpsql.sgd_epoch(x, y, $state) FROM t``, batch size 1 and 50;
* the epoch as a parallel plan (Partial Aggregate + COMBINEFUNC) with 1 and 2 workers;
* the same epoch in memory (``dpsql._core.run_epoch`` on numpy arrays);
* exporting the table to numpy (``dpsql.loading.fetch_numpy``, binary COPY).

It also times the load (``load_numpy``) and the server-side shuffle of a training run
(``dpsql_internal._prepare(..., shuffle => true)``). Times are client wall times; every query
returns one small row. The last line of the output is ``epoch/scan ratio: <median epoch b=1 /
median scan>``.


Usage::

    .venv/bin/python -m bench.epoch_vs_scan [--rows 1000000] [--dim 50] [--repeats 5] [--dsn DSN]
    .venv/bin/python -m bench.epoch_vs_scan --quick       # 100,000 rows, smoke test

Without ``--dsn`` (or ``DPSQL_DSN``) a throw-away embedded server runs in a temporary data
directory and is stopped and deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

import dpsql
from dpsql import _core, extension, server
from dpsql.datasets import synthetic_classification
from dpsql.loading import fetch_numpy, load_numpy

TABLE = "dpsql_bench_epoch_vs_scan"
SEED = 20240601

SCAN_SQL = "SELECT sum(array_length(x, 1)) FROM {t}"
COUNT_SQL = "SELECT count(x) FROM {t}"
EPOCH_SQL = "SELECT dpsql.sgd_epoch(x, y, %s::float8[]) FROM {t}"
INIT_SQL = (
    "SELECT dpsql_internal._sgd_init('logistic', %s, 1, 0.0, 'constant', %s, 0, 0, 0.1, %s,"
    " 0)::float8[]"
)


# --------------------------------------------------------------------------------------------
# Connection
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _server(dsn: str | None, pg_version: int | None) -> Iterator[tuple[str, str]]:
    """URI of the server to use and a description of it."""
    if dsn:
        yield dsn, "given DSN"
        return
    version = pg_version or server.DEFAULT_PG_VERSION
    with server.temporary_server(version) as uri:
        # dpsql.connect() builds the extension only for the default embedded cluster; this one
        # lives in a temporary data directory, so make sure its install has the extension.
        extension.ensure_available(uri, server.pg_config_path(version))
        yield uri, f"embedded PostgreSQL {version}, temporary pgdata"


def _session(conn: psycopg.Connection, **settings: str) -> None:
    for name, value in settings.items():
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _query(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    # prepare=False: an unnamed statement planned at every call, so that a plan cached under one
    # max_parallel_workers_per_gather is never reused under another.
    row = conn.execute(query, params, prepare=False).fetchone()
    assert row is not None
    return row[0]


def _stats(times: list[float]) -> tuple[float, float, float]:
    return statistics.median(times), min(times), max(times)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:8.3f}"


def _explain(conn: psycopg.Connection, explain: str) -> str:
    rows = conn.execute(explain, prepare=False).fetchall()
    return "\n".join(r[0] for r in rows)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.epoch_vs_scan",
        description="Time one in-database SGD epoch against a plain scan of the same table.",
    )
    p.add_argument("--rows", type=int, default=1_000_000, help="table rows (default 1,000,000)")
    p.add_argument("--dim", type=int, default=50, help="features per row (default 50)")
    p.add_argument("--repeats", type=int, default=5, help="measurements of each figure (5)")
    p.add_argument(
        "--dsn",
        default=None,
        help="server to use (default: $DPSQL_DSN, else a temporary embedded server)",
    )
    p.add_argument(
        "--pg-version",
        type=int,
        default=None,
        choices=server.SUPPORTED_PG_VERSIONS,
        help="embedded PostgreSQL major version (default: DPSQL_PG_VERSION or 18)",
    )
    p.add_argument("--quick", action="store_true", help="smoke test: 100,000 rows")
    args = p.parse_args(argv)
    if args.quick:
        args.rows = 100_000
    if args.rows < 1 or args.dim < 1 or args.repeats < 1:
        p.error("--rows, --dim and --repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    dsn = args.dsn or os.environ.get("DPSQL_DSN") or None
    rows, dim, repeats = args.rows, args.dim, args.repeats
    eta = 1.0 / math.sqrt(rows)
    ident = sql.Identifier(TABLE)
    t = TABLE  # a plain lowercase name: valid unquoted in SQL text and for fetch_numpy

    print(
        f"# epoch_vs_scan: {rows:,} rows x {dim} features, {repeats} repeats, "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )
    print(
        f"# machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, numpy {np.__version__}"
    )

    X, y = synthetic_classification(rows, dim, seed=SEED)

    with _server(dsn, args.pg_version) as (uri, where), dpsql.connect(uri) as db:
        conn = db.conn
        version = _query(conn, "SHOW server_version")
        print(
            f"# server: PostgreSQL {version} ({where}); shared_buffers "
            f"{_query(conn, 'SHOW shared_buffers')}"
        )
        try:
            return _run(conn, uri, t, ident, X, y, eta, repeats)
        finally:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))


def _run(
    conn: psycopg.Connection,
    uri: str,
    t: str,
    ident: sql.Identifier,
    X: np.ndarray,
    y: np.ndarray,
    eta: float,
    repeats: int,
) -> int:
    rows, dim = X.shape
    figures: dict[str, list[float]] = {}
    notes: list[str] = []

    # -- load -------------------------------------------------------------------------------
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))

    def load() -> int:
        with conn.transaction():
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (rid bigint, x float8[], y float8) "
                    "WITH (autovacuum_enabled = false)"
                ).format(ident)
            )
            # Inline and uncompressed: a TOASTed row would cost a detoast per row and epoch.
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN x SET STORAGE PLAIN").format(ident))
            return load_numpy(conn, ident, X, y, create=False)

    figures["load_numpy (binary COPY)"] = [_timed(load)[0]]
    t_vac, _ = _timed(lambda: conn.execute(sql.SQL("VACUUM ANALYZE {}").format(ident)))
    figures["VACUUM ANALYZE"] = [t_vac]

    heap, toast, colsize, pages = conn.execute(
        sql.SQL(
            "SELECT pg_relation_size(c.oid), "
            "       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), "
            "       (SELECT pg_column_size(x) FROM {} LIMIT 1), c.relpages "
            "FROM pg_class c WHERE c.oid = {}::regclass"
        ).format(ident, sql.Literal(t))
    ).fetchone()
    notes.append(
        f"table: heap {heap / 2**20:.0f} MB ({pages} pages, {rows / max(pages, 1):.1f} rows/page),"
        f" toast {toast / 2**10:.0f} kB, pg_column_size(x) = {colsize} bytes"
    )

    # -- shuffle once (server-side prepare of a training run) -------------------------------
    def prepare() -> int:
        return _query(
            conn,
            "SELECT (dpsql_internal._prepare(source => %s, features => ARRAY['x'], label => 'y', "
            "model => 'logistic', epochs => 1, batch_size => 1, lambda => 0, step_size => NULL, "
            "schedule => 'constant', step_offset => 0, radius => NULL, shuffle => true, "
            "seed => 42, labels => NULL, intercept => false, row_norm => 'none', "
            "huber_h => 0.1, tolerance => NULL)).run_id",
            (t,),
        )

    t_prep, run_id = _timed(prepare)
    figures["shuffle once (dpsql_internal._prepare)"] = [t_prep]
    conn.execute("SELECT dpsql_internal._abort(%s)", (run_id,))

    # -- sessions ---------------------------------------------------------------------------
    serial = {
        "max_parallel_workers_per_gather": "0",
        "synchronize_seqscans": "off",
        "jit": "off",
    }
    _session(conn, **serial)
    par = psycopg.connect(uri, autocommit=True)
    try:
        _session(
            par,
            synchronize_seqscans="off",
            jit="off",
            parallel_setup_cost="0",
            parallel_tuple_cost="0",
            min_parallel_table_scan_size="0",
        )
        conn.execute(sql.SQL("ALTER TABLE {} SET (parallel_workers = 2)").format(ident))
        return _measure(conn, par, t, X, y, eta, repeats, figures, notes)
    finally:
        par.close()


def _measure(
    conn: psycopg.Connection,
    par: psycopg.Connection,
    t: str,
    X: np.ndarray,
    y: np.ndarray,
    eta: float,
    repeats: int,
    figures: dict[str, list[float]],
    notes: list[str],
) -> int:
    rows, dim = X.shape
    state1 = _query(conn, INIT_SQL, (dim, eta, 1))
    state50 = _query(conn, INIT_SQL, (dim, eta, 50))
    core_state = _core.init_state("logistic", dim, eta=eta, huber_h=0.1, batch_size=1)
    scan_q = SCAN_SQL.format(t=t)
    count_q = COUNT_SQL.format(t=t)
    epoch_q = EPOCH_SQL.format(t=t)

    _prepare_parallel(par, epoch_q, state1, notes)

    # Warm-up: cache (one scan), the extension's library in this backend, the client side.
    _query(conn, scan_q)
    server_state = _query(conn, epoch_q, (state1,))
    core_out = _core.run_epoch(core_state, X, y)
    diff = float(np.max(np.abs(np.asarray(server_state) - core_out)))
    notes.append(
        f"server epoch vs in-memory epoch (b=1, same row order): max |state diff| = {diff:.3g}"
    )

    def par_epoch(workers: int) -> Callable[[], float]:
        query = _execute_sql(par, workers, state1)
        return lambda: _timed(lambda: _query(par, query))[0]

    def plain(fn: Callable[[], Any]) -> Callable[[], float]:
        return lambda: _timed(fn)[0]

    steps: list[tuple[str, Callable[[], float]]] = [
        ("scan: sum(array_length(x, 1))", plain(lambda: _query(conn, scan_q))),
        ("epoch b=1 (serial)", plain(lambda: _query(conn, epoch_q, (state1,)))),
        ("epoch b=50 (serial)", plain(lambda: _query(conn, epoch_q, (state50,)))),
        ("scan: count(x)", plain(lambda: _query(conn, count_q))),
        ("epoch b=1, 1 parallel worker", par_epoch(1)),
        ("epoch b=1, 2 parallel workers", par_epoch(2)),
        ("in-memory epoch b=1 (_core)", plain(lambda: _core.run_epoch(core_state, X, y))),
        ("fetch_numpy (binary COPY out)", plain(lambda: fetch_numpy(conn, t, ordered=False))),
    ]
    for name, _ in steps:
        figures[name] = []
    for r in range(repeats):
        # Rotate the order too, so no figure always runs right after the same neighbour.
        k = r % len(steps)
        for name, step in steps[k:] + steps[:k]:
            figures[name].append(step())

    _report(rows, dim, repeats, figures, notes)
    return 0


def _execute_sql(conn: psycopg.Connection, workers: int, state: Any) -> str:
    # EXECUTE takes no protocol-level parameters: the state goes in as an exact literal
    # (float8 values print with round-trip precision).
    return (
        sql.SQL("EXECUTE {}({}::float8[])")
        .format(sql.Identifier(f"epoch_w{workers}"), sql.Literal([float(v) for v in state]))
        .as_string(conn)
    )


def _prepare_parallel(par: psycopg.Connection, epoch_q: str, state: Any, notes: list[str]) -> None:
    """Prepare ``epoch_w1`` and ``epoch_w2``: the epoch as parallel plans of 1 and 2 workers.

    "N workers" should mean N processes scanning, so the leader must not take part
    (``parallel_leader_participation = off``). But without the leader a 1-worker parallel plan
    costs as much as the serial plan, and the planner keeps the serial one. So the plans are
    made with the leader counted in (generic plans, cached by the prepared statements) and run
    with the leader off: the executor reads that setting when it starts the Gather, and a GUC
    change does not invalidate a cached plan. EXPLAIN ANALYZE checks both.
    """
    _session(par, plan_cache_mode="force_generic_plan", parallel_leader_participation="on")
    param = epoch_q.replace("%s::float8[]", "$1")
    for workers in (1, 2):
        _session(par, max_parallel_workers_per_gather=str(workers))
        par.execute(f"PREPARE epoch_w{workers}(float8[]) AS {param}")
        _query(par, _execute_sql(par, workers, state))  # plans and caches
    _session(par, parallel_leader_participation="off", max_parallel_workers_per_gather="0")
    for workers in (1, 2):
        plan = _explain(
            par, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + _execute_sql(par, workers, state)
        )
        ok = (
            "Partial Aggregate" in plan
            and f"Workers Planned: {workers}" in plan
            and f"Workers Launched: {workers}" in plan
            and f"loops={workers})" in plan.split("Partial Aggregate", 1)[1].splitlines()[0]
        )
        if not ok:
            raise RuntimeError(f"expected a parallel plan run by {workers} workers, got:\n{plan}")
        if workers == 2:
            lines = [ln.strip() for ln in plan.splitlines() if "Time:" not in ln]
            notes.append("parallel plan, 2 workers, leader off: " + " | ".join(lines))


def _report(
    rows: int, dim: int, repeats: int, figures: dict[str, list[float]], notes: list[str]
) -> None:
    med = {name: _stats(ts)[0] for name, ts in figures.items()}
    print()
    for note in notes:
        print(f"# {note}")
    print()
    width = max(len(n) for n in figures)
    print(f"{'figure':<{width}}  {'median s':>8}  {'min s':>8}  {'max s':>8}  {'ns/row':>7}  n")
    print("-" * (width + 46))
    for name, ts in figures.items():
        m, lo, hi = _stats(ts)
        print(
            f"{name:<{width}}  {_fmt_s(m)}  {_fmt_s(lo)}  {_fmt_s(hi)}  "
            f"{m / rows * 1e9:7.0f}  {len(ts)}"
        )
    print()
    scan = med["scan: sum(array_length(x, 1))"]
    e1 = med["epoch b=1 (serial)"]
    e50 = med["epoch b=50 (serial)"]
    w1 = med["epoch b=1, 1 parallel worker"]
    w2 = med["epoch b=1, 2 parallel workers"]
    core = med["in-memory epoch b=1 (_core)"]
    ratios = [
        ("epoch b=50 / scan", e50 / scan),
        ("epoch b=1 / count(x) scan", e1 / med["scan: count(x)"]),
        ("epoch b=1 - scan, ns/row (extra cost of the SGD step)", (e1 - scan) / rows * 1e9),
        ("in-memory epoch, ns/row", core / rows * 1e9),
        ("parallel speedup: 1 worker / 2 workers", w1 / w2),
        ("parallel speedup: serial / 2 workers", e1 / w2),
        (
            "fetch_numpy / epoch b=1 (export vs one epoch in the server)",
            med["fetch_numpy (binary COPY out)"] / e1,
        ),
        ("epoch b=1 / in-memory epoch", e1 / core),
    ]
    rw = max(len(n) for n, _ in ratios)
    for name, value in ratios:
        print(f"{name:<{rw}}  {value:8.2f}")
    print(f"epoch/scan ratio: {e1 / scan:.3f}")


if __name__ == "__main__":
    sys.exit(main())
