"""DP-FTRL's C core (core/ftrl.h; Thakurta, "Private Optimization", §6.3.2): the streaming tree's
exact prefix sums and node count, the depth m, the node noise (variance popcount(t) sigma^2,
fails at 10% mis-scale or missing noise), the calibration against dp-accounting, the clipped
leaf sums on adversarial neighbours and the noiseless run against a numpy reference."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpsql import _core

# ------------------------------------------------------------------------------- the tree


@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 2), (3, 2), (1000, 10), (1024, 11), (1025, 11)])
def test_levels_vectors(n: int, m: int) -> None:
    # m = floor(lg n) + 1, never the chapter's ceil(lg n) (Theorem 6.13: one level short at n = 2^h,
    # 0 at n = 1)
    assert _core.tree_levels(n) == m
    assert _core.tree_levels(n) == math.floor(math.log2(n)) + 1


@pytest.mark.parametrize("n", [1, 2, 7, 8, 16, 33, 100, 128])
def test_noiseless_prefix_sums_are_exact(n: int) -> None:
    rng = np.random.default_rng(n)
    leaves = rng.normal(size=(n, 3))
    sums, used = _core.tree_prefix_sums(leaves, 0.0)
    np.testing.assert_allclose(sums, np.cumsum(leaves, axis=0), rtol=1e-12, atol=1e-12)
    # GetSum(t) uses popcount(t) nodes, all at levels <= floor(lg n)
    assert list(used) == [bin(t).count("1") for t in range(1, n + 1)]
    assert max(t.bit_length() for t in range(1, n + 1)) == _core.tree_levels(n)


def test_a_tree_refuses_leaves_beyond_its_levels() -> None:
    with pytest.raises(ValueError):
        _core.tree_prefix_sums(np.ones((5, 2)), 0.0, n_leaves=4)


def test_n_equal_one_still_gets_noise() -> None:
    # the chapter's ceil(lg n) gives lambda = 0 at n = 1: here one noisy leaf (spec trap 7)
    sums, used = _core.tree_prefix_sums(np.zeros((1, 4)), 1.0, seed=1)
    assert used[0] == 1 and np.all(sums != 0)


def test_prefix_noise_variance_is_popcount_sigma_squared() -> None:
    """Var GetSum(t) = popcount(t) sigma^2 per coordinate. 400 seeds x 64 coordinates =
    25600 draws per t: the sample variance has relative sd sqrt(2/25600) = 0.9%; a 4% band
    (4.5 sd, false failure < 1e-5 per t) rejects 10% mis-scale (variance off by >= 19%) and
    missing noise."""
    sigma, n, p = 2.5, 13, 64
    draws = np.stack(
        [_core.tree_prefix_sums(np.zeros((n, p)), sigma, seed=s)[0] for s in range(400)]
    )  # (seeds, t, p)
    for t in range(1, n + 1):
        var = draws[:, t - 1, :].var()
        expected = bin(t).count("1") * sigma**2
        assert abs(var / expected - 1) < 0.04, (t, var, expected)
        assert abs(var / (expected * 1.21) - 1) > 0.04
        assert abs(var / (expected * 0.81) - 1) > 0.04
    # GetSum(1) = node (0, 1) and GetSum(2) = node (1, 1) have independent noise (25600
    # pairs: correlation sd 0.006), while GetSum(3) - GetSum(2) = node (0, 3) is fresh again
    c = np.corrcoef(draws[:, 0, :].ravel(), draws[:, 1, :].ravel())[0, 1]
    assert abs(c) < 0.03
    c = np.corrcoef(draws[:, 1, :].ravel(), (draws[:, 2, :] - draws[:, 1, :]).ravel())[0, 1]
    assert abs(c) < 0.03


# ------------------------------------------------------------------------ the calibration


def test_sigma_is_the_analytic_gaussian_of_the_node_sensitivity() -> None:
    from scipy.stats import norm

    for m, epochs in [(1, 1), (10, 1), (11, 3)]:
        s = _core.ftrl_sigma(1.0, m, epochs, 1.0, 1e-5)
        sens = 2 * math.sqrt(m * epochs)
        # Balle-Wang: delta(sigma) = Phi(s/2sig - eps sig/s) - e^eps Phi(-s/2sig - eps sig/s)
        a, b = sens / (2 * s), s / sens
        delta = norm.cdf(a - b) - math.e * norm.cdf(-a - b)
        assert delta == pytest.approx(1e-5, rel=1e-6)


def test_sigma_is_monotone_and_below_the_chapter_rule() -> None:
    # The chapter's lambda for m = 10 (eps 1, delta 1e-5, add/remove, sensitivity L sqrt(m))
    # is 15.819561; ours is replace-one (sensitivity 2 C sqrt(m)): compare like with like,
    # sigma_addremove = sigma / 2 must be smaller than the chapter's L lambda.
    chapter = math.sqrt(2 * 10 * (math.log(1e5) + 1)) / 1.0
    assert chapter == pytest.approx(15.819561, abs=1e-6)
    assert _core.ftrl_sigma(1.0, 10, 1, 1.0, 1e-5) / 2 < chapter
    assert _core.ftrl_sigma(1.0, 11, 1, 1.0, 1e-5) / 2 < 16.591695
    last = 0.0
    for m in range(1, 20):
        s = _core.ftrl_sigma(1.0, m, 1, 1.0, 1e-5)
        assert s > last
        last = s
    assert _core.ftrl_sigma(1.0, 5, 1, 2.0, 1e-5) < _core.ftrl_sigma(1.0, 5, 1, 1.0, 1e-5)
    assert _core.ftrl_sigma(2.0, 5, 1, 1.0, 1e-5) == pytest.approx(
        2 * _core.ftrl_sigma(1.0, 5, 1, 1.0, 1e-5)
    )
    with pytest.raises(ValueError):
        _core.ftrl_sigma(1.0, 0, 1, 1.0, 1e-5)


@pytest.mark.parametrize(("m", "epochs", "eps", "delta"), [(10, 1, 1.0, 1e-5), (7, 4, 0.5, 1e-6)])
def test_sigma_cross_checked_by_dp_accounting(
    m: int, epochs: int, eps: float, delta: float
) -> None:
    """The whole node-release vector is one Gaussian of sensitivity 2 C sqrt(m E): the PLD
    accountant on GaussianDpEvent(sigma / (2 C sqrt(m E))) gives epsilon <= requested."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    clip = 0.7
    sigma = _core.ftrl_sigma(clip, m, epochs, eps, delta)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma / (2 * clip * math.sqrt(m * epochs))))
    got = acc.get_epsilon(delta)
    assert got <= eps + 1e-3
    assert got > 0.97 * eps  # tight, not wildly conservative


