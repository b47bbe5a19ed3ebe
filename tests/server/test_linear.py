"""DP linear regression through the server: regression datasets, the zCDP calibration and
the plans of DP-AMBSSGD, DP-SSGD, DP-GD and AdaSSP, their releases, budgets and intervals."""

from __future__ import annotations

import math
import uuid

import numpy as np
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from scipy import stats

from dpsql import _core
from tests.pg_helpers import leftovers, load

DELTA = 1e-6


def _register(conn, schema, X, y, *, label_bound, table="pts", **kw) -> tuple[int, str]:
    source = load(conn, schema, table, X, y)
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => %s,"
        " delta_budget => %s, label_bound => %s, row_bound => %s, row_norm => %s, name => %s)",
        (
            source,
            kw.get("epsilon_budget", 1000.0),
            kw.get("delta_budget", 0.5),
            label_bound,
            kw.get("row_bound"),
            kw.get("row_norm"),
            f"{table}_{uuid.uuid4().hex[:8]}",
        ),
    ).fetchone()
    return ds, source


def _train(conn, source, privacy, epsilon=1.0, delta=DELTA, **kw) -> dict:
    args = {"privacy": privacy, "epsilon": epsilon, "delta": delta, "model": "linear", **kw}
    if isinstance(args.get("options"), dict):
        args["options"] = Jsonb(args["options"])
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(source)s, NULL, NULL, {names})", {"source": source, **args}
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


def _plan(conn, ds, privacy, n, d, epsilon, delta=DELTA, **params) -> dict:
    if isinstance(params.get("options"), dict):
        params["options"] = params["options"]
    (plan,) = conn.execute(
        "SELECT dpsql_internal._linear_plan(%s, d, %s, %s, %s, %s, %s) FROM dpsql.datasets d"
        " WHERE dataset_id = %s",
        (privacy, n, d, epsilon, delta, Jsonb(params), ds),
    ).fetchone()
    return plan


def _spent(conn, ds) -> float:
    (e,) = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    return e


def _gaussian_data(n, d, sigma=1.0, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    X = rng.normal(size=(n, d))
    return X, X @ w + sigma * rng.normal(size=n), w


# ---------------------------------------------------------------------- regression datasets


def test_regression_dataset_registration(conn, scratch_schema) -> None:
    X, y, _ = _gaussian_data(50, 3)
    ds, _ = _register(conn, scratch_schema, X, y, label_bound=5.0, row_bound=4.0)
    row = conn.execute(
        "SELECT labels, row_norm, label_bound, row_bound FROM dpsql.datasets WHERE dataset_id = %s",
        (ds,),
    ).fetchone()
    assert row == (None, "none", 5.0, 4.0)
    # row_norm clip implies ||x|| <= 1; feature bounds rescale onto [-1, 1]^d: sqrt(d).
    ds2, _ = _register(conn, scratch_schema, X, y, label_bound=5.0, row_norm="clip", table="p2")
    assert conn.execute(
        "SELECT row_bound FROM dpsql.datasets WHERE dataset_id = %s", (ds2,)
    ).fetchone() == (1.0,)
    conn.execute("CREATE TABLE cols AS SELECT x[1] AS a, x[2] AS b, y FROM pts")
    (ds3,) = conn.execute(
        "SELECT dpsql.register_dataset('cols', '{a,b}', 'y', 5, 1e-3, label_bound => 3,"
        " feature_bounds => '{{-3,3},{-3,3}}')"
    ).fetchone()
    assert conn.execute(
        "SELECT row_bound FROM dpsql.datasets WHERE dataset_id = %s", (ds3,)
    ).fetchone()[0] == pytest.approx(math.sqrt(2))


@pytest.mark.parametrize(
    "args, message",
    [
        ("label_bound => 0", "label_bound must be a finite number > 0"),
        ("label_bound => 'NaN'", "label_bound must be a finite number > 0"),
        ("label_bound => 1, labels => '{0,1}'", "not both"),
        ("row_bound => 2", "row_bound"),
        ("label_bound => 1, row_bound => -1", "row_bound"),
        ("label_bound => 1, row_norm => 'unit'", "none or clip"),
    ],
)
def test_regression_registration_refusals(conn, scratch_schema, args, message) -> None:
    X, y, _ = _gaussian_data(10, 2)
    source = load(conn, scratch_schema, "pts", X, y)
    before = conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(f"SELECT dpsql.register_dataset('{source}', '{{x}}', 'y', 1, 1e-3, {args})")
    assert conn.execute("SELECT count(*) FROM dpsql.datasets").fetchone() == before


# ---------------------------------------------------------------------------- zCDP calibration


@pytest.mark.parametrize("rho, eps", [(0.015, 0.92546), (0.05, 1.71226), (0.1, 2.45079)])
def test_zcdp_conversion_reproduces_reference_table(conn, rho, eps) -> None:
    """zCDP -> (epsilon, delta) (Brown et al. 2024, Claim A.6; Varshney et al. 2022, Theorem 9;
    alpha* = 1/sqrt(rho))."""
    (e, r) = conn.execute(
        "SELECT dpsql.zcdp_epsilon(%s, 1e-6), dpsql.zcdp_rho(%s, 1e-6)", (rho, eps)
    ).fetchone()
    assert e == pytest.approx(eps, abs=5e-6)
    assert r == pytest.approx(rho, rel=2e-5)


def test_zcdp_tight_inversion_reproduces_reference_vectors(conn) -> None:
    """The tight inversion: rho*(1, 1e-5) = 0.0208199, lambda* = sqrt(T / (2 rho*)) = 4.900555 at
    T = 1 and 49.005552 at T = 100, below the Gaussian composition rule of Thakurta, "Private
    Optimization", §6.3.1 (5.002584, 50.025844)."""
    (rho,) = conn.execute("SELECT dpsql.zcdp_rho(1, 1e-5)").fetchone()
    assert rho == pytest.approx(0.0208199, abs=1e-7)
    for steps, tight, book in [(1, 4.900555, 5.002584), (100, 49.005552, 50.025844)]:
        lam = math.sqrt(steps / (2 * rho))
        assert lam == pytest.approx(tight, abs=1e-5)
        assert lam < book == pytest.approx(math.sqrt(2 * steps * (math.log(1e5) + 1)), abs=1e-5)


@pytest.mark.parametrize(
    "eps, delta, alpha",
    [
        (0.5, 1e-6, 15.0010),
        (1, 1e-6, 7.5660),
        (2, 1e-6, 3.8469),
        (4, 1e-6, 1.9844),
        (1, 1e-5, 6.9304),
    ],
)
def test_ambssgd_noise_multiplier_is_spec_alpha_star(conn, eps, delta, alpha) -> None:
    (rho,) = conn.execute("SELECT dpsql.zcdp_rho(%s, %s)", (eps, delta)).fetchone()
    assert 1 / math.sqrt(rho) == pytest.approx(alpha, abs=1e-4)
    (back,) = conn.execute("SELECT dpsql.zcdp_epsilon(%s, %s)", (rho, delta)).fetchone()
    assert back == pytest.approx(eps, rel=1e-9)


def test_zcdp_calibration_is_sound_under_dp_accounting(conn) -> None:
    """rho-zCDP of a Gaussian mechanism with multiplier 1/sqrt(2 rho): dp-accounting's RDP and
    PLD accountants find at most the target epsilon (the zCDP conversion is the loosest)."""
    import dp_accounting
    from dp_accounting import pld, rdp

    for eps in (0.5, 1.0, 4.0):
        (rho,) = conn.execute("SELECT dpsql.zcdp_rho(%s, %s)", (eps, DELTA)).fetchone()
        event = dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho))
        e_rdp = rdp.RdpAccountant().compose(event).get_epsilon(DELTA)
        e_pld = pld.PLDAccountant().compose(event).get_epsilon(DELTA)
        assert e_pld <= e_rdp <= eps * (1 + 1e-9)
        assert e_rdp > 0.8 * eps  # and not absurdly loose


