"""DP-AMBSSGD block by block (ambssgd_shards_fmgr.c): the path it takes on Citus, here on one
node. A table stands for one shard; its rows filed by _ambssgd_block_steps and replayed by
_ambssgd_blocks give the one-node aggregate's release bit for bit, and every entry point
refuses bad input with a clear error. The Citus half is tests/citus/test_citus_ambssgd.py.
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from dpsql import _core
from tests.pg_helpers import load
from tests.server.test_ambssgd import (
    INIT_SQL,
    MALFORMED,
    SMALL,
    _data,
    _private,
    _sql_args,
    _sql_pass,
)

FIXED = dict(n_rows=187, blocks=6, batch=30, stat=0, alpha=2.0, eta=0.3, zeta_fixed=1.0)
ADAPTIVE = {**_private(SMALL), "theta": 7.0, "intercept": True, "x_bound": 3.0}


def _members(conn, table: str, cfg: dict, shards: str | None = None, counts: str | None = None):
    """The members' table of a pass over table (one shard, or the given list)."""
    name = shards or f"ARRAY['{table.split('.')[1]}']"
    rows = counts or f"ARRAY[{cfg['n_rows']}]::bigint[]"
    conn.execute(f"DROP TABLE IF EXISTS {table}_members")
    conn.execute(f"CREATE TABLE {table}_members (row_id bigint, step int, x float8[], y float8)")
    conn.execute(
        f"INSERT INTO {table}_members SELECT o.rid, unnest(dpsql_internal._ambssgd_block_steps("
        "  %s, %s, %s, %s, o.tableoid, " + name + ", " + rows + ", o.rid, o.rid)), o.x, o.y"
        f" FROM (SELECT tableoid, rid, x, y FROM {table} ORDER BY rid) o ORDER BY 2, o.rid",
        (cfg["blocks"], cfg["batch"], cfg["stat"], cfg["n_rows"]),
    )
    return f"{table}_members"


def _blocks(conn, members: str, cfg: dict, init: np.ndarray) -> np.ndarray:
    with conn.cursor(binary=True) as cur:
        (st,) = cur.execute(
            "SELECT dpsql_internal._ambssgd_blocks(%s, %s, %s, %b)",
            (members, cfg["blocks"], cfg["stat"], list(init)),
        ).fetchone()
    return np.array(st, dtype=np.float64)


def _result(conn, state: np.ndarray) -> tuple:
    with conn.cursor(binary=True) as cur:
        return cur.execute(
            "SELECT * FROM dpsql_internal._ambssgd_result(%b)", (list(state),)
        ).fetchone()


@pytest.mark.parametrize("cfg", [ADAPTIVE, FIXED], ids=["adaptive", "fixed"])
def test_the_blocks_path_releases_the_one_node_pass_bit_for_bit(conn, scratch_schema, cfg) -> None:
    """Malformed rows included (zero records), with the same generator: the same weights,
    gamma_t, zeta_t and DP-STAT draws, to the last bit (the counts are exact and each batch's
    sum is added in the pass's order)."""
    X, y, _ = _data(187, 3, seed=10)
    table = load(conn, scratch_schema, "src", X, y)
    for rid, change in MALFORMED.items():
        conn.execute(f"UPDATE {table} SET {change} WHERE rid = %s", (rid,))
    init, final = _sql_pass(conn, table, _sql_args(3, 42, **cfg))
    members = _members(conn, table, cfg)
    used = cfg["blocks"] * (cfg["batch"] + cfg["stat"])
    assert conn.execute(f"SELECT count(*) FROM {members}").fetchone()[0] == used
    got = _result(conn, _blocks(conn, members, cfg, init))
    want = _result(conn, final)
    for a, b in zip(got[:4], want[:4], strict=True):
        assert np.array_equal(
            np.asarray(a, dtype=np.float64).view(np.uint64),
            np.asarray(b, dtype=np.float64).view(np.uint64),
        )
    assert got[4] == want[4] == used


