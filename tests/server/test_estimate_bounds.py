"""dpsql.estimate_bounds (issues 10 and 25; PrivQuantile, Sun et al. 2024, Lemma 4): private
quantiles by a scan (AboveThreshold) of a public grid of magnitudes. The grid, the scan's exact law,
the counts'
sensitivity on adversarial neighbours, bounds on features of very different scales, the charge,
and the bounds a later training uses. Also the exponential mechanism on a linear grid
(_private_quantile) that DPSGD-F's private mean uses."""

from __future__ import annotations

import uuid

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from scipy import stats

# The exponential mechanism of DPSGD-F's quantiles (39_dpsgd_f_alg2.sql). A tiny grid: points
# 0..10 (step 1), ten values at 2, 5 and 8, the median rank 5.
VALUES, COUNTS, RANK = [2.0, 5.0, 8.0], [3, 4, 3], 5


def _grid_utility(values: list[float], counts: list[int], rank: int) -> np.ndarray:
    data = np.repeat(values, counts)
    g = np.arange(11.0)
    below = (data[None, :] < g[:, None]).sum(1)
    at_most = (data[None, :] <= g[:, None]).sum(1)
    return -np.maximum(0, np.maximum(below - rank, rank - at_most))


def _draws(conn, epsilon: float, n: int) -> np.ndarray:
    rows = conn.execute(
        "SELECT dpsql_internal._private_quantile(%s, %s, %s, 0, 10, 1, %s, s) FROM"
        " generate_series(1, %s) s",
        (VALUES, COUNTS, RANK, epsilon, n),
    ).fetchall()
    return np.array([r[0] for r in rows])


def test_quantile_draws_follow_the_exponential_mechanism(conn) -> None:
    """2000 seeded draws against the exact law p(g) ~ exp(eps u(g) / 2) on 11 grid points:
    chi-square at alpha = 1e-3 (false-failure rate 1e-3; deterministic under the seeds). The
    same draws are rejected against the law of twice the epsilon, and of no noise (argmax)."""
    eps, n = 1.0, 2000
    got = _draws(conn, eps, n)
    assert set(np.unique(got)) <= set(range(11))
    observed = np.bincount(got.astype(int), minlength=11)
    u = _grid_utility(VALUES, COUNTS, RANK)
    for factor, should_pass in [(1.0, True), (2.0, False)]:
        p = np.exp(factor * eps * u / 2)
        p /= p.sum()
        expected = p * n
        keep = expected > 5  # the cells below 5 expected draws are pooled into one
        f_obs, f_exp = observed[keep], expected[keep]
        if (~keep).any():
            f_obs = np.append(f_obs, observed[~keep].sum())
            f_exp = np.append(f_exp, expected[~keep].sum())
        pvalue = stats.chisquare(f_obs, f_exp).pvalue
        assert (pvalue > 1e-3) == should_pass, (factor, pvalue)
    assert len(np.unique(got)) > 3  # not the argmax alone


def test_utility_sensitivity_on_adversarial_neighbours(conn) -> None:
    """Replace one record by an extreme one (2 -> 10, 5 -> 0): every grid point's utility moves
    by at most 1, the sensitivity the mechanism is calibrated to."""

    def utilities(values, counts) -> np.ndarray:
        rows = conn.execute(
            "SELECT start, points, utility FROM dpsql_internal._quantile_segments(%s, %s, %s, 0,"
            " 10, 1)",
            (values, counts, RANK),
        ).fetchall()
        out = np.full(11, np.nan)
        for start, points, utility in rows:
            out[int(start) : int(start) + int(points)] = utility
        assert not np.isnan(out).any()
        return out

    base = utilities(VALUES, COUNTS)
    np.testing.assert_array_equal(base, _grid_utility(VALUES, COUNTS, RANK))
    for values, counts in [
        ([2.0, 5.0, 8.0, 10.0], [2, 4, 3, 1]),
        ([0.0, 2.0, 5.0, 8.0], [1, 3, 3, 3]),
    ]:
        assert np.max(np.abs(utilities(values, counts) - base)) <= 1