# -------------------------------------------------------------------------------- the plans


@pytest.fixture
def regression(conn, scratch_schema):
    X, y, w = _gaussian_data(2000, 4, seed=1)
    ds, source = _register(conn, scratch_schema, X, y, label_bound=6.0, row_bound=5.0)
    return ds, source, X, y, w


def test_dpgd_noise_formula(conn, regression) -> None:
    """Lemma 2.1 of Brown et al. 2024: n = 1e4, p = 10, gamma = 5 sqrt(10), rho = 0.015, T = 400
    gives lambda = 0.36515 (the clipped-row count off: all of rho to the steps)."""
    ds = regression[0]
    (eps,) = conn.execute("SELECT dpsql.zcdp_epsilon(0.015, 1e-6)").fetchone()
    plan = _plan(
        conn,
        ds,
        "dpgd",
        10_000,
        10,
        eps,
        steps=400,
        clip_norm=5 * math.sqrt(10),
        options={"clip_check": False, "precondition": False},
    )
    assert plan["noise_std"] == pytest.approx(0.36515, abs=5e-6)
    # The paper's defaults (no preconditioner): eta 1/5, gamma = 5 sqrt(p) for the pilot,
    # 40 + 40 m steps, 1/50 of rho for the count, 1/10 for the clip quantile (issue 25).
    plan = _plan(conn, ds, "dpgd", 10_000, 10, 1.0, intercept=True, options={"precondition": False})
    rho = plan["rho"]
    assert (plan["step_size"], plan["steps"], plan["ci"]) == (0.2, 440, "batch_means")
    assert (plan["burn_in"], plan["clip_pilot_steps"], plan["clip_quantile"]) == (40, 20, 0.995)
    assert plan["clip_norm"] == pytest.approx(5 * math.sqrt(11))
    assert plan["clip_grid"] == pytest.approx([5 * math.sqrt(11) * 2.0**j for j in range(-5, 6)])
    assert plan["rho_clip"] == pytest.approx(rho / 10)
    assert plan["clip_noise_std"] == pytest.approx(1 / math.sqrt(rho / 10))
    assert plan["noise_std"] == pytest.approx(
        math.sqrt(2 * 440) * 5 * math.sqrt(11) / (math.sqrt(rho * 44 / 50) * 10_000)
    )
    assert plan["noise_multiplier"] == pytest.approx(plan["noise_std"] / plan["clip_norm"])
    assert plan["check_noise_std"] == pytest.approx(1 / math.sqrt(2 * rho / 50))
    # The public rule alone (options.clip_quantile = false): the 20 + 40 m steps.
    plan = _plan(
        conn,
        ds,
        "dpgd",
        10_000,
        10,
        1.0,
        intercept=True,
        options={"precondition": False, "clip_quantile": False},
    )
    assert (plan["steps"], plan["rho_clip"], plan["clip_pilot_steps"]) == (420, 0, 0)
    assert plan["noise_std"] == pytest.approx(
        math.sqrt(2 * 420) * 5 * math.sqrt(11) / (math.sqrt(rho * 49 / 50) * 10_000)
    )
    # dpsql's default with a public row bound: preconditioned, step 1, a tenth of rho less,
    # draws 120 steps apart (40 + 120 m steps).
    plan = _plan(conn, ds, "dpgd", 10_000, 10, 1.0, intercept=True)
    assert plan["precondition"] is True and plan["step_size"] == 1.0
    assert plan["steps"] == 1240
    assert plan["rho_pre"] == pytest.approx(rho / 10)
    assert plan["noise_std"] == pytest.approx(
        math.sqrt(2 * 1240) * 5 * math.sqrt(11) / (math.sqrt(rho * 39 / 50) * 10_000)
    )


