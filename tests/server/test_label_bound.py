"""dpsql.estimate_label_bound and register_dataset(estimate => ...) (issues 10 and 25): a
private upper quantile of |y| by the scan of a grid of magnitudes, for a regression dataset
registered without a label bound. The draws' exact law through the whole function, the counts'
sensitivity on adversarial neighbours read through the real read path, the charge, the
refusals, atomic registration, and a private DP-GD run on the estimated bound."""

from __future__ import annotations

import uuid

import numpy as np
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.server.test_estimate_bounds import scan_law

# Ten labels whose |y| are 2 (x3), 5 (x4) and 8 (x3), signs mixed; the median rank 5. All
# three are points of the grid of magnitudes of [0, 10] (2, 4 (1 + 16/64), 8).
LABELS = [-2.0, 2.0, 2.0, -5.0, 5.0, 5.0, -5.0, 8.0, -8.0, 8.0]
RANK = 5


def _grid(conn) -> np.ndarray:
    (grid,) = conn.execute("SELECT dpsql_internal._magnitude_grid(0, 10)").fetchone()
    return np.array(grid)


def _exact_law(grid: np.ndarray, epsilon: float) -> np.ndarray:
    """P(the bound is grid point k): the ascending scan of #{|y| <= g} to the rank 5."""
    counts = (np.abs(LABELS)[None, :] <= grid[:, None]).sum(1)
    return scan_law(counts, RANK, epsilon)


def _table(conn, schema: str, labels, *, table: str = "lab") -> str:
    conn.execute(f"CREATE TABLE {schema}.{table} (x float8, y float8)")
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {schema}.{table} VALUES (%s, %s)",
            [(float(i % 3) / 3, y) for i, y in enumerate(labels)],
        )
    return f"{schema}.{table}"


def _register(conn, source: str, **kw) -> str:
    name = f"lab_{uuid.uuid4().hex[:8]}"
    # adversarial rows (NULL, inf, nan labels) on purpose: accepted at registration
    args = {"epsilon_budget": 1e6, "delta_budget": 0.5, "regression": True, "accept": True, **kw}
    if isinstance(args.get("estimate"), dict):
        args["estimate"] = Jsonb(args["estimate"])
    names = "".join(f", {k} => %({k})s" for k in args)
    conn.execute(
        f"SELECT dpsql.register_dataset(%(source)s, '{{x}}', 'y', name => %(name)s{names})",
        {"source": source, "name": name, **args},
    )
    return name


def _ledger(conn, name: str) -> list[tuple]:
    return conn.execute(
        "SELECT mechanism, epsilon, delta FROM dpsql.ledger_entries l JOIN dpsql.datasets d"
        " USING (dataset_id) WHERE d.name = %s ORDER BY entry_id",
        (name,),
    ).fetchall()


def _declared(conn, name: str) -> tuple:
    return conn.execute(
        "SELECT labels, label_bound, feature_bounds, row_bound FROM dpsql.datasets WHERE name = %s",
        (name,),
    ).fetchone()


@pytest.fixture
def small(conn, scratch_schema) -> str:
    return _register(conn, _table(conn, scratch_schema, LABELS))


def _chisquare_pvalue(observed: np.ndarray, law: np.ndarray, draws: int = 200_000) -> float:
    """P(Pearson's statistic >= the observed one) when the counts are multinomial with the
    cells' probabilities law: its null law simulated by 200,000 seeded draws (the p-value's
    error near 1e-3 is about 7e-5)."""
    n, law = int(observed.sum()), law / law.sum()
    expected = n * law
    statistic = ((observed - expected) ** 2 / expected).sum()
    null = np.random.default_rng(0).multinomial(n, law, size=draws)
    return float(
        (1 + (((null - expected) ** 2 / expected).sum(1) >= statistic).sum()) / (1 + draws)
    )


