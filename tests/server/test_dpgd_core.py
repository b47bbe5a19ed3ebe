"""DP-GD for linear regression (Brown et al. 2024, Algorithm 1): the clipped gradient sum, the noisy
step, the law of the iterates, the confidence-interval estimators and the Student-t quantile, in
memory
(dpsql._core) and in the server (dpsql.dpgd_gradient, dpsql_internal._dpgd_step,
dpsql_internal._confint_draws, dpsql_internal._t_interval, dpsql.t_quantile).

Statistical tests are seeded, so every run draws the same numbers and the outcome is
deterministic; each states its false-failure probability: the chance that a correct
implementation fails for a random choice of seeds (the seeds were not tuned to pass).
"""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest
from scipy import optimize, stats

from dpsql import _core
from tests.pg_helpers import load

# ---------------------------------------------------------------------------------------------
# Reference formulas (numpy)
# ---------------------------------------------------------------------------------------------


def _rows(X, intercept=False, x_bound=0.0):
    """x_bound > 0 clips rows to that norm; the intercept feature 1 is appended after."""
    X = np.asarray(X, dtype=np.float64)
    if x_bound > 0:
        norms = np.linalg.norm(X, axis=1)
        X = X * np.minimum(1.0, x_bound / np.where(norms > 0, norms, 1.0))[:, None]
    if intercept:
        X = np.hstack([X, np.ones((X.shape[0], 1))])
    return X


def _vectorized_sum(X, y, theta, gamma):
    """Algorithm 1 line 2: sum_i x_i r_i f_i, f_i = min(1, gamma / (||x_i|| |r_i|)),
    r = X th - y."""
    r = X @ theta - y
    gn = np.linalg.norm(X, axis=1) * np.abs(r)
    f = np.minimum(1.0, gamma / np.where(gn > 0, gn, 1.0))
    return X.T @ (r * f), int(np.sum(gn > gamma))


def _explicit_sum(X, y, theta, gamma):
    """The same, one example at a time: g_i = x_i (<x_i, theta> - y_i), CLIP_gamma(g_i)."""
    total = np.zeros(X.shape[1])
    for x_i, y_i in zip(X, y, strict=True):
        g = x_i * (x_i @ theta - y_i)
        norm = np.linalg.norm(g)
        total += g if norm <= gamma else g * (gamma / norm)
    return total


def _well_conditioned(n, p, rng):
    """Rows whose second-moment matrix Sigma = X'X/n is exactly I (well inside 1/2 I..2 I)."""
    Z = rng.normal(size=(n, p))
    Q, _ = np.linalg.qr(Z)
    return Q * math.sqrt(n)


def _law(X, y, eta, lam, theta0, t):
    """Lemma 2.3: mean mu_t, covariance S_t = eta^2 lam^2 A^(t), contraction M = I - eta Sigma."""
    n, p = X.shape
    sigma = X.T @ X / n
    theta_hat = np.linalg.solve(X.T @ X, X.T @ y)
    M = np.eye(p) - eta * sigma
    D = M @ M
    A = np.linalg.solve(np.eye(p) - D, np.eye(p) - np.linalg.matrix_power(D, t))
    mu = theta_hat + np.linalg.matrix_power(M, t) @ (theta0 - theta_hat)
    return mu, eta**2 * lam**2 * A, M


# ---------------------------------------------------------------------------------------------
# Student t
# ---------------------------------------------------------------------------------------------


def test_t_quantile_matches_scipy_over_a_grid() -> None:
    ps = np.concatenate(
        [np.geomspace(1e-6, 0.49, 40), 1 - np.geomspace(1e-6, 0.49, 40), [0.025, 0.975, 0.3]]
    )
    dfs = [*range(1, 201), 2.5, 7.3, 1e3, 1e4, 1e5, 1e6, 1e9]
    got = np.array([[_core.t_quantile(p, df) for p in ps] for df in dfs])
    want = np.array([[stats.t.ppf(p, df) for p in ps] for df in dfs])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
    # symmetry, and the value of eq. (12) (m = 10 draws, alpha = 0.05)
    assert _core.t_quantile(0.975, 9) == pytest.approx(2.2621571627982053, rel=1e-14)
    assert _core.t_quantile(0.025, 9) == -_core.t_quantile(0.975, 9)
    assert _core.t_quantile(0.5, 5) == 0.0


def test_t_quantile_near_the_centre_and_far_in_the_tails() -> None:
    # Near p = 1/2 the quantile is (p - 1/2) / f(0) to first order (scipy loses digits there).
    for df in (3.0, 10.0, 50.0):
        f0 = stats.t.pdf(0.0, df)
        for h in (1e-7, 1e-10, 1e-13):
            assert _core.t_quantile(0.5 - h, df) == pytest.approx(-h / f0, rel=1e-9)
    # Cauchy and df = 2: their CDFs in closed forms without cancellation, far tails included
    for p in (1e-300, 1e-12, 0.1, 0.4999999):
        t1, t2 = _core.t_quantile(p, 1), _core.t_quantile(p, 2)
        assert math.atan2(1.0, -t1) / math.pi == pytest.approx(p, rel=1e-13)
        s = math.sqrt(2.0 + t2 * t2)
        assert 1.0 / (s * (s - t2)) == pytest.approx(p, rel=1e-13)
    # the CDF inverts the quantile
    for df in (1.5, 4.0, 30.0):
        for p in (1e-200, 1e-9, 0.2, 0.7):
            assert _core.t_cdf(_core.t_quantile(p, df), df) == pytest.approx(p, rel=1e-11)