def test_ambssgd_plan_formulas(conn, regression) -> None:
    """Varshney et al. 2022, Algorithm 2, with a robust DP-STAT: counts calibrated for the L + 1
    counts it can make (the paper calibrates for L), threshold s - Gamma (the paper's s
    overshoots)."""
    ds = regression[0]
    n, d, eps = 1_000_000, 10, 1.0
    plan = _plan(conn, ds, "dp_ambssgd", n, d, eps)
    rho = plan["rho"]
    blocks = 2 * math.ceil(8 * math.log(n) / 2)
    m = n // blocks
    s, b = m // 11, m - m // 11
    r_x = 5.0
    L = math.ceil(math.log2(n))
    alpha = 1 / math.sqrt(rho)
    sigma_c = alpha * math.sqrt(L + 1)
    assert (plan["blocks"], plan["stat_size"], plan["batch_size"]) == (blocks, s, b)
    assert plan["noise_multiplier"] == pytest.approx(alpha)
    assert plan["step_size"] == pytest.approx(b / (r_x**2 + (b - 1) * r_x**2))
    assert plan["levels"] == L
    assert plan["count_noise_std"] == pytest.approx(sigma_c)
    assert plan["stat_threshold"] == pytest.approx(
        s - sigma_c * math.sqrt(2 * math.log(2 * (L + 1) / 1e-3))
    )
    assert plan["log_factor"] == pytest.approx(math.sqrt(math.log(n)))
    assert plan["domain_bound"] == 12.0
    tight = _plan(conn, ds, "dp_ambssgd", n, d, eps, options={"tight_accounting": True})
    assert tight["noise_multiplier"] == pytest.approx(alpha / math.sqrt(2))


def test_ambssgd_refuses_infeasible_dp_stat(conn, regression) -> None:
    """Stat samples smaller than 2 Gamma learn nothing (DP-STAT returns a tiny level); refused with
    the rows needed."""
    ds, source = regression[:2]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="DP-STAT is infeasible"):
        _plan(conn, ds, "dp_ambssgd", 2000, 4, 1.0)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="DP-STAT is infeasible"):
        _train(conn, source, "dp_ambssgd", epsilon=1.0)
    assert _spent(conn, ds) == 0


def test_adassp_plan_uses_replace_one_sensitivities(conn, regression) -> None:
    ds = regression[0]
    plan = _plan(conn, ds, "adassp", 2000, 4, 1.0)
    X, Y = 5.0, 6.0
    sd = 1 / math.sqrt(2 * plan["rho"] / 3)
    assert plan["sigma_min"] == pytest.approx(X**2 * sd)
    assert plan["sigma_xx"] == pytest.approx(math.sqrt(2) * X**2 * sd)
    assert plan["sigma_xy"] == pytest.approx(2 * X * Y * sd)
    assert plan["ridge_factor"] == pytest.approx(
        math.sqrt(2) * X**2 * sd * math.sqrt(4 * math.log(2 * 16 / 0.05))
    )


# ------------------------------------------------------------------------- refusals, budget


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(privacy="dpgd", delta=0), "delta must be > 0"),
        (dict(privacy="dpgd", model="logistic"), "model => 'linear'"),
        (dict(privacy="bolton", model="logistic"), "regression dataset"),
        (dict(privacy="dpgd", options={"bogus": 1}), "unknown options"),
        (dict(privacy="dpgd", ci="bootstrap"), "ci must be 'batch_means' or"),
        (dict(privacy="dpgd", ci="independent_runs", steps=55), "independent runs"),
        (dict(privacy="dpgd", ci_draws=1), "ci_draws"),
        (dict(privacy="dpgd", steps=0), "steps must be"),
        (dict(privacy="dpgd", clip_norm=-1.0), "clip_norm"),
        (dict(privacy="dpgd", epsilon=float("nan")), "epsilon"),
        (dict(privacy="dp_ssgd", options={"r_x": -1}), "r_x"),
        (dict(privacy="dpgd", noise_multiplier=1.0), "noise_multiplier"),
        (dict(privacy="dpgd", step_size=1e300), "too large"),
        (dict(privacy="dp_ssgd", step_size=1e250), "too large"),
        (dict(privacy="dp_ssgd"), "noise would swamp the model"),
        (dict(privacy="dpgd", step_size=-1.0), "step_size must be"),
    ],
)
def test_refusals_charge_nothing(conn, regression, kw, message) -> None:
    ds, source = regression[:2]
    kw = {"epsilon": 1.0, **kw}
    with pytest.raises(psycopg.Error, match=message):
        _train(conn, source, **kw)
    assert _spent(conn, ds) == 0
    assert leftovers(conn)[0] == 0


