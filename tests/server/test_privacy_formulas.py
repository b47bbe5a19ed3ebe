"""The privacy formulas every mechanism shares, each in one place in the C core (issue 26):
the zCDP Gaussian, DP-GD's per-step noise, the one-vs-rest split, the size of a release's
noise, SCS13's and BST14's per-step noise and output perturbation's E||b||^2. Each is checked
against an independent computation (numpy closed forms, scipy, dp-accounting) and, where a
mechanism used to spell it in SQL, against that spelling to the bit: moving the formula into
the core changed no release."""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest
from scipy import optimize, stats

DELTA = 1e-6


def _one(conn, sql, *args):
    """The row of a query with positional arguments, or one dict of named ones."""
    params = args[0] if len(args) == 1 and isinstance(args[0], dict) else args
    return conn.execute(sql, params).fetchone()


# --------------------------------------------------------------------------- the zCDP Gaussian


@pytest.mark.parametrize("shares", [1, 2, 3, 10])
def test_zcdp_sigma_is_the_gaussian_of_its_share(conn, shares) -> None:
    """sigma = Delta / sqrt(2 rho / shares): `shares` such Gaussians are rho-zCDP, i.e. their
    Renyi divergence of order a is a rho (dp-accounting's RDP accountant, exact for Gaussians),
    and dp-accounting finds at most the epsilon whose rho it was."""
    import dp_accounting
    from dp_accounting import rdp

    for eps, sens in [(0.5, 1.0), (1.0, 2.5), (4.0, 0.3)]:
        (rho,) = _one(conn, "SELECT dpsql.zcdp_rho(%s, %s)", eps, DELTA)
        (sigma,) = _one(conn, "SELECT dpsql_internal._zcdp_sigma(%s, %s, %s)", sens, rho, shares)
        assert sigma == pytest.approx(sens / np.sqrt(2 * rho / shares), rel=1e-15)
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(sigma / sens), shares
        )
        orders = [1.5, 2.0, 8.0, 32.0]
        acc = rdp.RdpAccountant(orders=orders).compose(event)
        assert np.asarray(acc._rdp) == pytest.approx(np.asarray(orders) * rho, rel=1e-12)
        assert rdp.RdpAccountant().compose(event).get_epsilon(DELTA) <= eps * (1 + 1e-9)


def test_zcdp_sigma_keeps_the_plans_bits(conn) -> None:
    """The spellings the linear mechanisms' plans used before: DP-SSGD and tight DP-AMBSSGD
    1/sqrt(2 rho), the paper's DP-AMBSSGD 1/sqrt(rho) (two shares), AdaSSP 1/sqrt(2 rho / 3),
    DP-GD's clip histogram 1/sqrt(rho) (two counts) and its checks Delta/sqrt(2 rho)."""
    for eps in (0.1, 0.7, 1.0, 3.3, 9.0):
        (rho,) = _one(conn, "SELECT dpsql.zcdp_rho(%s, %s)", eps, DELTA)
        row = _one(
            conn,
            "SELECT dpsql_internal._zcdp_sigma(1, r) = 1 / sqrt(2 * r),"
            "       dpsql_internal._zcdp_sigma(1, r, 2) = 1 / sqrt(r),"
            "       dpsql_internal._zcdp_sigma(1, r, 3) = 1 / sqrt(2 * r / 3),"
            "       dpsql_internal._zcdp_sigma(1.7, r / 10) = 1.7 / sqrt(2 * (r / 10))"
            "  FROM (SELECT %s::float8 AS r) s",
            rho,
        )
        assert all(row), (eps, row)


@pytest.mark.parametrize(
    "args", [(-1, 0.5, 1), (1, 0, 1), (1, "NaN", 1), (1, 0.5, 0.5), ("Infinity", 0.5, 1)]
)
def test_zcdp_sigma_refuses_bad_input(conn, args) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="zCDP Gaussian"):
        _one(conn, "SELECT dpsql_internal._zcdp_sigma(%s::float8, %s::float8, %s::float8)", *args)