def test_a_shards_rows_are_filed_by_their_place_in_the_pass(conn, scratch_schema) -> None:
    """The table as the second of two shards (100 rows before it): its k-th row in rid order is
    row 100 + k - 1 of the pass, in block (99 + k) // 30 as stat (place < 10) or batch row."""
    X, y, _ = _data(187, 3, seed=3)
    table = load(conn, scratch_schema, "src", X, y)
    cfg = dict(SMALL, n_rows=287, blocks=8)
    members = _members(conn, table, cfg, "ARRAY['other', 'src']", "ARRAY[100, 187]::bigint[]")
    got = dict(conn.execute(f"SELECT row_id, step FROM {members}").fetchall())
    want = {}
    for k in range(1, 188):
        g = 99 + k
        t, j = divmod(g, 30)
        if t < 8:
            want[k - 1] = 2 * t + (1 if j < 10 else 2)
    assert got == want


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((6, 20, 10, 100), "blocks \\* \\(batch \\+ stat\\) <= rows"),
        ((0, 20, 10, 187), "1 <= blocks"),
        ((6, 0, 10, 187), "batch >= 1"),
        ((6, 20, -1, 187), "stat >= 0"),
    ],
)
def test_block_steps_refuse_bad_shapes(conn, scratch_schema, args, message) -> None:
    X, y, _ = _data(187, 3, seed=3)
    table = load(conn, scratch_schema, "src", X, y)
    cfg = dict(blocks=args[0], batch=args[1], stat=args[2], n_rows=args[3])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        _members(conn, table, cfg, counts=f"ARRAY[{args[3]}]::bigint[]")


def test_block_steps_refuse_rows_out_of_order_or_a_changed_table(conn, scratch_schema) -> None:
    X, y, _ = _data(187, 3, seed=3)
    table = load(conn, scratch_schema, "src", X, y)
    sql = (
        "SELECT dpsql_internal._ambssgd_block_steps(6, 20, 10, %s, o.tableoid, ARRAY['src'],"
        f" ARRAY[%s]::bigint[], o.rid, o.rid) FROM (SELECT tableoid, rid FROM {table}"
        " ORDER BY rid {}) o"
    )
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="order"):
        conn.execute(sql.format("DESC"), (187, 187))
    with pytest.raises(psycopg.errors.DataException, match="more rows than its count"):
        conn.execute(sql.format(""), (186, 186))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="add up"):
        conn.execute(sql.format(""), (187, 186))


@pytest.fixture
def fresh(conn) -> np.ndarray:
    with conn.cursor(binary=True) as cur:
        return np.array(cur.execute(INIT_SQL, _sql_args(3, 7, **ADAPTIVE)).fetchone()[0])


def _call(conn, sql: str, *args):
    with conn.cursor(binary=True) as cur:
        return cur.execute(sql, args).fetchone()[0]


def test_the_coordinator_refuses_bad_counts_and_sums(conn, fresh) -> None:
    """Counts that do not add up to s, of the wrong length or not counts; sums of a batch of
    another size; steps out of turn; NULL or forged states: errors, nothing released."""
    levels = ADAPTIVE["levels"]
    good = [10.0] + [0.0] * levels + [10.0, 0.0]  # rows, buckets 0..L+1
    stat_sql = "SELECT dpsql_internal._ambssgd_block_stat(%b, %b)"
    step_sql = "SELECT dpsql_internal._ambssgd_block_step(%b, %b)"
    st = list(fresh)
    for bad in (
        good[:-1],
        [9.0] + good[1:],
        [10.0, 11.0] + good[2:],
        [10.0, 0.5] + good[2:],
        [10.0, np.nan] + good[2:],
    ):
        with pytest.raises(psycopg.errors.DataException, match="public sizes"):
            _call(conn, stat_sql, st, bad)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not where"):
        _call(conn, step_sql, st, [20.0, 0.0] + [0.0] * 4)
    with pytest.raises(psycopg.errors.DataException, match="no row"):
        _call(conn, stat_sql, st, None)
    after = _call(conn, stat_sql, st, good)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not where"):
        _call(conn, stat_sql, after, good)
    for bad in ([19.0, 0.0] + [0.0] * 4, [20.0, 21.0] + [0.0] * 4, [20.0, 0.0] + [0.0] * 3):
        with pytest.raises(psycopg.errors.DataException, match="public sizes"):
            _call(conn, step_sql, after, bad)
    forged = list(fresh)
    forged[0] = 1.0
    for sql, sums in ((stat_sql, good), (step_sql, [20.0, 0.0] + [0.0] * 4)):
        with pytest.raises(psycopg.Error, match="state"):
            _call(conn, sql, forged, sums)
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            _call(conn, sql, None, sums)


