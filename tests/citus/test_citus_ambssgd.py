"""DP-AMBSSGD on Citus (41_ambssgd.sql, ambssgd_shards_fmgr.c, docs/citus.md).

The one pass runs block by block: the shards number their rows (the shards by name, each
one's rows in (rid, row id) order) and file block t's stat sample and gradient batch; each
block's residual counts and clipped-gradient sum are pushed-down aggregates, and the
coordinator's state takes DP-STAT and the noisy step. Checked on nodes that refuse to pull
rows to the coordinator: the pass equals one node's aggregate over the rows in that order
with the same generator; its noise is present and scaled; a row replaced in any shard moves
only its own block's counts (by at most 1) or sum (by at most 2 zeta_t); releases charge once.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import psycopg
import pytest
from scipy import stats

from dpsql.loading import load_numpy
from tests.citus.test_citus import (
    SHARDS,
    _analyst,
    _distributed,
    _ledger,
    _private,
    _refused,
    _register,
)
from tests.citus.test_citus_sampled import _rows_of_shard, _training_table
from tests.server.test_ambssgd import INIT_SQL, _sql_args
from tests.server.test_ambssgd import _private as _calibrated

D = 4


def _regression(n: int, seed: int, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) / 2
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    y = np.clip(X @ np.array([0.8, -0.5, 0.3, 0.1]) + noise * rng.normal(size=n), -1, 1)
    return X, y


def _config(n: int, blocks: int, batch: int, stat: int, alpha: float = 1.0) -> dict:
    cfg = dict(n_rows=n, blocks=blocks, batch=batch, stat=stat, eta=0.5, r_x=1.0,
               log_factor=1.0, domain=2.0, levels=10)  # fmt: skip
    return {**_calibrated(cfg, alpha=alpha), "theta": stat * 0.7}


def _plan(cfg: dict) -> psycopg.types.json.Jsonb:
    return psycopg.types.json.Jsonb(
        {
            "blocks": cfg["blocks"],
            "batch_size": cfg["batch"],
            "stat_size": cfg["stat"],
            "dim": D,
            "rows": cfg["n_rows"],
        }  # fmt: skip
    )


def _init(conn: psycopg.Connection, cfg: dict, seed: int) -> list[float]:
    with conn.cursor(binary=True) as cur:
        return list(cur.execute(INIT_SQL, _sql_args(D, seed, **cfg)).fetchone()[0])


def _result(conn: psycopg.Connection, state: Any) -> tuple:
    with conn.cursor(binary=True) as cur:
        return cur.execute(
            "SELECT * FROM dpsql_internal._ambssgd_result(%b)", (list(state),)
        ).fetchone()


def _on_shards(conn: psycopg.Connection, table: str, cfg: dict, init: list[float]) -> tuple:
    with conn.cursor(binary=True) as cur:
        (state,) = cur.execute(
            "SELECT dpsql_internal._ambssgd_pass_on_shards(%s,"
            " jsonb_populate_record(NULL::dpsql_internal.ambssgd_plan, %s), %b)",
            (table, _plan(cfg), init),
        ).fetchone()
    return _result(conn, state)


def _pass_order(conn: psycopg.Connection, table: str) -> list[int]:
    """The row ids in the pass's order: the shards by name, each one's rows by (rid, row id)."""
    with conn.transaction():
        conn.execute("SET LOCAL citus.coordinator_aggregation_strategy = 'row-gather'")
        rows = conn.execute(
            f"SELECT dpsql_internal._relation_name(tableoid), rid, row_id FROM {table}"
        ).fetchall()
    return [r[2] for r in sorted(rows, key=lambda r: (r[0].encode(), r[1], r[2]))]


def test_the_pass_on_shards_is_one_nodes_pass_in_the_shards_order(coord) -> None:
    """A private pass (seeded generator), malformed rows on two shards: DP-STAT's choices and
    draws are one node's exactly (its counts are exact) and the weights to 1e-9 (a batch that
    spans two shards adds their partial sums)."""
    n = 1300
    X, y = _regression(n, seed=1)
    table = _training_table(coord, X, y)
    order = _pass_order(coord, table)
    bad = [order[5], order[-200]]  # a stat row of block 0; a late one
    coord.execute(f"UPDATE {table} SET x = NULL WHERE row_id = %s", (bad[0],))
    coord.execute(f"UPDATE {table} SET y = 'NaN' WHERE row_id = %s", (bad[1],))
    cfg = _config(n, blocks=6, batch=150, stat=60)
    init = _init(coord, cfg, seed=5)
    got = _on_shards(coord, table, cfg, init)
    local = f"l_{uuid.uuid4().hex[:8]}"
    Xl = X[np.asarray(order) - 1].copy()
    yl = y[np.asarray(order) - 1].copy()
    Xl[order.index(bad[0])] = np.nan  # a zero record either way
    yl[order.index(bad[1])] = np.nan
    load_numpy(coord, local, Xl, yl)
    with coord.cursor(binary=True) as cur:
        (final,) = cur.execute(
            f"SELECT dpsql.ambssgd_pass(x, y, %b ORDER BY rid) FROM {local}", (init,)
        ).fetchone()
    want = _result(coord, final)
    np.testing.assert_array_equal(got[1], want[1])  # gamma_t
    np.testing.assert_array_equal(got[3], want[3])  # DP-STAT's draws
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12)  # zeta_t
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9, atol=1e-12)
    assert got[4] == 6 * 210
    left = coord.execute(f"SELECT to_regclass('{table}_members')").fetchone()[0]
    assert left is None


def test_the_noise_on_shards_is_present_and_scaled(coord) -> None:
    """Rows with x = 0, y = 0 carry no gradient, so w_bar is the steps' noise alone: each
    coordinate is N(0, v) with v = (2 eta alpha / (b T/2))^2 sum_t zeta_t^2 min(T - t, T/2)^2
    (zeta_t released). Over 6 seeds x 4 coordinates, the standardized sum of squares lies in
    the chi-square(24) central 0.999 interval (false-failure rate 1e-3; fixed seeds); missing,
    halved or doubled noise fails."""
    n, blocks, b, s, alpha = 800, 4, 150, 50, 1.3
    table = _training_table(coord, np.zeros((n, D)), np.zeros(n))
    cfg = _config(n, blocks=blocks, batch=b, stat=s, alpha=alpha)
    zs = []
    for seed in range(6):
        w, _, zetas, *_ = _on_shards(coord, table, cfg, _init(coord, cfg, seed=100 + seed))
        weight = np.array([min(blocks - t, blocks // 2) for t in range(blocks)])
        v = (2 * cfg["eta"] * alpha / (b * blocks / 2)) ** 2 * np.sum(
            (np.asarray(zetas) * weight) ** 2
        )
        zs.extend(np.asarray(w) / np.sqrt(v))
    ss = float(np.sum(np.square(zs)))
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], len(zs))
    assert lo < ss < hi, (ss, lo, hi)


@pytest.mark.parametrize("shard_index", range(SHARDS))
def test_a_replaced_row_moves_only_its_own_block_on_every_shard(coord, shard_index) -> None:
    """Replace-one neighbours on shards: a row of the shard_index-th shard, in a stat sample or
    in a batch, given adversarial contents: the filing is unchanged (it does not read the
    contents), its own step's level counts move by at most 1 each or its clipped-gradient sum
    by at most 2 zeta, and no other step moves."""
    n = 1000
    X, y = _regression(n, seed=2)
    table = _training_table(coord, X, y)
    cfg = _config(n, blocks=4, batch=200, stat=40)
    zeta = 0.7
    probe = [
        float(v) for v in (4475, D, 0, 0, cfg["domain"], cfg["levels"], zeta, 0.3, -0.2, 0.5, 0.1)
    ]

    def filed() -> dict[int, int]:
        members = coord.execute(
            "SELECT dpsql_internal._ambssgd_fill_blocks(%s,"
            " jsonb_populate_record(NULL::dpsql_internal.ambssgd_plan, %s))",
            (table, _plan(cfg)),
        ).fetchone()[0]
        return dict(coord.execute(f"SELECT row_id, step FROM {members}").fetchall())

    def sums() -> dict[int, np.ndarray]:
        members = f"{table}_members"
        out = {}
        for step, agg in ((1, "_ambssgd_stat_counts"), (0, "_ambssgd_gradient_sum")):
            for st, v in coord.execute(
                f"SELECT step, dpsql_internal.{agg}(x, y, %s) FROM {members}"
                " WHERE step %% 2 = %s GROUP BY step",
                (probe, step),
            ).fetchall():
                out[st] = np.asarray(v)
        return out

    steps = filed()
    before = sums()
    shard_rows = set(_rows_of_shard(coord, table, shard_index))
    for kind in (1, 0):  # a stat row, then a batch row
        target = min(r for r, st in steps.items() if r in shard_rows and st % 2 == kind)
        for change in ("x = ARRAY[1e6, -1e6, 1e6, 1e6], y = 1e6", "x = NULL", "y = 'NaN'"):
            original = coord.execute(
                f"SELECT x, y FROM {table} WHERE row_id = %s", (target,)
            ).fetchone()
            coord.execute(f"UPDATE {table} SET {change} WHERE row_id = %s", (target,))
            assert filed() == steps
            after = sums()
            coord.execute(
                f"UPDATE {table} SET x = %s, y = %s WHERE row_id = %s", (*original, target)
            )
            for st in before:
                if st % 2 == 1:
                    cum = np.cumsum(after[st][1:]) - np.cumsum(before[st][1:])
                    moved = float(np.max(np.abs(cum)))
                    assert after[st][0] == before[st][0] and moved <= 1
                else:
                    assert after[st][:1] == before[st][:1]
                    moved = float(np.linalg.norm(after[st][2:] - before[st][2:]))
                    assert moved <= 2 * zeta * (1 + 1e-12)
                if st != steps[target]:
                    assert moved <= 1e-12, (st, steps[target], change)
    coord.execute(f"DROP TABLE {table}_members")


def test_dp_ambssgd_releases_on_shards_like_one_node(coord) -> None:
    """dpsql.train on a distributed regression dataset and on a local copy: one charge each,
    no members' table left, test error within 0.02 of the local release's. The noise and the
    shuffle are seeded (an owner's reproduction); unseeded, 4 pairs differed by at most 0.004
    (MSE about 0.063 against a label variance of 0.19)."""
    X, y = _regression(8000, seed=3)
    local = f"l_{uuid.uuid4().hex[:8]}"
    load_numpy(coord, local, X, y)
    src = _distributed(coord, X, y)
    mse = []
    for table in (local, src):
        ds = _register(coord, table, label_bound=1.0, row_norm="clip")
        before = _ledger(coord)
        mid = _private(coord, ds, model="linear", privacy="dp_ambssgd", epsilon=4.0,
                       delta=1e-5, steps=8, noise_seed=3, seed=5)  # fmt: skip
        assert _ledger(coord) == before + 1
        mse.append(float(coord.execute(
            "SELECT value FROM dpsql.evaluate(%s, %s) WHERE metric = 'mse'", (mid, table)
        ).fetchone()[0]))  # fmt: skip
    params = coord.execute(
        "SELECT params FROM dpsql.model_store WHERE model_id = %s", (mid,)
    ).fetchone()[0]
    assert params["distributed"]["shard_count"] == SHARDS
    variance = float(np.var(y))
    assert mse[1] < 0.5 * variance and abs(mse[1] - mse[0]) < 0.02, (mse, variance)
    left = coord.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'dpsql_work'")
    assert left.fetchone()[0] == 0


def test_an_analysts_rolled_back_release_keeps_its_charge(cluster, coord) -> None:
    """As an analyst with hostile settings, inside a transaction rolled back (and a savepoint
    rolled back before it), and in a DO block whose handler catches an exception raised after
    it: each release is charged for good, leaves no model and no members'
    table, and the analyst reads no row of the training table's shards."""
    X, y = _regression(3000, seed=6)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, label_bound=1.0, row_norm="clip")
    login = _analyst(coord, ds)
    before = _ledger(coord)
    models = coord.execute("SELECT count(*) FROM dpsql.model_store").fetchone()[0]
    call = (
        "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'dp_ambssgd', epsilon => 8,"
        " delta => 1e-5, steps => 2)"
    )
    with login(cluster.coordinator) as a:
        a.execute("SET extra_float_digits = -15")
        a.execute("SET search_path = public, pg_temp")
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        a.execute(call, (ds,))
        a.execute("ROLLBACK TO SAVEPOINT s")
        a.execute(call, (ds,))
        a.execute("ROLLBACK")
        # a DO block whose exception handler undoes the release
        a.execute(
            "DO $$ BEGIN PERFORM "
            + call.removeprefix("SELECT ").replace("%s", f"'{ds}'")
            + "; RAISE EXCEPTION 'undo'; EXCEPTION WHEN raise_exception THEN NULL; END $$"
        )
        _refused(a, f"SELECT * FROM {src} LIMIT 1", code="42501")
    assert _ledger(coord) == before + 3
    assert coord.execute("SELECT count(*) FROM dpsql.model_store").fetchone()[0] == models
    left = coord.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'dpsql_work'")
    assert left.fetchone()[0] == 0
