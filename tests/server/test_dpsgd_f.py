"""DPSGD-F* (Sun et al. 2024, Algorithm 3; issue 10): the private mean's noise and sensitivity, its
composition with the steps in the accountant, the charge, and the centring that predict applies in
SQL and in Python."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from psycopg.rows import dict_row
from scipy import stats

import dpsql
from dpsql import accounting
from tests.pg_helpers import load


def _register(conn, schema: str, X: np.ndarray, y: np.ndarray, **kw) -> str:
    source = load(conn, schema, f"t_{uuid.uuid4().hex[:6]}", X, y)
    name = f"f_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    conn.execute(
        "SELECT dpsql.register_dataset(%(s)s, '{x}', 'y', 1e6, 0.5, labels => '{0,1}',"
        f" name => %(n)s{extra})",
        {"s": source, "n": name, **kw},
    )
    return name


def _train(conn, name: str, **kw) -> dict:
    args = {"privacy": "dpsgd_f", "epsilon": 1.0, "delta": 1e-5, "epochs": 1, **kw}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(n)s, NULL, NULL, 'logistic', {names})", {"n": name, **args}
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


def _chi2_pvalue(z: np.ndarray) -> float:
    """Two-sided p-value of sum z^2 ~ chi^2(n): is the scale of z 1?"""
    q = stats.chi2.cdf(float(np.sum(z**2)), df=len(z))
    return 2 * min(q, 1 - q)


def test_mean_noise_is_gaussian_at_the_stated_scale(conn, scratch_schema) -> None:
    """All-zero rows: the released mean (preprocessing.mean) is noise / m with std p =
    gaussian_sigma(2, eps/10, delta) per coordinate. 20 seeded runs x 50 coordinates: KS against
    N(0, 1) and a chi-square test of the scale, each at alpha = 1e-3 (false-failure rate 2e-3;
    deterministic under the seeds). The scale test rejects the same draws read with a std off by
    10%, and zeros fail both."""
    m, d = 200, 50
    name = _register(conn, scratch_schema, np.zeros((m, d)), np.tile([0.0, 1.0], m // 2))
    (p,) = conn.execute("SELECT dpsql.gaussian_sigma(2, 0.1, 1e-5)").fetchone()
    draws: list[float] = []
    for seed in range(20):
        pre = _train(conn, name, noise_seed=seed)["params"]["privacy"]["preprocessing"]
        assert pre["mean_noise_std"] == pytest.approx(p)
        draws.extend(np.asarray(pre["mean"]) * m / p)
    z = np.asarray(draws)
    assert stats.kstest(z, "norm").pvalue > 1e-3 and _chi2_pvalue(z) > 1e-3
    assert _chi2_pvalue(z / 1.1) < 1e-3 and _chi2_pvalue(z * 1.1) < 1e-3


def test_mean_sensitivity_holds_on_adversarial_neighbours(conn, scratch_schema) -> None:
    """Replace-one neighbours that differ in one extreme row (norm 1e6, then its antipode):
    with the same noise seed the centres differ by exactly the clipped rows' difference / m,
    2 / m at most, the sensitivity the noise is calibrated to."""
    m, d = 100, 3
    X = np.tile(np.eye(d)[0], (m, 1)) * 0.5
    base = X.copy()
    base[0] = [1e6, 0, 0]
    other = X.copy()
    other[0] = [-1e6, 0, 0]
    y = np.tile([0.0, 1.0], m // 2)
    centres = []
    for rows in (base, other):
        name = _register(conn, scratch_schema, rows, y)
        centres.append(
            np.asarray(
                _train(conn, name, noise_seed=9)["params"]["privacy"]["preprocessing"]["mean"]
            )
        )
    gap = np.linalg.norm(centres[0] - centres[1]) * m
    assert gap == pytest.approx(2.0, rel=1e-9)


def test_mean_and_steps_are_composed_and_charged_once(conn, scratch_schema) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 4)) / 3 + 0.5
    y = (X @ np.array([1.0, -1.0, 0.5, 0.0]) > 0.25).astype(float)
    name = _register(conn, scratch_schema, X, y)
    m = _train(conn, name, noise_seed=1, epochs=2)
    priv = m["params"]["privacy"]
    acct = priv["accountant"]
    assert m["privacy"] == "dpsgd_f" and (m["epsilon"], m["delta"]) == (1.0, 1e-5)
    assert acct["scheme"] == "poisson"
    # The charged z makes mean + steps (epsilon, delta) in the PLD accountant, and the mean
    # raised it above what the steps alone would need.
    steps = 2 * (2000 // 50)
    composed = accounting.epsilon(
        acct["noise_multiplier"],
        scheme="poisson",
        steps=steps,
        sampling_rate=50 / 2000,
        delta=1e-5,
        prefix_noise_multiplier=priv["preprocessing"]["mean_noise_std"],
    )
    assert composed <= 1.0 + 1e-9
    alone = accounting.calibrate(1.0, 1e-5, scheme="poisson", steps=steps, sampling_rate=50 / 2000)
    assert acct["noise_multiplier"] > alone
    (charged,) = conn.execute(
        "SELECT array_agg(ARRAY[epsilon, delta]) FROM dpsql.ledger_entries l"
        " JOIN dpsql.datasets d USING (dataset_id) WHERE d.name = %s",
        (name,),
    ).fetchone()
    assert charged == [[1.0, 1e-5]]


def test_prefix_composition_matches_dp_accounting() -> None:
    """The accountant's prefix is dp-accounting's ComposedDpEvent under REPLACE_ONE."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    z, p, q, steps = 1.1, 20.0, 0.01, 300
    event = dp_accounting.ComposedDpEvent(
        [
            dp_accounting.GaussianDpEvent(p),
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
            ),
        ]
    )
    acc = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct = acc.compose(event).get_epsilon(1e-5)
    ours = accounting.epsilon(
        z, scheme="poisson", steps=steps, sampling_rate=q, delta=1e-5, prefix_noise_multiplier=p
    )
    assert ours == pytest.approx(direct, rel=1e-3)
    assert ours > accounting.epsilon(z, scheme="poisson", steps=steps, sampling_rate=q, delta=1e-5)


