"""Sampled epochs without a sort (sampled_fmgr.c): Poisson batches and draws with replacement.

Poisson: up to dpsql.sampling_in_place_memory of rows by rid, the scan files the rows by rid and
the final function reads each member where its row lies, by step; over it the scan copies each
member row into the bucket of its step range (spilled to temporary files over
dpsql.sampling_memory) and the final function replays the buckets in step order. With
replacement: the scan files the rows by rid and the final function replays the draws. Checked
here: the replay is the sorted batched aggregate bit for bit on the same members (for Poisson,
the sorted join over dpsql_internal._poisson_batches computed in SQL), in place, in memory and
out of core alike; the members follow the sampling laws (seeded; each chi-square or z test
below fails falsely with probability at most 1e-3); over dpsql.sampling_memory BST14's sorted
join still runs; bad input is refused without a crash.
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg import errors
from scipy import stats

D = 4
FLAGS_SANITIZE = 8  # DPSQL_FLAG_SANITIZE (private runs: a malformed row is a null record)


def _only_superusers_set(conn, setting: str) -> None:
    """A role without superuser cannot raise the setting (the memory it lets an epoch take)."""
    conn.execute("CREATE ROLE sampled_setting_test LOGIN")
    try:
        conn.execute("SET ROLE sampled_setting_test")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f"SET {setting} = '100GB'")
    finally:
        conn.execute("RESET ROLE")
        conn.execute("DROP ROLE sampled_setting_test")


def _state(conn, *, batch: int, steps: int, flags: int = 0, noise_seed: int = 5) -> list[float]:
    return conn.execute(
        "SELECT dpsql_internal._sgd_init('logistic', %s, 1, 0.01, 'constant', 0.5, 0, 0, 0.1,"
        " %s, %s, 1.0, 'gaussian', 0.7, %s, %s, %s)",
        (D, batch, flags, batch, steps, noise_seed),
    ).fetchone()[0]


@pytest.fixture
def rows_table(conn, scratch_schema) -> int:
    """A training table (rid 1..m, x, y) stored out of rid order, as a scan may meet it."""
    m = 300
    rng = np.random.default_rng(3)
    x = rng.normal(size=(m, D))
    y = np.where(rng.random(m) < 0.5, -1.0, 1.0)
    order = rng.permutation(m)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (rid bigint, x float8[], y float8)")
        with cur.copy("COPY t (rid, x, y) FROM STDIN") as copy:
            for i in order:
                copy.write_row((int(i) + 1, x[i].tolist(), float(y[i])))
    return m


def _epoch_and_path(conn, query: str, params) -> tuple[list[float] | None, str | None]:
    """The query's first value, and how its Poisson epochs read their members (the DEBUG1
    messages of sampled_fmgr.c): 'in place', 'buckets', both, or None."""
    paths: list[str] = []

    def notice(d) -> None:
        msg = d.message_primary or ""
        if "replays its members in place" in msg:
            paths.append("in place")
        elif "replays its members from step buckets" in msg:
            paths.append("buckets")

    conn.add_notice_handler(notice)
    try:
        conn.execute("SET client_min_messages = debug1")
        value = conn.execute(query, params).fetchone()[0]
    finally:
        conn.execute("RESET client_min_messages")
        conn.remove_notice_handler(notice)
    return value, "+".join(sorted(set(paths))) or None


# dpsql.sampling_in_place_memory: Poisson in place (the default, for these small tables) or in
# step buckets (0)
IN_PLACE = {"in place": "1GB", "buckets": "0"}


@pytest.mark.parametrize(
    ("sampling", "q", "batch", "steps", "path"),
    [
        ("poisson", 0.03, 9, 40, "in place"),
        ("poisson", 0.03, 9, 40, "buckets"),
        ("replacement", 0.0, 7, 40, None),
        ("poisson", 1.0, 300, 3, "in place"),
        ("poisson", 1.0, 300, 3, "buckets"),
    ],
)
def test_replay_is_the_sorted_aggregate_bit_for_bit(
    conn, rows_table, sampling, q, batch, steps, path
) -> None:
    m = rows_table
    conn.execute(
        "SELECT set_config('dpsql.sampling_in_place_memory', %s, false)",
        (IN_PLACE[path or "in place"],),
    )
    init = _state(conn, batch=batch, steps=steps)
    assert (
        _epoch_and_path(
            conn,
            "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, %s, 11, %s, %s, NULL, NULL)"
            " FROM t",
            (init, sampling, m, q),
        )[1]
        == path
    )
    replay = conn.execute(
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, %s, 11, %s, %s, NULL, NULL)"
        " FROM t",
        (init, sampling, m, q),
    ).fetchone()[0]
    order = "s.step, s.rid" if sampling == "poisson" else "s.ord"
    sorted_ = conn.execute(
        f"SELECT dpsql.sgd_epoch_batches(t.x, t.y, s.step, %s ORDER BY {order})"
        "  FROM dpsql_internal._sampled_members(%s, 11, %s, %s, %s, %s)"
        "       WITH ORDINALITY AS s(step, rid, ord) JOIN t USING (rid)",
        (init, sampling, m, steps, q, batch),
    ).fetchone()[0]
    assert replay == sorted_
    # another epoch seed is another sample (and another model)
    other = conn.execute(
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, %s, 12, %s, %s, NULL, NULL)"
        " FROM t",
        (init, sampling, m, q),
    ).fetchone()[0]
    assert (other != replay) == (q < 1.0)


def test_poisson_members_are_binomial(conn) -> None:
    """Batch sizes Binomial(m, q) (mean z test and variance over 400 steps) and per-row counts
    Binomial(steps, q) (chi-square), alpha = 1e-3 each; seeded."""
    m, steps, q = 2000, 400, 0.01
    sizes = np.zeros(steps, dtype=int)
    per_row = np.zeros(m, dtype=int)
    for step, rid in conn.execute(
        "SELECT step, rid FROM dpsql_internal._sampled_members('poisson', 42, %s, %s, %s, 0)",
        (m, steps, q),
    ).fetchall():
        sizes[step - 1] += 1
        per_row[rid - 1] += 1
    assert abs(sizes.mean() - m * q) < 3.3 * np.sqrt(m * q * (1 - q) / steps)
    assert np.var(sizes, ddof=1) == pytest.approx(m * q * (1 - q), rel=0.25)
    counts = np.bincount(per_row, minlength=12)[:12]
    expected = stats.binom(steps, q).pmf(np.arange(12)) * m
    keep = expected > 5
    scaled = expected[keep] * counts[keep].sum() / expected[keep].sum()
    assert stats.chisquare(counts[keep], scaled).pvalue > 1e-3


def test_draws_with_replacement_are_uniform(conn) -> None:
    """b draws per step, each uniform over the rows (chi-square, alpha = 1e-3; seeded)."""
    m, steps, b = 50, 200, 10
    got = conn.execute(
        "SELECT step, rid FROM dpsql_internal._sampled_members('replacement', 9, %s, %s, 0, %s)",
        (m, steps, b),
    ).fetchall()
    assert len(got) == steps * b
    assert np.array_equal(np.bincount([s for s, _ in got])[1:], np.full(steps, b))
    assert [s for s, _ in got] == sorted(s for s, _ in got)
    assert stats.chisquare(np.bincount([r for _, r in got], minlength=m + 1)[1:]).pvalue > 1e-3


def test_private_runs_take_the_replay_and_the_sort_over_the_memory_limit(conn, rows_table) -> None:
    """Poisson DP-SGD and BST14 train through dpsql.train either way; a non-superuser cannot
    raise the limit."""
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 100, delta_budget => 0.1,"
        " labels => '{-1,1}', row_norm => 'clip', name => %s)",
        (f"{schema}.t", f"t_{schema}"),
    )
    for limit in ("1GB", "0"):
        conn.execute("SELECT set_config('dpsql.sampling_memory', %s, false)", (limit,))
        state = _state(conn, batch=10, steps=30)
        fits = conn.execute(
            "SELECT dpsql_internal._sampled_epoch_fits(%s, 300)", (state,)
        ).fetchone()[0]
        assert fits == (limit == "1GB")  # 300 rows x 5 doubles + 300 bytes
        for privacy in (
            "privacy => 'dpsgd', sampling => 'poisson', noise_multiplier => 1, delta => 1e-5",
            "privacy => 'bst14', epsilon => 1, delta => 1e-5",
        ):
            (mid,) = conn.execute(
                "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 2, batch_size => 10,"
                f" intercept => false, {privacy})",
                (f"t_{schema}",),
            ).fetchone()
            w = conn.execute(
                "SELECT weights FROM dpsql.models WHERE model_id = %s", (mid,)
            ).fetchone()[0]
            assert len(w) == D and np.all(np.isfinite(w))
    conn.execute("RESET dpsql.sampling_memory")
    _only_superusers_set(conn, "dpsql.sampling_memory")


@pytest.mark.parametrize(
    ("rows_sql", "message"),
    [
        ("VALUES (0::bigint, '{1,2,3,4}'::float8[], 1.0::float8)", "out of 1..2"),
        (
            "VALUES (1::bigint, '{1,2,3,4}'::float8[], 1.0::float8), (1, '{1,2,3,4}', 1.0)",
            "repeated",
        ),
        ("VALUES (1::bigint, '{1,2,3,4}'::float8[], 1.0::float8)", "saw 1"),
        ("VALUES (1::bigint, '{1,2}'::float8[], 1.0::float8), (2, '{1,2,3,4}', 1)", "4 plain"),
        ("VALUES (NULL::bigint, '{1,2,3,4}'::float8[], 1.0::float8)", "NULL row id"),
    ],
)
@pytest.mark.parametrize("sampling", ["poisson", "replacement"])
def test_bad_rows_are_refused(conn, rows_sql, message, sampling) -> None:
    init = _state(conn, batch=1, steps=2)
    with pytest.raises(psycopg.DataError if "NULL" not in message else psycopg.Error) as err:
        conn.execute(
            f"SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, '{sampling}', 1, 2, 0.5,"
            f" NULL, NULL) FROM ({rows_sql}) AS r(rid, x, y)",
            (init,),
        )
    assert message in str(err.value)


@pytest.mark.parametrize("path", ["in place", "buckets"])
def test_private_state_files_malformed_rows_as_null_records(conn, path) -> None:
    conn.execute(
        "SELECT set_config('dpsql.sampling_in_place_memory', %s, false)", (IN_PLACE[path],)
    )
    init = _state(conn, batch=1, steps=2, flags=FLAGS_SANITIZE)
    out = conn.execute(
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 1, 2, 1.0, NULL, NULL)"
        " FROM (VALUES (1::bigint, '{1,2}'::float8[], 1.0::float8), (2, NULL, NULL))"
        " AS r(rid, x, y)",
        (init,),
    ).fetchone()[0]
    # header fields rows and invalid (sgd.h): q = 1 puts both rows in both steps, all null
    assert (out[17], out[22]) == (4, 4)


@pytest.mark.parametrize(
    "args",
    [
        "'bernoulli', 1, 10, 5, 0.5, 1",
        "'poisson', 1, 10, 5, 0, 1",
        "'poisson', 1, 10, 5, 1.5, 1",
        "'poisson', 1, 0, 5, 0.5, 1",
        "'poisson', 1, 10, 0, 0.5, 1",
        "'replacement', 1, 10, 5, 0, 0",
    ],
)
def test_bad_sampling_parameters_are_refused(conn, args) -> None:
    with pytest.raises(errors.InvalidParameterValue):
        conn.execute(f"SELECT count(*) FROM dpsql_internal._sampled_members({args})")


def test_later_epochs_replay_the_kept_rows_without_a_scan(conn, rows_table) -> None:
    """With replacement (BST14), in one transaction, the rows filed for run 77's table replay
    its next epoch exactly as a scan would; any other run, table, size, or a new transaction
    gets NULL (a scan). (Poisson epochs keep no rows: each scans.)"""
    m, q = rows_table, 0.0
    init = _state(conn, batch=15, steps=20)
    scanned = conn.execute(
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'replacement', 12, %s, %s,"
        " NULL, NULL) FROM t",
        (init, m, q),
    ).fetchone()[0]
    replayed = (
        "SELECT dpsql_internal._sgd_epoch_replayed(%s, %s, %s::regclass, 'replacement', 12, %s, %s)"
    )
    with conn.transaction():
        first = conn.execute(
            "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'replacement', 11, %s, %s, 77,"
            " 't'::regclass) FROM t",
            (init, m, q),
        ).fetchone()[0]
        assert first != scanned
        assert conn.execute(replayed, (init, 77, "t", m, q)).fetchone()[0] == scanned
        conn.execute("CREATE TABLE t2 (rid bigint)")
        for run, rel, rows in ((78, "t", m), (77, "t2", m), (77, "t", m - 1)):
            assert conn.execute(replayed, (init, run, rel, rows, q)).fetchone()[0] is None
        # rows of another model length are not these
        other = conn.execute(
            "SELECT dpsql_internal._sgd_init('logistic', 3, 1, 0.01, 'constant', 0.5, 0, 0, 0.1,"
            " 15, 0, 1.0, 'gaussian', 0.7, 15, 20, 5)"
        ).fetchone()[0]
        assert conn.execute(replayed, (other, 77, "t", m, q)).fetchone()[0] is None
    assert conn.execute(replayed, (init, 77, "t", m, q)).fetchone()[0] is None


def test_rows_of_a_failed_filing_are_never_replayed(conn, rows_table) -> None:
    m, q = rows_table, 0.0
    init = _state(conn, batch=15, steps=20)
    replayed = (
        "SELECT dpsql_internal._sgd_epoch_replayed(%s, 77, 't'::regclass, 'replacement', 12,"
        " %s, %s)"
    )
    with conn.transaction():
        conn.execute(
            "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'replacement', 11, %s, %s, 77,"
            " 't'::regclass) FROM t",
            (init, m, q),
        ).fetchone()
        assert conn.execute(replayed, (init, m, q)).fetchone()[0] is not None
        # the same run's next filing fails half way (a repeated rid): nothing is kept
        with pytest.raises(psycopg.DataError), conn.transaction():
            conn.execute(
                "SELECT dpsql_internal._sgd_epoch_sampled(x, y, least(rid, 150), %s,"
                " 'replacement', 11, %s, %s, 77, 't'::regclass) FROM t",
                (init, m, q),
            ).fetchone()
        assert conn.execute(replayed, (init, m, q)).fetchone()[0] is None


def _poisson_sorted_join(conn, init, seed: int, steps: int, q: float) -> list[float]:
    """The reference: rows joined to their Poisson batches in SQL, sorted by (batch, rid)."""
    return conn.execute(
        "SELECT dpsql.sgd_epoch_batches(t.x, t.y, b.batch, %s ORDER BY b.batch, t.rid)"
        "  FROM t CROSS JOIN LATERAL unnest(dpsql_internal._poisson_batches(%s, t.rid, %s, %s))"
        "       AS b(batch)",
        (init, seed, steps, q),
    ).fetchone()[0]


@pytest.fixture
def big_table(conn, scratch_schema, request) -> int:
    """3,000 rows, in rid order or not: many buckets under a small dpsql.sampling_memory."""
    m = 3000
    rng = np.random.default_rng(8)
    x = rng.normal(size=(m, D))
    y = np.where(rng.random(m) < 0.5, -1.0, 1.0)
    order = rng.permutation(m) if request.param == "shuffled" else np.arange(m)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (rid bigint, x float8[], y float8)")
        with cur.copy("COPY t (rid, x, y) FROM STDIN") as copy:
            for i in order:
                copy.write_row((int(i) + 1, x[i].tolist(), float(y[i])))
    return m


@pytest.mark.parametrize("big_table", ["in_order", "shuffled"], indirect=True)
def test_poisson_in_memory_and_out_of_core_are_the_sorted_join(conn, big_table) -> None:
    """The same model in memory (one bucket or many) and spilled to temporary files (proved by
    temp_file_limit = 0 refusing it), and the SQL sorted join's, bit for bit."""
    m, steps, q = big_table, 150, 0.02
    init = _state(conn, batch=60, steps=steps)
    conn.execute("SET dpsql.sampling_in_place_memory = 0")  # buckets (in place: below)
    epoch = (
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 31, %s, %s,"
        " NULL, NULL) FROM t"
    )
    reference = _poisson_sorted_join(conn, init, 31, steps, q)
    models = {}
    for limit in ("1GB", "256kB", "64kB", "0"):
        conn.execute("SELECT set_config('dpsql.sampling_memory', %s, false)", (limit,))
        models[limit] = conn.execute(epoch, (init, m, q)).fetchone()[0]
        assert models[limit] == reference, limit
        # spilled (a temporary file) exactly when the members are over the limit (~500 kB)
        conn.execute("SET temp_file_limit = 0")
        try:
            if limit == "1GB":
                assert conn.execute(epoch, (init, m, q)).fetchone()[0] == reference
            else:
                with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
                    conn.execute(epoch, (init, m, q))
        finally:
            conn.execute("RESET temp_file_limit")
    conn.execute("RESET dpsql.sampling_memory")
    conn.execute("RESET dpsql.sampling_in_place_memory")
    assert _epoch_and_path(conn, epoch, (init, m, q)) == (reference, "in place")
    # another epoch seed is another sample
    assert conn.execute(epoch.replace("31", "32"), (init, m, q)).fetchone()[0] != reference


