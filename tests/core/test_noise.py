"""Noise of the bolt-on releases (Wu et al. 2017, "Bolt-on DP", eqs. (3)-(4), Appendix E): the C
samplers, the output perturbation of eq. (3)/(4), the Gaussian calibrations and the exponential
mechanism, through dpsql._core.

Statistical tests are seeded, so every run draws the same numbers and the outcome is
deterministic. Each states its false-failure probability: the chance that a correct sampler
fails the test for a random choice of seeds (the seeds were not tuned to pass).
"""

from __future__ import annotations

import itertools
import math
import struct

import numpy as np
import pytest
from scipy import integrate, stats

from dpsql import _core

ALPHA = 1e-3  # significance level of the goodness-of-fit tests below


def _words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def _draws(n: int, d: int, sens: float, eps: float, delta: float = 0.0, seed0: int = 0, **kw):
    """Noise of n independent releases of a zero (1 x d) model, one seed per release."""
    zero = np.zeros((1, d))
    return np.array(
        [
            _core.output_perturbation(zero, sens, eps, delta, seed=seed0 + i, **kw)[0][0]
            for i in range(n)
        ]
    )


def _ks(sample: np.ndarray, cdf) -> float:
    return stats.kstest(sample, cdf).pvalue


def _chi2_uncorrelated(Z: np.ndarray) -> float:
    """p-value of "columns uncorrelated": N * sum_{i<j} r_ij^2 ~ chi2(d(d-1)/2) under H0."""
    n, d = Z.shape
    r = np.corrcoef(Z, rowvar=False)[np.triu_indices(d, 1)]
    return stats.chi2.sf(n * np.sum(r**2), d * (d - 1) // 2)


# ---------------------------------------------------------------------------------------------
# ChaCha20 and the base samplers
# ---------------------------------------------------------------------------------------------

# (key, counter, nonce, 64-byte block): RFC 8439 section 2.3.2 and Appendix A.1 #1-#5.
RFC8439_BLOCKS = [
    (
        bytes(range(32)),
        1,
        bytes.fromhex("000000090000004a00000000"),
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e",
    ),
    (
        bytes(32),
        0,
        bytes(12),
        "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
        "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586",
    ),
    (
        bytes(32),
        1,
        bytes(12),
        "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
        "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f",
    ),
    (
        bytes(31) + b"\x01",
        1,
        bytes(12),
        "3aeb5224ecf849929b9d828db1ced4dd832025e8018b8160b82284f3c949aa5a"
        "8eca00bbb4a73bdad192b5c42f73f2fd4e273644c8b36125a64addeb006c13a0",
    ),
    (
        b"\x00\xff" + bytes(30),
        2,
        bytes(12),
        "72d54dfbf12ec44b362692df94137f328fea8da73990265ec1bbbea1ae9af0ca"
        "13b25aa26cb4a648cb9b9d1be65b2c0924a66c54d545ec1b7374f4872e99f096",
    ),
    (
        bytes(32),
        0,
        bytes(11) + b"\x02",
        "c2c64d378cd536374ae204b9ef933fcd1a8b2288b3dfa49672ab765b54ee27c7"
        "8a970e0e955c14f3a88e741b97c286f75f8fc299e8148362fa198a39531bed6d",
    ),
]


@pytest.mark.parametrize("key,counter,nonce,block", RFC8439_BLOCKS)
def test_chacha20_block_matches_rfc8439(key: bytes, counter: int, nonce: bytes, block: str):
    out = _core.chacha20_block(_words(key), counter, _words(nonce))
    assert out == _words(bytes.fromhex(block))


def test_chacha20_rfc8439_section_2_3_2_state_words() -> None:
    out = _core.chacha20_block(list(_words(bytes(range(32)))), 1, [0x09000000, 0x4A000000, 0])
    assert out[0] == 0xE4E7F110 and out[15] == 0x4E3C50A2
    assert out[4:8] == [0xC7F4D1C7, 0x0368C033, 0x9AAA2204, 0x4E6CD4C3]


def test_generator_is_the_chacha20_keystream_in_block_order() -> None:
    # Across several refills (16 blocks computed side by side in SIMD lanes, AVX-512 or AVX2
    # chosen at run time) the words are the block function's, counter by counter.
    key = bytes(range(7, 39))
    stream = 0x0123456789ABCDEF
    nonce = [0, stream & 0xFFFFFFFF, stream >> 32]
    blocks = 16 * 3 + 5
    expected = [w for c in range(blocks) for w in _core.chacha20_block(list(_words(key)), c, nonce)]
    assert _core.rng_words(key, stream, 16 * blocks) == expected


@pytest.mark.parametrize("chunk", [1, 7, 50, 256])
def test_bulk_normals_are_the_one_at_a_time_draws(chunk: int) -> None:
    # Per-step noise draws a step's normals in bulk; a seeded release must not change with it.
    # 20,000 draws take about 200 of the ziggurat's slow paths (wedges, tail) at every chunk.
    one_by_one = _core.normal_fast(20000, seed=77)
    assert np.array_equal(_core.normal_fast(20000, seed=77, chunk=chunk), one_by_one)


def test_uniform_is_in_the_open_unit_interval_and_uniform() -> None:
    # KS at alpha=1e-3: false failure probability 1e-3 per run; seeds fixed, so deterministic.
    u = _core.uniform(20000, seed=101)
    assert u.min() > 0.0 and u.max() < 1.0
    assert _ks(u, stats.uniform.cdf) > ALPHA


def test_normal_is_standard_normal() -> None:
    # KS at alpha=1e-3: false failure probability 1e-3 per run; seeds fixed, so deterministic.
    z = _core.normal(20000, seed=102)
    assert np.all(np.isfinite(z))
    assert _ks(z, stats.norm.cdf) > ALPHA


@pytest.mark.parametrize("shape", [0.5, 1.0, 2.0, 10.0, 50.0])
def test_gamma_sampler_matches_scipy(shape: float) -> None:
    # KS at alpha=1e-3 per shape: false failure probability 1e-3 per shape (5e-3 for the
    # five); seeds fixed, so deterministic.
    scale = 0.37
    g = _core.gamma(20000, shape, scale, seed=int(1000 + 10 * shape))
    assert g.min() > 0.0
    assert _ks(g, stats.gamma(shape, scale=scale).cdf) > ALPHA


# ---------------------------------------------------------------------------------------------
# Eq. (3): the eps-DP noise
# ---------------------------------------------------------------------------------------------

RADIUS_GRID = list(itertools.product([1, 2, 10, 50], [1e-3, 1.0], [0.1, 1.0]))


@pytest.mark.parametrize("d,sens,eps", RADIUS_GRID)
def test_laplace_l2_radius_is_gamma(d: int, sens: float, eps: float) -> None:
    """||kappa|| ~ Gamma(shape d, scale sens/eps), mean d sens/eps."""
    # Per combination: KS at alpha=1e-3 (false failure 1e-3) and a 3-SE mean check (false
    # failure 2.7e-3, normal approximation): 3.7e-3 per combination, ~6% over the 16; seeds
    # fixed (disjoint per combination), so deterministic.
    n = 20000
    seed0 = 1_000_000 * RADIUS_GRID.index((d, sens, eps))
    noise = _draws(n, d, sens, eps, seed0=seed0)
    norms = np.linalg.norm(noise, axis=1)
    scale = sens / eps
    assert _ks(norms, stats.gamma(d, scale=scale).cdf) > ALPHA
    se = math.sqrt(d) * scale / math.sqrt(n)  # sd of Gamma(d, scale) is sqrt(d) * scale
    assert abs(norms.mean() - d * scale) < 3 * se


def test_output_perturbation_reports_the_laplace_scale_and_copies() -> None:
    w = np.arange(6.0).reshape(2, 3)
    noisy, scale = _core.output_perturbation(w, 0.25, 0.5, seed=1)
    assert scale == 0.5
    assert np.array_equal(w, np.arange(6.0).reshape(2, 3))  # the input is not modified
    assert noisy.shape == (2, 3) and not np.array_equal(noisy, w)


@pytest.mark.parametrize("d", [2, 3, 10, 50])
def test_directions_are_uniform_on_the_sphere(d: int) -> None:
    """Uniform directions: the direction sampler and for the direction of eq. (3) noise."""
    # Per d: each coordinate's |mean| < 4/sqrt(N) (threshold; sd of the mean is
    # 1/sqrt(dN), so this is >= 5.6 SE: false failure < 1e-6); E[u_i^2] within 5 SE of 1/d
    # (false failure < 6e-7 per coordinate); KS at alpha=1e-3 of the first coordinate against
    # its exact law ((u_1 + 1)/2 ~ Beta((d-1)/2, (d-1)/2)) and, for d = 2, of the angle against
    # U[0, 2 pi) (false failure 1e-3 each). Seeds fixed, so deterministic.
    n = 20000
    samples = {
        "directions": _core.directions(n, d, seed=200 + d),
        "eq3": _draws(n, d, 1.0, 1.0, seed0=3_000_000 + 100_000 * d),
    }
    for name, u in samples.items():
        u = u / np.linalg.norm(u, axis=1, keepdims=True) if name == "eq3" else u
        np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, rtol=1e-12)
        assert np.all(np.abs(u.mean(axis=0)) < 4 / math.sqrt(n)), name
        # Var(u_i^2) = E u_i^4 - 1/d^2 = 3/(d(d+2)) - 1/d^2 on the sphere.
        se = math.sqrt((3 / (d * (d + 2)) - 1 / d**2) / n)
        assert np.all(np.abs((u**2).mean(axis=0) - 1 / d) < 5 * se), name
        a = (d - 1) / 2
        assert _ks((u[:, 0] + 1) / 2, stats.beta(a, a).cdf) > ALPHA, name
        if d == 2:
            angle = np.mod(np.arctan2(u[:, 1], u[:, 0]), 2 * np.pi)
            assert _ks(angle, stats.uniform(0, 2 * np.pi).cdf) > ALPHA, name


