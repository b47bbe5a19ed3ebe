"""dpsql on a local Citus cluster (coordinator + 2 workers) against the same table on one node.

For each shard count: the prepare (the pushed-down fill of the distributed training table),
one epoch (logistic, d features, b = 1), the bytes the coordinator receives per epoch (Citus's
EXPLAIN ANALYZE "Tuple data received from nodes"), the ROW() overhead of Citus's partial
aggregate (the same shard scanned on its worker by the plain aggregate), and the accuracy of
shard-averaged training against sequential training at equal epochs.

    python -m bench.citus_scale [--rows 1000000] [--dim 50] [--shards 2 32] [--epochs 3]

Needs Citus in the embedded PostgreSQL 18 (``make citus``).
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import numpy as np
import psycopg

from dpsql import citus


def _timed(conn: psycopg.Connection, query: str, params: Any = None) -> tuple[float, Any]:
    t0 = time.perf_counter()
    cur = conn.execute(query, params)
    row = cur.fetchone() if cur.description is not None else None
    return time.perf_counter() - t0, row


def _fill(conn: psycopg.Connection, table: str, rows: int, dim: int) -> None:
    """Rows of a noisy linear rule, ||x|| <= 1, generated in the server (deterministic)."""
    conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, x float8[], y float8)")
    conn.execute("SELECT setseed(0.5)")
    conn.execute(
        f"""INSERT INTO {table}
            SELECT i, x, CASE WHEN s + 0.1 * (random() - 0.5) > 0 THEN 1 ELSE 0 END
              FROM (SELECT i, x, (SELECT sum(v * (CASE WHEN k % 2 = 0 THEN 1 ELSE -1 END))
                                    FROM unnest(x) WITH ORDINALITY u(v, k)) AS s
                      FROM (SELECT i, ARRAY(SELECT (random() - 0.5) / {np.sqrt(dim) / 2}
                                              FROM generate_series(1, {dim}) WHERE i > 0) AS x
                              FROM generate_series(1, {rows}) i) a) b"""
    )


def _accuracy(conn: psycopg.Connection, model_id: int, table: str) -> float:
    """On every tenth row, computed here (models live on the coordinator only)."""
    w = np.asarray(
        conn.execute(
            "SELECT weights FROM dpsql.model_store WHERE model_id = %s", (model_id,)
        ).fetchone()[0]
    )
    rows = conn.execute(f"SELECT x, y FROM {table} WHERE id % 10 = 0").fetchall()
    X = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    return float(np.mean((X @ w > 0) == (y > 0)))


def _train(conn: psycopg.Connection, table: str, epochs: int, shard_parallel: bool) -> int:
    row = conn.execute(
        "SELECT dpsql.train(%s, '{x}', 'y', labels => '{0,1}', epochs => %s, step_size => 0.05,"
        " seed => 1, shard_parallel => %s)",
        (table, epochs, shard_parallel),
    ).fetchone()
    return int(row[0])


PREPARE = (
    "SELECT (dpsql_internal._prepare(%s, '{x}', 'y', 'logistic', 1, 1, 0, 0.05, 'constant', 0,"
    " NULL, true, 1, '{0,1}', false, 'none', 0.1, NULL, shard_parallel => %s)).run_id"
)
PARTIAL = (
    "SELECT worker_binary_partial_agg('dpsql.sgd_epoch(double precision[], double precision,"
    " double precision[])'::regprocedure, ROW(x, y, %s)) FROM {}"
)


def _one_node(conn: psycopg.Connection, epochs: int) -> None:
    """The coordinator alone, on a local table."""
    prep, _ = _timed(conn, PREPARE, ("local_t", False))
    run = conn.execute("SELECT max(run_id) FROM dpsql.runs").fetchone()[0]
    epoch, _ = _timed(conn, "SELECT * FROM dpsql_internal._run_epoch(%s)", (run,))
    conn.execute("SELECT dpsql_internal._abort(%s)", (run,))
    accuracy = _accuracy(conn, _train(conn, "local_t", epochs, False), "local_t")
    print(f"one node: prepare {prep:.2f} s, epoch {epoch:.2f} s;"
          f" sequential accuracy after {epochs} epochs {accuracy:.4f}")  # fmt: skip


def _row_overhead(cl: citus.Cluster, conn: psycopg.Connection, table: str, state: Any) -> str:
    """One shard on its worker: Citus's ROW()-wrapped partial aggregate vs the plain one."""
    shard, port = conn.execute(
        "SELECT shard_name(%s::regclass, s.shardid), n.nodeport FROM pg_dist_shard s"
        " JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)"
        " WHERE s.logicalrelid = %s::regclass ORDER BY s.shardid LIMIT 1",
        (table, table),
    ).fetchone()
    node = next(w for w in cl.workers if w.port == port)
    with psycopg.connect(node.uri, autocommit=True) as w:
        plain, _ = _timed(w, f"SELECT dpsql.sgd_epoch(x, y, %s) FROM {shard}", (state,))
        wrapped, _ = _timed(w, PARTIAL.format(shard), (state,))
        rows = w.execute(f"SELECT count(*) FROM {shard}").fetchone()[0]
    rate = rows / plain / 1e6
    return (f"one shard ({rows} rows) plain {plain:.3f} s vs ROW() {wrapped:.3f} s"
            f" ({wrapped / plain:.2f}x), per-shard scan rate {rate:.2f} M rows/s")  # fmt: skip


