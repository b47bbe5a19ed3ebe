"""The combine step: a parallel scan averages the workers' models weighted by their rows."""

from __future__ import annotations

import numpy as np

from dpsql import _core
from tests.pg_helpers import load


def test_parallel_epoch_is_the_row_weighted_average_of_shard_models(conn, scratch_schema) -> None:
    # Row i is a*e_i with label +1 and Huber loss in its linear zone: its only step sets
    # w_i = eta*a in whichever shard reads it, whatever the order. After the combine,
    # w_i = eta*a*n_s/m, so each coordinate tells the size n_s of the shard that read it.
    m, a, eta = 1000, 0.01, 0.5
    X = np.eye(m) * a
    load(conn, scratch_schema, "onehot", X, np.ones(m))
    conn.execute("ALTER TABLE onehot SET (parallel_workers = 2)")
    for setting in (
        "max_parallel_workers_per_gather = 2",
        "parallel_setup_cost = 0",
        "parallel_tuple_cost = 0",
        "min_parallel_table_scan_size = 0",
        "parallel_leader_participation = off",
    ):
        conn.execute(f"SET {setting}")
    init = _core.init_state("huber", m, eta=eta)
    plan = "\n".join(
        r[0]
        for r in conn.execute("EXPLAIN SELECT dpsql.sgd_epoch(x, y, %s) FROM onehot", (list(init),))
    )
    assert "Partial Aggregate" in plan and "Finalize Aggregate" in plan

    # A loaded machine may start the second worker after the first has read every row: try
    # up to 20 scans for one that splits (each is checked exactly either way).
    shard_counts = set()
    for _ in range(20):
        (state,) = conn.execute(
            "SELECT dpsql.sgd_epoch(x, y, %s) FROM onehot", (list(init),)
        ).fetchone()
        h = _core.header(state)
        w = _core.weights(np.asarray(state))[0]
        assert h["rows"] == m
        values, counts = np.unique(np.round(w / (eta * a) * m, 6), return_counts=True)
        # Each distinct value is the size of its shard, and the shard sizes sum to m.
        np.testing.assert_allclose(values, counts, rtol=1e-9)
        assert counts.sum() == m
        assert h["shards"] == len(counts)
        shard_counts.add(len(counts))
    assert max(shard_counts) >= 2, "the parallel plan never split the scan"


def test_serial_epoch_is_one_shard(conn, scratch_schema) -> None:
    m = 50
    load(conn, scratch_schema, "onehot", np.eye(m) * 0.01, np.ones(m))
    conn.execute("SET max_parallel_workers_per_gather = 0")
    init = _core.init_state("huber", m, eta=0.5)
    (state,) = conn.execute(
        "SELECT dpsql.sgd_epoch(x, y, %s) FROM onehot", (list(init),)
    ).fetchone()
    assert _core.header(state)["shards"] == 1
    np.testing.assert_allclose(_core.weights(np.asarray(state))[0], 0.5 * 0.01)