# The scan (27_estimate_bounds.sql): the exact law of its stop, in numpy.


def dlap_at_least(t: npt.ArrayLike, scale: float) -> np.ndarray:
    """P(nu >= t) for nu discrete Laplace, P(k) ~ exp(-|k| / scale), t an integer."""
    p = np.exp(-1 / scale)
    t = np.asarray(t, dtype=float)
    return np.where(
        t >= 1, p ** np.maximum(t, 1) / (1 + p), 1 - p ** np.maximum(1 - t, 1) / (1 + p)
    )


def scan_law(counts: npt.ArrayLike, target: int, epsilon: float) -> np.ndarray:
    """P(the scan stops at point k), k in scan order: the first k with c_k + nu_k >= target +
    rho, rho and nu_k discrete Laplace of scale 2 / epsilon; no stop counts as the last."""
    scale = 2 / epsilon
    p = np.exp(-1 / scale)
    rho = np.arange(-int(60 * scale) - 5, int(60 * scale) + 6)
    weight = (1 - p) / (1 + p) * p ** np.abs(rho)
    stop = dlap_at_least(target + rho[:, None] - np.asarray(counts)[None, :], scale)
    before = np.cumprod(np.hstack([np.ones((len(rho), 1)), 1 - stop[:, :-1]]), axis=1)
    law = before * stop
    law[:, -1] += before[:, -1] * (1 - stop[:, -1])
    return weight @ law


def _scan_draws(conn, target: int, ascending: bool, epsilon: float, n: int) -> np.ndarray:
    rows = conn.execute(
        "WITH g AS (SELECT array_agg(x::float8 ORDER BY x) AS grid FROM generate_series(0, 10) x),"
        " h AS (SELECT array_agg(p ORDER BY p) AS p, array_agg(c ORDER BY p) AS c FROM ("
        "   SELECT dpsql_internal._grid_place(v, g.grid, dpsql_internal._negated(g.grid)) AS p,"
        "          sum(c)::bigint AS c FROM g, unnest(%s::float8[], %s::bigint[]) t(v, c)"
        "   GROUP BY 1) q)"
        " SELECT dpsql_internal._private_scan(g.grid, h.p, h.c, %s, %s, %s, s)"
        "   FROM g, h, generate_series(1, %s) s",
        (VALUES, COUNTS, target, ascending, epsilon, n),
    ).fetchall()
    return np.array([r[0] for r in rows])


@pytest.mark.parametrize("ascending", [True, False])
def test_scan_draws_follow_their_exact_law(conn, ascending: bool) -> None:
    """2000 seeded scans of the grid 0..10 against the exact law (scan_law) at epsilon 1:
    chi-square at alpha = 1e-3 (false-failure rate 1e-3; deterministic under the seeds).
    Ascending: the upper quantile at rank 8 (#{v <= g}); descending: the lower at rank 3
    (#{v >= g} >= 10 + 1 - 3). The same draws are rejected against the law at twice the
    epsilon (noise mis-scaled) and are not one point (noise missing)."""
    eps, n = 1.0, 2000
    data = np.repeat(VALUES, COUNTS)
    grid = np.arange(11.0)
    if ascending:
        target, counts, order = 8, (data[None, :] <= grid[:, None]).sum(1), grid
    else:
        target, counts, order = 11 - 3, (data[None, :] >= grid[:, None]).sum(1)[::-1], grid[::-1]
    got = _scan_draws(conn, target, ascending, eps, n)
    assert set(np.unique(got)) <= set(range(11))
    observed = np.array([(got == g).sum() for g in order])
    for factor, should_pass in [(1.0, True), (2.0, False)]:
        expected = scan_law(counts, target, factor * eps) * n
        keep = expected > 5  # the cells below 5 expected draws are pooled into one
        f_obs, f_exp = observed[keep], expected[keep]
        if (~keep).any():
            f_obs = np.append(f_obs, observed[~keep].sum())
            f_exp = np.append(f_exp, expected[~keep].sum())
        pvalue = stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue
        assert (pvalue > 1e-3) == should_pass, (factor, pvalue, observed, expected)
    assert len(np.unique(got)) > 3


