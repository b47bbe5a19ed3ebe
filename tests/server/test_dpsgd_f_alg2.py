"""DPSGD-F, Algorithm 2 (Sun et al. 2024, §5): the map back, the feature clipping, the charge, the
noise scale of the private mean and the s. 7 counterexample (DPSGD fails, DPSGD-F succeeds)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import pytest
from psycopg.rows import dict_row
from scipy import stats

import dpsql
from tests.pg_helpers import load

_SOURCES: dict[str, str] = {}


def _register(conn, schema: str, X: np.ndarray, y: np.ndarray, **kw) -> str:
    source = load(conn, schema, f"t_{uuid.uuid4().hex[:6]}", X, y)
    name = f"a_{uuid.uuid4().hex[:8]}"
    kw = {"labels": [0.0, 1.0], **kw}
    extra = "".join(f", {k} => %({k})s" for k in kw)
    conn.execute(
        f"SELECT dpsql.register_dataset(%(s)s, '{{x}}', 'y', 1e6, 0.5, name => %(n)s{extra})",
        {"s": source, "n": name, **kw},
    )
    _SOURCES[name] = source
    return name


def _train(conn, name: str, model: str = "logistic", **kw) -> dict:
    args = {"privacy": "dpsgd_f_alg2", "epsilon": 1.0, "delta": 1e-5, "epochs": 1, **kw}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(n)s, NULL, NULL, %(model)s, {names})",
        {"n": name, "model": model, **args},
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


def _charges(conn, name: str) -> list:
    (charged,) = conn.execute(
        "SELECT coalesce(array_agg(ARRAY[epsilon, delta]), '{}') FROM dpsql.ledger_entries l"
        " JOIN dpsql.datasets d USING (dataset_id) WHERE d.name = %s",
        (name,),
    ).fetchone()
    return charged


def _blobs(seed: int, m: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.array([0.6, 0.3, -0.2]) + 0.05 * rng.normal(size=(m, 3))
    y = (X[:, 0] - 0.6 + X[:, 1] - 0.3 > 0).astype(float)
    return X, y


def test_map_back_round_trip_and_predictions_agree(conn, scratch_schema, server_uri) -> None:
    """Spec item 3: for the points inside the tau-ball, w.x + b == theta''.(x - mean, tau); the
    released (w, b) scores rows in SQL (predict, evaluate) and Python alike. The charge is the
    stated (epsilon, delta), once."""
    X, y = _blobs(0)
    name = _register(conn, scratch_schema, X, y, row_norm="clip")
    m = _train(conn, name, noise_seed=3, epochs=2, seed=7)
    priv = m["params"]["privacy"]
    pre = priv["preprocessing"]
    theta = np.asarray(priv["theta"])
    mean, tau = np.asarray(pre["mean"]), pre["tau"]
    w, b = np.asarray(m["coef"]), m["intercept"][0]
    assert m["privacy"] == "dpsgd_f_alg2" and m["fit_intercept"]
    assert (m["epsilon"], m["delta"]) == (1.0, 1e-5)
    assert _charges(conn, name) == [[1.0, 1e-5]]  # once, the stated (epsilon, delta)
    np.testing.assert_allclose(w, theta[:3], rtol=0, atol=0)
    inside = np.linalg.norm(X - mean, axis=1) <= tau  # rows have norm < 1: clip is the identity
    assert inside.sum() > 100
    xp = np.column_stack([X - mean, np.full(len(X), tau)])
    np.testing.assert_allclose((X @ w + b)[inside], (xp @ theta)[inside], rtol=1e-9, atol=1e-9)
    assert b == pytest.approx(tau * theta[3] - w @ mean, rel=1e-12)
    sql_p = np.array(
        [
            conn.execute("SELECT dpsql.predict(%s, %s)", (m["model_id"], list(x))).fetchone()[0]
            for x in X[:50]
        ]
    )
    np.testing.assert_allclose(sql_p, 1 / (1 + np.exp(-(X[:50] @ w + b))), rtol=1e-9)
    with dpsql.connect(server_uri) as db:
        model = db.model(m["model_id"])
        np.testing.assert_allclose(model.predict_proba(X[:50])[:, 1], sql_p, rtol=1e-12)
        # the Python mechanism object: the same release under the same seeds
        again = db.train(
            name,
            None,
            None,
            "logistic",
            epochs=2,
            seed=7,
            privacy=dpsql.DPSGDFAlg2(epsilon=1.0, delta=1e-5, noise_seed=3),
        )
        np.testing.assert_allclose(again.predict_proba(X[:50])[:, 1], sql_p, rtol=1e-12)
    (acc,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], _SOURCES[name])
    ).fetchone()
    assert acc == pytest.approx(np.mean((X @ w + b > 0) == (y == 1)))


def test_feature_clipping_bounds_the_rows(conn) -> None:
    """Spec item 4: ||x''|| <= sqrt(2) tau, and x'' == x' iff ||x - mean|| <= tau."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 4)) * rng.uniform(0.01, 1, size=(200, 1))
    mean, tau = rng.normal(size=4) * 0.1, 0.3
    rows = [
        conn.execute(
            "SELECT dpsql_internal._alg2_features(%s, %s, %s)", (list(x), list(mean), tau)
        ).fetchone()
        for x in X
    ]
    assert len(rows) == 200
    Xpp = np.asarray([r[0] for r in rows])
    Xp = np.column_stack([X - mean, np.full(200, tau)])
    assert np.all(np.linalg.norm(Xpp, axis=1) <= np.sqrt(2) * tau * (1 + 1e-12))
    same = np.all(np.isclose(Xpp, Xp, rtol=1e-12, atol=0), axis=1)
    np.testing.assert_array_equal(same, np.linalg.norm(X - mean, axis=1) <= tau)