def test_dpgd_noise_std_is_the_zcdp_gaussian_of_a_step(conn) -> None:
    """N steps of sensitivity 2 gamma / n at rho / N each: the zCDP Gaussian up to rounding,
    and bit for bit the plan's sqrt(2 N) gamma / (sqrt(rho) n)."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        gamma, rho = rng.uniform(0.1, 50), rng.uniform(1e-4, 5)
        steps, n = int(rng.integers(1, 5000)), int(rng.integers(10, 10**7))
        sd, general, same = _dpgd(conn, gamma, rho, steps, n)
        assert same
        assert sd == pytest.approx(general, rel=1e-15)
        assert sd == pytest.approx(2 * gamma / n / math.sqrt(2 * rho / steps), rel=1e-14)
    for bad in [(0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="_dpgd_noise_std"):
            _one(conn, "SELECT dpsql_internal._dpgd_noise_std(%s, %s, %s, %s)", *bad)


def _dpgd(conn, gamma, rho, steps, n):
    return conn.execute(
        "SELECT dpsql_internal._dpgd_noise_std(%(g)s, %(r)s, %(N)s, %(n)s),"
        "       dpsql_internal._zcdp_sigma(2 * %(g)s / %(n)s::float8, %(r)s, %(N)s),"
        "       dpsql_internal._dpgd_noise_std(%(g)s, %(r)s, %(N)s, %(n)s)"
        "         = sqrt(2 * %(N)s::bigint) * %(g)s::float8"
        "           / (sqrt(%(r)s::float8) * %(n)s::bigint)",
        {"g": gamma, "r": rho, "N": steps, "n": n},
    ).fetchone()


# ------------------------------------------------------------------------------- one-vs-rest


@pytest.mark.parametrize(
    ("model", "classes", "models"),
    [
        ("logistic", 2, 1),
        ("logistic", 3, 3),
        ("huber", 10, 10),
        ("svm", 4, 4),  # an alias of huber
        ("multinomial", 5, 1),  # one softmax model
        ("linear", 0, 1),
        ("logistic", 0, 1),
    ],
)
def test_one_vs_rest_splits_the_budget_evenly(conn, model, classes, models) -> None:
    got = _one(
        conn,
        "SELECT models, model_epsilon, model_delta"
        "  FROM dpsql_internal._one_vs_rest(%s, %s, %s, %s)",
        model,
        classes,
        1.3,
        3e-6,
    )
    assert got == (models, 1.3 / models, 3e-6 / models)
    # no budget: the models alone
    assert _one(
        conn, "SELECT * FROM dpsql_internal._one_vs_rest(%s, %s, NULL, NULL)", model, classes
    ) == (
        models,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("lasso", 3, 1, 0), "unknown model"),
        (("logistic", -1, 1, 0), "negative number"),
        (("logistic", 3, 0, 0), "epsilon > 0"),
        (("logistic", 3, 1, 1), "delta < 1"),
        ((None, 3, 1, 0), "needs a model"),
    ],
)
def test_one_vs_rest_refuses_bad_input(conn, args, match) -> None:
    with pytest.raises(psycopg.Error, match=match):
        _one(conn, "SELECT * FROM dpsql_internal._one_vs_rest(%s, %s, %s, %s)", *args)


def test_the_sgd_state_has_one_output_per_one_vs_rest_model() -> None:
    """The core's SGD state (sgd.h, dpsql_outputs) follows the same rule."""
    from dpsql import _core

    for model, classes, outputs in [("logistic", 3, 3), ("huber", 2, 1), ("multinomial", 4, 4)]:
        s = _core.init_state(model, 2, n_classes=classes)
        assert _core.header(s)["n_out"] == outputs


# ------------------------------------------------------------------- the size of the noise


def _balle_wang_delta(sigma: float, sens: float, eps: float) -> float:
    a, b = sens / (2 * sigma), eps * sigma / sens
    return float(stats.norm.cdf(a - b) - np.exp(eps) * stats.norm.cdf(-a - b))