def test_directions_in_one_dimension_are_signs() -> None:
    # Binomial test at alpha=1e-3: false failure probability 1e-3; seed fixed.
    u = _core.directions(20000, 1, seed=7).ravel()
    np.testing.assert_allclose(np.abs(u), 1.0, rtol=1e-15)
    assert stats.binomtest(int((u > 0).sum()), len(u)).pvalue > ALPHA


def test_ball_instead_of_sphere_is_detected() -> None:
    """The radius test above rejects Appendix E's literal "uniform in the ball"."""
    # Ours: KS at alpha=1e-3, false failure probability 1e-3 (seeds fixed, deterministic).
    # The mis-implementation: p ~ 1e-56 expected at d = 50, N = 20000, asserted < 1e-10.
    n, d, sens, eps = 20000, 50, 0.01, 0.5
    law = stats.gamma(d, scale=sens / eps)
    rng = np.random.default_rng(42)
    g = rng.normal(size=(n, d))
    in_ball = g / np.linalg.norm(g, axis=1, keepdims=True) * rng.random((n, 1)) ** (1 / d)
    wrong = in_ball * rng.gamma(d, sens / eps, size=(n, 1))
    ours = _draws(n, d, sens, eps, seed0=4_000_000)
    wrong_norms = np.linalg.norm(wrong, axis=1)
    assert _ks(wrong_norms, law.cdf) < 1e-10
    # The 3-SE mean check catches it too: E||.|| shrinks by d/(d+1), about 20 SE here.
    se = math.sqrt(d) * sens / eps / math.sqrt(n)
    assert abs(wrong_norms.mean() - d * sens / eps) > 3 * se
    assert _ks(np.linalg.norm(ours, axis=1), law.cdf) > ALPHA