def test_label_bound_draws_follow_the_scan(conn, small) -> None:
    """300 seeded runs of the whole function (each rolled back) against the scan's exact law
    at epsilon 2, in 7 cells (the three data values and the runs between them): Pearson's
    statistic at alpha = 1e-3, its p-value from the statistic's exact null law (simulated:
    _chisquare_pvalue), so the false-failure rate is 1e-3 (deterministic under the seeds). (The
    chi-square approximation's is not: three cells expect about one draw in 1000 or fewer, and
    at 1000 runs it failed wrongly about 0.8% of the time.) The same draws are rejected against
    the law of twice the epsilon (noncentrality about 1,600 at 300 runs: never missed in
    simulation, nor at 1.5 times the epsilon; 1.25 times is caught 2% of the time, always at
    1000 runs), and no draw is the noiseless median alone (noise missing) or off the grid.
    (1000 runs took 45 s of a CI, issue 43: each run is charged, by a commit of its own.)"""
    eps, n = 2.0, 300
    bounds: list[float] = []
    for seed in range(1, n + 1):
        with conn.transaction(force_rollback=True):
            (b,) = conn.execute(
                "SELECT dpsql.estimate_label_bound(%s, %s, '{0,10}', 0.5, noise_seed => %s)",
                (small, eps, seed),
            ).fetchone()
            bounds.append(b)
    grid = _grid(conn)
    got = np.array(bounds)
    assert np.isin(got, grid).all() and got.min() > 0  # 0 -> the next point (label_bound > 0)
    # [0, 2), {2}, (2, 5), {5}, (5, 8), {8}, (8, 10]
    cells = [(0, 2, False), (2, 2, True), (2, 5, False), (5, 5, True), (5, 8, False),
             (8, 8, True), (8, 10.5, False)]  # fmt: skip

    def cell(v: np.ndarray, lo: float, hi: float, point: bool) -> np.ndarray:
        return v == lo if point else (v > lo if lo > 0 else v >= 0) & (v < hi)

    observed = np.array([cell(got, *c).sum() for c in cells])
    for factor, should_pass in [(1.0, True), (2.0, False)]:
        p = _exact_law(grid, factor * eps)
        law = np.array([p[cell(grid, *c)].sum() for c in cells])
        pvalue = _chisquare_pvalue(observed, law)
        assert (pvalue > 1e-3) == should_pass, (factor, pvalue, observed, n * law)
    assert observed[3] < n * 0.9  # the noiseless answer is 5 every time
    assert len(_ledger(conn, small)) == n  # every run rolled back, and every one still charged


def _counts(conn, name: str) -> np.ndarray:
    """The scan's counts #{|y| <= g} on the grid of [0, 10] as estimate_label_bound computes
    them: the labels read by dpsql_internal._label_places, then dpsql_internal._grid_counts."""
    (counts,) = conn.execute(
        "SELECT dpsql_internal._grid_counts(cardinality(g.grid), p.places, p.counts, true)"
        "  FROM dpsql.datasets d, (SELECT dpsql_internal._magnitude_grid(0, 10) AS grid) g,"
        "       dpsql_internal._label_places(d, g.grid) p"
        " WHERE d.name = %s",
        (name,),
    ).fetchone()
    return np.array(counts)


@pytest.mark.parametrize(
    "replacement",
    [1e300, -1e300, float("inf"), 0.0, float("nan"), None, -10.0, 8.0, 2.05],
)
def test_count_sensitivity_on_adversarial_neighbours(conn, scratch_schema, replacement) -> None:
    """Replace one record's label (the median's, 5) by an extreme one: beyond the range either
    way, infinite, 0, NaN or NULL (not counted), on another data value, or off the grid: every
    count of the scan moves by at most 1, all in one direction (the sensitivity and the
    monotonicity of the privacy argument). The base counts are the exact ones."""
    base_name = _register(conn, _table(conn, scratch_schema, LABELS, table="base"))
    base = _counts(conn, base_name)
    grid = _grid(conn)
    np.testing.assert_array_equal(base, (np.abs(LABELS)[None, :] <= grid[:, None]).sum(1))
    neighbour = list(LABELS)
    neighbour[4] = replacement
    name = _register(conn, _table(conn, scratch_schema, neighbour, table="nb"))
    moved = _counts(conn, name) - base
    assert np.abs(moved).max() <= 1, moved
    assert moved.min() >= 0 or moved.max() <= 0, moved


