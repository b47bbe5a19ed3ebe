"""Issue 44, item 1: private evaluation on a registered dataset (61_private_evaluate.sql).

An analyst granted a test dataset, without SELECT on its table, evaluates a private model on it
with epsilon: the metrics come from noisy statistics, charged once to that dataset before any
row is read; every refusal that needs no row comes first. The statistics' sensitivities are
checked on adversarial neighbouring tables, the noise's scale statistically, and the metrics
against the noiseless ones at a large epsilon."""

from __future__ import annotations

import math
import uuid

import numpy as np
import psycopg
import pytest

from tests.server.test_durable_charge import VARIANTS, _undo
from tests.server.test_pinned_settings import _set_hostile

ROWS = 3000
EVALUATE = "SELECT metric, value, rows, baseline, metrics FROM dpsql.evaluate(%s, %s{extra})"


def _evaluate(c: psycopg.Connection, mid: int, name: str, extra: str = "", args: tuple = (), **kw):
    return c.execute(EVALUATE.format(extra=extra), (mid, name, *args), **kw).fetchone()


def _register(conn, source: str, *, budget: float = 1000.0, **kw) -> tuple[int, str]:
    name = f"pe_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    (ds,) = conn.execute(
        f"SELECT dpsql.register_dataset(%(source)s, '{{a,b}}', 'y', %(budget)s, 1e-3,"
        f" name => %(name)s, feature_bounds => '{{{{-1,1}},{{-1,1}}}}'{extra})",
        {"source": source, "name": name, "budget": budget, **kw},
    ).fetchone()
    return ds, name


def _entries(conn, ds: int) -> list[tuple]:
    return conn.execute(
        "SELECT mechanism, epsilon, delta, note, dp_event FROM dpsql.ledger_entries"
        " WHERE dataset_id = %s ORDER BY entry_id",
        (ds,),
    ).fetchall()


def _tables(conn) -> None:
    for t, n, seed in (("cls_train", 2000, 1), ("cls_test", ROWS, 2)):
        conn.execute(
            f"CREATE TABLE {t} AS SELECT g AS rid, a, b,"
            " CASE WHEN a - b / 2 + (random() - 0.5) / 2 > 0.1 THEN 1 ELSE -1 END AS y"
            " FROM (SELECT g, 2 * random() - 1 AS a, 2 * random() - 1 AS b"
            f"        FROM (SELECT setseed({seed / 10}), 1) s, generate_series(1, {n}) g) r"
        )
    for t, n, seed in (("reg_train", 2000, 3), ("reg_test", ROWS, 4)):
        conn.execute(
            f"CREATE TABLE {t} AS SELECT g AS rid, a, b, (a + b) / 2 + (random() - 0.5) / 5 AS y"
            " FROM (SELECT g, 2 * random() - 1 AS a, 2 * random() - 1 AS b"
            f"        FROM (SELECT setseed({seed / 10}), 1) s, generate_series(1, {n}) g) r"
        )
    conn.execute(
        "CREATE TABLE multi_test AS SELECT g AS rid, a, b,"
        " CASE WHEN a > 0.3 THEN 2 WHEN a > -0.3 THEN 1 ELSE 0 END AS y"
        " FROM (SELECT g, 2 * random() - 1 AS a, 2 * random() - 1 AS b"
        "        FROM (SELECT setseed(0.5), 1) s, generate_series(1, 1500) g) r"
    )
    conn.execute("CREATE TABLE multi_train AS SELECT * FROM multi_test")