@pytest.mark.parametrize("sens,eps", [(1.0, 1.0), (1e-3, 0.1)])
def test_one_dimensional_noise_is_laplace(sens: float, eps: float) -> None:
    """d = 1 gives Laplace(0, sens/eps)."""
    # Per case: KS at alpha=1e-3 (1e-3), E|kappa| within 3 SE (2.7e-3, normal approx.) and a
    # binomial sign test at alpha=1e-3 (1e-3): ~5e-3 per case; seeds fixed, deterministic.
    n = 20000
    k = _draws(n, 1, sens, eps, seed0=5_000_000 + int(eps * 10)).ravel()
    b = sens / eps
    assert _ks(k, stats.laplace(scale=b).cdf) > ALPHA
    assert abs(np.abs(k).mean() - b) < 3 * b / math.sqrt(n)  # |kappa| ~ Exp(b): sd b
    assert stats.binomtest(int((k > 0).sum()), n).pvalue > ALPHA


# ---------------------------------------------------------------------------------------------
# Eq. (4) and the analytic Gaussian mechanism
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("calibration", ["classic", "analytic"])
def test_gaussian_noise_is_iid_with_the_calibrated_sigma(calibration: str) -> None:
    # N*d = 1e6. Pooled: sum of squares / sigma^2 ~ chi2(1e6), two-sided test at alpha=1e-3
    # (false failure 1e-3); per-coordinate std within 2%: 4 SE at N = 20000, false
    # failure ~6e-5 per coordinate, 3e-3 for the 50; KS of the pooled standardized values at
    # alpha=1e-3 (1e-3); uncorrelated coordinates, chi2 test at alpha=1e-3 (1e-3). Seeds
    # fixed, so deterministic.
    n, d, sens, eps, delta = 20000, 50, 0.5, 0.4, 1e-6
    seed0 = 6_000_000 if calibration == "classic" else 7_000_000
    sigma = _core.gaussian_sigma(sens, eps, delta, calibration)
    _, scale = _core.output_perturbation(
        np.zeros((1, d)), sens, eps, delta, seed=1, calibration=calibration
    )
    assert scale == sigma
    z = _draws(n, d, sens, eps, delta, seed0=seed0, calibration=calibration)
    ss = float(np.sum(z**2)) / sigma**2
    p = stats.chi2.cdf(ss, n * d)
    assert ALPHA / 2 < p < 1 - ALPHA / 2
    assert abs(math.sqrt(ss / (n * d)) - 1) < 0.02
    assert np.all(np.abs(z.std(axis=0) / sigma - 1) < 0.02)
    assert _ks(z.ravel() / sigma, stats.norm.cdf) > ALPHA
    assert _chi2_uncorrelated(z) > ALPHA