def test_charged_exactly_once_and_registered(conn, scratch_schema, make_role) -> None:  # noqa: F811
    rng = np.random.default_rng(3)
    y = rng.normal(0, 30, size=4000)
    name = _register(conn, _table(conn, scratch_schema, y))
    assert _declared(conn, name)[:2] == (None, None)
    (bound,) = conn.execute(
        "SELECT dpsql.estimate_label_bound(%s, 1e4, '{0,1e4}', noise_seed => 5)", (name,)
    ).fetchone()
    # epsilon 1e4: the first grid point at or above the rank-r value of |y| (noise 0 but with
    # probability e^-5000)
    v = np.sort(np.abs(y))
    r = int(np.ceil(0.99 * 4000))
    (grid,) = conn.execute("SELECT dpsql_internal._magnitude_grid(0, 1e4)").fetchone()
    assert bound == min(g for g in grid if g >= v[r - 1]), (bound, v[r - 1])
    assert _ledger(conn, name) == [("estimate_label_bound", 1e4, 0.0)]
    assert _declared(conn, name)[1] == bound
    # Once only; never for analysts; neither refusal charges.
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="already has a label bound"):
        conn.execute("SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}')", (name,))
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute(
        "SELECT dpsql.grant_dataset(d.dataset_id, %s) FROM dpsql.datasets d WHERE name = %s",
        (analyst, name),
    )
    with connect() as a, pytest.raises(psycopg.errors.InsufficientPrivilege):
        a.execute("SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}')", (name,))
    assert _ledger(conn, name) == [("estimate_label_bound", 1e4, 0.0)]


def test_analyst_is_refused_before_anything(conn, small, make_role) -> None:  # noqa: F811
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute(
        "SELECT dpsql.grant_dataset(d.dataset_id, %s) FROM dpsql.datasets d WHERE name = %s",
        (analyst, small),
    )
    with connect() as a:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("SELECT dpsql.estimate_label_bound(%s, 1, '{0,10}')", (small,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor through registration
            a.execute(
                "SELECT dpsql.register_dataset('x', '{x}', 'y', 1,"
                ' estimate => \'{"label_bound": {"epsilon": 1, "search_range": [0, 1]}}\')'
            )
    assert _ledger(conn, small) == [] and _declared(conn, small)[1] is None


@pytest.mark.parametrize(
    ("args", "error", "message"),  # error: the SQLSTATE
    [
        ("0, '{0,10}'", "22023", "epsilon must be"),
        ("'Infinity', '{0,10}'", "22023", "epsilon must be"),
        ("'NaN', '{0,10}'", "22023", "epsilon must be"),
        ("1, '{-1,10}'", "22023", "0 <= a < b"),
        ("1, '{10,0}'", "22023", "search_range"),
        ("1, '{0,Infinity}'", "22023", "search_range"),
        ("1, '{0,NULL}'", "22023", "search_range"),
        ("1, '{0,1,2}'", "22023", "search_range"),
        ("1e-10, '{0,10}'", "22023", "at least 1e-9"),
        ("1, '{0,10}', 0", "22023", "quantile must be"),
        ("1, '{0,10}', 1.5", "22023", "quantile must be"),
        ("2e6, '{0,10}'", "DP001", "budget"),
    ],
)
def test_refusals_charge_nothing_and_change_nothing(conn, small, args, error, message) -> None:
    with pytest.raises(psycopg.Error, match=message) as err:
        conn.execute(f"SELECT dpsql.estimate_label_bound(%s, {args})", (small,))
    assert err.value.sqlstate == error
    assert _ledger(conn, small) == []
    assert _declared(conn, small) == (None, None, None, None)


def test_classification_and_declared_datasets_are_refused(conn, scratch_schema) -> None:
    source = _table(conn, scratch_schema, [0.0, 1.0] * 5)
    classes = _register(conn, source, regression=None, labels=[0, 1])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="classification dataset"):
        conn.execute("SELECT dpsql.estimate_label_bound(%s, 1, '{0,10}')", (classes,))
    assert _ledger(conn, classes) == []
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="regression => false"):
        _register(conn, source, regression=False, label_bound=3)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not both"):
        _register(conn, source, labels=[0, 1])  # regression => true with labels


def test_training_waits_for_the_label_bound(conn, small) -> None:
    """A regression dataset without its bound is untrainable (whatever the model), uncharged."""
    for model, privacy in [("linear", "dpgd"), ("logistic", "bolton"), ("linear", "auto")]:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="label bound"):
            conn.execute(
                "SELECT dpsql.train(%s, NULL, NULL, %s, privacy => %s, epsilon => 1,"
                " delta => 1e-6)",
                (small, model, privacy),
            )
    assert _ledger(conn, small) == []