def test_t_interval_formula() -> None:
    rng = np.random.default_rng(1)
    draws = rng.normal(size=(10, 4)) * [1, 2, 3, 0.1] + [5, -1, 0, 2]
    est, lo, hi = _core.t_interval(draws, 0.05)
    mean, sd = draws.mean(axis=0), draws.std(axis=0, ddof=1)
    half = stats.t.ppf(0.975, 9) * sd / math.sqrt(10)
    np.testing.assert_allclose(est, mean, rtol=1e-14)
    np.testing.assert_allclose(lo, mean - half, rtol=1e-13)
    np.testing.assert_allclose(hi, mean + half, rtol=1e-13)
    # width 2 t sd / sqrt(m) with t = 2.2622 (the upper critical value; the paper's t_{alpha/2,m-1}
    # means it)
    np.testing.assert_allclose(hi - lo, 2 * 2.2621571627982053 * sd / math.sqrt(10), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# The clipped gradient
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gamma", "intercept", "x_bound"),
    [
        (np.inf, False, 0.0),
        (3.0, False, 0.0),
        (0.5, True, 0.0),
        (2.0, True, 1.5),
        (1.0, False, 2.0),
    ],
)
def test_gradient_sum_vectorized_and_explicit_forms(gamma, intercept, x_bound) -> None:
    """The C sum equals both numpy forms; the clipped count is right."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 5)) * rng.uniform(0.1, 3.0, size=(300, 1))
    y = X @ rng.normal(size=5) + rng.standard_t(2, size=300)
    theta = rng.normal(size=6 if intercept else 5)
    total, n, clipped = _core.dpgd_gradient(X, y, theta, gamma, intercept, x_bound)
    Xa = _rows(X, intercept, x_bound)
    want, want_clipped = _vectorized_sum(Xa, y, theta, gamma)
    np.testing.assert_allclose(total, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(total, _explicit_sum(Xa, y, theta, gamma), rtol=1e-12, atol=1e-12)
    assert n == 300 and clipped == want_clipped
    if np.isfinite(gamma):
        assert 0 < clipped < 300


def test_each_clipped_gradient_keeps_its_direction_and_has_norm_at_most_gamma() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 4)) * 3
    y = rng.normal(size=200) * 5
    theta, gamma = rng.normal(size=4), 2.0
    for x_i, y_i in zip(X, y, strict=True):
        g, n, clipped = _core.dpgd_gradient(x_i[None, :], [y_i], theta, gamma)
        raw = x_i * (x_i @ theta - y_i)
        norm = np.linalg.norm(raw)
        assert n == 1 and clipped == (norm > gamma)
        if norm <= gamma:
            np.testing.assert_allclose(g, raw, rtol=1e-13, atol=1e-14)
        else:
            assert np.linalg.norm(g) == pytest.approx(gamma, rel=1e-14)
            assert g @ raw / (np.linalg.norm(g) * norm) == pytest.approx(1.0, rel=1e-14)
    # CLIP(0) = 0: a zero residual or a zero row adds nothing
    assert np.all(_core.dpgd_gradient([[1.0, 2.0]], [5.0], [1.0, 2.0], 0.1)[0] == 0)
    assert np.all(_core.dpgd_gradient([[0.0, 0.0]], [5.0], [1.0, 2.0], 0.1)[0] == 0)


EXTREMES = [
    ([1e6, 0.0, 0.0], -1e6),  # the record of the task: ||x|| = 1e6, y = -1e6
    ([1e6 / math.sqrt(3)] * 3, 1e6),
    ([1e300, -1e300, 1e300], 1e300),  # squares and inner products overflow
    ([1e-200, 0.0, 0.0], 1e300),  # tiny row, huge residual
    ([0.0, 0.0, 0.0], -1e308),
    ([np.nan, 1.0, 1.0], 1.0),  # malformed: a null record
    ([1.0, 1.0, 1.0], np.inf),
]


@pytest.mark.parametrize(("intercept", "x_bound"), [(False, 0.0), (True, 0.0), (True, 3.0)])
def test_replacing_one_record_moves_the_sum_by_at_most_two_gamma(intercept, x_bound) -> None:
    """Replace-one sensitivity of the clipped sum is 2 gamma (the mean: 2 gamma / n)."""
    rng = np.random.default_rng(4)
    n, gamma = 100, 1.5
    X = rng.normal(size=(n, 3))
    y = X @ [1.0, -2.0, 0.5] + rng.normal(size=n)
    worst = 0.0
    for trial in range(20):
        theta = rng.normal(size=4 if intercept else 3) * 3
        base, n0, _ = _core.dpgd_gradient(X, y, theta, gamma, intercept, x_bound)
        i = trial % n
        for x_new, y_new in EXTREMES:
            X2, y2 = X.copy(), y.copy()
            X2[i], y2[i] = x_new, y_new
            other, n1, _ = _core.dpgd_gradient(X2, y2, theta, gamma, intercept, x_bound)
            assert n1 == n0 == n
            assert np.all(np.isfinite(other))
            worst = max(worst, float(np.linalg.norm(other - base)))
    assert worst <= 2 * gamma * (1 + 1e-12)
    assert worst > 1.9 * gamma  # the bound is reached: an extreme record flips a clipped gradient


def test_null_records_count_as_rows_and_add_nothing() -> None:
    rng = np.random.default_rng(5)
    X, y, theta = rng.normal(size=(20, 3)), rng.normal(size=20), rng.normal(size=4)
    X2, y2 = X.copy(), y.copy()
    X2[3, 1], y2[7], X2[11, 0] = np.nan, np.nan, np.inf
    keep = np.ones(20, dtype=bool)
    keep[[3, 7, 11]] = False
    total, n, _ = _core.dpgd_gradient(X2, y2, theta, 1.0, True)
    want, _, _ = _core.dpgd_gradient(X[keep], y[keep], theta, 1.0, True)
    np.testing.assert_allclose(total, want, rtol=1e-14)
    assert n == 20


# ---------------------------------------------------------------------------------------------
# Noiseless runs: the deterministic recursion and the Huberised minimiser
# ---------------------------------------------------------------------------------------------


def test_noiseless_unclipped_run_follows_the_linear_recursion() -> None:
    """Lemma 2.3 without noise: theta_t - theta_hat = (I - eta Sigma)^t (theta_0 - theta_hat)."""
    rng = np.random.default_rng(6)
    n, p, eta, steps = 400, 4, 0.25, 40
    X = rng.normal(size=(n, p)) * [1.0, 1.2, 0.8, 1.1]
    y = X @ rng.normal(size=p) + rng.normal(size=n)
    theta0 = rng.normal(size=p)
    its = _core.dpgd_run(X, y, steps=steps, eta=eta, gamma=np.inf, noise_std=0.0, theta0=theta0)
    sigma = X.T @ X / n
    mu_min = np.linalg.eigvalsh(sigma)[0]
    assert mu_min > 0.5 and np.linalg.eigvalsh(sigma)[-1] < 2.0
    theta_hat = np.linalg.solve(X.T @ X, X.T @ y)
    M = np.eye(p) - eta * sigma
    for t in range(1, steps + 1):
        want = np.linalg.matrix_power(M, t) @ (theta0 - theta_hat)
        np.testing.assert_allclose(its[t - 1] - theta_hat, want, rtol=0, atol=1e-13)
        bound = (1 - eta * mu_min) ** t * np.linalg.norm(theta0 - theta_hat)
        assert np.linalg.norm(its[t - 1] - theta_hat) <= bound * (1 + 1e-9)


def test_noiseless_clipped_run_converges_to_the_huber_minimiser() -> None:
    """Brown et al. 2024, §2.5: clipping at gamma is GD on sum_i huber_{B_i}, B_i = gamma/|x_i|."""
    rng = np.random.default_rng(7)
    n, p, gamma = 300, 3, 1.0
    X = rng.normal(size=(n, p))
    y = X @ [1.0, -1.0, 2.0] + rng.standard_t(1.5, size=n)  # heavy tails: Huber != OLS
    its, clipped = _core.dpgd_run(
        X, y, steps=3000, eta=0.5, gamma=gamma, noise_std=0.0, return_clipped=True
    )
    B = gamma / np.linalg.norm(X, axis=1)

    def objective(theta):
        r = y - X @ theta
        a = np.abs(r)
        return np.mean(np.where(a <= B, 0.5 * r**2, B * (a - 0.5 * B)))

    def gradient(theta):
        r = X @ theta - y
        return X.T @ np.clip(r, -B, B) / n

    def hessian(theta):
        inside = np.abs(X @ theta - y) <= B  # the generalised Hessian of the piecewise quadratic
        return X[inside].T @ X[inside] / n

    theta_ols = np.linalg.lstsq(X, y, rcond=None)[0]
    res = optimize.minimize(
        objective,
        theta_ols,
        jac=gradient,
        hess=hessian,
        method="trust-exact",
        options={"gtol": 1e-14},
    )
    huber = res.x
    assert np.linalg.norm(gradient(huber)) < 1e-12
    assert np.linalg.norm(gradient(its[-1])) < 1e-12  # the run's fixed point is stationary
    np.testing.assert_allclose(its[-1], huber, atol=1e-8)
    assert np.linalg.norm(huber - theta_ols) > 0.05  # the check can tell Huber from OLS
    assert 0.1 < clipped[-1] / n < 0.9  # clipping is material at the fixed point
    # with gamma large nothing is clipped and the run converges to OLS
    its = _core.dpgd_run(X, y, steps=300, eta=0.5, gamma=1e6, noise_std=0.0)
    np.testing.assert_allclose(its[-1], theta_ols, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# The law of the iterates (Monte Carlo)
# ---------------------------------------------------------------------------------------------


def _chains(X, y, R, steps, eta, lam, theta0, seed0):
    return np.array(
        [
            _core.dpgd_run(
                X,
                y,
                steps=steps,
                eta=eta,
                gamma=np.inf,
                noise_std=lam,
                theta0=theta0,
                seed=seed0 + r,
            )
            for r in range(R)
        ]
    )


def _law_z_scores(chains, X, y, eta, lam, theta0, t, k):
    """z-scores of every mean, covariance and lag-k cross-covariance entry of theta_t against
    Lemma 2.3 (each statistic's Monte Carlo standard error from the predicted Gaussian law)."""
    R = chains.shape[0]
    mu, S, M = _law(X, y, eta, lam, theta0, t)
    _, S_later, _ = _law(X, y, eta, lam, theta0, t + k)
    a, b = chains[:, t - 1], chains[:, t + k - 1]
    z_mean = (a.mean(axis=0) - mu) / np.sqrt(np.diag(S) / R)
    ca, cb = a - a.mean(axis=0), b - b.mean(axis=0)
    cov = ca.T @ ca / (R - 1)
    d = np.diag(S)
    iu = np.triu_indices(len(mu))
    z_cov = ((cov - S) / np.sqrt((np.outer(d, d) + S**2) / R))[iu]
    cross_want = np.linalg.matrix_power(M, k) @ S  # Cov(theta_{t+k}, theta_t)
    cross = cb.T @ ca / (R - 1)
    z_cross = (cross - cross_want) / np.sqrt((np.outer(np.diag(S_later), d) + cross_want**2) / R)
    return np.concatenate([z_mean, z_cov, z_cross.ravel()])


def test_iterate_law_without_clipping_monte_carlo() -> None:
    """Brown et al. 2024 (Lemma 2.3 and the cross-covariance of eqs. 88-94): 3000 seeded
    chains, 18 statistics (3 means, 6 covariances and 9 lag-3 cross-covariances of theta_5
    and theta_8), each |z| < 4.5. Each z is N(0, 1) up to O(1/sqrt(R)) corrections (220
    replications with other seeds: sd of each z in 0.89..1.11, largest |z| 4.05), so the
    false-failure probability is about 18 P(|N(0,1)| > 4.5) ~ 1e-4 (union bound). It fails
    when the noise is added without the eta factor (std lambda instead of eta lambda: max |z|
    567), when the noise is missing (39) or 10% too large (7.1).
    """
    rng = np.random.default_rng(8)
    n, p, eta, lam = 120, 3, 0.25, 0.8
    X = rng.normal(size=(n, p)) * [1.0, 1.3, 0.7]
    y = X @ [0.5, -1.0, 0.25] + rng.normal(size=n)
    theta0 = np.zeros(p)
    chains = _chains(X, y, 3000, 8, eta, lam, theta0, seed0=10_000)
    z = _law_z_scores(chains, X, y, eta, lam, theta0, t=5, k=3)
    assert np.max(np.abs(z)) < 4.5, np.round(z, 2)


# ---------------------------------------------------------------------------------------------
# Confidence-interval estimators
# ---------------------------------------------------------------------------------------------


def test_estimator_indexing_on_a_hand_made_run() -> None:
    """Row k - 1 holds theta_k = (k, 10 k), so every draw is an index or a mean of indices."""
    N, b, m = 47, 5, 4
    its = np.array([[k, 10 * k] for k in range(1, N + 1)], dtype=float)
    B = (N - b) // m  # 10: iterates 46 and 47 are left over
    chk = _core.confint_draws(its, "checkpoints", m, b)
    np.testing.assert_array_equal(chk[:, 0], [b + l_ * B for l_ in range(1, m + 1)])  # 15..45
    np.testing.assert_array_equal(chk[:, 1], 10 * chk[:, 0])
    bm = _core.confint_draws(its, "batch_means", m, b)
    want = [np.mean(range(b + (l_ - 1) * B + 1, b + l_ * B + 1)) for l_ in range(1, m + 1)]
    np.testing.assert_array_equal(bm[:, 0], want)  # 10.5, 20.5, 30.5, 40.5
    # independent runs: 4 runs of L = 12 iterates each, concatenated; run l's theta_k = l L + k
    L = 12
    runs = np.array([[l_ * L + k, 0.0] for l_ in range(m) for k in range(1, L + 1)])
    ind = _core.confint_draws(runs, "independent_runs", m, b)
    np.testing.assert_array_equal(
        ind[:, 0], [l_ * L + np.mean(range(b + 1, L + 1)) for l_ in range(m)]
    )
    # burn-in 0, B = 1: the draws are the iterates themselves
    np.testing.assert_array_equal(_core.confint_draws(its[:6], "batch_means", 6, 0), its[:6])


def test_estimators_refuse_too_few_iterates() -> None:
    its = np.ones((30, 2))
    with pytest.raises(ValueError, match="too few"):
        _core.confint_draws(its, "checkpoints", 10, 21)  # B = 0
    with pytest.raises(ValueError, match="too few"):
        _core.confint_draws(its, "independent_runs", 7, 0)  # 30 runs' iterates not a multiple of 7
    with pytest.raises(ValueError, match="too few"):
        _core.confint_draws(its, "independent_runs", 10, 3)  # L = 3 is all burn-in
    with pytest.raises(ValueError, match="unknown method"):
        _core.confint_draws(its, "bootstrap", 10, 0)
    with pytest.raises(ValueError, match="draws"):
        _core.confint_draws(its, "checkpoints", 1, 0)
    with pytest.raises(ValueError, match="NaN"):
        _core.confint_draws(np.full((30, 2), np.nan), "checkpoints", 2, 0)
    with pytest.raises(ValueError):
        _core.t_interval(np.ones((1, 3)), 0.05)


def test_batch_means_coverage_needs_batches_longer_than_the_autocorrelation() -> None:
    """Coverage at eta = 0.2, Sigma = I (lag-1 autocorrelation 0.8): over 200
    seeded runs of N = 400 steps, 95% batch-means intervals for theta_hat with 10 batches of
    38 cover >= 0.90 of the 600 (run, coordinate) pairs (expected ~0.94), batches of 1 cover
    < 0.75 (expected ~0.47 in a numpy simulation). Coverage indicators of one run are dependent;
    even treating runs as the unit (200 runs, sd of a run's coverage <= 0.5) the gaps are > 5 sd, so
    the false-failure probability is < 1e-6."""
    rng = np.random.default_rng(9)
    n, p, eta, lam, N, b = 200, 3, 0.2, 0.5, 400, 20
    X = _well_conditioned(n, p, rng)
    y = X @ [1.0, -0.5, 0.3] + rng.normal(size=n)
    theta_hat = np.linalg.solve(X.T @ X, X.T @ y)
    covered: dict[int, list[np.ndarray]] = {10: [], N - b: []}
    for r in range(200):
        its = _core.dpgd_run(X, y, steps=N, eta=eta, gamma=np.inf, noise_std=lam, seed=50_000 + r)
        for m in covered:
            _, lo, hi = _core.t_interval(_core.confint_draws(its, "batch_means", m, b), 0.05)
            covered[m].append((lo <= theta_hat) & (theta_hat <= hi))
    assert np.mean(covered[10]) >= 0.90
    assert np.mean(covered[N - b]) < 0.75


# ---------------------------------------------------------------------------------------------
# Bad input (in memory)
# ---------------------------------------------------------------------------------------------


def test_bad_input_in_memory() -> None:
    X, y = np.ones((4, 2)), np.ones(4)
    with pytest.raises(ValueError, match="theta has 3"):
        _core.dpgd_gradient(X, y, [0.0, 0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="NaN"):
        _core.dpgd_gradient(X, y, [np.nan, 0.0], 1.0)
    for gamma in (0.0, -1.0, np.nan):
        with pytest.raises(ValueError, match="gamma"):
            _core.dpgd_gradient(X, y, [0.0, 0.0], gamma)
    with pytest.raises(ValueError, match="x_bound"):
        _core.dpgd_gradient(X, y, [0.0, 0.0], 1.0, x_bound=-1.0)
    with pytest.raises(ValueError, match="rows"):
        _core.dpgd_gradient(X, y[:3], [0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="n must"):
        _core.dpgd_step([0.0], [1.0], 0, 0.1, 1.0)
    with pytest.raises(ValueError, match="eta"):
        _core.dpgd_step([0.0], [1.0], 3, -0.1, 1.0)
    with pytest.raises(ValueError, match="noise_std"):
        _core.dpgd_step([0.0], [1.0], 3, 0.1, np.nan)
    with pytest.raises(ValueError, match="diverged"):
        _core.dpgd_step([0.0], [np.inf], 3, 0.1, 1.0)
    with pytest.raises(ValueError, match="theta must be finite"):
        _core.dpgd_step([np.nan], [1.0], 3, 0.1, 1.0)
    with pytest.raises(ValueError, match="diverged"):
        _core.dpgd_run(X * 1e3, y, steps=200, eta=1.0, gamma=np.inf, noise_std=0.0)
    for p, df in ((0.0, 3), (1.0, 3), (0.5, 0.5), (np.nan, 3), (0.3, np.inf)):
        with pytest.raises(ValueError):
            _core.t_quantile(p, df)


def test_unseeded_steps_differ_and_seeded_steps_repeat() -> None:
    a = _core.dpgd_step(np.zeros(3), np.zeros(3), 10, 0.2, 1.0)
    b = _core.dpgd_step(np.zeros(3), np.zeros(3), 10, 0.2, 1.0)
    assert not np.array_equal(a, b)
    c = _core.dpgd_step(np.zeros(3), np.zeros(3), 10, 0.2, 1.0, seed=1, stream=4)
    np.testing.assert_array_equal(
        c, _core.dpgd_step(np.zeros(3), np.zeros(3), 10, 0.2, 1.0, seed=1, stream=4)
    )
    assert not np.array_equal(
        c, _core.dpgd_step(np.zeros(3), np.zeros(3), 10, 0.2, 1.0, seed=1, stream=5)
    )


# ---------------------------------------------------------------------------------------------
# In the server
# ---------------------------------------------------------------------------------------------


def _sql_gradient(conn, table, theta, gamma, intercept=False, x_bound=0.0):
    (g,) = conn.execute(
        f"SELECT dpsql.dpgd_gradient(x, y, %s::float8[], %s::float8, %s, %s::float8) FROM {table}",
        (list(map(float, theta)), float(gamma), intercept, float(x_bound)),
    ).fetchone()
    return None if g is None else np.asarray(g, dtype=np.float64)


def _physical_rows(conn, table):
    """The table in scan order (what a sequential scan feeds the aggregate)."""
    rows = conn.execute(f"SELECT x, y FROM {table}").fetchall()
    return np.array([r[0] for r in rows], dtype=np.float64), np.array([r[1] for r in rows])


def _data(n=250, d=4, seed=11):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, X @ rng.normal(size=d) + rng.normal(size=n)


@pytest.mark.parametrize(
    ("gamma", "intercept", "x_bound"), [(np.inf, False, 0.0), (1.0, False, 0.0), (2.0, True, 1.5)]
)
def test_aggregate_equals_the_in_memory_gradient(
    conn, scratch_schema, gamma, intercept, x_bound
) -> None:
    X, y = _data()
    table = load(conn, scratch_schema, "train", X, y)
    conn.execute("SET max_parallel_workers_per_gather = 0")
    Xs, ys = _physical_rows(conn, table)
    theta = np.linspace(-1, 1, X.shape[1] + intercept)
    g = _sql_gradient(conn, table, theta, gamma, intercept, x_bound)
    total, n, clipped = _core.dpgd_gradient(Xs, ys, theta, gamma, intercept, x_bound)
    np.testing.assert_array_equal(g, [*total, n, clipped])  # same C code, same order: bit for bit
    assert g.shape == (len(theta) + 2,)


def test_malformed_rows_are_null_records_in_the_server(conn, scratch_schema) -> None:
    X, y = _data(n=40)
    table = load(conn, scratch_schema, "train", X, y)
    conn.execute(f"UPDATE {table} SET x = NULL WHERE rid = 1")
    conn.execute(f"UPDATE {table} SET y = NULL WHERE rid = 2")
    conn.execute(f"UPDATE {table} SET x = x[1:3] WHERE rid = 3")  # wrong length
    conn.execute(f"UPDATE {table} SET x[2] = NULL WHERE rid = 4")  # NULL element
    conn.execute(f"UPDATE {table} SET x[1] = 'NaN' WHERE rid = 5")
    conn.execute(f"UPDATE {table} SET y = 'Infinity' WHERE rid = 6")
    conn.execute(f"UPDATE {table} SET x = '{{}}' WHERE rid = 7")  # empty array
    conn.execute(f"UPDATE {table} SET x = ARRAY[x, x] WHERE rid = 8")  # 2-D
    keep = np.ones(40, dtype=bool)
    keep[1:9] = False  # rids 1..8 (rid = row index)
    total, _, clipped = _core.dpgd_gradient(X[keep], y[keep], np.full(5, 0.3), 1.5, True)
    g = _sql_gradient(conn, table, np.full(5, 0.3), 1.5, True)
    np.testing.assert_allclose(g[:5], total, rtol=1e-12)
    assert g[5] == 40 and g[6] == clipped
    # theta's length defines the row length: with one coefficient too many, every row is
    # malformed (no error could tell a wrong theta from wrong rows without reading the data)
    g = _sql_gradient(conn, table, np.full(6, 0.3), 1.5, True)
    assert np.all(g[:6] == 0) and g[6] == 40 and g[7] == 0


def test_parallel_aggregate_adds_partial_sums(conn, scratch_schema) -> None:
    X, y = _data(n=20_000, d=3)
    table = load(conn, scratch_schema, "train", X, y)
    conn.execute(f"ALTER TABLE {table} SET (parallel_workers = 2)")
    conn.execute("SET max_parallel_workers_per_gather = 0")
    theta = [0.1, -0.2, 0.3]
    serial = _sql_gradient(conn, table, theta, 1.0)
    for setting in (
        "max_parallel_workers_per_gather = 2",
        "parallel_setup_cost = 0",
        "parallel_tuple_cost = 0",
        "min_parallel_table_scan_size = 0",
    ):
        conn.execute(f"SET {setting}")
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            f"EXPLAIN SELECT dpsql.dpgd_gradient(x, y, '{{0,0,0}}', 1, false, 0) FROM {table}"
        )
    )
    assert "Partial Aggregate" in plan
    parallel = _sql_gradient(conn, table, theta, 1.0)
    np.testing.assert_allclose(parallel[:3], serial[:3], rtol=1e-11)
    assert parallel[3:].tolist() == serial[3:].tolist() == [20_000, serial[4]]


def test_seeded_step_and_run_equal_the_in_memory_ones(conn, scratch_schema) -> None:
    X, y = _data(n=300, d=3)
    table = load(conn, scratch_schema, "train", X, y)
    conn.execute("SET max_parallel_workers_per_gather = 0")
    Xs, ys = _physical_rows(conn, table)
    eta, lam, gamma, seed, steps = 0.25, 0.3, 2.0, 1234, 12
    theta = np.array([0.2, 0.0, -0.1, 0.5])
    grad = _sql_gradient(conn, table, theta, gamma, True)
    (sql_step,) = conn.execute(
        "SELECT dpsql_internal._dpgd_step(%s::float8[], %s::float8[], %s, %s, %s, %s)",
        (theta.tolist(), grad.tolist(), eta, lam, seed, 7),
    ).fetchone()
    mem_step = _core.dpgd_step(theta, grad[:4], grad[4], eta, lam, seed=seed, stream=7)
    np.testing.assert_array_equal(sql_step, mem_step)

    theta = np.zeros(4)
    sql_its = []
    for t in range(1, steps + 1):
        grad = _sql_gradient(conn, table, theta, gamma, True)
        (theta,) = conn.execute(
            "SELECT dpsql_internal._dpgd_step(%s::float8[], %s::float8[], %s, %s, %s, %s)",
            (list(theta), grad.tolist(), eta, lam, seed, t),
        ).fetchone()
        sql_its.append(theta)
    mem_its = _core.dpgd_run(
        Xs, ys, steps=steps, eta=eta, gamma=gamma, noise_std=lam, intercept=True, seed=seed
    )
    np.testing.assert_array_equal(np.array(sql_its), mem_its)

    # unseeded steps draw fresh noise
    (a, b) = conn.execute(
        "SELECT dpsql_internal._dpgd_step('{0,0}', '{0,0,5,0}', 1, 1),"
        " dpsql_internal._dpgd_step('{0,0}', '{0,0,5,0}', 1, 1)"
    ).fetchone()
    assert a != b


def test_confidence_intervals_in_the_server(conn) -> None:
    rng = np.random.default_rng(12)
    its = rng.normal(size=(120, 3))
    for method, m, b in (
        ("checkpoints", 10, 20),
        ("batch_means", 10, 20),
        ("independent_runs", 4, 5),
    ):
        (draws,) = conn.execute(
            "SELECT dpsql_internal._confint_draws(%s::float8[], %s, %s, %s)",
            (its.tolist(), method, m, b),
        ).fetchone()
        np.testing.assert_array_equal(draws, _core.confint_draws(its, method, m, b))
    draws = rng.normal(size=(10, 3))
    rows = conn.execute(
        "SELECT coef_index, estimate, lower, upper, sd FROM"
        " dpsql_internal._t_interval(%s::float8[], 0.05)"
        " ORDER BY coef_index",
        (draws.tolist(),),
    ).fetchall()
    est, lo, hi = _core.t_interval(draws, 0.05)
    assert [r[0] for r in rows] == [1, 2, 3]
    np.testing.assert_array_equal([r[1] for r in rows], est)
    np.testing.assert_array_equal([r[2] for r in rows], lo)
    np.testing.assert_array_equal([r[3] for r in rows], hi)
    np.testing.assert_allclose([r[4] for r in rows], draws.std(axis=0, ddof=1), rtol=1e-14)
    (t,) = conn.execute("SELECT dpsql.t_quantile(0.975, 9)").fetchone()
    assert t == _core.t_quantile(0.975, 9)


BAD_SQL = [
    # (statement, expected message fragment)
    ("SELECT dpsql.dpgd_gradient(x, y, '{}', 1, false, 0) FROM {t}", "theta has 0"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{0.5}', 1, true, 0) FROM {t}", "theta has 1"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{NaN,0}', 1, false, 0) FROM {t}", "NaN"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{0,0}', -1, false, 0) FROM {t}", "gamma"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{0,0}', 'NaN', false, 0) FROM {t}", "gamma"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{0,0}', 1, false, -1) FROM {t}", "x_bound"),
    ("SELECT dpsql.dpgd_gradient(x, y, NULL, 1, false, 0) FROM {t}", "theta is NULL"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{0,0}', NULL, false, 0) FROM {t}", "gamma is NULL"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{{0,0},{0,0}}', 1, false, 0) FROM {t}", "one-dimensional"),
    ("SELECT dpsql.dpgd_gradient(x, y, '{0,0}', rid + 1, false, 0) FROM {t}", "same on every row"),
    (
        "SELECT dpsql_internal._dpgd_gradient_transition(NULL, x, y, '{0,0}', 1, false, 0) FROM"
        " {t}",
        "outside an aggregate",
    ),
    ("SELECT dpsql_internal._dpgd_step('{0,0,0}', '{1,1,5,0}', 0.1, 1)", "expected 5"),
    ("SELECT dpsql_internal._dpgd_step('{0,NaN}', '{1,1,5,0}', 0.1, 1)", "theta contains NaN"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,Infinity,5,0}', 0.1, 1)", "gradient sum"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,1,0,0}', 0.1, 1)", "row count"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,1,2.5,0}', 0.1, 1)", "row count"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,1,5,6}', 0.1, 1)", "clipped count"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,1,5,0}', 0, 1)", "eta"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,1,5,0}', 0.1, -1)", "noise_std"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,1,5,0}', 0.1, 1, 3, -1)", "stream"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', NULL, 0.1, 1)", "gradient is NULL"),
    ("SELECT dpsql_internal._dpgd_step('{0,0}', '{1,NULL,5,0}', 0.1, 1)", "NULL elements"),
    ("SELECT dpsql_internal._dpgd_step('{1e300,0}', '{-1e300,0,1,0}', 1e10, 0)", "diverged"),
    ("SELECT dpsql_internal._confint_draws('{1,2,3,4}', 'checkpoints', 2, 0)", "two-dimensional"),
    (
        "SELECT dpsql_internal._confint_draws('{{1,2},{3,NULL}}', 'checkpoints', 2, 0)",
        "NULL elements",
    ),
    ("SELECT dpsql_internal._confint_draws('{{1},{2}}', 'bootstrap', 2, 0)", "unknown method"),
    ("SELECT dpsql_internal._confint_draws('{{1},{2}}', 'checkpoints', 1, 0)", "draws must be"),
    ("SELECT dpsql_internal._confint_draws('{{1},{2}}', 'checkpoints', 2, -1)", "burn_in"),
    ("SELECT dpsql_internal._confint_draws('{{1},{2},{3}}', 'checkpoints', 2, 2)", "too few"),
    ("SELECT dpsql_internal._confint_draws('{{1},{NaN}}', 'checkpoints', 2, 0)", "NaN"),
    ("SELECT * FROM dpsql_internal._t_interval('{{1,2}}', 0.05)", "at least 2 rows"),
    ("SELECT * FROM dpsql_internal._t_interval('{{1},{2}}', 1.5)", "alpha"),
    ("SELECT dpsql.t_quantile(1, 3)", "p must be"),
    ("SELECT dpsql.t_quantile(0.5, 0.5)", "df must be"),
]


