"""Bolt-on releases by the server: noise present and correctly scaled, sensitivities recorded,
refusals that charge nothing, one-vs-rest and multinomial, sanitized rows."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row
from scipy import stats

import dpsql
from dpsql import _core
from tests.pg_helpers import leftovers, load


def _register(conn, table: str, *, labels="{0,1}", budget=1e6, delta_budget=0.5, **kw) -> int:
    extra = "".join(f", {k} => %({k})s" for k in kw)
    (ds,) = conn.execute(
        f"SELECT dpsql.register_dataset(%(t)s, '{{x}}', 'y', epsilon_budget => %(b)s,"
        f" delta_budget => %(db)s, labels => %(l)s{extra})",
        {"t": table, "b": budget, "db": delta_budget, "l": labels, **kw},
    ).fetchone()
    return ds


def _model(conn, model_id):
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (model_id,)).fetchone()


@pytest.fixture
def binary(conn, scratch_schema):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 4)) * 0.4
    y = np.where(X @ [1.0, -1.0, 0.5, 0.2] > 0, 1.0, 0.0)
    load(conn, scratch_schema, "pts", X, y)
    table = f"{scratch_schema}.pts"
    _register(conn, table, name=f"pts_{scratch_schema}")
    return table, X, y


# The paper's constant step 1/sqrt(m), given (m = 300 rows: the binary fixture; a schedule
# given without a step is the default schedule with the default step since issue 45).
BASE = "epochs => 3, batch_size => 5, seed => 11, intercept => false"
PAPER = ", schedule => 'constant', step_size => 1 / sqrt(300)"
COMMON = BASE + PAPER


def _noiseless(conn, table, extra=""):
    """The data owner's noiseless run with the same permutation and settings."""
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%s, '{{x}}', 'y', 'logistic', {BASE}{extra or PAPER},"
        f" labels => '{{0,1}}', row_norm => 'clip')",
        (table,),
    ).fetchone()
    return np.asarray(_model(conn, mid)["weights"])


def test_epsilon_dp_noise_has_the_gamma_norm_law(conn, binary) -> None:
    """Fails if the noise is missing (norm 0), mis-scaled (KS and the mean), or not eq. (3).

    KS at p > 1e-3 on 200 seeded releases: deterministic (noise_seed fixed); for fresh seeds the
    false-failure probability would be 1e-3.
    """
    table, X, _ = binary
    w0 = _noiseless(conn, table)
    eps = 2.0
    norms, sens = [], set()
    for i in range(200):
        (mid,) = conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {COMMON}, privacy => 'bolton',"
            " epsilon => %s, noise_seed => %s)",
            (table, eps, 1000 + i),
        ).fetchone()
        m = _model(conn, mid)
        sens.add(m["sensitivity"])
        norms.append(np.linalg.norm(np.asarray(m["weights"]) - w0))
    (delta2,) = sens
    m_rows, b, k = 300, 5, 3
    assert delta2 == pytest.approx(2 * k * 1.0 * (1 / np.sqrt(m_rows)) / b, rel=1e-12)
    assert m["noise_scale"] == pytest.approx(delta2 / eps)
    d = X.shape[1]
    assert stats.kstest(norms, stats.gamma(d, scale=delta2 / eps).cdf).pvalue > 1e-3
    se = np.sqrt(d) * delta2 / eps / np.sqrt(len(norms))
    assert abs(np.mean(norms) - d * delta2 / eps) < 3 * se