@pytest.fixture
def setup(conn, scratch_schema, make_role):
    """Train and test datasets (binary, regression, three classes) granted to an analyst, and
    the analyst's private models on the train sets: (connect, datasets, models)."""
    _tables(conn)
    s = scratch_schema
    ds = {
        "cls_train": _register(conn, f"{s}.cls_train"),
        "cls_test": _register(conn, f"{s}.cls_test"),
        "reg_train": _register(conn, f"{s}.reg_train", labels=None, label_bound=1.5),
        "reg_test": _register(conn, f"{s}.reg_test", labels=None, label_bound=1.5),
        "multi_train": _register(conn, f"{s}.multi_train", labels=[0, 1, 2]),
        "multi_test": _register(conn, f"{s}.multi_test", labels=[0, 1, 2]),
    }
    name, connect = make_role("analyst", "dpsql_analyst")
    for d, _ in ds.values():
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (d, name))
    models = {}
    with connect() as a:
        for kind, model in (("cls", "logistic"), ("reg", "linear"), ("multi", "multinomial")):
            privacy = "adassp" if kind == "reg" else "bolton"
            (models[kind],) = a.execute(
                f"SELECT dpsql.train(%s, NULL, NULL, model => '{model}', privacy => '{privacy}',"
                " epsilon => 5, delta => 1e-6)",
                (ds[f"{kind}_train"][1],),
            ).fetchone()
    return name, connect, ds, models


# ------------------------------------------------------------------ the analyst's path


