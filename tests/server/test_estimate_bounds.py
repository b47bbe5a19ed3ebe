"""dpsql.estimate_bounds (issue 10; spec 001 s. 3.3): private quantiles by the exponential
mechanism on a grid, their exact distribution, the utility's sensitivity on adversarial
neighbours, the charge, and the bounds a later training uses."""

from __future__ import annotations

import uuid

import numpy as np
import psycopg
import pytest
from scipy import stats

# A tiny grid: points 0..10 (step 1), ten values at 2, 5 and 8, the median rank 5.
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
    # epsilon 1e4: a point with utility 0, between the rank-r order statistic and the next
    g = np.arange(1, 4001)
    for column, (lo, hi) in zip((40 + 10 * np.sin(g), 1000 * np.cos(g)), bounds, strict=True):
        v = np.sort(column)
        for got, rank in ((lo, 40), (hi, 3960)):  # ceil(0.01 m), ceil(0.99 m)
            assert v[rank - 1] - 1e-3 <= got <= v[rank] + 1e-3, (got, v[rank - 1], v[rank])
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


def test_small_data_and_wide_range_warn(conn, unbounded) -> None:
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute(
        "SELECT dpsql.estimate_bounds(%s, 0.5, '{-1e6,1e6}', noise_seed => 2)", (unbounded,)
    )
    assert any("far outside the data" in n for n in notices)