def test_gaussian_noise_has_the_calibrated_sigma(conn, binary) -> None:
    """Per-coordinate noise over 150 seeded releases: chi-square bounds for sigma (two-sided
    alpha = 1e-3; deterministic under the fixed noise seeds)."""
    table, X, _ = binary
    w0 = _noiseless(conn, table)
    eps, delta = 0.5, 1e-5
    noise = []
    for i in range(150):
        (mid,) = conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {COMMON}, privacy => 'bolton',"
            " epsilon => %s, delta => %s, noise_seed => %s)",
            (table, eps, delta, 5000 + i),
        ).fetchone()
        m = _model(conn, mid)
        noise.append(np.asarray(m["weights"]) - w0)
    sigma = m["noise_scale"]
    assert sigma == pytest.approx(_core.gaussian_sigma(m["sensitivity"], eps, delta), rel=1e-12)
    z = np.concatenate(noise) / sigma
    dof = z.size
    chi2 = float(np.sum(z**2))
    assert stats.chi2(dof).ppf(5e-4) < chi2 < stats.chi2(dof).ppf(1 - 5e-4)
    assert abs(np.mean(z)) < 4 / np.sqrt(dof)


def test_releases_differ_without_a_noise_seed(conn, binary) -> None:
    table, _, _ = binary
    coefs = []
    for _ in range(2):
        (mid,) = conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {COMMON}, privacy => 'bolton',"
            " epsilon => 1)",
            (table,),
        ).fetchone()
        m = _model(conn, mid)
        assert m["params"]["privacy"]["noise_seed"] == "pg_strong_random"
        coefs.append(m["coef"])
    assert coefs[0] != coefs[1]


def test_strongly_convex_release_and_recorded_provenance(conn, binary) -> None:
    table, _, _ = binary
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 4, batch_size => 10,"
        " lambda => 0.01, privacy => 'bolton', epsilon => 0.8, delta => 1e-6)",
        (table,),
    ).fetchone()
    m = _model(conn, mid)
    # Algorithm 2: decreasing steps, R = 1/lambda, L = 2, Delta = 2L/(gamma m), not divided by b.
    assert m["schedule"] == "decreasing" and m["radius"] == pytest.approx(100.0)
    assert m["sensitivity"] == pytest.approx(2 * 2 / (0.01 * 300), rel=1e-12)
    assert m["privacy"] == "bolton" and m["epsilon"] == 0.8 and m["delta"] == 1e-6
    assert m["loss_history"] == [] and m["train_loss"] is None and m["clipped_rows"] is None
    p = m["params"]["privacy"]
    assert p["algorithm"].startswith("Algorithm 2") and p["neighbouring"].startswith("replace-one")
    ledger = conn.execute(
        "SELECT epsilon, delta, mechanism FROM dpsql.ledger WHERE model_id = %s", (mid,)
    ).fetchone()
    assert ledger == (0.8, 1e-6, "bolton")


def test_empirical_distance_of_neighbours_is_within_the_recorded_sensitivity(
    conn, scratch_schema
) -> None:
    """Noiseless runs on S and S' (one label flipped, same permutation) stay within Delta."""
    rng = np.random.default_rng(9)
    X = rng.normal(size=(200, 3)) * 0.5
    y = np.where(X[:, 0] > 0, 1.0, 0.0)
    y2 = y.copy()
    y2[17] = 1 - y2[17]
    load(conn, scratch_schema, "s1", X, y)
    load(conn, scratch_schema, "s2", X, y2)
    _register(conn, f"{scratch_schema}.s1", name=f"s1_{scratch_schema}")
    for extra in ("", ", lambda => 0.05, schedule => 'decreasing'"):
        w = [_noiseless(conn, f"{scratch_schema}.{t}", extra) for t in ("s1", "s2")]
        (mid,) = conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {BASE}{extra or PAPER},"
            " privacy => 'bolton', epsilon => 1)",
            (f"s1_{scratch_schema}",),
        ).fetchone()
        assert 0 < np.linalg.norm(w[0] - w[1]) <= _model(conn, mid)["sensitivity"] * (1 + 1e-9)