def test_an_analyst_evaluates_privately_and_is_charged_once(conn, setup) -> None:
    _, connect, ds, models = setup
    test_id, test_name = ds["cls_test"]
    with connect() as a:
        schema = conn.execute("SELECT current_schema").fetchone()[0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute(f"SELECT count(*) FROM {schema}.cls_test")
        metric, value, rows, baseline, m = _evaluate(a, models["cls"], test_name, ", epsilon => 1")
    assert (metric, rows) == ("accuracy", ROWS)
    assert 0.6 < value <= 1 and value == m["accuracy"] and baseline == m["baseline"]["accuracy"]
    for key in ("accuracy", "balanced_accuracy", "f1", "roc_auc"):
        assert 0 < m["noise_sd"][key] < 0.05, key
    assert m["private"]["mechanism"] == "discrete_laplace"
    assert m["private"]["noise_seed"] == "pg_strong_random"
    assert len(m["private"]["statistics"]["confusion"]) == 4
    assert len(m["private"]["statistics"]["histogram"]) == 32
    assert "log_loss" not in m
    [(mechanism, eps, delta, note, event)] = _entries(conn, test_id)
    assert (mechanism, eps, delta) == ("evaluate", 1.0, 0.0)
    assert f"model {models['cls']}" in note
    assert event == {  # confusion, histograms, the correct count
        "type": "Composed",
        "events": [{"type": "EpsilonDelta", "epsilon": e, "delta": 0} for e in (0.25, 0.25, 0.5)],
    }
    assert isinstance(m["private"]["statistics"]["correct"], (int, float))
    outcome = conn.execute(
        "SELECT outcome FROM dpsql.ledger WHERE dataset_id = %s", (test_id,)
    ).fetchone()[0]
    assert outcome == "released"


def test_regression_and_several_classes(conn, setup) -> None:
    _, connect, ds, models = setup
    with connect() as a:
        metric, value, rows, baseline, m = _evaluate(
            a, models["reg"], ds["reg_test"][1], ", epsilon => 1"
        )
        assert (metric, rows) == ("mse", ROWS)
        # (sum r^2's sensitivity is (2 B)^2 = 9 at 0.3 epsilon: an sd of 0.014 over 3,000 rows)
        assert value >= 0 and m["noise_sd"]["mse"] < 0.03 and m["noise_sd"]["r2"] < 0.2
        assert m["baseline"]["predictor"] == "mean" and "mae" in m["baseline"]
        metric, value, rows, baseline, m = _evaluate(
            a, models["multi"], ds["multi_test"][1], ", epsilon => 1, delta => 1e-6"
        )
        assert (metric, rows) == ("accuracy", 1500)
        assert value > baseline and m["private"]["mechanism"] == "gaussian"
        assert len(m["private"]["statistics"]["confusion"]) == 9
    [(_, _, _, _, event)] = _entries(conn, ds["multi_test"][0])
    assert event["type"] == "Gaussian" and event["noise_multiplier"] > 0


def test_the_ledger_event_composes_to_the_charge(conn, setup) -> None:
    """The recorded DpEvent, composed by dp-accounting, is within the charged (epsilon, delta)."""
    from dpsql import ledger_events

    _, connect, ds, models = setup
    with connect() as a:
        _evaluate(a, models["cls"], ds["cls_test"][1], ", epsilon => 0.7, delta => 1e-6")
        _evaluate(a, models["reg"], ds["reg_test"][1], ", epsilon => 0.7")
    for kind in ("cls_test", "reg_test"):
        [(_, eps, delta, _, event)] = _entries(conn, ds[kind][0])
        got = ledger_events.compose([ledger_events.from_json(event)], max(delta, 1e-12))
        assert got["epsilon_pld"] <= eps * (1 + 1e-3), (kind, got)
        assert got["epsilon_pld"] >= eps * 0.9, (kind, got)  # and the charge is not loose


def test_without_epsilon_an_analyst_is_refused_with_a_hint(conn, setup, scratch_schema) -> None:
    _, connect, ds, models = setup
    test_id, test_name = ds["cls_test"]
    with connect() as a:
        for source in (test_name, f"{scratch_schema}.cls_test"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
                _evaluate(a, models["cls"], source)
            assert "epsilon" in err.value.diag.message_primary
            assert "epsilon =>" in (err.value.diag.message_hint or "")
    assert _entries(conn, test_id) == []


def test_the_owner_keeps_the_noiseless_path_and_epsilon_on_a_table_is_refused(
    conn, setup, scratch_schema
) -> None:
    _, _, ds, models = setup
    table = f"{scratch_schema}.cls_test"
    metric, value, rows, _, m = _evaluate(conn, models["cls"], table)
    assert rows == ROWS and "noise_sd" not in m
    with pytest.raises(psycopg.errors.UndefinedObject):  # not a registered dataset
        _evaluate(conn, models["cls"], f"SELECT * FROM {table}", ", epsilon => 1")
    assert _entries(conn, ds["cls_test"][0]) == []


REFUSALS = [
    # (what, model key or literal id, dataset key, extra, SQLSTATE)
    ("unknown model", "999999999", "cls_test", ", epsilon => 1", "42704"),
    ("a regression model on a classification set", "reg", "cls_test", ", epsilon => 1", "22023"),
    ("different labels", "multi", "cls_test", ", epsilon => 1", "22023"),
    ("features argument", "cls", "cls_test", ", features => '{a}', epsilon => 1", "22023"),
    ("label argument", "cls", "cls_test", ", label => 'b', epsilon => 1", "22023"),
    ("zero epsilon", "cls", "cls_test", ", epsilon => 0", "22023"),
    ("negative epsilon", "cls", "cls_test", ", epsilon => -1", "22023"),
    ("NaN epsilon", "cls", "cls_test", ", epsilon => 'NaN'", "22023"),
    ("infinite epsilon", "cls", "cls_test", ", epsilon => 'Infinity'", "22023"),
    ("tiny epsilon", "cls", "cls_test", ", epsilon => 1e-10", "22023"),
    ("delta 1", "cls", "cls_test", ", epsilon => 1, delta => 1", "22023"),
    ("negative delta", "cls", "cls_test", ", epsilon => 1, delta => -0.1", "22023"),
    ("noise seed", "cls", "cls_test", ", epsilon => 1, noise_seed => 7", "42501"),
    ("budget", "cls", "cls_test", ", epsilon => 5000", "DP001"),
]


@pytest.mark.parametrize(
    "what, model, dataset, extra, state", REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_public_refusals_come_before_the_charge(
    conn, setup, what, model, dataset, extra, state
) -> None:
    _, connect, ds, models = setup
    mid = models[model] if model in models else int(model)
    with connect() as a, pytest.raises(psycopg.Error) as err:
        _evaluate(a, mid, ds[dataset][1], extra)
    assert err.value.sqlstate == state, err.value
    assert _entries(conn, ds[dataset][0]) == []


def test_models_and_datasets_the_analyst_cannot_see(conn, setup, make_role, scratch_schema) -> None:
    _, connect, ds, models = setup
    other, connect_other = make_role("other", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds["cls_train"][0], other))
    conn.execute(f"CREATE TABLE {scratch_schema}.secret AS SELECT * FROM {scratch_schema}.cls_test")
    secret_id, secret = _register(conn, f"{scratch_schema}.secret")
    # a noiseless model of the owner's, and a seeded (not private) release
    (noiseless,) = conn.execute(
        f"SELECT dpsql.train('{scratch_schema}.cls_train', '{{a,b}}', 'y', epochs => 1)"
    ).fetchone()
    with connect() as a:
        for mid in (noiseless,):
            with pytest.raises(psycopg.errors.UndefinedObject):
                _evaluate(a, mid, ds["cls_test"][1], ", epsilon => 1")
        with pytest.raises(psycopg.errors.UndefinedObject):  # not granted: unknown
            _evaluate(a, models["cls"], secret, ", epsilon => 1")
    # the model's dataset is granted to the other analyst, the test set is not
    with connect_other() as o, pytest.raises(psycopg.errors.UndefinedObject):
        _evaluate(o, models["cls"], ds["cls_test"][1], ", epsilon => 1")
    assert _entries(conn, ds["cls_test"][0]) == [] and _entries(conn, secret_id) == []


def test_a_model_of_other_features_is_refused(conn, setup, scratch_schema) -> None:
    _, connect, ds, _ = setup
    conn.execute(
        f"CREATE TABLE {scratch_schema}.wide AS"
        f" SELECT *, a * b AS c FROM {scratch_schema}.cls_train"
    )
    (wide_id,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b,c}', 'y', 100, 1e-3, name => %s,"
        " feature_bounds => '{{-1,1},{-1,1},{-1,1}}')",
        (f"{scratch_schema}.wide", f"pe_{uuid.uuid4().hex[:8]}"),
    ).fetchone()
    (name,) = conn.execute(
        "SELECT name FROM dpsql.datasets WHERE dataset_id = %s", (wide_id,)
    ).fetchone()
    (analyst,) = conn.execute(
        "SELECT role FROM dpsql.dataset_grants WHERE dataset_id = %s", (ds["cls_test"][0],)
    ).fetchone()
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (wide_id, analyst))
    with connect() as a:
        (mid,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (name,)
        ).fetchone()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="features"):
            _evaluate(a, mid, ds["cls_test"][1], ", epsilon => 1")
    assert _entries(conn, ds["cls_test"][0]) == []