def test_linear_mechanisms_refuse_classification_datasets(conn, scratch_schema) -> None:
    X, y, _ = _gaussian_data(100, 2)
    source = load(conn, scratch_schema, "cls", X, np.sign(y))
    conn.execute("SELECT dpsql.register_dataset(%s, '{x}', 'y', 5, 1e-3)", (source,))
    with pytest.raises(psycopg.Error, match="classification dataset"):
        _train(conn, source, "adassp")


# ------------------------------------------------------------------------------- AdaSSP


def test_adassp_release_is_the_core_release_with_the_plans_noise(conn, regression) -> None:
    """Seeded: the server's release equals the C core's on the same (clipped) gram and the
    plan's noise scales; and the noise is there (the weights differ from the noiseless fit)."""
    ds, source, X, y, _ = regression
    m = _train(conn, source, "adassp", epsilon=1.0, noise_seed=11, intercept=True)
    priv = m["params"]["privacy"]
    plan = _plan(conn, ds, "adassp", len(y), X.shape[1], 1.0, intercept=True)
    rows = conn.execute(f"SELECT x, y FROM {source}").fetchall()  # the sums up to rounding
    gram = _core.adassp_gram(
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        plan["x_bound"],
        plan["y_bound"],
        intercept=True,
    )
    w, ridge, _ = _core.adassp_release(
        gram,
        plan["sigma_min"],
        plan["sigma_xx"],
        plan["sigma_xy"],
        plan["min_shift"],
        plan["ridge_factor"],
        seed=11,
    )
    np.testing.assert_allclose(m["weights"], w, rtol=1e-12, atol=1e-12)
    assert priv["ridge"] == pytest.approx(ridge, rel=1e-12, abs=1e-12)
    noiseless, *_ = _core.adassp_release(gram, 0, 0, 0, 0, 0, seed=11)
    assert np.max(np.abs(np.asarray(m["weights"]) - noiseless)) > 1e-3
    assert priv["noise_seed"].endswith("NOT private")


def test_adassp_accuracy_and_budget(conn, scratch_schema) -> None:
    """At a large n the release is close to OLS; the ledger has exactly epsilon."""
    X, y, w = _gaussian_data(20_000, 3, sigma=0.5, seed=3)
    ds, source = _register(conn, scratch_schema, X, y, label_bound=6.0, row_bound=5.0)
    m = _train(conn, source, "adassp", epsilon=2.0)
    assert np.linalg.norm(np.asarray(m["coef"]) - w) < 0.1
    assert _spent(conn, ds) == pytest.approx(2.0)
    assert m["privacy"] == "adassp" and m["epsilon"] == 2.0


# ---------------------------------------------------------------------------------- DP-GD


def test_dpgd_noise_in_the_server_has_the_plans_scale(conn, scratch_schema) -> None:
    """Zero features: every gradient is 0, so each released step is theta_t - theta_{t-1} =
    eta z_t with z_t ~ N(0, lambda^2 I). Chi-square on the 420 x 3 increments (two-sided,
    alpha = 1e-3, seeded: deterministic); fails without noise, with lambda 10% off, or with
    the noise not multiplied by eta."""
    n, d = 500, 3
    ds, source = _register(
        conn, scratch_schema, np.zeros((n, d)), np.ones(n), label_bound=2.0, row_bound=1.0
    )
    m = _train(
        conn,
        source,
        "dpgd",
        epsilon=1.0,
        noise_seed=5,
        intercept=False,
        options={"precondition": False, "clip_quantile": False},
    )
    priv = m["params"]["privacy"]
    (its,) = conn.execute(
        "SELECT iterates FROM dpsql.model_iterates WHERE model_id = %s", (m["model_id"],)
    ).fetchone()
    its = np.asarray(its)
    assert its.shape == (priv["steps"], d) == (420, d)
    steps = np.diff(np.vstack([np.zeros(d), its]), axis=0)
    z = steps / (priv["step_size"] * priv["noise_std"])
    chi2 = float(np.sum(z**2))
    assert stats.chi2(z.size).ppf(5e-4) < chi2 < stats.chi2(z.size).ppf(1 - 5e-4)
    # lambda from the formula (Brown et al. 2024, Lemma 2.1), rho less the clipped-row count's share
    (rho,) = conn.execute("SELECT dpsql.zcdp_rho(1, %s)", (DELTA,)).fetchone()
    assert priv["noise_std"] == pytest.approx(
        math.sqrt(2 * 420) * 5 * math.sqrt(d) / (math.sqrt(rho * 49 / 50) * n)
    )
    assert _spent(conn, ds) == pytest.approx(1.0)