@pytest.mark.parametrize(("eps", "delta"), [(0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-7)])
def test_noise_size_of_the_analytic_gaussian(conn, eps, delta) -> None:
    """sigma sqrt(dim), sigma the smallest with the exact delta(sigma) of Balle-Wang (Thm 8)
    at most delta: scipy's root of delta(sigma) = delta."""
    sens = 2.0
    for dim in (1, 7):
        (size,) = _one(
            conn, "SELECT dpsql_internal._noise_size(%s, %s, %s, %s)", sens, eps, delta, dim
        )
        root = optimize.brentq(
            lambda s: _balle_wang_delta(s, sens, eps) - delta, 1e-3, 1e3, xtol=1e-14
        )
        assert size == pytest.approx(root * math.sqrt(dim), rel=1e-9)


def test_noise_size_classic_and_gamma(conn) -> None:
    (classic,) = _one(conn, "SELECT dpsql_internal._noise_size(1.5, 0.5, 1e-5, 4, 'classic')")
    assert classic == pytest.approx(1.5 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5 * 2, rel=1e-15)
    # Gamma(dim, s/eps) has mean dim s / eps (numpy's sampler, independent of the core's)
    (gamma,) = _one(
        conn, "SELECT dpsql_internal._noise_size(1.5, 0.5, 0, 4, 'no calibration needed')"
    )
    draws = np.random.default_rng(0).gamma(4, 1.5 / 0.5, size=400_000)
    assert gamma == 4 * 1.5 / 0.5 and draws.mean() == pytest.approx(gamma, rel=1e-2)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no Gaussian noise"):
        _one(conn, "SELECT dpsql_internal._noise_size(1, 1, 1e-5, 1, 'classic')")  # eps >= 1
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown Gaussian calibration"):
        _one(conn, "SELECT dpsql_internal._noise_size(1, 0.5, 1e-5, 1, 'exact')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no noise"):
        _one(conn, "SELECT dpsql_internal._noise_size(1, 0.5, 0, 0)")


def test_noise_size_keeps_the_defaults_bits(conn) -> None:
    """The spelling 34_defaults.sql used (_unit_noise_norm): k / epsilon and
    gaussian_sigma(1, epsilon, delta) sqrt(k)."""
    for eps, delta, k in [(0.3, 0, 7), (1.7, 0, 501), (0.3, 1e-6, 7), (2.9, 1e-5, 120)]:
        (same,) = _one(
            conn,
            "SELECT dpsql_internal._noise_size(1, %(e)s, %(d)s, %(k)s)"
            "       = CASE WHEN %(d)s > 0"
            "              THEN dpsql.gaussian_sigma(1, %(e)s, %(d)s) * sqrt(%(k)s::int)"
            "              ELSE %(k)s::int / %(e)s::float8 END",
            {"e": eps, "d": delta, "k": k},
        )
        assert same


# ------------------------------------------------------------------ SCS13's and BST14's steps


def test_scs13_step_noise_splits_the_passes(conn) -> None:
    """(epsilon, delta) / passes per pass; the noise at sensitivity s as _noise_size, bit for
    bit the old plan's 2 L / (epsilon / k) and gaussian_sigma(2 L, epsilon / k, delta / k)."""
    for eps, delta, k, cal in [
        (3.0, 0, 1, "analytic"),
        (2.0, 1e-6, 2, "analytic"),
        (0.9, 1e-5, 1, "classic"),
    ]:
        row = _one(
            conn,
            "SELECT s.epsilon_pass, s.delta_pass, s.noise,"
            "       s.noise = CASE WHEN %(d)s = 0 THEN 2 * 0.7::float8 / (%(e)s / %(k)s)"
            "                      ELSE dpsql.gaussian_sigma(2 * 0.7::float8, %(e)s / %(k)s,"
            "                                                %(d)s / %(k)s, %(c)s) END"
            "  FROM dpsql_internal._scs13_step_noise(2 * 0.7::float8, %(e)s, %(d)s, %(k)s, 1,"
            "                                        %(c)s) s",
            {"e": eps, "d": delta, "k": k, "c": cal},
        )
        assert row[:2] == (eps / k, delta / k) and row[3]
        if delta == 0:
            assert row[2] == pytest.approx(1.4 * k / eps, rel=1e-15)
        elif cal == "classic":
            assert row[2] == pytest.approx(
                1.4 * math.sqrt(2 * math.log(1.25 * k / delta)) * k / eps, rel=1e-14
            )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no noise"):
        _one(conn, "SELECT * FROM dpsql_internal._scs13_step_noise(1, 1, 0, 0, 1, 'analytic')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no Gaussian noise"):
        _one(conn, "SELECT * FROM dpsql_internal._scs13_step_noise(1, 1, 1e-5, 1, 1, 'classic')")