@pytest.mark.parametrize("kind", ["cls", "reg", "multi"])
@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_hostile_session_settings_change_nothing(conn, setup, kind, delta) -> None:
    """The same seeded release under test_pinned_settings' hostile settings and a search_path
    that shadows the built-ins it calls: the same released statistics and metrics."""
    _, _, ds, models = setup
    call = ", epsilon => 1, delta => %s, noise_seed => 11"
    # (binary: a float8 as text would follow the client's extra_float_digits)
    plain = _evaluate(conn, models[kind], ds[f"{kind}_test"][1], call, (delta,), binary=True)
    conn.execute("CREATE SCHEMA IF NOT EXISTS hostile_pe")
    for f in ("width_bucket(float8, float8[])", "abs(float8)", "round(float8)"):
        conn.execute(
            f"CREATE OR REPLACE FUNCTION hostile_pe.{f} RETURNS int LANGUAGE sql AS 'SELECT 1'"
        )
    _set_hostile(conn)
    conn.execute("SET search_path = hostile_pe, pg_catalog, public")
    try:
        hostile = _evaluate(conn, models[kind], ds[f"{kind}_test"][1], call, (delta,), binary=True)
    finally:
        conn.execute("RESET ALL")
        conn.execute("DROP SCHEMA hostile_pe CASCADE")
    assert hostile[:4] == plain[:4]
    assert hostile[4]["private"] == plain[4]["private"]
    assert hostile[4]["noise_sd"] == plain[4]["noise_sd"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_variant_takes_the_charge_back(conn, setup, variant) -> None:
    _, connect, ds, models = setup
    test_id, test_name = ds["cls_test"]
    call = "SELECT (dpsql.evaluate(%s, %s, epsilon => 1)).value"
    with connect() as a:
        _undo(a, variant, call, (models["cls"], test_name))
    assert [e[:2] for e in _entries(conn, test_id)] == [("evaluate", 1.0)]


def test_preview_charges_nothing(conn, setup) -> None:
    _, connect, ds, models = setup
    test_id, test_name = ds["cls_test"]
    with connect() as a:
        (p,) = a.execute(
            "SELECT dpsql.preview_evaluate(%s, %s, 0.5, 1e-6)", (models["cls"], test_name)
        ).fetchone()
        (refused,) = a.execute(
            "SELECT dpsql.preview_evaluate(%s, %s, 1e6)", (models["cls"], test_name)
        ).fetchone()
        (bad,) = a.execute(
            "SELECT dpsql.preview_evaluate(%s, %s, -1)", (models["cls"], test_name)
        ).fetchone()
    assert p["dataset"] == test_name and p["mechanism"] == "evaluate"
    assert (p["epsilon"], p["delta"]) == (0.5, 1e-6) and p["dp_event"]["type"] == "Gaussian"
    assert p["budget"]["epsilon_remaining"] == 1000 and "refused" not in p
    assert refused["refused"]["sqlstate"] == "DP001"
    assert bad["refused"]["sqlstate"] == "22023"
    assert _entries(conn, test_id) == []


def test_the_preview_runs_only_the_plan_as_the_release_would(conn, setup, make_role) -> None:
    """Issue 45: dpsql.preview_evaluate is a definer function that runs evaluate's plan. As
    another analyst granted the test set: the first analyst's model is refused as the release
    refuses it; the plan's helper is not the analyst's to call."""
    _, connect, ds, models = setup
    test_id, test_name = ds["cls_test"]
    other, connect_other = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (test_id, other))
    with connect_other() as b:
        (refused,) = b.execute(
            "SELECT dpsql.preview_evaluate(%s, %s, 0.5)", (models["cls"], test_name)
        ).fetchone()
        with pytest.raises(psycopg.Error) as release:
            b.execute("SELECT dpsql.evaluate(%s, %s, epsilon => 0.5)", (models["cls"], test_name))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            b.execute(
                "SELECT dpsql_internal._evaluate_release_plan(%s, %s, NULL, NULL, 0.5, 0, NULL)",
                (models["cls"], test_name),
            )
    assert refused["refused"]["sqlstate"] == release.value.sqlstate
    assert refused["refused"]["message"] == release.value.diag.message_primary
    assert _entries(conn, test_id) == []