def test_python_and_sql_centre_rows_alike(conn, scratch_schema, server_uri) -> None:
    """A bounded, centred dataset: probabilities and labels agree between SQL and Python."""
    rng = np.random.default_rng(5)
    X = np.column_stack([40 + 5 * rng.normal(size=1000), 300 + 50 * rng.normal(size=1000)])
    y = ((X[:, 0] - 40) / 5 + (X[:, 1] - 300) / 50 > 0).astype(float)
    name = _register(conn, scratch_schema, X, y, feature_bounds=[[20, 60], [100, 500]])
    m = _train(conn, name, noise_seed=2, epochs=3)
    sql_p = [
        conn.execute("SELECT dpsql.predict(%s, %s)", (m["model_id"], list(x))).fetchone()[0]
        for x in X[:50]
    ]
    with dpsql.connect(server_uri) as db:
        model = db.model(m["model_id"])
        np.testing.assert_array_equal(model.predict_proba(X[:50])[:, 1], sql_p)
        assert np.array_equal(model.predict(X[:50]) == 1, np.asarray(sql_p) >= 0.5)


def test_dpsgd_f_refuses_regression_and_pure_dp(conn, scratch_schema) -> None:
    name = _register(conn, scratch_schema, np.zeros((100, 2)), np.tile([0.0, 1.0], 50))
    for kw, message in [
        ({"delta": 0.0}, "delta must be > 0"),
        ({"noise_multiplier": 1.0}, "not noise_multiplier"),
    ]:
        with pytest.raises(Exception, match=message):
            _train(conn, name, **kw)
    assert (
        conn.execute(
            "SELECT count(*) FROM dpsql.ledger_entries l JOIN dpsql.datasets d USING (dataset_id)"
            " WHERE d.name = %s",
            (name,),
        ).fetchone()[0]
        == 0
    )