def test_classic_gaussian_sigma_is_eq_4() -> None:
    for sens, eps, delta in itertools.product(
        [1e-3, 1.0, 3.0], [0.01, 0.1, 0.5, 0.999], [1e-12, 1e-6, 0.01]
    ):
        expected = math.sqrt(2 * math.log(1.25 / delta)) * sens / eps
        assert _core.gaussian_sigma(sens, eps, delta, "classic") == pytest.approx(
            expected, rel=1e-14
        )
    # The paper's MNIST setting: c = sqrt(2 ln(1.25 m^2)) = 6.66743 for delta = 1/m^2, m = 60000.
    c = _core.gaussian_sigma(1.0, 0.5, 1 / 60000**2, "classic") * 0.5
    assert c == pytest.approx(6.66743, abs=5e-6)


@pytest.mark.parametrize("eps", [1.0, 1.5, 10.0])
def test_classic_gaussian_refuses_epsilon_at_least_one(eps: float) -> None:
    assert math.isnan(_core.gaussian_sigma(1.0, eps, 1e-5, "classic"))
    with pytest.raises(ValueError):
        _core.output_perturbation(np.zeros((1, 3)), 1.0, eps, 1e-5, seed=1, calibration="classic")
    # The analytic calibration is valid for every epsilon.
    _, sigma = _core.output_perturbation(np.zeros((1, 3)), 1.0, eps, 1e-5, seed=1)
    assert sigma == _core.gaussian_sigma(1.0, eps, 1e-5) > 0


def _delta_scipy(sigma: float, sens: float, eps: float) -> float:
    """Balle and Wang (2018), Theorem 8, written with scipy's normal CDF."""
    a, b = sens / (2 * sigma), eps * sigma / sens
    return stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b)