# ------------------------------------------------------------------ sensitivity and noise


def _plan_and_stats(conn, mid: int, ds: int, delta: float = 0.0) -> tuple[dict, np.ndarray]:
    plan, stats = conn.execute(
        "SELECT p, dpsql_internal._evaluation_statistics(m, d, p)"
        "  FROM dpsql.models m, dpsql.datasets d,"
        "       LATERAL dpsql_internal._private_evaluation_plan(m, d, 1, %s) p"
        " WHERE m.model_id = %s AND d.dataset_id = %s",
        (delta, mid, ds),
    ).fetchone()
    return plan, np.asarray(stats, dtype=float)


def _blocks(plan: dict, stats: np.ndarray) -> list[tuple[dict, np.ndarray]]:
    out, at = [], 0
    for b in plan["blocks"]:
        out.append((b, stats[at : at + b["size"]]))
        at += b["size"]
    return out


# One row replaced by each of these (a, b, y): extremes, malformed values, labels outside the set.
ADVERSARIAL = [
    ("1", "1", "1"),
    ("-1", "-1", "-1"),
    ("1e300", "-1e300", "1"),
    ("'NaN'", "0", "1"),
    ("0", "0", "'NaN'"),
    ("NULL", "0", "-1"),
    ("0", "0", "NULL"),
    ("0", "0", "7"),
    ("'Infinity'", "0", "-1"),
    ("0.01", "-0.01", "-1e300"),
    ("0", "0", "1e300"),
]