def test_magnitude_grid_is_public_and_relative(conn) -> None:
    """The grid depends on [a, b] only: ascending, a and b its ends, 0 in it, and above the
    floor 2^-40 each step is 1/64 to 1/128 of its value; a range 10^6 times wider costs
    2 * 64 points per octave (about 2550 more points), not 10^6 times more."""
    (grid,) = conn.execute("SELECT dpsql_internal._magnitude_grid(-1e7, 1e7)").fetchone()
    g = np.array(grid)
    assert g[0] == -1e7 and g[-1] == 1e7 and 0.0 in g and np.all(np.diff(g) > 0)
    pos = g[g >= 2.0**-40]
    rel = np.diff(pos)[:-1] / pos[:-2]
    assert rel.max() <= 1 / 64 + 1e-12 and rel.min() >= 1 / 128 - 1e-12
    np.testing.assert_array_equal(g[g < 0], -g[g > 0][::-1])  # symmetric
    (narrow,) = conn.execute(
        "SELECT cardinality(dpsql_internal._magnitude_grid(-10, 10))"
    ).fetchone()
    assert len(g) - narrow == pytest.approx(2 * 64 * np.log2(1e6), abs=2 * 64)
    (half,) = conn.execute("SELECT dpsql_internal._magnitude_grid(0, 1)").fetchone()
    assert half[0] == 0 and half[-1] == 1 and half == sorted(set(half))


def _counts(conn, values: list[float | None], ascending: bool) -> np.ndarray:
    """The scan's counts on the grid of [-10, 10] for these values, as estimate_bounds
    reads them: places (NULL and NaN: none), their histogram, then _grid_counts."""
    (counts,) = conn.execute(
        "WITH g AS (SELECT dpsql_internal._magnitude_grid(-10, 10) AS grid),"
        " h AS (SELECT array_agg(p ORDER BY p) AS p, array_agg(c ORDER BY p) AS c FROM ("
        "   SELECT dpsql_internal._grid_place(v, g.grid, dpsql_internal._negated(g.grid)) AS p,"
        "          count(*) AS c FROM g, unnest(%s::float8[]) v"
        "   WHERE v IS NOT NULL AND v <> 'NaN' GROUP BY 1) q)"
        " SELECT dpsql_internal._grid_counts(cardinality(g.grid), h.p, h.c, %s) FROM g, h",
        (values, ascending),
    ).fetchone()
    return np.array(counts)


@pytest.mark.parametrize(
    "replacement",
    [
        1e300,
        -1e300,
        float("inf"),
        float("-inf"),
        float("nan"),
        None,
        0.0,
        -10.0,
        10.0,
        5.0,
        5.0001,
        2.0**-45,
        -(2.0**-45),
    ],
)
def test_count_sensitivity_on_adversarial_neighbours(conn, replacement) -> None:
    """Replace one value (the median's) by an extreme one: beyond the range either way,
    infinite, NaN or NULL (not counted), 0, the range's ends, on a grid point, between two,
    below the floor. Every count of the scan, ascending (#{v <= g}) and descending
    (#{v >= g}), moves by at most 1 and all in one direction: the sensitivity and the
    monotonicity the privacy argument needs. The base counts are the exact ones."""
    base_values = [float(v) for v in np.repeat(VALUES, COUNTS)]
    (grid,) = conn.execute("SELECT dpsql_internal._magnitude_grid(-10, 10)").fetchone()
    g, data = np.array(grid), np.array(base_values)
    for ascending in (True, False):
        base = _counts(conn, base_values, ascending)
        exact = (data[None, :] <= g[:, None]) if ascending else (data[None, :] >= g[:, None])
        np.testing.assert_array_equal(base, exact.sum(1))
        neighbour = list(base_values)
        neighbour[4] = replacement
        moved = _counts(conn, neighbour, ascending) - base
        assert np.abs(moved).max() <= 1, moved
        assert moved.min() >= 0 or moved.max() <= 0, moved  # monotone