def _delta_hockey_stick(sigma: float, sens: float, eps: float) -> float:
    """sup_E P(E) - e^eps Q(E) for P = N(0, sigma^2), Q = N(sens, sigma^2), by quadrature.

    The supremum is attained on {p > e^eps q}; log(p/q) is linear, so that set is
    (-inf, x*) with x* = sens/2 - eps sigma^2/sens.
    """
    p, q = stats.norm(0, sigma), stats.norm(sens, sigma)
    x_star = sens / 2 - eps * sigma**2 / sens
    value, _ = integrate.quad(
        lambda x: p.pdf(x) - math.exp(eps) * q.pdf(x),
        x_star - 40 * sigma,
        x_star,
        epsabs=0,
        epsrel=1e-11,
        limit=200,
    )
    return value


CALIBRATION_GRID = list(
    itertools.product([0.05, 0.1, 0.5, 0.9, 2.0, 8.0], [1e-12, 1e-6, 1e-3, 0.1], [1e-3, 1.0, 50.0])
)


def test_analytic_gaussian_sigma_is_valid_and_tight() -> None:
    for eps, delta, sens in CALIBRATION_GRID:
        sigma = _core.gaussian_sigma(sens, eps, delta)
        assert _core.gaussian_delta(sigma, sens, eps) <= delta, (eps, delta, sens)
        assert _core.gaussian_delta(0.99 * sigma, sens, eps) > delta, (eps, delta, sens)
        assert _core.gaussian_delta(sigma * (1 - 1e-6), sens, eps) > delta, (eps, delta, sens)
        if eps < 1:
            assert sigma < _core.gaussian_sigma(sens, eps, delta, "classic")


def test_gaussian_delta_matches_independent_computations() -> None:
    for eps, delta, sens in CALIBRATION_GRID:
        for factor in (0.5, 1.0, 2.0):
            sigma = factor * _core.gaussian_sigma(sens, eps, delta)
            ours = _core.gaussian_delta(sigma, sens, eps)
            ref = _delta_scipy(sigma, sens, eps)
            assert ours == pytest.approx(ref, rel=1e-9, abs=1e-300), (eps, delta, sens, factor)
            if ref > 1e-9:
                quad = _delta_hockey_stick(sigma, sens, eps)
                assert ours == pytest.approx(quad, rel=1e-6), (eps, delta, sens, factor)


def test_gaussian_delta_decreases_in_sigma() -> None:
    sigmas = np.geomspace(0.02, 50, 300)
    for eps in (0.1, 1.0, 4.0):
        deltas = np.array([_core.gaussian_delta(s, 1.0, eps) for s in sigmas])
        assert np.all((deltas >= 0) & (deltas <= 1))
        assert np.all(np.diff(deltas) <= 0)
        # Strictly, wherever neither term saturates in double precision.
        inner = (deltas[:-1] > 1e-290) & (deltas[:-1] < 1 - 1e-9)
        assert inner.sum() > 50 and np.all(np.diff(deltas)[inner] < 0)


# ---------------------------------------------------------------------------------------------
# Noise present and correctly scaled
# ---------------------------------------------------------------------------------------------


def test_noise_scale_is_exactly_proportional_for_a_fixed_seed() -> None:
    w = np.zeros((1, 10))
    base = _core.output_perturbation(w, 0.3, 0.8, seed=11)[0]
    half_eps = _core.output_perturbation(w, 0.3, 0.4, seed=11)[0]
    triple_sens = _core.output_perturbation(w, 0.9, 0.8, seed=11)[0]
    np.testing.assert_allclose(half_eps, 2 * base, rtol=1e-14)
    np.testing.assert_allclose(triple_sens, 3 * base, rtol=1e-14)