def test_one_vs_rest_splits_the_budget_and_multinomial_does_not(conn, scratch_schema) -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 4)) * 0.4
    y = np.argmax(X @ rng.normal(size=(4, 3)), axis=1).astype(float)
    load(conn, scratch_schema, "multi", X, y)
    _register(conn, f"{scratch_schema}.multi", labels="{0,1,2}", name=f"multi_{scratch_schema}")
    (ovr,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 3, batch_size => 10,"
        " schedule => 'constant', step_size => 0.05, privacy => 'bolton', epsilon => 3)",
        (f"multi_{scratch_schema}",),
    ).fetchone()
    m = _model(conn, ovr)
    assert np.asarray(m["coef"]).shape == (3, 4)
    assert m["params"]["privacy"]["one_vs_rest"] is True
    assert m["params"]["privacy"]["model_epsilon"] == pytest.approx(1.0)
    assert m["noise_scale"] == pytest.approx(m["sensitivity"] / 1.0)
    (mul,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'multinomial', epochs => 3, batch_size => 10,"
        " schedule => 'constant', step_size => 0.05, privacy => 'bolton', epsilon => 3)",
        (f"multi_{scratch_schema}",),
    ).fetchone()
    m2 = _model(conn, mul)
    assert m2["params"]["privacy"]["one_vs_rest"] is False
    # Multinomial: L = sqrt(2) (||p - e_y|| <= sqrt 2), one draw with the whole epsilon.
    assert m2["sensitivity"] == pytest.approx(np.sqrt(2) * m["sensitivity"], rel=1e-12)
    assert m2["noise_scale"] == pytest.approx(m2["sensitivity"] / 3.0)
    for mid in (ovr, mul):
        pred = conn.execute("SELECT dpsql.predict(%s, %s)", (mid, list(X[0]))).fetchone()[0]
        assert pred in (0.0, 1.0, 2.0)
        acc = conn.execute(
            "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, f"{scratch_schema}.multi")
        ).fetchone()[0]
        assert acc > 0.5


REFUSALS = [
    ("privacy => 'bolton', epsilon => 1, paper_minibatch_formula => true", "refused for real"),
    ("privacy => 'bolton', epsilon => 1, tolerance => 0.01", "tolerance is not allowed"),
    ("privacy => 'bolton', epsilon => 0", "epsilon must be"),
    ("privacy => 'bolton', epsilon => 'NaN'", "epsilon must be"),
    ("privacy => 'bolton'", "epsilon must be"),
    ("privacy => 'bolton', epsilon => 1, delta => 1", "delta must be"),
    ("privacy => 'bolton', epsilon => 1, delta => -0.1", "delta must be"),
    ("privacy => 'bolton', epsilon => 2, delta => 1e-6, gaussian => 'classic'", "epsilon < 1"),
    ("privacy => 'bolton', epsilon => 1, step_size => 5", "no sensitivity bound"),
    ("privacy => 'bolton', epsilon => 1, lambda => 0.1, radius => 0", "radius must be > 0"),
    ("privacy => 'bolton', epsilon => 1, shuffle => false", "shuffle"),
    ("privacy => 'bolton', epsilon => 1e9", "budget"),
    ("privacy => 'dp_magic', epsilon => 1", "unknown privacy mechanism"),
]


@pytest.mark.parametrize("args,message", REFUSALS, ids=[m for _, m in REFUSALS])
def test_refused_releases_charge_nothing(conn, binary, args, message) -> None:
    table, _, _ = binary
    before = leftovers(conn), conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()
    with pytest.raises(psycopg.Error, match=message):
        # (the refusal's own step, when it gives one, replaces the paper's)
        common = BASE + (", schedule => 'constant'" if "step_size" in args else PAPER)
        conn.execute(f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {common}, {args})", (table,))
    assert (leftovers(conn), conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()) == before


def test_linear_and_unregistered_sources_are_refused(conn, binary, scratch_schema) -> None:
    table, X, y = binary
    with pytest.raises(psycopg.Error, match="not 'linear'"):
        conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'linear', {COMMON}, privacy => 'bolton',"
            " epsilon => 1)",
            (table,),
        )
    load(conn, scratch_schema, "unregistered", X, y)
    with pytest.raises(psycopg.Error, match="not a registered dataset"):
        conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {COMMON},"
            " privacy => 'bolton', epsilon => 1)",
            (f"{scratch_schema}.unregistered",),
        )
    with pytest.raises(psycopg.Error, match="registered with features"):
        conn.execute(
            f"SELECT dpsql.train(%s, '{{z}}', NULL, 'logistic', {COMMON},"
            " privacy => 'bolton', epsilon => 1)",
            (table,),
        )


