"""Sampled private SGD on a local Citus cluster (coordinator + 2 workers) against one node.

For each size: DP-SGD (Poisson), DPSGD-F, BST14 (draws with replacement), SCS13 and DP-FTRL
(keyed steps or leaves) released on the distributed table and on the same rows in a local table
of the coordinator (one node), at the same epsilon, delta, epochs and batch (the cluster's
default: at most 2,000 steps an epoch); wall time, the time per step, accuracy (dpsql.evaluate,
pushed down on the cluster); DP-AMBSSGD (one pass in blocks, its own plan) on the 0/1 label as
a regression target (label bound 1), with R^2 for accuracy and ms per block;
a noiseless distributed SGD epoch (shard-averaged, one scan) for
scale; and the bytes the coordinator receives for one step (Citus's EXPLAIN ANALYZE "Tuple data
received from nodes") and so per epoch.

    python -m bench.citus_sampled [--rows 1000000 10000000] [--dim 50] [--shards 8] [--epochs 2]
                                  [--mechanisms dpsgd dpsgd_f bst14 scs13 dp_ftrl dp_ambssgd]

Needs Citus in the embedded PostgreSQL 18 (``make citus``). The machine's 2 cores run three
nodes: the figures show per-step latency and bytes, not a cluster's speed-up.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any

import psycopg

from bench.citus_scale import PREPARE, _fill, _timed
from dpsql import citus

MECHANISMS = ("dpsgd", "dpsgd_f", "bst14", "scs13", "dp_ftrl", "dp_ambssgd")


def _release(
    conn: psycopg.Connection, dataset: str, table: str, privacy: str, args: Any, batch: int
) -> dict[str, Any]:
    if privacy == "dp_ambssgd":  # one pass, its own blocks: a regression model
        query = (
            "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => %s, epsilon => %s,"
            " delta => %s)"
        )
        params: tuple[Any, ...] = (dataset, privacy, args.epsilon, args.delta)
        metric = "r2"
    else:
        extra = ", sampling => 'poisson'" if privacy == "dpsgd" else ""
        query = (
            "SELECT dpsql.train(%s, NULL, NULL, privacy => %s, epsilon => %s, delta => %s,"
            f" epochs => %s, batch_size => %s{extra})"
        )
        params = (dataset, privacy, args.epsilon, args.delta, args.epochs, batch)
        metric = "accuracy"
    wall, row = _timed(conn, query, params)
    mid = int(row[0])
    train_s, prepare_s, steps = conn.execute(
        "SELECT train_seconds, prepare_seconds,"
        "       jsonb_path_query_first(params, 'strict $.**.blocks')::int"
        "  FROM dpsql.model_store WHERE model_id = %s",
        (mid,),
    ).fetchone()
    score = conn.execute(
        "SELECT coalesce(max(value) FILTER (WHERE metric = %s), max(metrics->>%s)::float8)"
        "  FROM dpsql.evaluate(%s, %s)",
        (metric, metric, mid, table),
    ).fetchone()[0]
    if not train_s:  # a planned mechanism (DP-AMBSSGD) times no epochs: the call less prepare
        train_s = wall - prepare_s
    return {"wall": wall, "train": train_s, "prepare": prepare_s, "accuracy": float(score),
            "blocks": steps}  # fmt: skip


def _noiseless_epoch(conn: psycopg.Connection, table: str, distributed: bool) -> float:
    conn.execute(PREPARE, (table, distributed))
    run = conn.execute("SELECT max(run_id) FROM dpsql.runs").fetchone()[0]
    epoch, _ = _timed(conn, "SELECT * FROM dpsql_internal._run_epoch(%s)", (run,))
    conn.execute("SELECT dpsql_internal._abort(%s)", (run,))
    return epoch


def _step_bytes(conn: psycopg.Connection, table: str, rows: int, dim: int, batch: int) -> str:
    """One step's query over an epoch's members (built as 59_distributed_sampled.sql does)."""
    steps = rows // batch
    conn.execute(
        "CREATE UNLOGGED TABLE bench_members (row_id bigint NOT NULL, step int NOT NULL,"
        " x float8[], y float8)"
    )
    conn.execute(
        "SELECT create_distributed_table('bench_members', 'row_id', colocate_with => %s)", (table,)
    )
    conn.execute("CREATE INDEX ON bench_members (step)")
    fill, _ = _timed(
        conn,
        f"INSERT INTO bench_members SELECT t.id, b.step, t.x, t.y FROM {table} t CROSS JOIN"
        " LATERAL unnest(dpsql_internal._poisson_batches(7, t.id, %s, %s::float8)) b(step)"
        " ORDER BY 2, 1",
        (steps, batch / rows),
    )
    state = conn.execute(
        "SELECT dpsql_internal._sgd_init('logistic', %s, 1, 0, 'constant', 0.5, 0, 0, 0.1, %s,"
        " 8, 1.0, 'gaussian', 1.0, %s, %s, 5)",
        (dim, batch, batch, steps),
    ).fetchone()[0]
    probe = conn.execute("SELECT dpsql_internal._sgd_probe(%s)", (state,)).fetchone()[0]
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            "EXPLAIN (ANALYZE, VERBOSE) SELECT dpsql_internal._sgd_batch_sum(x, y, %s)"
            " FROM bench_members WHERE step = 1",
            (probe,),
        ).fetchall()
    )
    sample = min(steps, 200)
    t0 = time.perf_counter()
    for step in range(1, sample + 1):
        conn.execute(
            "SELECT dpsql_internal._sgd_batch_sum(x, y, %s) FROM bench_members WHERE step = %s",
            (probe, step),
        ).fetchone()
    per_step = (time.perf_counter() - t0) / sample
    conn.execute("DROP TABLE bench_members")
    found = re.search(r"Tuple data received from nodes: (\d+) (bytes|kB|MB)", plan)
    if found is None:
        return "? bytes per step"
    received = int(found.group(1)) * {"bytes": 1, "kB": 1024, "MB": 1024**2}[found.group(2)]
    return (
        f"an epoch's members: filled in {fill:.2f} s; a step's sum (from the client):"
        f" {1000 * per_step:.2f} ms; received {received} bytes per step,"
        f" {received * steps / 1e6:.1f} MB per epoch ({steps} steps)"
    )


def _size(cl: citus.Cluster, conn: psycopg.Connection, rows: int, args: Any) -> None:
    local, dist = f"local_{rows}", f"dist_{rows}"
    t0 = time.perf_counter()
    _fill(conn, local, rows, args.dim)
    conn.execute(f"CREATE TABLE {dist} (LIKE {local} INCLUDING ALL)")
    conn.execute(
        "SELECT create_distributed_table(%s, 'id', shard_count => %s)", (dist, args.shards)
    )
    conn.execute(f"INSERT INTO {dist} SELECT * FROM {local}")
    conn.execute(f"VACUUM ANALYZE {local}")
    conn.execute(f"VACUUM ANALYZE {dist}")
    print(
        f"## {rows:,} rows x {args.dim} features, {args.shards} shards"
        f" (generated and distributed in {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    names: dict[tuple[str, bool], str] = {}
    for table in (local, dist):
        # DP-AMBSSGD: the same rows in a copy (a relation has one dataset), 0/1 as a value
        for regression in (False, True) if "dp_ambssgd" in args.mechanisms else (False,):
            source = f"{table}_reg" if regression else table
            if regression:
                conn.execute(f"CREATE TABLE {source} (LIKE {table} INCLUDING ALL)")
                if table == dist:
                    conn.execute(
                        "SELECT create_distributed_table(%s, 'id', colocate_with => %s)",
                        (source, dist),
                    )
                conn.execute(f"INSERT INTO {source} SELECT * FROM {table}")
                conn.execute(f"VACUUM ANALYZE {source}")
            names[table, regression] = f"ds_{source}"
            conn.execute(
                "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1000,"
                " delta_budget => 0.5, row_norm => 'clip', accept => true, name => %s"
                + (", label_bound => 1)" if regression else ", labels => '{0,1}')"),
                (source, names[table, regression]),
            )
    batch = max(50, -(-rows // 2000))
    for distributed, table in ((False, local), (True, dist)):
        epoch = _noiseless_epoch(conn, table, distributed)
        where = "cluster" if distributed else "one node"
        print(f"noiseless SGD epoch (b = 1), {where}: {epoch:.2f} s", flush=True)
    print(
        f"batch {batch} (the cluster's default), {args.epochs} epochs, epsilon {args.epsilon},"
        f" delta {args.delta}",
        flush=True,
    )
    print(
        f"{'mechanism':10} {'where':9} {'wall s':>8} {'train s':>8} {'ms/step':>8} {'accuracy':>8}"
    )
    steps = args.epochs * (rows // batch)
    for privacy in args.mechanisms:
        for where, table in (("one node", local), ("cluster", dist)):
            regression = privacy == "dp_ambssgd"
            r = _release(conn, names[table, regression], table, privacy, args, batch)
            per = r["blocks"] if regression else steps
            print(
                f"{privacy:10} {where:9} {r['wall']:8.2f} {r['train']:8.2f}"
                f" {1000 * r['train'] / per:8.2f} {r['accuracy']:8.4f}",
                flush=True,
            )
    print(_step_bytes(conn, dist, rows, args.dim, batch), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    args = ap.parse_args()
    print(
        f"# citus_sampled, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};"
        f" load average {os.getloadavg()[0]:.1f}; coordinator + 2 workers on one machine"
    )
    settings = {"shared_buffers": "'1GB'", "citus.coordinator_aggregation_strategy": "'disabled'"}
    with (
        citus.local_cluster(workers=2, settings=settings) as cl,
        psycopg.connect(cl.coordinator.uri, autocommit=True) as conn,
    ):
        cl.install_dpsql()
        conn.execute("SET client_min_messages = warning")
        conn.execute("SET dpsql.sampling_memory = '8GB'")  # one node: the in-memory replay
        for rows in args.rows:
            _size(cl, conn, rows, args)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