@pytest.mark.parametrize("kind", ["cls", "reg", "multi"])
def test_each_statistic_moves_by_at_most_its_sensitivity(conn, setup, scratch_schema, kind) -> None:
    """Replace-one neighbours: each released block moves by at most its stated L1 (in its
    integer steps when quantized) and L2 sensitivity, for adversarial replacements of rows
    with extreme, malformed and out-of-set values."""
    _, _, ds, models = setup
    table = f"{scratch_schema}.{kind}_test"
    conn.execute(
        f"ALTER TABLE {table} ALTER a TYPE float8, ALTER b TYPE float8, ALTER y TYPE float8"
    )
    test_id = ds[f"{kind}_test"][0]
    rows = [1, 2, 3]
    for delta in (0.0, 1e-6):
        for rid in rows:
            for a, b, y in ADVERSARIAL:
                base = conn.execute(
                    f"SELECT a, b, y FROM {table} WHERE rid = %s", (rid,)
                ).fetchone()
                plan, before = _plan_and_stats(conn, models[kind], test_id, delta)
                conn.execute(f"UPDATE {table} SET a = {a}, b = {b}, y = {y} WHERE rid = %s", (rid,))
                _, after = _plan_and_stats(conn, models[kind], test_id, delta)
                conn.execute(
                    f"UPDATE {table} SET a = %s, b = %s, y = %s WHERE rid = %s", (*base, rid)
                )
                for (blk, x0), (_, x1) in zip(
                    _blocks(plan, before), _blocks(plan, after), strict=True
                ):
                    d = np.abs(x1 - x0)
                    if plan["mechanism"] == "discrete_laplace":
                        assert d.sum() <= blk["l1"] / blk["unit"] * (1 + 1e-12), (blk, a, b, y)
                        assert np.all(x1 == np.round(x1)), blk  # integer steps
                    else:
                        assert math.sqrt((d**2).sum()) <= blk["l2"] * (1 + 1e-12), (blk, a, b, y)


def test_the_noise_has_its_stated_scale(conn, setup) -> None:
    """Released statistics minus the exact ones, divided by each statistic's stated noise sd,
    over 60 seeded releases of each mechanism (2,160 binary draws each): their variance is
    within [0.7, 1.4] and their mean within 0.2 of 0 (a missing noise gives 0, a noise of the
    wrong scale by 1.5x falls outside; sd of the variance estimate < 5%: false-failure
    rate < 1e-6)."""
    _, _, ds, models = setup
    test_id, test_name = ds["cls_test"]
    for delta in (0.0, 1e-6):
        plan, exact = _plan_and_stats(conn, models["cls"], test_id, delta)
        sd = np.concatenate([np.full(b["size"], b["noise_sd"]) for b in plan["blocks"]])
        draws = []
        for seed in range(60):
            m = _evaluate(
                conn,
                models["cls"],
                test_name,
                ", epsilon => 1, delta => %s, noise_seed => %s",
                (delta, seed),
            )[4]
            released = np.concatenate(
                [
                    np.atleast_1d(np.asarray(m["private"]["statistics"][b["name"]], dtype=float))
                    for b in plan["blocks"]
                ]
            )
            draws.append((released - exact) / sd)
        z = np.concatenate(draws)
        assert 0.7 < z.var() < 1.4, (delta, z.var())
        assert abs(z.mean()) < 0.2, (delta, z.mean())