@pytest.mark.parametrize("big_table", ["in_order", "shuffled"], indirect=True)
def test_poisson_past_the_limit_writes_only_the_excess(conn, big_table) -> None:
    """Over dpsql.sampling_memory the buckets spill from the last one down (a hybrid hash
    join's partitions): those replayed first stay in memory. At a limit of 3/4 of the members'
    bytes the epoch runs under a temp_file_limit of half of them, which a limit of 0 (every
    member written) exceeds; the model is the sorted join's either way, bit for bit."""
    m, steps, q = big_table, 150, 0.2
    init = _state(conn, batch=600, steps=steps)
    (members,) = conn.execute(
        "SELECT count(*) FROM t CROSS JOIN LATERAL"
        " unnest(dpsql_internal._poisson_batches(31, t.rid, %s, %s))",
        (steps, q),
    ).fetchone()
    members_kb = members * (D + 3) * 8 // 1024  # an entry: step and kind, rid, y, x
    assert members_kb > 4000
    epoch = (
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 31, %s, %s,"
        " NULL, NULL) FROM t"
    )
    reference = _poisson_sorted_join(conn, init, 31, steps, q)
    conn.execute("SET dpsql.sampling_in_place_memory = 0")
    conn.execute("SELECT set_config('temp_file_limit', %s, false)", (f"{members_kb // 2}kB",))
    try:
        conn.execute(
            "SELECT set_config('dpsql.sampling_memory', %s, false)", (f"{members_kb * 3 // 4}kB",)
        )
        assert _epoch_and_path(conn, epoch, (init, m, q)) == (reference, "buckets")
        conn.execute("SET dpsql.sampling_memory = 0")
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            conn.execute(epoch, (init, m, q))
    finally:
        conn.execute("RESET temp_file_limit")
        conn.execute("RESET dpsql.sampling_memory")
        conn.execute("RESET dpsql.sampling_in_place_memory")