def test_mean_noise_norm_scales_as_sensitivity_over_epsilon() -> None:
    """Independent seeds: halving eps doubles E||kappa||; tripling sens triples it."""
    # Each mean has relative SE 1/sqrt(dN) = 0.45% (d = 10, N = 5000); ratios within 5 combined
    # SE (false failure < 1e-6 each); seeds fixed, so deterministic.
    n, d = 5000, 10
    means = {}
    for i, (sens, eps) in enumerate([(0.3, 0.8), (0.3, 0.4), (0.9, 0.8)]):
        norms = np.linalg.norm(_draws(n, d, sens, eps, seed0=8_000_000 + 10_000 * i), axis=1)
        means[sens, eps] = norms.mean()
        assert norms.mean() == pytest.approx(d * sens / eps, rel=5 / math.sqrt(d * n))
    tol = 5 * math.sqrt(2) / math.sqrt(d * n)
    assert means[0.3, 0.4] / means[0.3, 0.8] == pytest.approx(2.0, rel=tol)
    assert means[0.9, 0.8] / means[0.3, 0.8] == pytest.approx(3.0, rel=tol)


def test_per_output_blocks_are_independent_gamma_draws() -> None:
    # Ten KS tests at alpha=1e-4 (family-wise false failure 1e-3), the chi2 test of zero
    # correlation between the block norms at alpha=1e-3 (1e-3); the contrasts (per_output
    # False) are expected to fail at p ~ 0, asserted < 1e-10. Seeds fixed, so deterministic.
    n, n_out, dim, sens, eps = 5000, 10, 5, 0.2, 0.5
    zero = np.zeros((n_out, dim))
    per = np.array(
        [
            _core.output_perturbation(zero, sens, eps, seed=9_000_000 + i, per_output=True)[0]
            for i in range(n)
        ]
    )
    norms = np.linalg.norm(per, axis=2)  # (n, n_out)
    for c in range(n_out):
        assert _ks(norms[:, c], stats.gamma(dim, scale=sens / eps).cdf) > ALPHA / n_out
    assert _chi2_uncorrelated(norms) > ALPHA
    # One draw for the whole model instead: its norm is Gamma(n_out * dim), not its blocks'.
    whole = np.array(
        [_core.output_perturbation(zero, sens, eps, seed=9_100_000 + i)[0] for i in range(n)]
    )
    assert (
        _ks(np.linalg.norm(whole, axis=(1, 2)), stats.gamma(n_out * dim, scale=sens / eps).cdf)
        > ALPHA
    )
    assert _ks(np.linalg.norm(whole[:, 0], axis=1), stats.gamma(dim, scale=sens / eps).cdf) < 1e-10