def test_the_metrics_noise_sd_is_their_spread(conn, setup) -> None:
    """The accuracy's stated noise sd against its spread over 150 seeded releases: within a
    factor 0.7 .. 1.4 (the sample sd's relative error is about 6%: false-failure rate < 1e-6)."""
    _, _, ds, models = setup
    test_id, test_name = ds["cls_test"]
    values, sds = [], []
    for seed in range(150):
        m = _evaluate(
            conn, models["cls"], test_name, ", epsilon => 0.2, noise_seed => %s", (seed,)
        )[4]
        values.append(m["accuracy"])
        sds.append(m["noise_sd"]["accuracy"])
    ratio = np.std(values) / np.mean(sds)
    assert 0.7 < ratio < 1.4, ratio


def test_large_epsilon_agrees_with_the_noiseless_metrics(conn, setup, scratch_schema) -> None:
    """At epsilon 900 the noise is tiny: the private metrics are the noiseless ones within six
    stated noise sds and the quantization's error."""
    _, _, ds, models = setup
    keys = {
        "cls": ["accuracy", "balanced_accuracy", "f1"],
        "reg": ["mse", "mae", "r2"],
        "multi": ["accuracy", "balanced_accuracy", "f1"],
    }
    for kind, names in keys.items():
        exact = _evaluate(conn, models[kind], f"{scratch_schema}.{kind}_test")[4]
        noisy = _evaluate(conn, models[kind], ds[f"{kind}_test"][1], ", epsilon => 900")[4]
        for key in names:
            tol = 6 * noisy["noise_sd"][key] + 1e-5
            assert noisy[key] == pytest.approx(exact[key], abs=tol), (kind, key)
            tol = 6 * noisy["noise_sd"]["baseline"].get(key, 0) + 1e-5
            assert noisy["baseline"][key] == pytest.approx(exact["baseline"][key], abs=tol)
        if kind == "cls":  # the 16-bin grid's ties: near the exact AUC
            assert noisy["roc_auc"] == pytest.approx(exact["roc_auc"], abs=0.02)


def test_a_metric_at_its_clamp_keeps_its_noise_sd(conn) -> None:
    """A noisy release whose MSE (or accuracy) is clamped at its bound still says how noisy it
    is: the sds are differences of the metrics before their clamps (bench/private_evaluate found
    "mse 0 +- 0, r2 1 +- 0" on 13 of 200 releases at epsilon 0.05)."""
    # regression: n, sum y, sum y^2, sum r^2 (noisy: negative), sum |r|, sum |y - c|
    s = [1000.0, 50.0, 400.0, -300.0, 200.0, 300.0]
    sd = [10.0, 40.0, 80.0, 400.0, 40.0, 40.0]
    (metrics,) = conn.execute(
        "SELECT dpsql_internal._metrics_of_statistics('regression', %s)", (s,)
    ).fetchone()
    assert metrics["mse"] == 0 and metrics["r2"] == 1
    (noise,) = conn.execute(
        "SELECT dpsql_internal._metrics_noise_sd('regression', %s, %s)", (s, sd)
    ).fetchone()
    assert noise["mse"] == pytest.approx(0.4, rel=0.05) and noise["r2"] > 0.5
    # two classes: a noisy confusion matrix whose accuracy clamps at 1
    binary = [600.0, -20.0, -30.0, 450.0] + [0.0] * 32
    (noise,) = conn.execute(
        "SELECT dpsql_internal._metrics_noise_sd('binary', %s, %s)", (binary, [20.0] * 36)
    ).fetchone()
    assert noise["accuracy"] > 0.01