def test_dpgd_model_and_confint_are_the_iterates_post_processed(conn, regression) -> None:
    """The released coefficients are the mean of the draws, and dpsql.confint equals the C
    core's Student-t interval on the stored iterates (for every CI method)."""
    ds, source, X, y, w = regression
    for ci, steps in (("batch_means", None), ("checkpoints", 120), ("independent_runs", 300)):
        m = _train(
            conn,
            source,
            "dpgd",
            epsilon=2.0,
            ci=ci,
            steps=steps,
            burn_in=20,
            intercept=True,
            noise_seed=3,
        )
        (its,) = conn.execute(
            "SELECT iterates FROM dpsql.model_iterates WHERE model_id = %s", (m["model_id"],)
        ).fetchone()
        draws = _core.confint_draws(np.asarray(its), ci, 10, 20)
        est, lo, hi = _core.t_interval(draws, 0.1)
        rows = conn.execute(
            "SELECT * FROM dpsql.confint(%s, 0.1) ORDER BY coef_index", (m["model_id"],)
        ).fetchall()
        assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
        np.testing.assert_allclose([r[1] for r in rows], est, rtol=1e-12)
        np.testing.assert_allclose(np.append(m["coef"], m["intercept"]), est, rtol=1e-12)
        # the t-interval, widened for the draws' correlation (none between independent runs)
        assert all(r[2] <= a and b <= r[3] for r, a, b in zip(rows, lo, hi, strict=True))
        _check_widening(conn, m["model_id"], m["params"]["privacy"]["ci"], alpha=0.1)
        assert m["params"]["privacy"]["ci"]["method"] == ci
        if ci == "batch_means":
            # Clean data (|residuals| ~ 1 << gamma/||x||): the noisy count (sd 19) says OLS.
            assert m["params"]["privacy"]["ci"]["target"] == "ols"
    # Point estimate near OLS at this n and epsilon.
    ols = np.linalg.lstsq(np.column_stack([X, np.ones(len(y))]), y, rcond=None)[0]
    assert np.linalg.norm(est - ols) < 0.2


def test_confint_refusals(conn, regression) -> None:
    ds, source = regression[:2]
    m = _train(conn, source, "dpgd", epsilon=1.0, ci="none")
    assert m["params"]["privacy"]["ci"]["estimate"] == "final iterate"
    with pytest.raises(psycopg.Error, match="no confidence intervals"):
        conn.execute("SELECT * FROM dpsql.confint(%s, 0.05)", (m["model_id"],))
    a = _train(conn, source, "adassp", epsilon=1.0)
    with pytest.raises(psycopg.Error, match="no confidence intervals"):
        conn.execute("SELECT * FROM dpsql.confint(%s, 0.05)", (a["model_id"],))
    for alpha in (0, 1, float("nan"), None):
        with pytest.raises(psycopg.Error, match="alpha must be in"):
            conn.execute("SELECT * FROM dpsql.confint(%s, %s)", (m["model_id"], alpha))
    with pytest.raises(psycopg.Error, match="no model"):
        conn.execute("SELECT * FROM dpsql.confint(-1, 0.05)")


def test_dpgd_huberised_target_is_reported(conn, scratch_schema) -> None:
    """Heavy outliers and a small fixed clip norm: the noisy count of rows clipped at the
    estimate is large, and the model says its intervals cover the clipped least-squares
    (Huberised) minimiser, with the estimated clipped fraction."""
    X, y, _ = _gaussian_data(3000, 2, seed=4)
    y[::10] += 50.0
    ds, source = _register(conn, scratch_schema, X, y, label_bound=60.0, row_bound=5.0)
    m = _train(conn, source, "dpgd", epsilon=2.0, clip_norm=2.0)
    ci = m["params"]["privacy"]["ci"]
    assert ci["target"] == "clipped least squares" and ci["clipped_rows_at_estimate"] > 200
    assert ci["clipped_fraction"] == pytest.approx(ci["clipped_rows_at_estimate"] / 3000)
    assert ci["clipped_fraction_std"] == pytest.approx(ci["clipped_rows_noise_std"] / 3000)
    assert "clip" not in m["params"]["privacy"]  # a fixed clip norm: no private quantile


def _coverage(method: str, runs: int, steps: int, seed0: int) -> float:
    """Mean coverage of theta_hat by 95% intervals over `runs` DP-GD runs (in memory: the C
    core the server runs) on one fixed dataset, p = 4, rho = 0.015."""
    n, p = 2000, 4
    rng = np.random.default_rng(7)
    X = rng.normal(size=(n, p))
    y = X @ (np.ones(p) / 2) + rng.normal(size=n)
    theta_hat = np.linalg.lstsq(X, y, rcond=None)[0]
    gamma = 5 * math.sqrt(p)
    lam = math.sqrt(2 * steps) * gamma / (math.sqrt(0.015) * n)
    hits = []
    for r in range(runs):
        if method == "independent_runs":
            its = np.vstack(
                [
                    _core.dpgd_run(
                        X,
                        y,
                        steps=steps // 10,
                        eta=0.2,
                        gamma=gamma,
                        noise_std=lam,
                        seed=seed0 + 1000 * r + k,
                    )
                    for k in range(10)
                ]
            )
        else:
            its = _core.dpgd_run(
                X, y, steps=steps, eta=0.2, gamma=gamma, noise_std=lam, seed=seed0 + r
            )
        _, lo, hi = _core.t_interval(_core.confint_draws(its, method, 10, 20), 0.05)
        hits.append((lo <= theta_hat) & (theta_hat <= hi))
    return float(np.mean(hits))


@pytest.mark.parametrize(
    "method, steps", [("batch_means", 420), ("checkpoints", 420), ("independent_runs", 600)]
)
def test_nominal_95_intervals_cover_ols(method, steps) -> None:
    """Coverage of theta_hat within 0.95 +- 3 standard errors of 300 runs
    (4 coordinates each; SE from the runs: sqrt(0.95 * 0.05 / 300) = 0.0126). Seeded; the
    false-failure rate of a 3-SE band is about 0.3%."""
    cov = _coverage(method, 300, steps, seed0=100)
    assert abs(cov - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / 300), cov


def test_batch_means_with_short_batches_under_cover() -> None:
    """The same test fails for a construction that ignores autocorrelation (consecutive iterates are
    strongly correlated): batches of 2 steps cover far below nominal."""
    assert _coverage("batch_means", 100, 40, seed0=5) < 0.8