def test_poisson_members_are_those_of_poisson_batches(conn) -> None:
    """_sampled_members lists exactly the rows' _poisson_batches, by rid then step."""
    m, steps, q = 200, 30, 0.07
    got = conn.execute(
        "SELECT step, rid FROM dpsql_internal._sampled_members('poisson', 5, %s, %s, %s, 0)",
        (m, steps, q),
    ).fetchall()
    want = conn.execute(
        "SELECT b, r FROM generate_series(1::bigint, %s) AS r,"
        "     unnest(dpsql_internal._poisson_batches(5, r, %s, %s)) AS b ORDER BY r, b",
        (m, steps, q),
    ).fetchall()
    assert got == want and len(got) > 0


def test_poisson_membership_frequency_per_row_and_step(conn) -> None:
    """Each (row, step) membership has frequency q: over 400 rows x 50 steps, member counts
    per step are uniform over the steps (chi-square) and per row uniform over the rows
    (chi-square), each alpha = 1e-3; seeded."""
    m, steps, q = 400, 50, 0.2
    got = np.array(
        conn.execute(
            "SELECT step, rid FROM dpsql_internal._sampled_members('poisson', 77, %s, %s, %s, 0)",
            (m, steps, q),
        ).fetchall()
    )
    assert abs(len(got) - m * steps * q) < 3.3 * np.sqrt(m * steps * q * (1 - q))
    assert stats.chisquare(np.bincount(got[:, 0], minlength=steps + 1)[1:]).pvalue > 1e-3
    assert stats.chisquare(np.bincount(got[:, 1], minlength=m + 1)[1:]).pvalue > 1e-3