def test_register_with_estimates_splits_the_budget(conn, scratch_schema) -> None:
    rng = np.random.default_rng(4)
    y = rng.normal(0, 3, size=2000)
    source = _table(conn, scratch_schema, y)
    estimate = {
        "feature_bounds": {"epsilon": 0.3, "search_range": [-10, 10]},
        "label_bound": {"epsilon": 0.2, "search_range": [0, 100], "quantile": 0.95},
        "noise_seed": 11,
    }
    name = _register(conn, source, regression=None, estimate=estimate)
    labels, label_bound, feature_bounds, row_bound = _declared(conn, name)
    assert labels is None and 0 < label_bound <= 100
    assert len(feature_bounds) == 1 and row_bound == 1.0  # sqrt(d): bounded features
    assert _ledger(conn, name) == [
        ("estimate_bounds", 0.3, 0.0),
        ("estimate_label_bound", 0.2, 0.0),
    ]
    (spent,) = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE name = %s", (name,)
    ).fetchone()
    assert spent == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("estimate", "kw", "error", "message"),  # error: the SQLSTATE
    [
        # the feature bounds are estimated and charged, then the label bound exceeds the budget
        (
            {
                "feature_bounds": {"epsilon": 0.5, "search_range": [-10, 10]},
                "label_bound": {"epsilon": 0.6, "search_range": [0, 10]},
            },
            {"epsilon_budget": 1.0},
            "DP001",
            "budget",
        ),
        (
            {
                "feature_bounds": {"epsilon": 0.5, "search_range": [-10, 10]},
                "label_bound": {"epsilon": 0.5, "search_range": [-1, 10]},
            },
            {},
            "22023",
            "0 <= a < b",
        ),
        ({"label_bound": {"search_range": [0, 1]}}, {}, "22023", "needs epsilon"),
        ({"label_bound": {"epsilon": 1, "search_range": [0]}}, {}, "22023", "must be \\[a, b\\]"),
        ({"labelbound": {}}, {}, "22023", "feature_bounds and/or label_bound"),
        (
            {"label_bound": {"epsilon": "1", "search_range": [0, 1]}},
            {},
            "22023",
            "must be a number",
        ),
        (
            '{"label_bound": {"epsilon": 1, "search_range": [0, 1e400]}}',
            {},
            "22023",
            "out of float8",
        ),
        (
            {"label_bound": {"epsilon": 1, "search_range": [0, 1], "q": 1}},
            {},
            "22023",
            "unknown key",
        ),
        (
            {"label_bound": {"epsilon": 1, "search_range": [0, 1]}},
            {"label_bound": 2},
            "22023",
            "not both",
        ),
        (
            {"feature_bounds": {"epsilon": 1, "search_range": [0, 1]}},
            {"feature_bounds": [[0, 1]]},
            "22023",
            "not both",
        ),
    ],
)
def test_registration_with_estimates_is_atomic(
    conn, scratch_schema, estimate, kw, error, message
) -> None:
    source = _table(conn, scratch_schema, np.linspace(-5, 5, 200))
    (datasets_before,) = conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()
    (entries_before,) = conn.execute("SELECT count(*) FROM dpsql.ledger_entries").fetchone()
    with pytest.raises(psycopg.Error, match=message) as err:
        _register(conn, source, regression=None, estimate=estimate, **kw)
    assert err.value.sqlstate == error
    assert conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0] == datasets_before
    assert conn.execute("SELECT count(*) FROM dpsql.ledger_entries").fetchone()[0] == entries_before
    # and the table registers afterwards: nothing was left behind
    _register(conn, source, label_bound=5)