def test_dpgd_privacy_error_falls_like_one_over_n() -> None:
    """Brown et al. 2024, Theorem 2.7: ||theta_T - theta_hat|| ~ 1/n at fixed p, rho, T (bias
    negligible after 60 steps of eta = 1/5); log-log slope over n = 1000 .. 16000 in [-1.2, -0.8],
    mean of 40 seeded runs per n."""
    p, steps = 5, 60
    errs = []
    ns = [1000, 4000, 16000]
    for n in ns:
        rng = np.random.default_rng(n)
        X = rng.normal(size=(n, p))
        y = X @ (np.ones(p) / math.sqrt(p)) + rng.normal(size=n)
        theta_hat = np.linalg.lstsq(X, y, rcond=None)[0]
        gamma = 5 * math.sqrt(p)
        lam = math.sqrt(2 * steps) * gamma / (math.sqrt(0.015) * n)
        e = [
            np.linalg.norm(
                _core.dpgd_run(X, y, steps=steps, eta=0.2, gamma=gamma, noise_std=lam, seed=s)[-1]
                - theta_hat
            )
            for s in range(40)
        ]
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert -1.2 <= slope <= -0.8, (errs, slope)


# ----------------------------------------------------------------------- DP-AMBSSGD, DP-SSGD


def test_ambssgd_noise_in_the_server_has_the_plans_scale(conn, scratch_schema) -> None:
    """Zero rows: the model is a fixed linear map of the step noises, w_bar = -(2/T) sum_t
    sum_{k<t} c_k g_k with c_k = 2 eta zeta_k alpha / b and zeta_k released. Each coordinate
    standardised by its exact sd must be N(0, 1): chi-square on 40 seeded runs x 5 coordinates
    (two-sided alpha = 1e-3; deterministic under the seeds). Fails without noise, without the
    2, or with alpha off by 10%."""
    n, d, blocks = 4000, 5, 20
    ds, source = _register(
        conn, scratch_schema, np.zeros((n, d)), np.zeros(n), label_bound=1.0, row_bound=1.0
    )
    z: list[float] = []
    for seed in range(40):
        m = _train(conn, source, "dp_ambssgd", epsilon=20.0, steps=blocks, noise_seed=seed)
        priv = m["params"]["privacy"]
        zetas = np.asarray(priv["released_zetas"])
        assert len(zetas) == blocks and len(priv["released_gammas"]) == blocks
        c = 2 * priv["step_size"] * zetas * priv["noise_multiplier"] / priv["batch_size"]
        k = np.arange(blocks)
        a = (2 / blocks) * (blocks - np.maximum(k, blocks // 2))
        z.extend(np.asarray(m["coef"]) / math.sqrt(np.sum((c * a) ** 2)))
    chi2 = float(np.sum(np.square(z)))
    assert stats.chi2(len(z)).ppf(5e-4) < chi2 < stats.chi2(len(z)).ppf(1 - 5e-4)
    assert priv["unused_rows"] == n - blocks * (priv["batch_size"] + priv["stat_size"])
    assert _spent(conn, ds) == pytest.approx(40 * 20.0)


def test_ambssgd_learns_and_releases_its_transcript(conn, scratch_schema) -> None:
    """Feasible regime (N = 200k, eps = 4): close to w*; the clip norms adapt (with little
    noise, sigma = 0.1, zeta_t falls from the first block as w_t approaches w*); the
    transcript is in the provenance. The noise and the table's order are seeded, so the test is
    deterministic on every server. gamma_t lies on a grid of powers of 2, so a fall by a factor
    of 4 is two grid levels (an unseeded order once landed exactly on zeta_1 / 4)."""
    X, y, w = _gaussian_data(200_000, 5, sigma=0.1, seed=8)
    ds, source = _register(conn, scratch_schema, X, y, label_bound=10.0, row_bound=7.0)
    m = _train(
        conn, source, "dp_ambssgd", epsilon=4.0, options={"h_norm": 1.0}, noise_seed=8, seed=8
    )
    priv = m["params"]["privacy"]
    assert np.linalg.norm(np.asarray(m["coef"]) - w) < 0.05
    zetas = np.asarray(priv["released_zetas"])
    assert zetas[-1] <= zetas[0] / 4 * (1 + 1e-12)
    assert priv["algorithm"].startswith("DP-AMBSSGD")
    assert _spent(conn, ds) == pytest.approx(4.0)


def test_dp_ssgd_runs_one_step_per_record(conn, regression) -> None:
    ds, source, X, y, w = regression
    m = _train(
        conn,
        source,
        "dp_ssgd",
        epsilon=2.0,
        clip_norm=5.0,
        options={"baseline": True},
        intercept=False,  # p below is the feature count
    )
    priv = m["params"]["privacy"]
    (rho,) = conn.execute("SELECT dpsql.zcdp_rho(2, %s)", (DELTA,)).fetchone()
    assert priv["noise_multiplier"] == pytest.approx(1 / math.sqrt(2 * rho))
    assert priv["gradient_noise_std"] == pytest.approx(2 * 5.0 / math.sqrt(2 * rho))
    assert priv["unused_rows"] == 0 and np.all(np.isfinite(m["coef"]))
    assert _spent(conn, ds) == pytest.approx(2.0)
    # the stationary prediction noise sqrt(eta p / 2) * 2 zeta alpha is what the refusal tests
    p = len(m["coef"])
    assert priv["stationary_prediction_noise_sd"] == pytest.approx(
        math.sqrt(priv["step_size"] * p / 2) * 2 * 5.0 / math.sqrt(2 * rho)
    )


def test_dp_ssgd_runs_when_its_noise_stays_below_the_label_bound(conn, regression) -> None:
    """A step small enough that the settled prediction noise is below the label bound runs
    without the baseline option; the same run with the default step is refused."""
    ds, source = regression[:2]
    (bound,) = conn.execute(
        "SELECT label_bound FROM dpsql.datasets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    m = _train(conn, source, "dp_ssgd", epsilon=2.0, clip_norm=0.05, step_size=1e-4)
    assert m["params"]["privacy"]["stationary_prediction_noise_sd"] < bound


def test_ambssgd_error_falls_with_n(conn, regression) -> None:
    """Varshney et al. 2022, Theorem 10: in the feasible regime the excess risk falls with N; its
    log-log slope lies in [-2.3, -0.8]. The server's plan, run by the C core in memory (the same
    code as the aggregate); 20 seeded runs per N, eps = 4, d = 5, H = I."""
    ds = regression[0]
    ns = [2**17, 2**18, 2**19]
    excess = []
    for n in ns:
        plan = _plan(conn, ds, "dp_ambssgd", n, 5, 4.0, options={"r_x": 7.0, "h_norm": 1.0})
        e = []
        for seed in range(20):
            X, y, w = _gaussian_data(n, 5, seed=100 * seed + n % 97)
            s = _core.ambssgd_init(
                5,
                n_rows=n,
                blocks=plan["blocks"],
                batch=plan["batch_size"],
                stat=plan["stat_size"],
                alpha=plan["noise_multiplier"],
                eta=plan["step_size"],
                r_x=plan["r_x"],
                log_factor=plan["log_factor"],
                domain=plan["domain_bound"],
                levels=plan["levels"],
                sigma_c=plan["count_noise_std"],
                theta=plan["stat_threshold"],
                seed=seed,
            )
            wb = _core.ambssgd_result(_core.ambssgd_run(s, X, y))["weights"]
            e.append(0.5 * np.sum((wb - w) ** 2))
        excess.append(np.mean(e))
    slope = np.polyfit(np.log(ns), np.log(excess), 1)[0]
    assert excess[0] > excess[1] > excess[2] and -2.3 <= slope <= -0.8, (excess, slope)


# ----------------------------------------------------------------- analysts, Python API


def test_analyst_trains_and_gets_intervals(conn, regression, server_uri) -> None:
    """An analyst granted the dataset trains DP-GD and asks for intervals; a data owner's
    seeded model is invisible to them (its noise is known), and so are its intervals."""
    ds, source = regression[:2]
    name = f"test_lin_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD 'pw_{name}' IN ROLE dpsql_analyst")
    try:
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, name))
        seeded = _train(conn, source, "dpgd", epsilon=0.5, noise_seed=1)
        with psycopg.connect(
            make_conninfo(server_uri, user=name, password=f"pw_{name}"), autocommit=True
        ) as a:
            (mid,) = a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'dpgd',"
                " epsilon => 1, delta => 1e-6)",
                (source,),
            ).fetchone()
            rows = a.execute("SELECT * FROM dpsql.confint(%s, 0.05)", (mid,)).fetchall()
            # 4 features and the intercept (the regression default since issue 25)
            assert len(rows) == 5 and all(lo < est < hi for _, est, lo, hi in rows)
            with pytest.raises(psycopg.Error, match="no model"):
                a.execute("SELECT * FROM dpsql.confint(%s, 0.05)", (seeded["model_id"],))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute("SELECT * FROM dpsql.model_iterates")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute(
                    "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'dpgd',"
                    " epsilon => 1, delta => 1e-6, noise_seed => 3)",
                    (source,),
                )
        assert _spent(conn, ds) == pytest.approx(1.5)
    finally:
        conn.execute("DELETE FROM dpsql.dataset_grants WHERE role = %s", (name,))
        conn.execute(f'DROP ROLE "{name}"')


