"""dpsql.describe (issue 44, item 4): private exploratory statistics of a registered dataset.

An analyst granted a dataset, without SELECT on its table, gets each column's mean, stddev,
quantiles, histogram or frequencies for one ledger entry; every refusal that needs no value
comes before that charge. The noise is checked for presence and scale, each statistic's
sensitivity on neighbouring datasets (one row replaced, adversarially), and the answer against
the true statistics at a large epsilon.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import psycopg
import pytest

from dpsql import ledger_events
from tests.server.test_pinned_settings import _set_hostile

H = 32768  # the sums' integer grid (_describe_constants)
ROWS = 2000


@pytest.fixture
def table(conn, scratch_schema) -> str:
    """a in [0, 1), b in [-2, 2], colour categorical, y in {-1, 1}: 2,000 rows."""
    conn.execute(
        "CREATE TABLE t AS SELECT g AS rid, (g % 10) / 10.0 AS a,"
        " ((g * 7919) % 4001) / 1000.0 - 2 AS b,"
        " (ARRAY['red', 'green', 'blue'])[1 + g % 3] AS colour,"
        f" CASE WHEN g % 4 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, {ROWS}) g"
    )
    return f"{scratch_schema}.t"


def _register(conn, source: str, budget: float = 1000.0, **kw) -> tuple[int, str]:
    name = f"ds_{uuid.uuid4().hex[:8]}"
    args = {
        "feature_bounds": [[0, 1], [-2, 2]],
        "categories": '{"colour": ["red", "green", "blue"]}',
        **kw,
    }
    extra = "".join(f", {k} => %({k})s" for k in args)
    (ds,) = conn.execute(
        f"SELECT dpsql.register_dataset(%(source)s, '{{a,b,colour}}', 'y', %(budget)s, 1e-3,"
        f" name => %(name)s{extra})",
        {"source": source, "name": name, "budget": budget, **args},
    ).fetchone()
    return ds, name


@pytest.fixture
def dataset(conn, table) -> tuple[int, str]:
    return _register(conn, table)


@pytest.fixture
def analyst(conn, dataset, make_role):
    """An analyst granted the dataset, no SELECT on its table: (connect, dataset id, name)."""
    role, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (dataset[0], role))
    return connect, *dataset


def _describe(c, name: str, epsilon: float, **kw) -> dict[tuple, tuple[float, float | None]]:
    names = "".join(f", {k} => %({k})s" for k in kw)
    rows = c.execute(
        f"SELECT feature, statistic, key, value, noise_sd FROM dpsql.describe(%(name)s,"
        f" %(epsilon)s{names})",
        {"name": name, "epsilon": epsilon, **kw},
    ).fetchall()
    return {(f, s, k): (v, sd) for f, s, k, v, sd in rows}


def _ledger(conn, ds: int) -> list[tuple]:
    return conn.execute(
        "SELECT mechanism, epsilon, delta, dp_event FROM dpsql.ledger_entries"
        " WHERE dataset_id = %s ORDER BY entry_id",
        (ds,),
    ).fetchall()


def _truth(conn, source: str) -> dict[str, np.ndarray]:
    rows = conn.execute(f"SELECT a, b, colour, y FROM {source} ORDER BY rid").fetchall()
    return {
        "a": np.array([float(r[0]) for r in rows]),
        "b": np.array([float(r[1]) for r in rows]),
        "colour": np.array([r[2] for r in rows]),
        "y": np.array([float(r[3]) for r in rows]),
    }


# ----------------------------------------------------------------------- the analyst's call


def test_an_analyst_without_select_describes_for_one_charge(conn, analyst, table) -> None:
    connect, ds, name = analyst
    with connect() as a:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute(f"SELECT a FROM {table} LIMIT 1")
        out = _describe(a, name, 1.0)
        ledger = a.execute(
            "SELECT mechanism, epsilon, delta, outcome FROM dpsql.ledger WHERE dataset_id = %s",
            (ds,),
        ).fetchall()
    assert ledger == [("describe", 1.0, 0.0, "released")]
    assert out[(None, "rows", None)] == (ROWS, 0.0)
    for f in ("a", "b"):
        for s in ("mean", "stddev"):
            assert (f, s, None) in out
        assert [k for (g, s, k) in out if g == f and s == "quantile"] == [
            "0.1", "0.25", "0.5", "0.75", "0.9"
        ]  # fmt: skip
        assert all(out[(f, "quantile", k)][1] is None for k in ("0.1", "0.5"))
        assert len([k for (g, s, k) in out if g == f and s == "histogram"]) == 10
    assert [k for (g, s, k) in out if g == "colour"] == ["red", "green", "blue"]
    assert [k for (g, s, k) in out if g == "y"] == ["-1", "1"]
    assert ("a", "histogram", "[0,0.1)") in out and ("b", "histogram", "[1.6,2]") in out
    (event,) = [e[3] for e in _ledger(conn, ds)]
    assert event["type"] == "Composed"
    # one ledger entry whose event accounts for at most what it charged
    composed = ledger_events.compose([ledger_events.from_json(event)], 1e-6)
    assert composed["epsilon_pld"] <= 1.0 + 1e-9


def test_the_split_is_the_documented_one(conn, dataset) -> None:
    """epsilon / k per column; of a numeric column's: mean, stddev, histogram 0.2, each
    quantile 0.08; a counted column's frequencies the whole share (docs/describe.md)."""
    _, name = dataset
    (p,) = conn.execute("SELECT dpsql.preview_describe(%s, 2)", (name,)).fetchone()
    plan = p["plan"]
    assert plan["epsilon_per_column"] == 0.5
    assert plan["mean"]["epsilon"] == plan["stddev"]["epsilon"] == pytest.approx(0.1)
    assert plan["histogram"]["epsilon"] == pytest.approx(0.1)
    assert plan["quantile"]["epsilon"] == pytest.approx(0.04)
    assert plan["frequency"]["epsilon"] == 0.5
    assert plan["mean"]["scale"] == pytest.approx(2 * H / 0.1)
    assert plan["stddev"]["scale"] == pytest.approx(H**2 / 0.1)
    event = ledger_events.from_json(p["dp_event"])
    assert ledger_events.compose([event], 1e-9)["epsilon_pld"] <= 2.0 + 1e-9