@pytest.fixture
def multiscale(conn, scratch_schema) -> tuple[str, np.ndarray]:
    """Three features of very different scales, uniform on [0, 1], [0, 300], [0, 1e5]
    (sharp upper edges: the hardest case for an upper quantile), m = 4000."""
    rng = np.random.default_rng(25)
    x = rng.uniform(0, 1, size=(4000, 3)) * np.array([1.0, 300.0, 1e5])
    conn.execute("CREATE TABLE ms (a float8, b float8, c float8, y float8)")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO ms VALUES (%s, %s, %s, %s)",
            [(*row, float(i % 2)) for i, row in enumerate(x.tolist())],
        )
    name = f"ms_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b,c}', 'y', 100, labels => '{0,1}', name => %s)",
        (f"{scratch_schema}.ms", name),
    )
    return name, x


def test_bounds_adapt_to_each_features_scale(conn, multiscale) -> None:
    """Issue 25: at epsilon 1 (1/6 per quantile), m = 4000 and one wide range {-1e7, 1e7}, each
    upper bound is within 2x of its feature's 0.99 quantile, and each lower bound within 5% of
    the feature's scale (its 0.99 quantile) of its 0.01 quantile. Under the exact law
    (scan_law on the same grid and data) this seeded run fails with probability 0.16% (union
    bound over the six quantiles); the linear grid's exponential mechanism it replaces put
    the upper bounds within 2x with probability 4e-6, 4e-5 and 0.011."""
    name, x = multiscale
    (bounds,) = conn.execute(
        "SELECT dpsql.estimate_bounds(%s, 1, '{-1e7,1e7}', noise_seed => 7)", (name,)
    ).fetchone()
    for (lo, hi), column in zip(bounds, x.T, strict=True):
        p01, p99 = np.quantile(column, [0.01, 0.99])
        assert p99 / 2 <= hi <= 2 * p99, (hi, p99)
        assert abs(lo - p01) <= 0.05 * p99, (lo, p01)


@pytest.fixture
def unbounded(conn, scratch_schema) -> str:
    conn.execute(
        "CREATE TABLE raw AS SELECT 40 + 10 * sin(g) AS a, 1000 * cos(g) AS b,"
        " CASE WHEN sin(g) + cos(g) > 0 THEN 1 ELSE 0 END AS y FROM generate_series(1, 4000) g"
    )
    name = f"raw_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 1e5, 1e-4, labels => '{0,1}', name => %s)",
        (f"{scratch_schema}.raw", name),
    )
    return name