def test_python_api(server_uri, scratch_schema) -> None:
    import dpsql

    X, y, w = _gaussian_data(3000, 3, seed=9)
    with dpsql.connect(server_uri) as db:
        db.execute(f"SET search_path TO {scratch_schema}, public")
        db.load_numpy("pts", X, y, schema=scratch_schema)
        db.register_dataset(
            f"{scratch_schema}.pts",
            "x",
            "y",
            epsilon_budget=10,
            delta_budget=1e-4,
            label_bound=6.0,
            row_bound=5.0,
            name=f"py_{uuid.uuid4().hex[:8]}",
        )
        m = db.train(
            f"{scratch_schema}.pts",
            None,
            None,
            "linear",
            intercept=True,
            privacy=dpsql.DPGD(epsilon=2.0, ci="checkpoints", steps=220),
        )
        ci = m.confint(0.1)
        assert ci.method == "checkpoints" and ci.draws == 10 and ci.epsilon == 2.0
        assert ci.estimate.shape == (4,) and np.all(ci.lower < ci.upper)
        np.testing.assert_allclose(ci.estimate[:3], m.coef_, rtol=1e-12)
        assert ci.target in ("ols", "clipped least squares") and "OLS" in ci.covers
        assert ci.clipped_fraction is not None and 0 <= ci.clipped_fraction <= 1
        for mech in (
            dpsql.AdaSSP(epsilon=1.0),
            dpsql.DPSSGD(epsilon=1.0, clip_norm=5.0, options={"baseline": True}),
        ):
            r = db.train(f"{scratch_schema}.pts", None, None, "linear", privacy=mech)
            assert r.row["privacy"] == mech.name and np.all(np.isfinite(r.coef_))
        with pytest.raises(psycopg.Error, match="no confidence intervals"):
            r.confint()


