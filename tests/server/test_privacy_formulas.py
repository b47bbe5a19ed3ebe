"""The privacy formulas every mechanism shares, each in one place in the C core (issue 26):
the zCDP Gaussian, DP-GD's per-step noise and the one-vs-rest split. Each is checked against
an independent computation (numpy closed forms, dp-accounting) and, where a mechanism used to
spell it in SQL, against that spelling to the bit: moving the formula into the core changed no
release."""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest

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