def test_private_runs_turn_bad_rows_into_null_records(conn, binary) -> None:
    table, _, _ = binary
    conn.execute(f"UPDATE {table} SET x[2] = 'NaN' WHERE rid = 3")
    conn.execute(f"UPDATE {table} SET y = 7 WHERE rid = 4")
    conn.execute(f"UPDATE {table} SET x = NULL WHERE rid = 5")
    # The data owner's non-private run reports the bad rows...
    with pytest.raises(psycopg.Error):
        _noiseless(conn, table)
    # ...a private run cannot: an error would reveal a value. It trains and releases.
    before = leftovers(conn)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {COMMON}, privacy => 'bolton',"
        " epsilon => 1)",
        (table,),
    ).fetchone()
    assert _model(conn, mid)["rows"] == 300
    tables, runs, models = leftovers(conn)
    assert (tables, runs, models) == (before[0], before[1], before[2] + 1)


def test_fresh_permutations_and_feature_bounds(conn, scratch_schema) -> None:
    rng = np.random.default_rng(4)
    X = rng.uniform(0, 10, size=(200, 2))
    y = np.where(X[:, 0] > X[:, 1], 1.0, -1.0)
    load(conn, scratch_schema, "raw", X, y)
    _register(
        conn,
        f"{scratch_schema}.raw",
        labels="{-1,1}",
        name=f"raw_{scratch_schema}",
        feature_bounds="{{0,10},{0,10}}",
    )
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 4, batch_size => 5,"
        " schedule => 'constant', step_size => 1 / sqrt(200), privacy => 'bolton', epsilon => 5,"
        " permutation => 'fresh')",
        (f"raw_{scratch_schema}",),
    ).fetchone()
    m = _model(conn, mid)
    assert m["params"]["permutation"] == "fresh"
    assert m["sensitivity"] == pytest.approx(
        _core.bolton_sensitivity(
            "constant",
            eta=1 / np.sqrt(200),
            lipschitz=1,
            smoothness=1,
            rows=200,
            batch_size=5,
            epochs=4,
            fresh=True,
        )
    )


def test_python_boltOn(server_uri, binary) -> None:
    table, X, y = binary
    with dpsql.connect(server_uri) as db:
        m = db.train(
            table,
            features=None,
            label=None,
            model="logistic",
            epochs=3,
            batch_size=5,
            seed=2,
            privacy=dpsql.BoltOn(epsilon=1.0, delta=1e-6),
        )
        assert m.row["privacy"] == "bolton" and m.row["delta"] == 1e-6
        assert m.coef_.shape == (4,) and set(np.unique(m.predict(X))) <= {0.0, 1.0}


def test_private_tuning_algorithm_3(conn, scratch_schema) -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=(700, 3)) * 0.5
    y = np.where(X @ [1.0, 2.0, -1.0] > 0, 1.0, 0.0)
    load(conn, scratch_schema, "tune", X, y)
    ds = _register(conn, f"{scratch_schema}.tune", name=f"tune_{scratch_schema}", budget=5)
    before = leftovers(conn)
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', batch_size => 5, privacy => 'bolton',"
        " epsilon => 2, tuning_lambdas => '{0.001,0.01,0.1}', tuning_epochs => '{2,4}')",
        (f"tune_{scratch_schema}",),
    ).fetchone()
    m = _model(conn, mid)
    t = m["params"]["privacy"]["tuning"]
    assert t["candidates"] == 6 and t["portion_rows"] == 100
    assert t["chosen_lambda"] in (0.001, 0.01, 0.1) and t["chosen_epochs"] in (2, 4)
    # The chosen candidate was trained on one portion: its sensitivity uses m = 100.
    assert m["rows"] == 100 and m["lambda"] == t["chosen_lambda"]
    assert m["sensitivity"] == pytest.approx(2 * 2 / (t["chosen_lambda"] * 100), rel=1e-12)
    # Charged once, for the whole procedure; nothing left behind but the model.
    spent = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE dataset_id = %s", (ds,)
    ).fetchone()[0]
    assert spent == 2
    tables, runs, models = leftovers(conn)
    assert (tables, runs, models) == (before[0], before[1], before[2] + 1)
    with pytest.raises(psycopg.Error, match="portions"):
        conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', batch_size => 300,"
            " privacy => 'bolton', epsilon => 1, tuning_lambdas => '{0.01,0.1}')",
            (f"tune_{scratch_schema}",),
        )