def test_unmixed_runs_are_flagged(conn, scratch_schema) -> None:
    """Ill-conditioned features (one direction with second moment 4e-4): 420 steps of 1/5
    cannot mix, the draws are autocorrelated, the model says so and confint warns; isotropic
    data mix (burn-in and autocorrelation). Seeded noise: deterministic."""
    X, y, _ = _gaussian_data(3000, 3, seed=12)
    X[:, 0] *= 0.02
    ds, source = _register(conn, scratch_schema, X, y, label_bound=6.0, row_bound=5.0)
    m = _train(conn, source, "dpgd", epsilon=2.0, noise_seed=1, options={"precondition": False})
    ci = m["params"]["privacy"]["ci"]
    assert ci["mixed"] is False and ci["draw_autocorrelation"] > 0.03
    (its,) = conn.execute(
        "SELECT iterates FROM dpsql.model_iterates WHERE model_id = %s", (m["model_id"],)
    ).fetchone()
    v = np.asarray(its)[40:]  # the burn-in (with the clip quantile's pilot: 40)
    v = v - v.mean(axis=0)
    r1 = np.sum(v[:-1] * v[1:], axis=0) / np.sum(v**2, axis=0)
    assert ci["draw_autocorrelation"] == pytest.approx(np.max(np.maximum(r1, 0) ** 40))
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    conn.execute("SELECT * FROM dpsql.confint(%s, 0.05)", (m["model_id"],)).fetchall()
    assert any("had not mixed" in (n or "") and "widened" in (n or "") for n in notices)
    # widened, not merely flagged (issue 42, item 10)
    _check_widening(conn, m["model_id"], ci)
    X, y, _ = _gaussian_data(3000, 3, seed=12)
    ds, source = _register(conn, scratch_schema, X, y, label_bound=6.0, row_bound=5.0, table="iso")
    for ci_method, steps in (("batch_means", None), ("independent_runs", 600)):
        m = _train(conn, source, "dpgd", epsilon=2.0, ci=ci_method, steps=steps, noise_seed=2)
        ci = m["params"]["privacy"]["ci"]
        assert ci["mixed"] is True and ci["draw_autocorrelation"] < 0.01, ci
        _check_widening(conn, m["model_id"], ci)


def test_draws_worth_fewer_than_two_give_no_interval(conn) -> None:
    """Iterates of a random walk (every lag-1 autocorrelation near 1): the draws carry almost
    no independent information, so the bounds are withheld rather than made up; white noise
    gives intervals close to the plain t-interval's (issue 42, item 10)."""
    rng = np.random.default_rng(3)
    query = (
        "SELECT lower, upper, effective_draws FROM dpsql_internal._confint_rows(%s, 'batch_means',"
        " 10, 0, 0.05) ORDER BY coef_index"
    )
    walk = np.cumsum(rng.normal(size=(1000, 2)), axis=0)
    rows = conn.execute(query, (walk.tolist(),)).fetchall()
    assert all(lo is None and hi is None and eff < 2 for lo, hi, eff in rows), rows
    noise = rng.normal(size=(1000, 2))
    rows = conn.execute(query, (noise.tolist(),)).fetchall()
    assert all(lo < hi and eff > 9 for lo, hi, eff in rows), rows


def _check_widening(conn, model_id: int, ci: dict, alpha: float = 0.05) -> None:
    """A run's intervals are its draws' t-intervals widened for their correlation
    (42_dpgd.sql, _confint_rows), recomputed here from the released iterates: r the largest
    lag-1 autocorrelation after the burn-in, rho the draws' correlation under an AR(1)."""
    from scipy import stats

    (its,) = conn.execute(
        "SELECT iterates FROM dpsql.model_iterates WHERE model_id = %s", (model_id,)
    ).fetchone()
    rows = np.array(
        conn.execute(
            "SELECT estimate, lower, upper FROM dpsql.confint(%s, %s) ORDER BY coef_index",
            (model_id, alpha),
        ).fetchall()
    )
    its, m, b = np.asarray(its), int(ci["draws"]), int(ci["burn_in"])
    draws = _core.confint_draws(its, ci["method"], m, b)
    c = g = 1.0
    if ci["method"] != "independent_runs":
        post = its[b:]
        B = len(post) // m
        v = post - post.mean(axis=0)
        r = min(float(np.max(np.maximum(np.sum(v[:-1] * v[1:], 0) / np.sum(v**2, 0), 0))), 1 - 1e-9)
        rho = (
            r * (1 - r**B) ** 2 / ((1 - r) ** 2 * B + 2 * r * (B * (1 - r) - 1 + r**B))
            if ci["method"] == "batch_means"
            else r**B
        )
        k = np.arange(1, m)
        S = float(np.sum((1 - k / m) * rho**k))
        c, g = 1 + 2 * S, 1 - 2 * S / (m - 1)
        assert c > 1  # the widening is there
    q = stats.t.ppf(1 - alpha / 2, max(m / c - 1, 1))
    half = q * draws.std(axis=0, ddof=1) * np.sqrt(c / (g * m))
    np.testing.assert_allclose(rows[:, 0], draws.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(rows[:, 2] - rows[:, 0], half, rtol=1e-6)
    np.testing.assert_allclose(rows[:, 0] - rows[:, 1], half, rtol=1e-6)