def _on_shards(cl: citus.Cluster, conn: psycopg.Connection, shards: int, epochs: int) -> None:
    table = f"dist_{shards}"
    conn.execute(f"CREATE TABLE {table} (LIKE local_t INCLUDING ALL)")
    conn.execute("SELECT create_distributed_table(%s, 'id', shard_count => %s)", (table, shards))
    load, _ = _timed(conn, f"INSERT INTO {table} SELECT * FROM local_t")
    prep, _ = _timed(conn, PREPARE, (table, True))
    run, train_table, state = conn.execute(
        "SELECT run_id, train_table, state FROM dpsql.runs ORDER BY run_id DESC LIMIT 1"
    ).fetchone()
    epoch, _ = _timed(conn, "SELECT * FROM dpsql_internal._run_epoch(%s)", (run,))
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            f"EXPLAIN (ANALYZE, VERBOSE) SELECT dpsql.sgd_epoch(x, y, %s) FROM {train_table}",
            (state,),
        ).fetchall()
    )
    received = re.search(r"Tuple data received from nodes: (\d+ \w+)", plan)
    overhead = _row_overhead(cl, conn, train_table, state)
    conn.execute("SELECT dpsql_internal._abort(%s)", (run,))
    accuracy = _accuracy(conn, _train(conn, table, epochs, True), table)
    print(f"{shards} shards: load {load:.1f} s, prepare {prep:.2f} s, epoch {epoch:.2f} s,"
          f" received per epoch {received.group(1) if received else '?'}; {overhead};"
          f" averaged accuracy after {epochs} epochs {accuracy:.4f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--shards", type=int, nargs="+", default=[2, 32])
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    print(f"rows={args.rows} dim={args.dim} epochs={args.epochs} (2 workers, 2 cores)")
    settings = {"shared_buffers": "'1GB'"}
    with (
        citus.local_cluster(workers=2, settings=settings) as cl,
        psycopg.connect(cl.coordinator.uri, autocommit=True) as conn,
    ):
        cl.install_dpsql()
        conn.execute("SET client_min_messages = warning")
        t0 = time.perf_counter()
        _fill(conn, "local_t", args.rows, args.dim)
        print(f"generated {args.rows} rows on the coordinator in {time.perf_counter() - t0:.1f} s")
        _one_node(conn, args.epochs)
        for shards in args.shards:
            _on_shards(cl, conn, shards, args.epochs)


if __name__ == "__main__":
    main()