@pytest.mark.parametrize(("statement", "message"), BAD_SQL)
def test_bad_input_in_the_server_is_a_clear_error(conn, scratch_schema, statement, message) -> None:
    X, y = _data(n=5, d=2)
    table = load(conn, scratch_schema, "train", X, y)
    with pytest.raises(psycopg.Error, match=message):
        conn.execute(statement.replace("{t}", table))
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the server survived


def test_empty_table_gives_a_null_gradient(conn, scratch_schema) -> None:
    table = load(conn, scratch_schema, "train", np.ones((1, 2)), np.ones(1))
    conn.execute(f"DELETE FROM {table}")
    assert _sql_gradient(conn, table, [0.0, 0.0], 1.0) is None


def _autocorrelation(its: np.ndarray, burn_in: int, lag: int) -> float | None:
    x = its[burn_in:] - its[burn_in:].mean(axis=0)
    best = None
    for j in range(its.shape[1]):
        sq = float(x[:, j] @ x[:, j])
        if sq > 0:
            r = float(x[:-1, j] @ x[1:, j]) / sq
            v = max(r, 0.0) ** lag
            best = v if best is None else max(best, v)
    return best


def test_iterate_autocorrelation_matches_numpy_and_never_underflows(conn) -> None:
    """The mixing check of DP-GD's released iterates: max over coordinates of max(r, 0)^lag.
    A small r with a large lag is 0, not a float underflow error (an error raised after the
    noise would roll the charge back: an uncharged answer; seen in bench erm_toolbox)."""
    rng = np.random.default_rng(0)
    n, p = 400, 3
    its = np.zeros((n, p))
    for t in range(1, n):  # AR(1) with coefficients 0.9, 0.5 and a white-noise coordinate
        its[t] = np.array([0.9, 0.5, 0.0]) * its[t - 1] + rng.normal(size=p)
    for burn_in, lag in [(20, 1), (20, 5), (0, 38)]:
        (got,) = conn.execute(
            "SELECT dpsql_internal._iterate_autocorrelation(%s, %s, %s)",
            (its.tolist(), burn_in, lag),
        ).fetchone()
        assert got == pytest.approx(_autocorrelation(its, burn_in, lag), rel=1e-9, abs=1e-300)
    # r about 0.2 > 0: r^400 is below the smallest double; and one constant column
    small = np.zeros((n, 2))
    for t in range(1, n):
        small[t, 0] = 0.2 * small[t - 1, 0] + rng.normal()
    assert 0 < _autocorrelation(small, 0, 1) < 0.5
    (got,) = conn.execute(
        "SELECT dpsql_internal._iterate_autocorrelation(%s, 0, 400)", (small.tolist(),)
    ).fetchone()
    assert got == pytest.approx(_autocorrelation(small, 0, 400), abs=1e-300)
    assert got < 1e-100
    (none,) = conn.execute(
        "SELECT dpsql_internal._iterate_autocorrelation(%s, 0, 3)", (np.ones((5, 2)).tolist(),)
    ).fetchone()
    assert none is None