def test_refusals_charge_nothing(conn, scratch_schema) -> None:
    X, y = _blobs(2, 200)
    name = _register(conn, scratch_schema, X, y, row_norm="clip")
    refused: list[tuple[dict[str, Any], str]] = [
        ({"delta": 0.0}, "delta must be > 0"),
        ({"noise_multiplier": 1.0}, "not noise_multiplier"),
        ({"clip_norm": 1.0}, "clip_norm is not a parameter"),
        ({"intercept": True}, "leave intercept false"),
        ({"model": "huber"}, "'logistic' or 'multinomial', not 'huber'"),
    ]
    for kw, message in refused:
        with pytest.raises(Exception, match=message):
            _train(conn, name, **kw)
    assert _charges(conn, name) == []


def test_mean_noise_is_gaussian_at_the_stated_scale(conn, scratch_schema) -> None:
    """All rows 0, m = 3000, d = 2: the EM medians (epsilon/18 each, utility -1500 off the
    value) and the EM radius (rank 2411 of 3000 equal distances) leave the data's grid
    point with probability < 1e-10, so c = 0, r = one grid step and mean * m is the noise
    alone, N(0, s^2) per coordinate with s = gaussian_sigma(2 r, eps/9, delta/3), replace-one
    sensitivity 2 r.
    60 seeded runs x 2 coordinates: KS against N(0, 1) and a two-sided chi-square test of the
    scale, each at alpha = 1e-3 (false-failure rate <= 2e-3; deterministic under the seeds);
    the scale test rejects the same draws read with a std off by 50%."""
    m, d = 3000, 2
    name = _register(
        conn, scratch_schema, np.zeros((m, d)), np.tile([0.0, 1.0], m // 2), row_norm="clip"
    )
    draws: list[float] = []
    for seed in range(60):
        pre = _train(conn, name, noise_seed=seed)["params"]["privacy"]["preprocessing"]
        info = pre["mean_info"]
        assert info["coarse_centre"] == [0.0] * d
        assert info["radius"] == pytest.approx(1 / m**2, rel=1e-9)
        (s,) = conn.execute(
            "SELECT dpsql.gaussian_sigma(2 * %s, 1.0 / 9, 1e-5 / 3)", (info["radius"],)
        ).fetchone()
        assert info["noise_std"] == pytest.approx(s) and info["sensitivity"] == 2 * info["radius"]
        draws.extend(np.asarray(pre["mean"]) * m / s)
    z = np.asarray(draws)

    def scale_p(v: np.ndarray) -> float:
        q = stats.chi2.cdf(float(np.sum(v**2)), df=len(v))
        return 2 * min(q, 1 - q)

    assert stats.kstest(z, "norm").pvalue > 1e-3 and scale_p(z) > 1e-3
    assert scale_p(z / 1.5) < 1e-3 and scale_p(z * 1.5) < 1e-3


def test_multinomial_maps_back_per_class(conn, scratch_schema, server_uri) -> None:
    rng = np.random.default_rng(4)
    centres = np.array([[0.5, 0.1], [0.4, 0.2], [0.45, 0.0]])
    y = rng.integers(0, 3, size=600).astype(float)
    X = centres[y.astype(int)] + 0.01 * rng.normal(size=(600, 2))
    name = _register(conn, scratch_schema, X, y, labels=[0.0, 1.0, 2.0], row_norm="clip")
    m = _train(conn, name, model="multinomial", noise_seed=5, epochs=3)
    priv = m["params"]["privacy"]
    theta, pre = np.asarray(priv["theta"]), priv["preprocessing"]
    W = np.asarray(m["weights"])
    np.testing.assert_allclose(W[:, :2], theta[:, :2], rtol=0, atol=0)
    np.testing.assert_allclose(
        W[:, 2], pre["tau"] * theta[:, 2] - theta[:, :2] @ np.asarray(pre["mean"]), rtol=1e-12
    )
    sql_c = [
        conn.execute("SELECT dpsql.predict(%s, %s)", (m["model_id"], list(x))).fetchone()[0]
        for x in X[:30]
    ]
    np.testing.assert_array_equal(sql_c, np.argmax(X[:30] @ W[:, :2].T + W[:, 2], axis=1))
    with dpsql.connect(server_uri) as db:
        np.testing.assert_array_equal(db.model(m["model_id"]).predict(X[:30]), sql_c)


def _counterexample(mu: float, n: int, flip: bool) -> tuple[np.ndarray, np.ndarray]:
    X = np.array([[mu, 1.0], [mu, -1.0]] * (n // 2))
    y = np.array([1.0, 0.0] * (n // 2))
    return X, (1 - y if flip else y)


def test_counterexample_dpsgd_fails_dpsgd_f_succeeds(conn, scratch_schema) -> None:
    """The paper's counter-example (Sun et al. 2024, §4; mu = 1e4, n = 2000, epsilon = 1, delta =
    1e-5) on D' and D'' (rows unit-normalised: a rescaling, R = 1). DP-SGD from w_0 = 0 predicts one
    label for every row (accuracy 0.5; threshold 0.6, for each of a few clip / step settings);
    DPSGD-F Algorithm 2 reaches accuracy >= 0.95 on both. Seeded (deterministic); a numpy simulation
    measured 10/10 seeds at accuracy 1.00, so a false failure needs a seed far in the tail."""
    t0 = time.monotonic()
    for flip in (False, True):
        X, y = _counterexample(1e4, 2000, flip)
        name = _register(conn, scratch_schema, X, y, row_norm="unit")
        for clip, step in [(1.0, 1.0), (1.0, 100.0), (1e-4, 1e4)]:
            m = _train(
                conn,
                name,
                privacy="dpsgd",
                epochs=5,
                clip_norm=clip,
                step_size=step,
                sampling="poisson",
                batch_size=50,
                noise_seed=11,
            )
            (acc,) = conn.execute(
                "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], _SOURCES[name])
            ).fetchone()
            assert acc <= 0.6, (flip, clip, step, acc)
        for seed in range(3):
            m = _train(conn, name, epochs=5, noise_seed=seed)
            (acc,) = conn.execute(
                "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], _SOURCES[name])
            ).fetchone()
            tau = m["params"]["privacy"]["preprocessing"]["tau"]
            assert acc >= 0.95, (flip, seed, acc, tau)
    assert time.monotonic() - t0 < 120


def test_malformed_rows_are_null_records(conn, scratch_schema) -> None:
    """A NaN, an infinite or a NULL feature raises no error (an error would reveal a value):
    the row counts as 0 in the quantiles and as the centre c in the mean, and is a null
    record in the steps; the release is finite."""
    X, y = _blobs(6, 300)
    name = _register(conn, scratch_schema, X, y, row_norm="clip")
    source = _SOURCES[name]
    for change in (
        "x[2] = 'NaN' WHERE rid = 3",
        "x[1] = 'Infinity' WHERE rid = 5",
        "x = NULL WHERE rid = 7",
    ):
        assert conn.execute(f"UPDATE {source} SET {change}").rowcount == 1
    m = _train(conn, name, noise_seed=1)
    assert np.all(np.isfinite(m["weights"]))
    assert np.isfinite(m["params"]["privacy"]["preprocessing"]["tau"])


def test_an_analyst_trains_it(conn, scratch_schema, make_role) -> None:
    """Real roles: an analyst's dpsgd_f_alg2 release (pg_strong_random noise) is charged once."""
    admin, connect_admin = make_role("owner", "dpsql_admin")
    analyst, connect_analyst = make_role("analyst", "dpsql_analyst")
    conn.execute(
        f"CREATE TABLE {scratch_schema}.pts AS SELECT i AS rid,"
        " ARRAY[0.5 + 0.1 * sin(i), 0.1 * cos(i)]::float8[] AS x, (i % 2)::float8 AS y"
        " FROM generate_series(1, 400) i"
    )
    conn.execute(f"GRANT USAGE ON SCHEMA {scratch_schema} TO {admin}")
    conn.execute(f"GRANT SELECT ON {scratch_schema}.pts TO {admin}")
    name = f"pts_{analyst}"
    with connect_admin() as ad:
        (ds,) = ad.execute(
            f"SELECT dpsql.register_dataset('{scratch_schema}.pts', '{{x}}', 'y',"
            f" epsilon_budget => 2, delta_budget => 1e-4, labels => '{{0,1}}',"
            f" row_norm => 'clip', name => '{name}')"
        ).fetchone()
        ad.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    with connect_analyst() as a:
        (mid,) = a.execute(
            f"SELECT dpsql.train('{name}', NULL, NULL, privacy => 'dpsgd_f_alg2',"
            " epsilon => 1, delta => 1e-5, epochs => 2)"
        ).fetchone()
        (p,) = a.execute("SELECT dpsql.predict(%s, ARRAY[0.5, 0.1])", (mid,)).fetchone()
        assert 0 <= p <= 1
    assert _charges(conn, name) == [[1.0, 1e-5]]