def test_preview_charges_nothing_and_names_the_release(conn, analyst) -> None:
    connect, ds, name = analyst
    with connect() as a:
        (p,) = a.execute("SELECT dpsql.preview_describe(%s, 1, 1e-6, '{b, y}')", (name,)).fetchone()
        (big,) = a.execute("SELECT dpsql.preview_describe(%s, 5000)", (name,)).fetchone()
        (bad,) = a.execute("SELECT dpsql.preview_describe(%s, 1, 0, '{nope}')", (name,)).fetchone()
    assert p["dataset"] == name and p["mechanism"] == "describe" and p["rows"] == ROWS
    assert (p["epsilon"], p["delta"]) == (1, 1e-6)
    assert p["plan"]["sums"]["noise"] == "gaussian"
    assert big["refused"]["sqlstate"] == "DP001"
    assert bad["refused"]["sqlstate"] == "42703"
    assert _ledger(conn, ds) == []


def test_the_preview_runs_only_the_plan_as_the_release_would(conn, table, analyst) -> None:
    """Issue 45: dpsql.preview_describe is a definer function that runs describe's plan (no
    exception carries its answer). As an analyst: a dataset not granted is refused as the
    release refuses it (one the analyst cannot use, whether it exists or not); the plan's
    helpers and the preview's executor are not the analyst's to call; the answer is the
    charge describe then books."""
    connect, ds, name = analyst
    conn.execute(f"CREATE TABLE hidden AS SELECT * FROM {table}")
    _, hidden = _register(conn, table.replace(".t", ".hidden"))  # not granted to the analyst
    with connect() as a:
        (refused,) = a.execute("SELECT dpsql.preview_describe(%s, 1)", (hidden,)).fetchone()
        with pytest.raises(psycopg.Error) as release:
            a.execute("SELECT * FROM dpsql.describe(%s, 1)", (hidden,))
        for call in (
            "SELECT dpsql_internal._preview_statement('SELECT 1')",
            f"SELECT dpsql_internal._describe_release_plan('{name}', 1, 0, NULL, NULL)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute(call)
        (p,) = a.execute("SELECT dpsql.preview_describe(%s, 1)", (name,)).fetchone()
        _describe(a, name, 1.0)
    assert refused["refused"]["sqlstate"] == release.value.sqlstate
    assert refused["refused"]["message"] == release.value.diag.message_primary
    ((mech, eps, delta, event),) = _ledger(conn, ds)
    assert (mech, eps, delta, event) == ("describe", p["epsilon"], p["delta"], p["dp_event"])


@pytest.mark.parametrize(
    ("args", "sqlstate", "match"),
    [
        ({"epsilon": float("nan")}, "22023", "epsilon must be"),
        ({"epsilon": float("inf")}, "22023", "epsilon must be"),
        ({"epsilon": -1.0}, "22023", "epsilon must be"),
        ({"epsilon": 0.0}, "22023", "epsilon must be"),
        ({"epsilon": None}, "22023", "epsilon must be"),
        ({"epsilon": 1e-9}, "22023", "too small"),
        ({"epsilon": 1e300}, "DP001", "budget"),
        ({"epsilon": 1.0, "delta": 1.0}, "22023", "delta must be"),
        ({"epsilon": 1.0, "delta": -0.1}, "22023", "delta must be"),
        ({"epsilon": 1.0, "delta": float("nan")}, "22023", "delta must be"),
        ({"epsilon": 1.0, "delta": 1e-6, "features": ["colour"]}, "22023", "buys nothing"),
        ({"epsilon": 1.0, "features": ["a", "nope"]}, "42703", "no column 'nope'"),
        ({"epsilon": 1.0, "features": ["a", "a"]}, "22023", "distinct"),
        ({"epsilon": 1.0, "features": []}, "22023", "distinct"),
        ({"epsilon": 1.0, "features": ["a", None]}, "22023", "distinct"),
        ({"epsilon": 1.0, "features": ["rid"]}, "42703", "no column"),  # not registered
        ({"epsilon": 1.0, "noise_seed": 7}, "42501", "noise_seed"),
    ],
    ids=lambda v: str(v),
)
def test_refusals_come_before_the_charge(conn, analyst, args, sqlstate, match) -> None:
    connect, ds, name = analyst
    names = "".join(f", {k} => %({k})s" for k in args if k != "epsilon")
    with connect() as a, pytest.raises(psycopg.Error, match=match) as err:
        a.execute(
            f"SELECT * FROM dpsql.describe(%(name)s, %(epsilon)s{names})",
            {"name": name, **args},
        )
    assert err.value.sqlstate == sqlstate
    assert _ledger(conn, ds) == []


def test_a_dataset_not_granted_is_unknown(conn, table, make_role) -> None:
    ds, name = _register(conn, table)
    _, connect = make_role("analyst", "dpsql_analyst")
    with connect() as a:
        with pytest.raises(psycopg.Error, match="among the datasets you can use") as err:
            _describe(a, name, 1.0)
        assert err.value.sqlstate == "42704"
        with pytest.raises(psycopg.Error, match="among the datasets you can use"):
            _describe(a, "no_such_dataset", 1.0)
    assert _ledger(conn, ds) == []


def test_features_without_bounds_are_refused_naming_the_estimate(conn, table, make_role) -> None:
    ds, name = _register(conn, table, feature_bounds=None)
    with pytest.raises(psycopg.Error, match="no public bounds for a, b") as err:
        _describe(conn, name, 1.0)
    assert "dpsql.estimate_bounds" in (err.value.diag.message_hint or "")
    # the categorical column and the label need none
    out = _describe(conn, name, 1.0, features=["colour", "y"])
    assert {f for f, _, _ in out} == {None, "colour", "y"}
    assert [e[:2] for e in _ledger(conn, ds)] == [("describe", 1.0)]


def test_a_regression_label_without_its_bound_is_refused(conn, table) -> None:
    ds, name = _register(conn, table, labels=None, regression=True)
    with pytest.raises(psycopg.Error, match="no label bound") as err:
        _describe(conn, name, 1.0)
    assert "dpsql.estimate_label_bound" in (err.value.diag.message_hint or "")
    assert _ledger(conn, ds) == []


def test_search_path_tricks_do_not_reach_the_release(conn, analyst, make_role) -> None:
    """An analyst's schema first on the search_path, with a function, an operator and a table
    named like what the release uses: the answer is the same and the ledger has its charges."""
    connect, ds, name = analyst
    with connect() as a:
        a.execute("CREATE TEMP TABLE datasets (x int)")
        a.execute(
            "CREATE FUNCTION pg_temp.greatest(float8, float8) RETURNS float8"
            " LANGUAGE sql AS 'SELECT 0::float8'"
        )
        a.execute("SET search_path = pg_temp, public")
        out = _describe(a, name, 100.0, features=["a"])
    assert abs(out[("a", "mean", None)][0] - 0.45) < 0.01
    assert len(_ledger(conn, ds)) == 1


# ------------------------------------------------------------------------ the statistics


def test_agrees_with_the_true_statistics_at_a_large_epsilon(conn, table, dataset) -> None:
    ds, name = dataset
    truth = _truth(conn, table)
    out = _describe(conn, name, 900.0)
    for f, lo, hi in (("a", 0.0, 1.0), ("b", -2.0, 2.0)):
        x = truth[f]
        # the grid's rounding and 6 noise sds (as released: false-failure rate < 1e-8)
        mean, mean_sd = out[(f, "mean", None)]
        assert mean == pytest.approx(x.mean(), abs=(hi - lo) / H + 6 * (mean_sd or 0))
        sd, sd_sd = out[(f, "stddev", None)]
        assert sd == pytest.approx(x.std(), abs=(hi - lo) / H * 4 + 6 * (sd_sd or 0))
        for q in ("0.1", "0.25", "0.5", "0.75", "0.9"):
            # the grid's step (1/256 of the range), and a few rows of rank either way
            exact = np.quantile(x, [float(q) - 0.01, float(q) + 0.01], method="inverted_cdf")
            got = out[(f, "quantile", q)][0]
            assert exact[0] - (hi - lo) / 256 <= got <= exact[1] + (hi - lo) / 256, (f, q)
        hist = [v for (g, s, _), (v, _) in out.items() if g == f and s == "histogram"]
        assert hist == list(_bins(x, lo, hi))
    for k in ("red", "green", "blue"):
        assert out[("colour", "frequency", k)][0] == (truth["colour"] == k).sum()
    assert out[("y", "frequency", "1")][0] == (truth["y"] == 1).sum()
    assert out[("y", "frequency", "-1")][0] == (truth["y"] == -1).sum()


def _bins(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The counts of the 10 public bins, each value placed as the server places it (t = (v -
    lo) / (hi - lo), halved first, then floor(10 t); the top bin closed)."""
    t = np.clip((x / 2 - lo / 2) / (hi / 2 - lo / 2), 0, 1)
    return np.bincount(np.minimum(np.floor(t * 10).astype(int), 9), minlength=10)


def _z_scores(conn, name: str, truth: dict, seeds: range, **kw) -> dict[str, list[float]]:
    z: dict[str, list[float]] = {"mean": [], "histogram": [], "frequency": [], "stddev": []}
    bounds = {"a": (0.0, 1.0), "b": (-2.0, 2.0)}
    for seed in seeds:
        out = _describe(conn, name, 1.0, noise_seed=seed, **kw)
        for f in ("a", "b"):
            v, sd = out[(f, "mean", None)]
            # the quantized sum's true mean: within half a grid step of the exact one
            z["mean"].append((v - truth[f].mean()) / sd)
            v, sd = out[(f, "stddev", None)]
            z["stddev"].append((v - truth[f].std()) / sd)
            counts = _bins(truth[f], *bounds[f])
            hist = [(v, sd) for (g, s, _), (v, sd) in out.items() if g == f and s == "histogram"]
            z["histogram"] += [(v - c) / sd for (v, sd), c in zip(hist, counts, strict=True)]
        for k in ("red", "green", "blue"):
            v, sd = out[("colour", "frequency", k)]
            z["frequency"].append((v - (truth["colour"] == k).sum()) / sd)
    return z


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_the_noise_is_there_and_scaled(conn, table, delta) -> None:
    """Over 60 seeded releases at epsilon 1, each value's error divided by its noise_sd has
    variance 1: between 0.55 and 1.6 (mean, histogram, frequency: 120 to 600 draws each, of
    kurtosis 6 at most, so a false failure at random seeds is below 1e-4), and 0.4 to 2.5 for
    the stddev (the delta method's). Missing noise gives 0; noise mis-scaled by 1.5 in either
    direction fails. The seeds are fixed: the test is deterministic."""
    _, name = _register(conn, table, budget=1e6)
    truth = _truth(conn, table)
    z = _z_scores(conn, name, truth, range(1, 61), delta=delta)
    for stat, (low, high) in {
        "mean": (0.55, 1.6),
        "histogram": (0.55, 1.6),
        "frequency": (0.55, 1.6),
        "stddev": (0.4, 2.5),
    }.items():
        var = float(np.mean(np.square(z[stat])))
        assert low < var < high, (stat, var, len(z[stat]))
        assert abs(float(np.mean(z[stat]))) < 4 / math.sqrt(len(z[stat])) * math.sqrt(var), stat


def test_the_quantiles_vary_and_stay_near_at_epsilon_1(conn, table) -> None:
    """Seeded: the median of b over 30 releases at epsilon 1 is not constant (noise), and its
    mean absolute error is under 0.25 (a sixteenth of the range; measured about 0.05)."""
    _, name = _register(conn, table, budget=1e6)
    truth = _truth(conn, table)
    medians = [
        _describe(conn, name, 1.0, features=["b"], noise_seed=s)[("b", "quantile", "0.5")][0]
        for s in range(30)
    ]
    assert len(set(medians)) > 3
    assert np.mean(np.abs(np.array(medians) - np.median(truth["b"]))) < 0.25


# --------------------------------------------------------- neighbouring datasets (replace one)

# Noiseless: at epsilon 1e280 every noise scale is below 1e-200 and each draw is 0.
HUGE = 1e280


def _exact(conn, name: str) -> dict[tuple, float]:
    return {k: v for k, (v, _) in _describe(conn, name, HUGE).items()}


@pytest.mark.parametrize(
    "replacement",
    [
        "a = 1, b = 2",  # the first row: a = 0.1, b near the middle
        "a = 1e308, b = '-Infinity'",
        "a = 'NaN', b = NULL",
        "a = -1e308, b = 'Infinity'",
        "colour = 'blue', y = 1",
        "colour = 'purple', y = 7",  # outside the public categories and labels
        "colour = NULL, y = NULL",
    ],
)
def test_one_replaced_row_moves_each_statistic_within_its_sensitivity(
    conn, scratch_schema, replacement
) -> None:
    for t in ("d0", "d1"):
        conn.execute(
            f"CREATE TABLE {t} AS SELECT g AS rid, ((g % 10) / 10.0 + 0.05)::float8 AS a,"
            " (((g * 7919) % 4001) / 1000.0 - 2)::float8 AS b,"
            " (ARRAY['red', 'green', 'blue'])[1 + g % 3] AS colour,"
            " CASE WHEN g % 4 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 500) g"
        )
    conn.execute(f"UPDATE d1 SET {replacement} WHERE rid = 1")
    out = [
        _exact(conn, _register(conn, f"{scratch_schema}.{t}", budget=1e300, accept=True)[1])
        for t in ("d0", "d1")
    ]
    m = 500
    for f, lo, hi in (("a", 0.0, 1.0), ("b", -2.0, 2.0)):
        half = (hi - lo) / 2
        mean = [o[(f, "mean", None)] for o in out]
        # S1 = sum of round((2t - 1) H): sensitivity 2H, i.e. (hi - lo) / m on the mean
        assert abs(mean[0] - mean[1]) <= (hi - lo) / m * (1 + 1e-9)
        # S2 = sum of A^2 in [0, H^2]: sensitivity H^2
        s2 = [
            ((o[(f, "stddev", None)] / half) ** 2 + (o[(f, "mean", None)] / half - 1 - lo / half)
             ** 2) * H**2 * m
            for o in out
        ]  # fmt: skip
        assert abs(s2[0] - s2[1]) <= H**2 * (1 + 1e-6)
        hist = [
            np.array([v for (g, s, _), v in o.items() if g == f and s == "histogram"]) for o in out
        ]
        assert np.abs(hist[0] - hist[1]).sum() <= 2  # L1 sensitivity 2
        for o in out:  # every value stays within the public bounds
            assert all(
                lo <= v <= hi for (g, s, _), v in o.items() if g == f and s in ("mean", "quantile")
            )
    for f in ("colour", "y"):
        freq = [np.array([v for (g, _, _), v in o.items() if g == f]) for o in out]
        assert np.abs(freq[0] - freq[1]).sum() <= 2


# ------------------------------------------------------------------------- other datasets


def test_an_array_feature_dataset(conn, scratch_schema) -> None:
    conn.execute(
        "CREATE TABLE arr AS SELECT g AS rid, ARRAY[(g % 10) / 10.0, (g % 4) - 1.5]::float8[] AS x,"
        " (g % 2)::float8 AS y FROM generate_series(1, 1000) g"
    )
    name = f"arr_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 1000, 0, name => %s, labels => '{0,1}',"
        " feature_bounds => '{{0,1},{-2,2}}')",
        (f"{scratch_schema}.arr", name),
    )
    out = _describe(conn, name, 50.0)
    assert {f for f, _, _ in out} == {None, "x[1]", "x[2]", "y"}
    assert out[("x[2]", "mean", None)][0] == pytest.approx(0.0, abs=0.05)
    assert out[("y", "frequency", "1")][0] == pytest.approx(500, abs=20)
    only = _describe(conn, name, 50.0, features=["x[2]"])
    assert {f for f, _, _ in only} == {None, "x[2]"}
    both = _describe(conn, name, 50.0, features=["x"])
    assert {f for f, _, _ in both} == {None, "x[1]", "x[2]"}
    with pytest.raises(psycopg.Error, match=r"no column 'x\[3\]'"):
        _describe(conn, name, 1.0, features=["x[3]"])


def test_a_text_label_and_a_regression_label(conn, scratch_schema) -> None:
    conn.execute(
        "CREATE TABLE tl AS SELECT g AS rid, (g % 10) / 10.0 AS a,"
        " (ARRAY['no', 'yes'])[1 + (g % 5 = 0)::int] AS y, (g % 7) - 3.0 AS z"
        " FROM generate_series(1, 1000) g"
    )
    text_name = f"tl_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a}', 'y', 100, 0, name => %s,"
        " labels => '{no,yes}'::text[], feature_bounds => '{{0,1}}')",
        (f"{scratch_schema}.tl", text_name),
    )
    out = _describe(conn, text_name, 50.0, features=["y"])
    assert out[("y", "frequency", "yes")][0] == pytest.approx(200, abs=20)
    assert out[("y", "frequency", "no")][0] == pytest.approx(800, abs=20)
    conn.execute("CREATE VIEW reg AS SELECT rid, a, z FROM tl")
    reg_name = f"reg_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a}', 'z', 100, 0, name => %s, labels => NULL,"
        " regression => true, label_bound => 4, feature_bounds => '{{0,1}}')",
        (f"{scratch_schema}.reg", reg_name),
    )
    out = _describe(conn, reg_name, 50.0, features=["z"])
    assert out[("z", "mean", None)][0] == pytest.approx(0.0, abs=0.05)
    assert out[("z", "stddev", None)][0] == pytest.approx(2.0, abs=0.1)
    assert out[("z", "quantile", "0.5")][0] == pytest.approx(0.0, abs=0.2)


def test_hostile_session_settings_change_nothing(conn, server_uri, dataset) -> None:
    """The same seeded release, bit for bit, in a calm session and under every hostile
    setting (tests/server/test_pinned_settings.py)."""
    _, name = dataset
    answers = []
    for hostile in (False, True):
        with psycopg.connect(server_uri, autocommit=True) as c:
            if hostile:
                _set_hostile(c)
            with c.cursor(binary=True) as cur:
                answers.append(
                    cur.execute(
                        "SELECT * FROM dpsql.describe(%s, 1, 1e-6, noise_seed => 3)", (name,)
                    ).fetchall()
                )
    assert answers[0] == answers[1]