def test_bounded_features_are_transformed_at_prediction_too(conn, scratch_schema) -> None:
    rng = np.random.default_rng(12)
    X = rng.uniform(0, 100, size=(1000, 2))
    y = np.where(X[:, 0] > X[:, 1], 1.0, -1.0)
    load(conn, scratch_schema, "wide", X, y)
    _register(
        conn,
        f"{scratch_schema}.wide",
        labels="{-1,1}",
        name=f"wide_{scratch_schema}",
        feature_bounds="{{0,100},{0,100}}",
    )
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 5, batch_size => 10,"
        " step_size => 0.5, privacy => 'bolton', epsilon => 20, intercept => false)",
        (f"wide_{scratch_schema}",),
    ).fetchone()
    acc = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (mid, f"{scratch_schema}.wide")
    ).fetchone()[0]
    assert acc > 0.9
    # predict maps [0, 100] onto [-1, 1] and clips to the unit ball, like training did.
    p = conn.execute("SELECT dpsql.predict(%s, '{90,10}')", (mid,)).fetchone()[0]
    w = np.asarray(_model(conn, mid)["weights"])
    v = np.array([0.8, -0.8]) / np.linalg.norm([0.8, -0.8])
    assert p == pytest.approx(1 / (1 + np.exp(-(w @ v))), rel=1e-12) and p > 0.5


def test_concurrent_trainings_never_overspend(conn, binary, server_uri) -> None:
    """Six real connections release at once against a budget for two: exactly two succeed.

    Deterministic: charges serialise on the dataset's row lock (no false failures)."""
    import threading

    table, _, _ = binary
    name = table.replace(".", "_") + "_c"
    conn.execute(f"CREATE TABLE {table}_copy AS SELECT * FROM {table}")
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1.2,"
        " labels => '{0,1}', name => %s)",
        (f"{table}_copy", name),
    )
    barrier = threading.Barrier(6)
    outcomes: list[str] = []

    def release() -> None:
        with psycopg.connect(server_uri, autocommit=True) as c:
            barrier.wait()
            try:
                c.execute(
                    "SELECT dpsql.train(%s, NULL, NULL, epochs => 2, privacy => 'bolton',"
                    " epsilon => 0.5)",
                    (name,),
                )
                outcomes.append("ok")
            except psycopg.Error as err:
                outcomes.append(err.sqlstate or "?")

    threads = [threading.Thread(target=release) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["DP001"] * 4 + ["ok"] * 2
    spent = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE name = %s", (name,)
    ).fetchone()[0]
    assert spent == 1.0


def test_parallel_bolton_is_the_convex_constant_step_algorithm(conn, binary) -> None:
    table, _, _ = binary
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {COMMON}, parallel_workers => 2,"
        " privacy => 'bolton', epsilon => 1)",
        (table,),
    ).fetchone()
    m = _model(conn, mid)
    # Averaging shard models with weights n_s/m <= 1 keeps 2 k L eta / b.
    assert m["sensitivity"] == pytest.approx(2 * 3 / np.sqrt(300) / 5, rel=1e-12)
    with pytest.raises(psycopg.Error, match="parallel bolt-on runs need"):
        conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {BASE}, lambda => 0.1,"
            " parallel_workers => 2, privacy => 'bolton', epsilon => 1)",
            (table,),
        )