@pytest.mark.parametrize("path", ["in place", "buckets"])
def test_poisson_epoch_survives_an_error_and_reuses_memory(conn, rows_table, path) -> None:
    """A failed Poisson filing in a subtransaction leaves the next epoch of the same
    transaction exact (its chunks or rows went back to the transaction)."""
    conn.execute(
        "SELECT set_config('dpsql.sampling_in_place_memory', %s, false)", (IN_PLACE[path],)
    )
    m, q = rows_table, 0.05
    init = _state(conn, batch=15, steps=20)
    epoch = (
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, {rid}, %s, 'poisson', 11, %s, %s,"
        " NULL, NULL) FROM t"
    )
    reference = _poisson_sorted_join(conn, init, 11, 20, q)
    with conn.transaction():
        assert conn.execute(epoch.format(rid="rid"), (init, m, q)).fetchone()[0] == reference
        with pytest.raises(psycopg.DataError), conn.transaction():
            conn.execute(epoch.format(rid="least(rid, 150)"), (init, m, q)).fetchone()
        assert conn.execute(epoch.format(rid="rid"), (init, m, q)).fetchone()[0] == reference


@pytest.mark.parametrize("path", ["in place", "buckets"])
def test_poisson_later_epochs_read_the_kept_rows(conn, rows_table, path) -> None:
    """A later Poisson epoch of run 77 reads the first epoch's kept rows (in place, or in rid
    order into buckets): the model a scan gives (the sorted join's), in memory and spilled; not
    kept over the limit."""
    conn.execute(
        "SELECT set_config('dpsql.sampling_in_place_memory', %s, false)", (IN_PLACE[path],)
    )
    m, q = rows_table, 0.05
    init = _state(conn, batch=15, steps=20)
    replayed = (
        "SELECT dpsql_internal._sgd_epoch_replayed(%s, 77, 't'::regclass, 'poisson', 12, %s, %s)"
    )
    first = (
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 11, %s, %s, 77,"
        " 't'::regclass) FROM t"
    )
    reference = _poisson_sorted_join(conn, init, 12, 20, q)
    with conn.transaction():
        assert conn.execute(first, (init, m, q)).fetchone()[0] == _poisson_sorted_join(
            conn, init, 11, 20, q
        )
        assert conn.execute(replayed, (init, m, q)).fetchone()[0] == reference
        conn.execute("SET LOCAL dpsql.sampling_memory = 0")  # the later epoch spills
        assert conn.execute(replayed, (init, m, q)).fetchone()[0] == reference
    with conn.transaction():
        conn.execute("SET LOCAL dpsql.sampling_memory = 0")  # nothing kept
        conn.execute(first, (init, m, q)).fetchone()
        assert conn.execute(replayed, (init, m, q)).fetchone()[0] is None