# --------------------------------------------------------------------- gradients, leaves


@pytest.mark.parametrize("model", ["logistic", "huber", "linear"])
def test_leaf_sensitivity_on_adversarial_neighbours(model: str) -> None:
    """Replace one row by an extreme one (norm 1e6, flipped label): the clipped leaf sums at
    the same theta differ by <= 2C, at many thetas."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 4)) / 2
    y = np.where(rng.random(50) < 0.5, -1.0, 1.0)
    if model == "linear":
        y = rng.normal(size=50)
    clip = 0.8
    worst = 0.0
    for _ in range(50):
        theta = rng.normal(size=5) * 5
        i = rng.integers(50)
        X2, y2 = X.copy(), y.copy()
        X2[i] = rng.normal(size=4) * 1e6 / 2
        y2[i] = -y[i] if model != "linear" else -1e6 * np.sign(y[i])
        a, _ = _core.ftrl_leaf_sum(X, y, theta, model, clip, 1.0, 2.0, True)
        b, _ = _core.ftrl_leaf_sum(X2, y2, theta, model, clip, 1.0, 2.0, True)
        worst = max(worst, float(np.linalg.norm(a - b)))
    assert worst <= 2 * clip * (1 + 1e-12)
    assert worst > clip  # the adversary does move it


def test_malformed_rows_are_zero_records() -> None:
    X = np.array([[np.nan, 1.0], [np.inf, 0.0], [1.0, 1.0]])
    y = np.array([1.0, -1.0, 0.5])  # 0.5 is not a binary label
    leaf, norms = _core.ftrl_leaf_sum(X, y, np.zeros(2), "logistic", 1.0)
    assert np.all(leaf == 0) and np.all(norms == 0)


def _numpy_ftrl(X, y, model, clip, batch, epochs, reg, radius, x_bound, y_bound, h=0.1):
    """Noiseless DP-FTRL (lazy-projection FTRL on minibatch leaves), independent of the C code."""
    n, d = X.shape
    Xc = X * np.minimum(1.0, x_bound / np.maximum(np.linalg.norm(X, axis=1), 1e-300))[:, None]
    Xi = np.hstack([Xc, np.ones((n, 1))])
    theta = np.zeros(d + 1)
    s_prev = np.zeros(d + 1)
    thetas = []
    for _ in range(epochs):
        s = s_prev.copy()
        for start in range(0, n, batch):
            xb, yb = Xi[start : start + batch], y[start : start + batch]
            z = xb @ theta
            if model == "logistic":
                dz = -yb / (1 + np.exp(yb * z))
            elif model == "huber":
                m = yb * z
                dz = np.where(m > 1 + h, 0.0, np.where(m < 1 - h, -yb, -yb * (1 + h - m) / (2 * h)))
            else:
                dz = z - np.clip(yb, -y_bound, y_bound)
            g = dz[:, None] * xb
            norms = np.linalg.norm(g, axis=1)
            g *= np.minimum(1.0, clip / np.maximum(norms, 1e-300))[:, None]
            thetas.append(theta.copy())
            s = s + g.sum(axis=0)
            v = -s / reg
            theta = v * min(1.0, radius / max(np.linalg.norm(v), 1e-300))
        s_prev = s
    return np.mean(thetas, axis=0), theta


@pytest.mark.parametrize(
    ("model", "batch", "epochs"), [("logistic", 7, 1), ("huber", 16, 3), ("linear", 1, 2)]
)
def test_noiseless_run_is_lazy_ftrl(model: str, batch: int, epochs: int) -> None:
    # with sigma = 0 DP-FTRL is lazy-projection FTRL / dual averaging
    rng = np.random.default_rng(5)
    X = rng.normal(size=(101, 3))
    y = np.sign(X @ [1.0, -1.0, 0.5] + 0.1)
    if model == "linear":
        y = X @ [0.5, -0.2, 0.1] + 0.1 * rng.normal(size=101)
    kw: dict[str, Any] = dict(
        clip=0.9, batch=batch, epochs=epochs, reg=30.0, radius=2.0, x_bound=1.5, y_bound=1.0
    )
    avg, last, _ = _core.ftrl_run(X, y, model, sigma=0.0, intercept=True, **kw)
    ref_avg, ref_last = _numpy_ftrl(X, y, model, **kw)
    np.testing.assert_allclose(avg, ref_avg, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(last, ref_last, rtol=1e-9, atol=1e-12)
    assert np.linalg.norm(last) <= 2.0 + 1e-12


def test_seeded_runs_reproduce_and_differ() -> None:
    rng = np.random.default_rng(6)
    X = rng.normal(size=(64, 3))
    y = np.sign(X[:, 0])
    a = _core.ftrl_run(X, y, sigma=1.0, batch=4, reg=50.0, seed=1)[0]
    b = _core.ftrl_run(X, y, sigma=1.0, batch=4, reg=50.0, seed=1)[0]
    c = _core.ftrl_run(X, y, sigma=1.0, batch=4, reg=50.0, seed=2)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