def test_estimated_bounds_are_charged_registered_and_used(conn, unbounded, make_role) -> None:  # noqa: F811
    (bounds,) = conn.execute(
        "SELECT dpsql.estimate_bounds(%s, 1e4, '{-1e4,1e4}', noise_seed => 1)", (unbounded,)
    ).fetchone()
    # epsilon 1e4 (noise 0 but with probability e^-5000): the last grid point at or below the
    # rank-40 value, the first at or above the rank-3960 value (ceil(0.01 m), ceil(0.99 m))
    (grid,) = conn.execute("SELECT dpsql_internal._magnitude_grid(-1e4, 1e4)").fetchone()
    grid = np.array(grid)
    g = np.arange(1, 4001)
    for column, (lo, hi) in zip((40 + 10 * np.sin(g), 1000 * np.cos(g)), bounds, strict=True):
        v = np.sort(column)
        assert lo == grid[grid <= v[39]].max() and hi == grid[grid >= v[3959]].min()
        assert abs(lo - v[39]) <= abs(v[39]) / 64 and abs(hi - v[3959]) <= abs(v[3959]) / 64
    ledger = conn.execute(
        "SELECT mechanism, epsilon, delta FROM dpsql.ledger_entries l JOIN dpsql.datasets d"
        " USING (dataset_id) WHERE d.name = %s",
        (unbounded,),
    ).fetchall()
    assert ledger == [("estimate_bounds", 1e4, 0.0)]
    registered = conn.execute(
        "SELECT feature_bounds FROM dpsql.datasets WHERE name = %s", (unbounded,)
    ).fetchone()[0]
    assert registered == bounds
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, epochs => 1)",
        (unbounded,),
    ).fetchone()
    used = conn.execute(
        "SELECT params->'feature_bounds' FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()[0]
    assert used == bounds
    # Once only, and never for analysts; refusals charge nothing.
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="already has feature bounds"):
        conn.execute("SELECT dpsql.estimate_bounds(%s, 1, '{-1e4,1e4}')", (unbounded,))
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute(
        "SELECT dpsql.grant_dataset(d.dataset_id, %s) FROM dpsql.datasets d WHERE name = %s",
        (analyst, unbounded),
    )
    with connect() as a, pytest.raises(psycopg.errors.InsufficientPrivilege):
        a.execute("SELECT dpsql.estimate_bounds(%s, 1, '{-1e4,1e4}')", (unbounded,))
    assert (
        len(
            conn.execute(
                "SELECT 1 FROM dpsql.ledger_entries l JOIN dpsql.datasets d USING (dataset_id)"
                " WHERE d.name = %s",
                (unbounded,),
            ).fetchall()
        )
        == 2
    )  # the estimate and the training


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("0, '{-1,1}'", "epsilon must be"),
        ("1, '{1,-1}'", "search_range"),
        ("1, '{-1e308,1e308}'", "search_range"),
        ("1, '{-1,1}', 0.9, 0.1", "quantiles"),
        ("1, '{-1,1}', -0.1, 0.9", "quantiles"),
        ("1, '{-1,1}', 0.1, NULL", "quantiles"),
        ("1, '{1}'", "search_range"),
        ("1, '{-1,NaN}'", "search_range"),
        ("1, '{-Infinity,1}'", "search_range"),
        ("'NaN', NULL", "epsilon must be"),
        ("3e-9, '{-1,1}'", "at least 1e-9"),  # over 4 quantiles
        ("1e-300, NULL", "at least 1e-9"),
    ],
)
def test_bad_arguments_charge_nothing(conn, unbounded, args, message) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(f"SELECT dpsql.estimate_bounds(%s, {args})", (unbounded,))
    assert (
        conn.execute(
            "SELECT count(*) FROM dpsql.ledger_entries l JOIN dpsql.datasets d USING (dataset_id)"
            " WHERE d.name = %s",
            (unbounded,),
        ).fetchone()[0]
        == 0
    )