@pytest.mark.parametrize("big_table", ["in_order"], indirect=True)
def test_spilled_buckets_are_removed_when_the_epoch_fails(conn, big_table) -> None:
    """A repeated rid found after the buckets spilled: the error, and no temporary file left."""
    m, steps, q = big_table, 150, 0.02
    init = _state(conn, batch=60, steps=steps)
    conn.execute("SET dpsql.sampling_memory = 0")
    try:
        with pytest.raises(psycopg.DataError, match="repeated"):
            conn.execute(
                "SELECT dpsql_internal._sgd_epoch_sampled(x, y,"
                " CASE WHEN rid = %s THEN 1 ELSE rid END, %s, 'poisson', 31, %s, %s, NULL, NULL)"
                " FROM t",
                (m, init, m, q),
            )
        assert conn.execute("SELECT count(*) FROM pg_ls_tmpdir()").fetchone()[0] == 0
    finally:
        conn.execute("RESET dpsql.sampling_memory")


@pytest.mark.parametrize("big_table", ["in_order", "shuffled"], indirect=True)
def test_poisson_reads_in_place_up_to_the_threshold(conn, big_table) -> None:
    """dpsql.sampling_in_place_memory is the largest rows-by-rid area (rows x (features + 1)
    doubles + a byte: 3,000 x 41 = 123,000 bytes here) a Poisson epoch reads in place: at 121kB
    the first and later epochs of run 77 take that path, at 120kB the buckets, and under a
    dpsql.sampling_memory too small for the rows and the members' list also the buckets. The
    model is the sorted join's, bit for bit, on every side."""
    m, steps, q = big_table, 150, 0.02
    init = _state(conn, batch=60, steps=steps)
    first = (
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s, 'poisson', 31, %s, %s, 77,"
        " 't'::regclass) FROM t"
    )
    later = (
        "SELECT dpsql_internal._sgd_epoch_replayed(%s, 77, 't'::regclass, 'poisson', 32, %s, %s)"
    )
    references = (
        _poisson_sorted_join(conn, init, 31, steps, q),
        _poisson_sorted_join(conn, init, 32, steps, q),
    )
    for in_place, memory, path in (
        ("121kB", "1GB", "in place"),
        ("120kB", "1GB", "buckets"),
        ("1GB", "1GB", "in place"),
        ("1GB", "125kB", "buckets"),  # 123,000 bytes of rows and ~10 kB of members' list
        ("0", "1GB", "buckets"),
    ):
        conn.execute("SELECT set_config('dpsql.sampling_in_place_memory', %s, false)", (in_place,))
        conn.execute("SELECT set_config('dpsql.sampling_memory', %s, false)", (memory,))
        with conn.transaction():
            assert _epoch_and_path(conn, first, (init, m, q)) == (references[0], path), in_place
            got = _epoch_and_path(conn, later, (init, m, q))
            if memory == "1GB":  # kept (under 125kB, rows and buckets do not fit: not kept)
                assert got == (references[1], path), in_place
            else:
                assert got == (None, None)
    conn.execute("RESET dpsql.sampling_memory")
    conn.execute("RESET dpsql.sampling_in_place_memory")
    _only_superusers_set(conn, "dpsql.sampling_in_place_memory")