def _register_regression(conn, schema: str, X: np.ndarray, y: np.ndarray, row_bound: float) -> str:
    source = load(conn, schema, f"r_{uuid.uuid4().hex[:6]}", X, y)
    name = f"fr_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 1e6, 0.5, label_bound => 4,"
        " row_bound => %s, name => %s)",
        (source, row_bound, name),
    )
    return name


def _train_linear(conn, name: str, **kw) -> dict:
    args = {"privacy": "dpsgd_f", "epsilon": 2.0, "delta": 1e-5, **kw}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(n)s, NULL, NULL, 'linear', {names})", {"n": name, **args}
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


def test_least_squares_mean_is_calibrated_to_the_row_bound(conn, scratch_schema) -> None:
    """Regression rows have norm <= row_bound r: the mean's replace-one sensitivity is 2 r, its
    noise gaussian_sigma(2 r, eps/10, delta), and the accountant's prefix multiplier std / r.
    Neighbours differing in one extreme row (norm 1e6, then its antipode) give centres exactly
    2 r / m apart with the same noise seed."""
    m, r = 100, 2.0
    X = np.tile([0.5, 0.0, 0.0], (m, 1))
    y = np.zeros(m)
    centres = []
    for sign in (1, -1):
        rows = X.copy()
        rows[0] = [sign * 1e6, 0, 0]
        name = _register_regression(conn, scratch_schema, rows, y, r)
        model = _train_linear(conn, name, noise_seed=4, epochs=1, batch_size=50)
        priv = model["params"]["privacy"]
        pre = priv["preprocessing"]
        (std,) = conn.execute("SELECT dpsql.gaussian_sigma(%s, 0.2, 1e-5)", (2 * r,)).fetchone()
        assert pre["mean_sensitivity"] == 2 * r and pre["mean_noise_std"] == pytest.approx(std)
        # the steps were calibrated with the prefix multiplier std / r: composed, exactly eps
        z = priv["accountant"]["noise_multiplier"]
        composed = accounting.epsilon(
            z,
            scheme="poisson",
            steps=2,  # 1 epoch of m / b = 2 steps
            sampling_rate=0.5,
            delta=1e-5,
            prefix_noise_multiplier=std / r,
        )
        assert model["batch_size"] == 50 and composed == pytest.approx(2.0, rel=1e-3)
        centres.append(np.asarray(pre["mean"]))
    assert np.linalg.norm(centres[0] - centres[1]) * m == pytest.approx(2 * r, rel=1e-9)


def test_least_squares_dpsgd_f_beats_the_mean_and_predicts_alike(
    conn, scratch_schema, server_uri
) -> None:
    """Features far from the origin (the case centring is for): at eps = 2 the default run's
    test MSE is under half the label variance (seeded; 20 fresh-noise runs gave 0.05 +- 0.02
    of it, max 0.10: the margin is 18 sd), and SQL and Python predict the same values."""
    rng = np.random.default_rng(8)
    X = 0.6 + 0.2 * rng.uniform(-1, 1, size=(6000, 3))
    y = np.clip((X - 0.6) @ np.array([4.0, -3.0, 2.0]) + 0.05 * rng.normal(size=6000), -4, 4)
    name = _register_regression(conn, scratch_schema, X[:4000], y[:4000], float(np.sqrt(3)))
    m = _train_linear(conn, name, noise_seed=3, seed=1)
    assert m["params"]["privacy"]["defaults"]["clip_norm"] == 4  # the label bound
    with dpsql.connect(server_uri) as db:
        model = db.model(m["model_id"])
        pred = model.predict(X[4000:])
        sql = [
            conn.execute("SELECT dpsql.predict(%s, %s)", (m["model_id"], list(x))).fetchone()[0]
            for x in X[4000:4050]
        ]
    np.testing.assert_array_equal(pred[:50], sql)
    assert np.mean((pred - y[4000:]) ** 2) < 0.5 * np.var(y[4000:])