def test_noise_beyond_the_margin_warns(conn, unbounded) -> None:
    """The scan's noise (2 / epsilon per quantile: 80 rows at epsilon 0.1 over 4 quantiles)
    exceeds the target ranks' 40 rows from the edges: warned before the charge."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("SELECT dpsql.estimate_bounds(%s, 0.1, noise_seed => 2)", (unbounded,))
    assert any("far outside the data" in n for n in notices)


def test_the_default_range_and_the_wide_one_agree(conn, unbounded) -> None:
    """search_range NULL is {-2^40, 2^40}; at a large epsilon the bounds are the grid points
    around the quantiles, the same in every range that holds them (a grid of magnitudes)."""
    with conn.transaction(force_rollback=True):
        (wide,) = conn.execute(
            "SELECT dpsql.estimate_bounds(%s, 1e4, '{-1e12,1e12}', noise_seed => 3)", (unbounded,)
        ).fetchone()
    (default,) = conn.execute(
        "SELECT dpsql.estimate_bounds(%s, 1e4, noise_seed => 3)", (unbounded,)
    ).fetchone()
    assert default == wide
    g = np.arange(1, 4001)
    for column, (lo, hi) in zip((40 + 10 * np.sin(g), 1000 * np.cos(g)), default, strict=True):
        p01, p99 = np.quantile(column, [0.01, 0.99])
        assert abs(lo - p01) < 0.02 * abs(p01) and abs(hi - p99) < 0.02 * abs(p99)


def test_a_constant_feature_gets_the_next_grid_point_up(conn, scratch_schema) -> None:
    """Both scans stop at the constant (epsilon 1e4: noise 0 but with probability e^-5000): the
    upper bound becomes the next grid point up (post-processing), so lo < hi."""
    conn.execute("CREATE TABLE k AS SELECT 5.0::float8 AS a, (g % 2)::float8 AS y"
                 " FROM generate_series(1, 500) g")  # fmt: skip
    name = f"k_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a}', 'y', 1e5, labels => '{0,1}', name => %s)",
        (f"{scratch_schema}.k", name),
    )
    (bounds,) = conn.execute(
        "SELECT dpsql.estimate_bounds(%s, 1e4, noise_seed => 1)", (name,)
    ).fetchone()
    assert bounds == [[5.0, 5.0 + 4 / 64]]  # 5 = 4 (1 + 16/64); the next point 4 (1 + 17/64)


def test_extreme_epsilons(conn, scratch_schema) -> None:
    """Near float8's max the noise is 0 and nothing underflows; 1e-9 per quantile is the least
    (its noise, up to 36.7 * 2e9, an exact integer)."""
    conn.execute("CREATE TABLE e AS SELECT g::float8 AS a, (g % 2)::float8 AS y"
                 " FROM generate_series(1, 300) g")  # fmt: skip
    name = f"e_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a}', 'y', 1.7e308, labels => '{0,1}', name => %s)",
        (f"{scratch_schema}.e", name),
    )
    with conn.transaction(force_rollback=True):
        (bounds,) = conn.execute("SELECT dpsql.estimate_bounds(%s, 1.6e308)", (name,)).fetchone()
    # ranks ceil(0.01 m) = 3 and ceil(0.99 m) = 298 (float8's 0.99 * 300 is above 297): 3 is a
    # grid point, 298 lies between 296 and 300 = 256 (1 + 11/64)
    assert bounds == [[3.0, 300.0]]
    (bounds,) = conn.execute("SELECT dpsql.estimate_bounds(%s, 2e-9)", (name,)).fetchone()
    assert len(bounds) == 1


def test_a_dataset_with_categorical_features_is_refused_before_the_charge(
    conn, scratch_schema
) -> None:
    """Issue 42: estimate_bounds on a dataset with a text (categorical) column read it as a
    number after the charge, failed with an internal error and kept the charge."""
    table = f"{scratch_schema}.cat_{uuid.uuid4().hex[:6]}"
    conn.execute(
        f"CREATE TABLE {table} AS SELECT g::float8 AS a,"
        " (ARRAY['red', 'blue'])[1 + g % 2] AS colour, (g % 2)::float8 AS y"
        " FROM generate_series(1, 500) g"
    )
    name = f"cat_{uuid.uuid4().hex[:6]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,colour}', 'y', 2.0, labels => '{0,1}',"
        """ categories => '{"colour": ["red", "blue"]}', name => %s)""",
        (table, name),
    )
    with pytest.raises(psycopg.Error, match="numeric features only") as err:
        conn.execute("SELECT dpsql.estimate_bounds(%s, epsilon => 0.2)", (name,))
    assert "Nothing was charged" in str(err.value)
    (spent,) = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE name = %s", (name,)
    ).fetchone()
    assert spent == 0