def _shard_steps(conn, names: str, counts: str, order: str = "rid", rows: int = 300) -> list:
    return conn.execute(
        "SELECT rid, dpsql_internal._replacement_steps(7, %s, 20, 15, o.tableoid,"
        f"  {names}, {counts}, o.rid, o.rid) FROM (SELECT tableoid, rid FROM t ORDER BY {order}) o",
        (rows,),
    ).fetchall()


def test_a_shards_share_of_the_draws_is_the_draws_in_its_range(conn, rows_table) -> None:
    """Citus's numbering of BST14's draws (replacement_fmgr.c), on one table standing for the
    second of two shards: its rows get exactly one node's draws with row numbers 101..400,
    the k-th row in rid order the draws of number 100 + k, steps in order, repeats kept."""
    draws = conn.execute(
        "SELECT step, rid FROM dpsql_internal._sampled_members('replacement', 7, 400, 20, 0, 15)"
    ).fetchall()
    got = _shard_steps(conn, "ARRAY['other', 't']", "ARRAY[100, 300]::bigint[]", rows=400)
    assert [rid for rid, _ in got] == list(range(1, 301))
    want = {k: [s for s, g in draws if g == 100 + k] for k in range(1, 301)}
    assert {rid: steps for rid, steps in got} == want
    assert sum(len(s) for _, s in got) == sum(1 for _, g in draws if g > 100)