@pytest.mark.parametrize(
    ("eps", "delta", "m", "b", "k"),
    [(1.0, 1e-5, 100, 5, 2), (2.0, 1e-6, 60000, 50, 10), (50.0, 1e-5, 2000, 5, 1)],
)
def test_bst14_noise_from_its_paper(conn, eps, delta, m, b, k) -> None:
    """Algorithm 4/5's numbers recomputed in numpy: T = k floor(m/b), delta_1 = delta/T,
    epsilon_1 the root of eps = T e1 (e^e1 - 1) + sqrt(2 T ln(1/delta_1)) e1 (scipy),
    epsilon_2 = min(1, m e1 / (2 b)), sigma = sqrt(2 ln(1.25/delta_1)) / epsilon_2 (at
    epsilon_2 = 1 too, as the paper applies it: the last case)."""
    e1, e2, d1, sigma = _one(
        conn, "SELECT * FROM dpsql_internal._bst14_noise(%s, %s, %s, %s, %s)", eps, delta, m, b, k
    )
    t = k * (m // b)
    assert d1 == delta / t
    root = optimize.brentq(
        lambda x: t * x * np.expm1(x) + np.sqrt(2 * t * np.log(1 / d1)) * x - eps,
        0,
        min(eps, 50),
        xtol=1e-300,
        rtol=1e-15,
    )
    assert e1 == pytest.approx(root, rel=1e-12)
    assert e2 == min(1.0, m * e1 / (2 * b))
    assert sigma == pytest.approx(np.sqrt(2 * np.log(1.25 / d1)) / e2, rel=1e-15)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="BST14"):
        _one(conn, "SELECT * FROM dpsql_internal._bst14_noise(1, 0, 100, 5, 1)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="BST14"):
        _one(conn, "SELECT * FROM dpsql_internal._bst14_noise(1, 1e-5, 4, 5, 1)")


# ------------------------------------------------------------- output perturbation's E||b||^2


@pytest.mark.parametrize(
    ("p", "eps", "delta", "shares"),
    [(5, 2.0, 1e-5, 1), (5, 6.0, 1e-5, 3), (31, 0.5, 0, 1), (4, 6.0, 0, 10)],
)
def test_noise_sq_norm(conn, p, eps, delta, shares) -> None:
    """p (p + 1) (C/eps)^2 (Gamma-norm: E r^2 of Gamma(p, C/eps), numpy's moments) or p times
    the classic variance at (eps, delta) / C; bit for bit the regulariser's old spelling."""
    (v, same) = _one(
        conn,
        "SELECT dpsql_internal._noise_sq_norm(%(p)s, %(e)s, %(d)s, %(c)s),"
        "       dpsql_internal._noise_sq_norm(%(p)s, %(e)s, %(d)s, %(c)s)"
        "         = CASE WHEN %(d)s > 0 THEN 2 * %(p)s::int * ln(1.25 * %(c)s::int / %(d)s)"
        "                ELSE %(p)s::int * (%(p)s::int + 1.0) END * (%(c)s::int / %(e)s) ^ 2",
        {"p": p, "e": eps, "d": delta, "c": shares},
    )
    assert same
    if delta == 0:
        scale = shares / eps
        assert v == pytest.approx(stats.gamma(p, scale=scale).moment(2), rel=1e-12)
    else:
        sigma = math.sqrt(2 * math.log(1.25 / (delta / shares))) / (eps / shares)
        assert v == pytest.approx(p * sigma**2, rel=1e-13)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="_noise_sq_norm"):
        _one(conn, "SELECT dpsql_internal._noise_sq_norm(0, 1, 0, 1)")