def test_register_estimate_train_dpgd(conn, scratch_schema) -> None:
    """End to end: register without a label bound, estimate it, train DP-GD privately."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=3000)
    y = 2 * x + rng.normal(0, 0.1, size=3000)
    conn.execute(f"CREATE TABLE {scratch_schema}.pts (x float8, y float8)")
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {scratch_schema}.pts VALUES (%s, %s)",
            list(zip(x.tolist(), y.tolist(), strict=True)),
        )
    name = _register(conn, f"{scratch_schema}.pts", feature_bounds=[[-1, 1]])
    (bound,) = conn.execute(
        "SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}', noise_seed => 9)", (name,)
    ).fetchone()
    assert 1.0 < bound < 3.5, bound  # |y| <= ~2.3; the 0.99 quantile near 2
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'dpgd', epsilon => 2,"
        " delta => 1e-6, noise_seed => 1)",
        (name,),
    ).fetchone()
    (coef,) = conn.execute("SELECT coef FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()
    assert abs(coef[0] - 2) < 0.5, coef
    assert [m for m, _, _ in _ledger(conn, name)] == ["estimate_label_bound", "dpgd"]


def test_python_api(conn, scratch_schema) -> None:
    import dpsql

    source = _table(conn, scratch_schema, np.linspace(-4, 4, 500))
    db = dpsql.connect(conn)
    ds = db.register_dataset(
        source,
        "x",
        "y",
        epsilon_budget=10,
        delta_budget=1e-3,
        name=f"py_{uuid.uuid4().hex[:8]}",
        estimate={
            "feature_bounds": {"epsilon": 1, "search_range": [-10, 10]},
            "label_bound": {"epsilon": 1, "search_range": [0, 100], "quantile": 0.9},
            "noise_seed": 3,
        },
    )
    name, label_bound = conn.execute(
        "SELECT name, label_bound FROM dpsql.datasets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    assert 0 < label_bound <= 100
    assert [m for m, _, _ in _ledger(conn, name)] == ["estimate_bounds", "estimate_label_bound"]
    later = db.register_dataset(
        _table(conn, scratch_schema, np.linspace(-4, 4, 500), table="later"),
        "x",
        "y",
        epsilon_budget=1e5,
        name=f"py_{uuid.uuid4().hex[:8]}",
        regression=True,
    )
    (later_name,) = conn.execute(
        "SELECT name FROM dpsql.datasets WHERE dataset_id = %s", (later,)
    ).fetchone()
    bound = db.estimate_label_bound(later_name, 1e4, [0, 100], noise_seed=1)
    assert 3.8 < bound < 4.1  # the 0.99 quantile of |y| over linspace(-4, 4)
    bounds = db.estimate_bounds(later_name, 1e4, upper_quantile=0.9, noise_seed=1)  # +-2^40
    assert bounds == [[0.0, 0.671875]]  # x in {0, 1/3, 2/3}: 0, and the grid point above 2/3
    assert [e for _, e, _ in _ledger(conn, later_name)] == [1e4, 1e4]


def test_estimates_ignore_session_settings(conn, server_uri, scratch_schema) -> None:
    """Same seed, hostile session settings (tests/server/test_pinned_settings.py): same bounds."""
    from tests.server.test_pinned_settings import _set_hostile

    source = _table(conn, scratch_schema, np.random.default_rng(6).normal(0, 7, size=300))
    call = (
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 100, name => %s, estimate =>"
        ' \'{"feature_bounds": {"epsilon": 0.7, "search_range": [-3, 3]},'
        ' "label_bound": {"epsilon": 0.3, "search_range": [0, 1000]}, "noise_seed": 4}\')'
    )
    got = []
    for hostile in (False, True):
        with psycopg.connect(server_uri, autocommit=True) as c:
            if hostile:
                _set_hostile(c)
            with c.transaction(force_rollback=True):
                c.execute(call, (source, "hostile"))
                got.append(
                    c.execute(
                        "SELECT label_bound, feature_bounds FROM dpsql.datasets"
                        " WHERE name = 'hostile'",
                        binary=True,
                    ).fetchone()
                )
    assert got[0] == got[1]


def test_registration_estimates_in_the_default_range(conn, scratch_schema) -> None:
    """No search_range: {-2^40, 2^40} for the features, {0, 2^40} for |y|; the bounds still
    fit the data (epsilon 1e3: noise 0 but with probability about e^-500)."""
    rng = np.random.default_rng(8)
    y = rng.normal(0, 30, size=2000)
    source = _table(conn, scratch_schema, y)
    estimate = {
        "feature_bounds": {"epsilon": 1e3},
        "label_bound": {"epsilon": 1e3},
        "noise_seed": 2,
    }
    name = _register(conn, source, regression=None, estimate=estimate)
    _, label_bound, feature_bounds, _ = _declared(conn, name)
    q99 = np.quantile(np.abs(y), 0.99)
    assert q99 <= label_bound <= q99 * (1 + 1 / 64), (label_bound, q99)
    x = np.arange(2000) % 3 / 3  # _table's x
    assert feature_bounds[0][0] <= 0 < x.max() <= feature_bounds[0][1] <= x.max() * (1 + 1 / 64)