@pytest.mark.parametrize(
    ("names", "counts", "order", "message"),
    [
        ("ARRAY['t']", "ARRAY[299]::bigint[]", "rid", "add up"),
        ("ARRAY['t', 'u']", "ARRAY[300, 0]::bigint[]", "rid", None),  # fine: u is empty
        ("ARRAY['u']", "ARRAY[300]::bigint[]", "rid", "not in the list"),
        ("ARRAY['t', 't']", "ARRAY[150, 150]::bigint[]", "rid", "twice"),
        ("ARRAY['t']", "ARRAY[300, 0]::bigint[]", "rid", "row counts"),
        ("ARRAY['t']", "ARRAY[-1]::bigint[]", "rid", ">= 0"),
        ("ARRAY[NULL, 't']", "ARRAY[0, 300]::bigint[]", "rid", "NULL"),
        ("ARRAY['t']", "ARRAY[300]::bigint[]", "rid DESC", "order"),
        ("'{}'::text[]", "'{}'::bigint[]", "rid", "row counts"),
    ],
)
def test_a_shards_draws_refuse_bad_input(conn, rows_table, names, counts, order, message) -> None:
    """Bad lists, a shard not listed, rows out of order: clear errors, no crash."""
    if message is None:
        assert len(_shard_steps(conn, names, counts, order)) == 300
        return
    with pytest.raises(psycopg.Error, match=message):
        _shard_steps(conn, names, counts, order)
    with pytest.raises(psycopg.Error, match="more rows than its count"):
        _shard_steps(conn, "ARRAY['t', 'u']", "ARRAY[299, 1]::bigint[]")