def test_the_shard_aggregates_refuse_forged_probes(conn, fresh, scratch_schema) -> None:
    X, y, _ = _data(20, 3, seed=3)
    table = load(conn, scratch_schema, "src", X, y)
    probe = list(_call(conn, "SELECT dpsql_internal._ambssgd_probe(%b)", list(fresh)))
    assert len(probe) == 7 + 4 and probe[-4:] == [0.0] * 4  # w_0 = 0 (p = 3 + intercept)
    for agg in ("_ambssgd_stat_counts", "_ambssgd_gradient_sum"):
        sql = f"SELECT dpsql_internal.{agg}(x, y, %b) FROM {table}"
        rows = _call(conn, sql, probe)
        assert rows[0] == 20
        for bad in (
            probe[:-1],
            [0.0] + probe[1:],
            probe[:3] + [-1.0] + probe[4:],
            probe[:5] + [1e9] + probe[6:],
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="probe"):
                _call(conn, sql, bad)
        with pytest.raises(psycopg.errors.NullValueNotAllowed, match="probe"):
            _call(conn, sql, None)
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="outside an aggregate"):
        _call(
            conn, "SELECT dpsql_internal._ambssgd_stat_transition(NULL, ARRAY[1.0], 1.0, %b)", probe
        )


def test_a_replaced_row_moves_its_blocks_counts_by_one_and_its_sum_by_two_zeta(
    conn, fresh, scratch_schema
) -> None:
    """Replace-one neighbours: an adversarial row (huge x, huge y, NaN) changes a stat sample's
    level counts by at most 1 each and a batch's clipped-gradient sum by at most 2 zeta."""
    X, y, _ = _data(40, 3, seed=5)
    table = load(conn, scratch_schema, "src", X, y)
    state = _call(
        conn,
        "SELECT dpsql_internal._ambssgd_block_stat(%b, %b)",
        list(fresh),
        [10.0] + [0.0] * 5 + [10.0] + [0.0] * 4,
    )
    zeta = state[_core.AMBSSGD_HEADER_FIELDS.index("zeta")]
    assert zeta > 0
    probes = {
        "stat": list(_call(conn, "SELECT dpsql_internal._ambssgd_probe(%b)", list(fresh))),
        "batch": list(_call(conn, "SELECT dpsql_internal._ambssgd_probe(%b)", list(state))),
    }
    probes["stat"][7:] = probes["batch"][7:] = [0.3, -0.2, 0.5, 0.1]  # some w

    def sums(kind: str) -> np.ndarray:
        agg = "_ambssgd_stat_counts" if kind == "stat" else "_ambssgd_gradient_sum"
        return np.array(
            _call(conn, f"SELECT dpsql_internal.{agg}(x, y, %b) FROM {table}", probes[kind])
        )

    before = {k: sums(k) for k in probes}
    for change in (
        "x = ARRAY[1e6, -1e6, 1e6], y = 1e6",
        "x = ARRAY[1e-300, 0, 0], y = -1e6",
        "y = 'NaN'",
        "x = NULL",
    ):
        conn.execute(f"UPDATE {table} SET {change} WHERE rid = 17")
        after = {k: sums(k) for k in probes}
        conn.execute(
            f"UPDATE {table} SET x = %s, y = %s WHERE rid = 17", (list(X[17]), y[17])
        )  # rids from 0
        cum = np.cumsum(after["stat"][1:]) - np.cumsum(before["stat"][1:])
        assert after["stat"][0] == before["stat"][0] and np.max(np.abs(cum)) <= 1
        move = np.linalg.norm(after["batch"][2:] - before["batch"][2:])
        assert move <= 2 * zeta * (1 + 1e-12), change
    np.testing.assert_allclose(sums("batch"), before["batch"], rtol=1e-12)  # (scan order moved)
