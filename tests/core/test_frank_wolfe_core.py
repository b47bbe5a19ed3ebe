"""The C core of private Frank-Wolfe (core/frank_wolfe.h): iterates in the L1 ball,
sparsity, non-private convergence at Jaggi's rate, the exponential-mechanism vertex choice
(distribution and scale), the score sensitivity on adversarial neighbours, the accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpsql import _core


def _design(n=2000, d=15, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.choice([-1.0, 1.0], size=(n, d)) / np.sqrt(d)
    beta = np.zeros(d)
    beta[[1, 4, 9]] = [0.5, -0.3, 0.2]
    y = X @ beta + 0.05 * rng.normal(size=n)
    return X, y, beta


def _l1_project(v, s):
    """Euclidean projection onto the L1 ball of radius s (Duchi et al. 2008)."""
    if np.abs(v).sum() <= s:
        return v
    u = np.sort(np.abs(v))[::-1]
    css = np.cumsum(u)
    k = np.nonzero(u * np.arange(1, len(u) + 1) > css - s)[0][-1]
    tau = (css[k] - s) / (k + 1)
    return np.sign(v) * np.maximum(np.abs(v) - tau, 0)


def _lasso_optimum(xtx, xty, s, iters=20000):
    theta = np.zeros(len(xty))
    step = 1 / np.linalg.eigvalsh(xtx)[-1]
    for _ in range(iters):
        theta = _l1_project(theta - step * (xtx @ theta - xty), s)
    return theta


def test_accounting_formulas() -> None:
    rho = 0.05
    assert _core.fw_eps_step(1.0, 1e-6, rho, 100) == pytest.approx(math.sqrt(8 * rho / 100))
    assert _core.fw_eps_step(2.0, 0.0, rho, 50) == pytest.approx(2.0 / 50)
    # K steps of eps_step^2/8-zCDP each give back rho
    e = _core.fw_eps_step(1.0, 1e-6, rho, 37)
    assert 37 * e**2 / 8 == pytest.approx(rho)
    # Corollary 6.24's constants: L_1 = 2 for ||x||_inf <= 1, |y| <= 1, s = 1
    assert _core.fw_l1_bound("lasso", 1.0, 1.0, 1.0) == 2.0
    assert _core.fw_l1_bound("logistic", 1.5, 3.0) == 1.5
    # Test vector with the noise on the SUM gradient (the chapter's /n assumes a mean):
    # T = 100, eps = 1, delta = 1e-5, L_1 = 2, ||C||_1 = 1 give
    # b_FW = L_1 ||C||_1 sqrt(8 T ln(1/delta)) / eps = 191.941
    assert 2 * 1 * math.sqrt(8 * 100 * math.log(1e5)) / 1 == pytest.approx(191.941, abs=1e-3)
    # default K: round((Gamma n eps)^(2/3) / (L_1 s)^(2/3)), Gamma = (2 s R)^2, clamped
    g = (2 * 1 * 1) ** 2
    assert _core.fw_default_steps("lasso", 1000, 1, 1, 1, 2) == round(
        (g * 1000) ** (2 / 3) / 2 ** (2 / 3)
    )
    assert _core.fw_default_steps("lasso", 1e12, 1, 1, 1, 2) == 2000
    assert _core.fw_default_steps("logistic", 1, 1e-6, 1, 1, 1) == 2
    for bad in [(-1.0, 1.0, 1.0), (1.0, math.inf, 1.0), (1.0, 1.0, -1.0)]:
        with pytest.raises(ValueError):
            _core.fw_l1_bound("lasso", *bad)
    with pytest.raises(ValueError):
        _core.fw_eps_step(1.0, 1e-6, 0.0, 10)
    with pytest.raises(ValueError):
        _core.fw_eps_step(1.0, 0.0, 0.0, 2001)


def test_iterates_in_the_ball_and_sparse() -> None:
    X, y, _ = _design()
    gram = _core.adassp_gram(X, y, 1.0, 2.0)
    for s, steps in [(1.0, 5), (0.3, 40), (4.0, 200)]:
        theta, its = _core.fw_lasso(
            gram, s, steps, 0.5, 2 * s * (s + 2), seed=1, return_iterates=True
        )
        assert its.shape == (steps, X.shape[1])
        assert np.all(np.abs(its).sum(axis=1) <= s * (1 + 1e-12))
        nnz = np.count_nonzero(its, axis=1)
        assert np.all(nnz <= np.arange(1, steps + 1))  # nnz(theta_k) <= k, theta_0 = 0
        np.testing.assert_array_equal(theta, its[-1])


def test_non_private_convergence_rate() -> None:
    """eps_step huge: the exact linear oracle; f(theta_K) - f* <= 2 Gamma_f / (K + 2) with
    Gamma_f = max_{u,v in C} ||X (u - v)||^2 = (2 s)^2 max_j (X^T X)_jj."""
    X, y, _ = _design()
    s = 1.0
    gram = _core.adassp_gram(X, y, 1.0, 2.0)
    p = X.shape[1]
    xtx = gram[2 : 2 + p * p].reshape(p, p)
    xty = gram[2 + p * p :]
    f = lambda t: 0.5 * t @ xtx @ t - xty @ t  # noqa: E731 (f up to a constant)
    fstar = f(_lasso_optimum(xtx, xty, s))
    gamma_f = (2 * s) ** 2 * np.max(np.diag(xtx))
    for steps in [2, 10, 50, 300]:
        theta = _core.fw_lasso(gram, s, steps, 1e12, 1.0, seed=0)
        assert f(theta) - fstar <= 2 * gamma_f / (steps + 2) + 1e-9
    assert f(_core.fw_lasso(gram, s, 2000, 1e12, 1.0, seed=0)) - fstar < 1e-3 * gamma_f


def test_selection_follows_the_exponential_mechanism() -> None:
    """20000 seeded draws of one step against the closed-form probabilities
    exp(-eps_step <v, g> / (2 Delta_u)) / Z: chi-square at alpha = 1e-3 (false-failure rate
    1e-3, deterministic under the seeds); the same draws reject probabilities computed with
    eps_step off by 10% (noise mis-scaled)."""
    g = np.array([3.0, -1.0, 0.5, 0.0, 2.0])
    s, eps_step, du = 2.0, 1.5, 4.0
    prob = _core.fw_probabilities(g, s, eps_step, du)
    expected = np.exp(-eps_step * np.concatenate([s * g, -s * g]) / (2 * du))
    np.testing.assert_allclose(prob, expected / expected.sum())
    draws = 20000
    counts = np.bincount(
        [_core.fw_select(g, s, eps_step, du, seed=i) for i in range(draws)], minlength=10
    )
    assert stats.chisquare(counts, prob * draws).pvalue > 1e-3
    for factor in (0.9, 1.1):
        wrong = _core.fw_probabilities(g, s, factor * eps_step, du)
        assert stats.chisquare(counts, wrong * draws).pvalue < 1e-3


def test_score_sensitivity_on_adversarial_neighbours() -> None:
    """Replace one row by an extreme one (clipped to the bounds by the gram): at iterates in C
    the SUM gradient moves by at most 2 L_1 per coordinate (one row's term out, one in, each
    <= L_1 = (R s + Y) R), so every score <+-s e_j, g> moves by at most Delta_u = 2 s L_1.
    Random extreme rows and the targeted one (x = e_j, y = -Y at theta = s e_j, where the new
    row's gradient is exactly L_1) are tried; the targeted one reaches about half of
    Delta_u (the rest is the removed row's own gradient)."""
    X, y, _ = _design(n=300)
    R, Y, s = 1.0, 2.0, 1.5
    l1 = _core.fw_l1_bound("lasso", R, s, Y)
    du = 2 * s * l1
    rng = np.random.default_rng(3)
    p = X.shape[1]
    worst = 0.0
    for trial in range(200):
        X2, y2 = X.copy(), y.copy()
        i = rng.integers(len(y))
        X2[i] = rng.choice([-1e3, 1e3], size=p) * (rng.random(p) < 0.5)
        if not X2[i].any():
            X2[i, 0] = 1e3
        y2[i] = rng.choice([-1e3, 1e3])
        theta = _l1_project(rng.normal(size=p) * 10, s)
        if trial % 2:
            j = rng.integers(p)
            X2[i] = 0.0
            X2[i, j] = 1e3
            y2[i] = -1e3
            theta = np.zeros(p)
            theta[j] = s
        g1 = _core.adassp_gram(X, y, R, Y)
        g2 = _core.adassp_gram(X2, y2, R, Y)
        a1, b1 = g1[2 : 2 + p * p].reshape(p, p), g1[2 + p * p :]
        a2, b2 = g2[2 : 2 + p * p].reshape(p, p), g2[2 + p * p :]
        d = (a1 @ theta - b1) - (a2 @ theta - b2)
        scores = s * np.abs(d)  # |<+-s e_j, g - g'>|
        worst = max(worst, float(np.max(scores)))
        assert np.max(np.abs(d)) <= 2 * l1 + 1e-9  # one row out (<= L_1), one in (<= L_1)
        assert np.max(scores) <= du + 1e-9
    assert worst > 0.45 * du


def test_logistic_gradient_is_clamped_and_matches_the_loss() -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(50, 3))
    y = rng.choice([-1.0, 1.0], size=50)
    theta = np.array([0.5, -1.0, 0.2, 0.3])
    g = _core.fw_gradient(X, y, theta, 1.0, True, 1e9)
    Xc = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0)
    Z = np.hstack([Xc, np.ones((50, 1))])
    m = y * (Z @ theta)
    expected = (-(y / (1 + np.exp(m)))[:, None] * Z).sum(axis=0)
    assert g[0] == 50
    np.testing.assert_allclose(g[1:], expected, rtol=1e-12, atol=1e-12)
    # the coordinate-wise clamp (trap 12)
    tight = _core.fw_gradient(X, y, theta, 1.0, True, 0.1)
    per = np.clip(-(y / (1 + np.exp(m)))[:, None] * Z, -0.1, 0.1).sum(axis=0)
    np.testing.assert_allclose(tight[1:], per, rtol=1e-12, atol=1e-12)
    # malformed rows are zero records
    Xb = X.copy()
    Xb[0, 0] = np.nan
    yb = y.copy()
    yb[1] = 0.5
    gb = _core.fw_gradient(Xb, yb, theta, 1.0, True, 1e9)
    assert gb[0] == 50
    np.testing.assert_allclose(
        gb[1:], expected - (-(y / (1 + np.exp(m)))[:, None] * Z)[:2].sum(axis=0), atol=1e-12
    )