def test_released_model_minus_trained_model_is_the_eq3_noise() -> None:
    """Fixed training, varied noise seed; the release differs from PSGD(S) by eq. (3)."""
    # KS at alpha=1e-3 (false failure 1e-3) and the 3-SE mean check (2.7e-3); seeds fixed.
    rng = np.random.default_rng(3)
    m, d, k, b = 400, 6, 3, 10
    X = rng.normal(size=(m, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.where(X @ rng.normal(size=d) > 0, 1.0, -1.0)
    eta = 1 / math.sqrt(m)
    state = _core.init_state("logistic", d, eta=eta, batch_size=b)
    for _ in range(k):
        state = _core.run_epoch(state, X, y)
    w = _core.weights(state)
    sens = _core.bolton_sensitivity(
        "constant", eta=eta, lipschitz=1.0, smoothness=1.0, rows=m, batch_size=b, epochs=k
    )
    eps, n = 0.2, 5000
    noise = np.array(
        [_core.output_perturbation(w, sens, eps, seed=10_000_000 + i)[0] - w for i in range(n)]
    ).reshape(n, d)
    norms = np.linalg.norm(noise, axis=1)
    assert np.all(norms > 0)  # the noise is never missing
    assert _ks(norms, stats.gamma(d, scale=sens / eps).cdf) > ALPHA
    assert abs(norms.mean() - d * sens / eps) < 3 * math.sqrt(d) * sens / eps / math.sqrt(n)


# ---------------------------------------------------------------------------------------------
# Exponential mechanism (private tuning, Wu et al. 2017, Algorithm 3)
# ---------------------------------------------------------------------------------------------


def test_exponential_mechanism_frequencies() -> None:
    # Chi-square goodness of fit at alpha=1e-3 over 1e5 draws: false failure probability 1e-3
    # (the smallest expected count is ~13); seeds fixed, so deterministic.
    chi = np.array([3.0, 5.0, 8.0, 8.0, 20.0])
    eps, n = 0.5, 100_000
    utility = -chi  # Alg. 3: utility = -(number of errors), sensitivity 1
    picks = [_core.exponential_mechanism(utility, eps, seed=20_000_000 + i) for i in range(n)]
    counts = np.bincount(picks, minlength=len(chi))
    p = np.exp(-eps * chi / 2)
    p /= p.sum()
    assert stats.chisquare(counts, n * p).pvalue > ALPHA


def test_exponential_mechanism_sensitivity_scales_epsilon() -> None:
    # Chi-square at alpha=1e-3: false failure probability 1e-3; seeds fixed.
    u = np.array([0.0, 1.0, 2.0])
    n = 30000
    picks = [
        _core.exponential_mechanism(u, 2.0, sensitivity=4.0, seed=21_000_000 + i) for i in range(n)
    ]
    p = np.exp(2.0 * u / (2 * 4.0))
    p /= p.sum()
    assert stats.chisquare(np.bincount(picks, minlength=3), n * p).pvalue > ALPHA


def test_exponential_mechanism_log_sum_exp_is_stable() -> None:
    # Utility differences of ~1e4: exp() of the raw exponents over- or underflows.
    for utility in ([-1e4, -2e4, -3e4], [1e4, 0.0, -1e4], [-2e4, -1e4, -3e4, -1.5e4]):
        best = int(np.argmax(utility))
        drawn = {_core.exponential_mechanism(utility, 0.5, seed=s) for s in range(2000)}
        assert drawn == {best}
    # A huge common offset must not wash out an O(1) difference: p = (1, e^-1) / (1 + e^-1).
    # Chi-square at alpha=1e-3: false failure probability 1e-3; seeds fixed.
    n = 20000
    picks = [
        _core.exponential_mechanism([1e6, 1e6 - 2.0], 1.0, seed=22_000_000 + i) for i in range(n)
    ]
    p = np.array([1.0, math.exp(-1.0)]) / (1 + math.exp(-1.0))
    assert stats.chisquare(np.bincount(picks, minlength=2), n * p).pvalue > ALPHA


# ---------------------------------------------------------------------------------------------
# Seeds: reproducible when given, fresh OS entropy when not
# ---------------------------------------------------------------------------------------------


def _all_draws(seed):
    w = np.zeros((2, 3))
    return [
        _core.uniform(8, seed=seed),
        _core.normal(8, seed=seed),
        _core.gamma(8, 3.0, seed=seed),
        _core.directions(4, 3, seed=seed),
        _core.output_perturbation(w, 1.0, 1.0, seed=seed)[0],
        _core.output_perturbation(w, 1.0, 0.5, 1e-5, seed=seed)[0],
        np.array([_core.exponential_mechanism(np.zeros(50), 1.0, seed=seed)]),
    ]


def test_fixed_seed_reproduces_and_seeds_differ() -> None:
    for a, b, c in zip(_all_draws(5), _all_draws(5), _all_draws(6), strict=True):
        assert np.array_equal(a, b)
        if a.size > 1:
            assert not np.array_equal(a, c)


def test_unseeded_draws_differ_between_calls() -> None:
    for a, b in zip(_all_draws(None), _all_draws(None), strict=True):
        if a.size > 1:
            assert not np.array_equal(a, b)
    # A single index out of 50 equal utilities: 200 unseeded draws are not all the same
    # (probability 50^-199 for a correct generator).
    assert len({_core.exponential_mechanism(np.zeros(50), 1.0) for _ in range(200)}) > 1
    # An unseeded draw is not the draw of a small fixed seed (e.g. a forgotten seed=0).
    fixed = [_core.uniform(4, seed=s) for s in range(10)]
    fresh = _core.uniform(4)
    assert not any(np.array_equal(fresh, f) for f in fixed)
