"""DP-AMBSSGD / DP-SSGD in one pass (Varshney et al. 2022, Algorithms 1-3): the C core in memory and
the SQL aggregate.

Statistical tests are seeded (deterministic); each states the false-failure rate it would have
over fresh seeds, and each was checked to fail with the noise removed or mis-scaled.
"""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest
from scipy import stats

from dpsql import _core
from tests.pg_helpers import load

# ---------------------------------------------------------------------------------- helpers

# A small adaptive configuration: T = 6 blocks of s = 10 stat rows and b = 20 gradient rows;
# N = 187 leaves 7 unused rows.
SMALL = dict(
    n_rows=187, blocks=6, batch=20, stat=10, eta=0.4, r_x=2.0, log_factor=1.2, domain=20.0, levels=8
)
SMALL_USED = 6 * 30


def _private(cfg: dict, alpha: float = 1.0, beta_s: float = 1e-3) -> dict:
    """cfg with alpha, V1 count noise sigma_c = alpha sqrt(L + 1) and V2 threshold s - Gamma."""
    n_q = cfg["levels"] + 1
    sigma_c = alpha * math.sqrt(n_q)
    theta = cfg["stat"] - sigma_c * math.sqrt(2 * math.log(2 * n_q / beta_s))
    return {**cfg, "alpha": alpha, "sigma_c": sigma_c, "theta": theta}


def _noiseless(cfg: dict) -> dict:
    """Noiseless run (alpha = 0, sigma_c = 0); DP-STAT breaks once all s points are covered."""
    return {**cfg, "alpha": 0.0, "sigma_c": 0.0, "theta": float(cfg.get("stat", 0))}


def _run(dim: int, X, y, seed: int = 1, **cfg):
    state = _core.ambssgd_init(dim, seed=seed, keep_iterates=True, **cfg)
    return _core.ambssgd_result(_core.ambssgd_run(state, X, y))


def _data(n: int, d: int, seed: int = 0, sigma: float = 0.3):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    X = rng.normal(size=(n, d))
    return X, X @ w + sigma * rng.normal(size=n), w


def _reference(
    X,
    y,
    *,
    blocks,
    batch,
    stat,
    eta,
    zeta_fixed=0.0,
    r_x=0.0,
    log_factor=0.0,
    domain=0.0,
    levels=0,
    theta=0.0,
    intercept=False,
    x_bound=0.0,
    **_,
):
    """Noiseless DP-AMBSSGD in numpy, straight from the paper's Algorithm 2."""
    d = X.shape[1]
    p = d + int(intercept)

    def row(k):
        x, t = X[k], y[k]
        if not (np.all(np.isfinite(x)) and np.isfinite(t)):
            return np.zeros(p), 0.0  # the zero record
        n = np.linalg.norm(x)
        if x_bound > 0 and n > x_bound:
            x = x * (x_bound / n)
        return (np.append(x, 1.0) if intercept else x), t

    w = np.zeros(p)
    iterates, gammas, zetas = [], [], []
    k = 0
    for _t in range(blocks):
        if stat > 0:
            r = np.sort([abs(a @ w - t) for a, t in map(row, range(k, k + stat))])
            for i in range(levels + 1):
                gamma = domain * 2.0 ** (i - levels)
                if np.searchsorted(r, gamma, side="right") >= theta:
                    break
            zeta = r_x * gamma * log_factor
        else:
            gamma, zeta = 0.0, zeta_fixed
        g = np.zeros(p)
        for a, t in map(row, range(k + stat, k + stat + batch)):
            v = a * (a @ w - t)
            n = np.linalg.norm(v)
            g += v * min(1.0, zeta / n) if n > 0 else 0.0
        w = w - eta * g / batch
        iterates.append(w)
        gammas.append(gamma)
        zetas.append(zeta)
        k += batch + stat
    it = np.array(iterates)
    return it, np.array(gammas), np.array(zetas), it[blocks // 2 :].mean(axis=0)


# ------------------------------------------------------------------ clipping and sensitivity


def test_clipping_properties() -> None:
    """Clipping on the core's clipped gradient (the code the gradient rows run)."""
    d = 4
    X, y, _ = _data(200, d)
    cfg = _noiseless(dict(n_rows=200, blocks=2, batch=100, stat=0, eta=0.5, zeta_fixed=50.0))
    state = _core.ambssgd_run(
        _core.ambssgd_init(d, intercept=True, seed=0, **cfg), X[:100], y[:100]
    )
    w = _core.ambssgd_result(state)["w_last"]
    assert np.all(w != 0)
    rng = np.random.default_rng(1)
    rows = [(rng.normal(size=d) * s, rng.normal() * s) for s in (1e-3, 1.0, 10.0, 1e6)]
    rows += [(np.full(d, 1e300), 1e300), (np.full(d, -1e300), 1e300), (np.zeros(d), 5.0)]
    rows += [(np.array([1e6, 0, 0, 0]), 1e6), (np.array([1e-300, 0, 0, 0]), -1e-300)]
    for zeta in (0.0, 1e-6, 0.5, 3.0, 1e6):
        for x, t in rows:
            g, clipped = _core.ambssgd_clipped_gradient(state, x, t, zeta)
            a = np.append(x, 1.0)
            norm = np.linalg.norm(g)
            assert norm <= zeta * (1 + 1e-12)
            if zeta == 0.0:
                assert np.all(g == 0)
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                full = a * (a @ w - t)
            if np.all(np.isfinite(full)) and np.linalg.norm(full) <= zeta * (1 - 1e-9):
                np.testing.assert_allclose(g, full, rtol=1e-12, atol=1e-300)  # identity
                assert not clipped
            elif np.all(np.isfinite(full)):
                assert clipped and norm == pytest.approx(zeta, rel=1e-12)
                # parallel to the unclipped gradient, same direction
                cos = (g / norm) @ (full / np.linalg.norm(full))
                assert cos == pytest.approx(1.0, abs=1e-12)
    # clip(0) = 0: x~ = 0 without an intercept, or a zero residual
    s0 = _core.ambssgd_init(d, seed=0, **cfg)
    assert np.all(_core.ambssgd_clipped_gradient(s0, np.zeros(d), 3.0, 1.0)[0] == 0)
    assert np.all(_core.ambssgd_clipped_gradient(s0, np.ones(d), 0.0, 1.0)[0] == 0)
    # zero records: NaN/Inf, wrong length
    for x, t in [(np.full(d, np.nan), 1.0), (np.ones(d), np.inf), (np.ones(d + 1), 1.0)]:
        g, _ = _core.ambssgd_clipped_gradient(state, x, t, 1.0)
        assert np.all(g == 0)


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_gradient_step_sensitivity(mode) -> None:
    """Replacing one gradient record by an adversarial one (||x|| = 1e6, y = 1e6) moves the
    noiseless update of its block by at most 2 eta zeta_t / b, and nothing before it."""
    d, T, b = 3, 4, 10
    if mode == "fixed":
        cfg = _noiseless(dict(n_rows=T * b, blocks=T, batch=b, stat=0, eta=0.5, zeta_fixed=0.7))
        s = 0
    else:
        cfg = _noiseless({**SMALL, "batch": b, "n_rows": T * (b + 10), "blocks": T})
        s = 10
    X, y, _ = _data(T * (b + s), d, seed=3)
    base = _run(d, X, y, **cfg)
    t = 2
    worst = 0.0
    for j in range(b):
        X2, y2 = X.copy(), y.copy()
        k = t * (b + s) + s + j
        X2[k] = 1e6 * np.eye(d)[j % d] * (1 if j % 2 else -1)
        y2[k] = 1e6
        other = _run(d, X2, y2, **cfg)
        assert np.array_equal(other["iterates"][:t], base["iterates"][:t])
        assert np.array_equal(other["gammas"][: t + 1], base["gammas"][: t + 1])
        zeta = base["zetas"][t]
        diff = np.linalg.norm(other["iterates"][t] - base["iterates"][t])
        assert diff <= 2 * cfg["eta"] * zeta / b * (1 + 1e-9)
        worst = max(worst, diff / (2 * cfg["eta"] * zeta / b))
    assert worst > 0.3  # the adversarial record does move the step (the bound is not vacuous)


# ------------------------------------------------------------------------------- DP-STAT


def test_dp_stat_output_domain_and_draws() -> None:
    rng = np.random.default_rng(0)
    r = np.abs(rng.standard_cauchy(40))
    B, L = 8.0, 12
    gam, lv, dr = _core.ambssgd_dp_stat(
        r, domain=B, levels=L, sigma_c=3.0, theta=30.0, trials=3000, seed=5
    )
    assert set(np.unique(lv)) <= set(range(L + 1)) and len(np.unique(lv)) > 3
    np.testing.assert_array_equal(gam, B * 2.0 ** (lv - L))
    assert np.all(dr <= L + 1)
    np.testing.assert_array_equal(dr, lv + 1)  # one noisy count per level tried, none after
    # V4: 2000 levels (the paper's Delta = B / N^100) need no float B * 2^-2000
    for tiny in (0.0, 1e-300, 1e-10, 3.0):
        gam, lv, dr = _core.ambssgd_dp_stat(
            [tiny, tiny / 2], domain=B, levels=2000, sigma_c=0.0, theta=2.0
        )
        i = 0 if tiny == 0 else math.ceil(math.log2(tiny / B)) + 2000
        assert lv[0] == i and dr[0] == i + 1
        assert gam[0] >= tiny and (i == 0 or B * 2.0 ** (i - 1 - 2000) < tiny)


def test_dp_stat_noiseless_is_the_smallest_covering_level() -> None:
    """DP-STAT without noise: sigma_c = 0, theta = s gives the smallest level >= max r (level 0 if
    every r is below it, level L if max r > B)."""
    rng = np.random.default_rng(1)
    B, L = 10.0, 10
    for trial in range(300):
        r = np.abs(rng.normal(size=25)) * 10.0 ** rng.uniform(-5, 1.5)
        if trial % 10 == 0:
            r[:] = 0.0
        _, lv, _ = _core.ambssgd_dp_stat(r, domain=B, levels=L, sigma_c=0.0, theta=25.0)
        levels = B * 2.0 ** (np.arange(L + 1) - L)
        covering = np.nonzero(levels >= r.max())[0]
        assert lv[0] == (covering[0] if covering.size else L)


def test_dp_stat_counts_have_sensitivity_one() -> None:
    rng = np.random.default_rng(2)
    B, L = 4.0, 15
    for _ in range(200):
        r = np.abs(rng.normal(size=30)) * 10.0 ** rng.uniform(-4, 1)
        c = _core.ambssgd_level_counts(r, B, L)
        for v in (0.0, np.inf, 1e300, r.max() * 2, rng.uniform(0, B)):
            r2 = r.copy()
            r2[rng.integers(30)] = v
            c2 = _core.ambssgd_level_counts(r2, B, L)
            assert np.max(np.abs(c2 - c)) <= 1
        assert np.all(np.diff(c) >= 0) and c[-1] == np.sum(r <= B)


def test_dp_stat_count_noise_scale_and_freshness() -> None:
    """All residuals 0: level 0 is chosen iff s + sigma_c Z >= theta. With theta = s + z sigma_c
    the probability is 1 - Phi(z); 20000 trials per z give SE <= 0.0036 and the tolerance is
    0.016 (4.4 SE; false failure < 1e-4 over fresh seeds). sigma_c off by sqrt(2) moves the
    z = 1 probability by 0.08, no noise by 0.16. With theta = s, level i < L has probability
    2^-(i+1) only if every level draws FRESH noise (one reused draw never breaks after level 0)."""
    s, L, sigma_c = 50, 5, 2.0
    for z in (-1.0, 0.0, 1.0):
        _, lv, _ = _core.ambssgd_dp_stat(
            np.zeros(s),
            domain=1.0,
            levels=L,
            sigma_c=sigma_c,
            theta=s + z * sigma_c,
            trials=20000,
            seed=11,
        )
        assert np.mean(lv == 0) == pytest.approx(stats.norm.sf(z), abs=0.016)
    _, lv, _ = _core.ambssgd_dp_stat(
        np.zeros(s), domain=1.0, levels=L, sigma_c=sigma_c, theta=float(s), trials=20000, seed=12
    )
    for i in range(3):
        assert np.mean(lv == i) == pytest.approx(2.0 ** -(i + 1), abs=0.016)


def test_pass_uses_the_given_count_noise() -> None:
    """Through the pass: zero data, theta = s - sigma_c, so each block picks level 0 with
    probability Phi(1) = 0.841 (2000 blocks: SE 0.008, tolerance 0.035 = 4.3 SE; false failure
    < 2e-5). A count noise std off by sqrt(2) gives 0.76."""
    T, s, b, L, sigma_c = 2000, 2, 1, 4, 1.7
    cfg = dict(
        n_rows=T * (s + b),
        blocks=T,
        batch=b,
        stat=s,
        alpha=0.0,
        eta=0.1,
        r_x=1.0,
        log_factor=1.0,
        domain=1.0,
        levels=L,
        sigma_c=sigma_c,
        theta=s - sigma_c,
    )
    r = _run(3, np.zeros((T * (s + b), 3)), np.zeros(T * (s + b)), seed=4, **cfg)
    assert np.mean(r["gammas"] == 2.0**-L) == pytest.approx(stats.norm.cdf(1.0), abs=0.035)
    assert np.all(r["draws"] <= L + 1)
    assert np.all(r["iterates"] == 0)  # zero records, alpha = 0: w stays 0


# ----------------------------------------------------------------------------- noise scale


@pytest.mark.parametrize("batch", [1, 4])
def test_parameter_noise_scale(batch) -> None:
    """Zero data: w_{t+1} - w_t = -eta (2 zeta alpha / b) n, so each coordinate has std
    2 eta zeta alpha / b (batch 1 = DP-SSGD: 2 eta zeta alpha). 4000 blocks x 3 coordinates
    estimate the std within 0.7% (SE); tolerance 3% (4.6 SE, false failure < 1e-5). Without
    the 2 the std is off by 50%."""
    T, d, eta, zeta, alpha = 4000, 2, 0.3, 0.5, 1.5
    n = T * batch
    cfg = dict(n_rows=n, blocks=T, batch=batch, stat=0, alpha=alpha, eta=eta, zeta_fixed=zeta)
    # zero records (NaN rows): no gradient even on the intercept
    r = _run(d, np.full((n, d), np.nan), np.zeros(n), seed=7, intercept=True, **cfg)
    steps = np.diff(np.vstack([np.zeros(d + 1), r["iterates"]]), axis=0).ravel()
    expected = 2 * eta * zeta * alpha / batch
    assert np.std(steps) == pytest.approx(expected, rel=0.03)
    assert abs(np.mean(steps)) < 4.5 * expected / math.sqrt(steps.size)
    assert stats.kstest(steps / expected, "norm").pvalue > 1e-4


# ------------------------------------------------------------------------------ data usage


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_noiseless_pass_matches_the_reference(mode) -> None:
    """Every one of the first T (b + s) rows is used exactly once, in its role (stat rows for
    DP-STAT, the next b for the step at w_t), and nothing after: the noiseless pass equals the
    numpy reference of the pseudo-code, malformed rows being zero records."""
    d = 3
    if mode == "fixed":
        cfg = _noiseless(dict(n_rows=187, blocks=6, batch=30, stat=0, eta=0.4, zeta_fixed=1.5))
    else:
        cfg = _noiseless(SMALL)  # theta = s: gamma_t covers the largest stat residual
    X, y, _ = _data(187, d, seed=5)
    X[[4, 17, 95]] = np.nan
    y[[33, 120]] = np.inf
    y[[30, 69, 150]] += 30.0  # outliers at the first and last stat positions of blocks 1, 2, 5
    for intercept, x_bound, theta in [(False, 0.0, 10.0), (True, 2.0, 10.0), (True, 0.0, 9.0)]:
        if mode == "adaptive":
            cfg["theta"] = theta
        r = _run(d, X, y, intercept=intercept, x_bound=x_bound, **cfg)
        it, gam, zet, wbar = _reference(X, y, intercept=intercept, x_bound=x_bound, **cfg)
        np.testing.assert_allclose(r["iterates"], it, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(r["gammas"], gam, rtol=0, atol=0)
        np.testing.assert_allclose(r["zetas"], zet, rtol=1e-15)
        np.testing.assert_allclose(r["weights"], wbar, rtol=1e-10, atol=1e-14)
        assert r["rows_used"] == SMALL_USED and r["rows_unused"] == 7
        if mode == "adaptive":
            assert len(set(r["gammas"])) > 1  # DP-STAT adapts


def test_rows_after_the_used_ones_are_never_read() -> None:
    X, y, _ = _data(187, 3, seed=6)
    cfg = _private(SMALL)
    base = _core.ambssgd_run(_core.ambssgd_init(3, seed=9, keep_iterates=True, **cfg), X, y)
    X2, y2 = X.copy(), y.copy()
    X2[SMALL_USED:] = np.array([[1e300, np.nan, -3.0]])
    y2[SMALL_USED:] = -1e200
    other = _core.ambssgd_run(_core.ambssgd_init(3, seed=9, keep_iterates=True, **cfg), X2, y2)
    assert np.array_equal(base.view(np.uint64), other.view(np.uint64))
    # fed in chunks, the pass is the same pass
    s = _core.ambssgd_init(3, seed=9, keep_iterates=True, **cfg)
    for lo, hi in [(0, 7), (7, 100), (100, 187)]:
        s = _core.ambssgd_run(s, X[lo:hi], y[lo:hi])
    assert np.array_equal(base.view(np.uint64), s.view(np.uint64))


def test_block_t_never_affects_earlier_blocks() -> None:
    """One pass, w_t before block t: with a fixed seed, perturbing a stat row of block t keeps
    gamma_0..gamma_{t-1} and w_1..w_t; perturbing a gradient row keeps gamma_0..gamma_t too."""
    X, y, _ = _data(187, 3, seed=8)
    cfg = _private(SMALL)
    cfg["theta"] = 8.0  # a data-dependent DP-STAT (the V2 theta is negative at s = 10)
    base = _run(3, X, y, seed=2, **cfg)
    for t in range(6):
        for j, is_stat in [(3, True), (15, False)]:
            X2, y2 = X.copy(), y.copy()
            X2[t * 30 + j] *= 40.0
            y2[t * 30 + j] += 100.0
            r = _run(3, X2, y2, seed=2, **cfg)
            assert np.array_equal(r["iterates"][:t], base["iterates"][:t])
            keep = t if is_stat else t + 1
            assert np.array_equal(r["gammas"][:keep], base["gammas"][:keep])
            if not is_stat:
                assert not np.array_equal(r["iterates"][t], base["iterates"][t])


def test_output_is_the_mean_of_the_last_half_of_the_iterates() -> None:
    X, y, _ = _data(187, 3, seed=9)
    r = _run(3, X, y, **_private(SMALL))
    it = r["iterates"]
    np.testing.assert_allclose(r["weights"], it[3:].mean(axis=0), rtol=1e-13, atol=1e-15)
    assert not np.allclose(r["weights"], it[2:].mean(axis=0), rtol=1e-6)
    assert not np.allclose(r["weights"], it[4:].mean(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(r["w_last"], it[-1])
    # deterministic under a seed, different under another
    again = _run(3, X, y, **_private(SMALL))
    np.testing.assert_array_equal(again["weights"], r["weights"])
    assert not np.array_equal(_run(3, X, y, seed=99, **_private(SMALL))["weights"], r["weights"])


# -------------------------------------------------------------------------------- utility


def _regression(N: int, d: int, sigma: float, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    X = rng.normal(size=(N, d))
    return X, X @ w + sigma * rng.normal(size=N), w


def _paper_config(N: int, d: int, mode: str) -> dict:
    """The default constants: T = 2 ceil(8 ln N / 2), s = floor(m / 11), eta = b / (R_x^2 + b - 1),
    a = 1/2, B = R_x (1 + 1) ln N, L = ceil(log2 N)."""
    T = 2 * math.ceil(8 * math.log(N) / 2)
    m = N // T
    rx2 = d + 2
    if mode == "fixed":
        return dict(n_rows=N, blocks=T, batch=m, stat=0, eta=m / (rx2 + m - 1), zeta_fixed=1e6)
    s = m // 11
    return dict(
        n_rows=N,
        blocks=T,
        batch=m - s,
        stat=s,
        eta=(m - s) / (rx2 + m - s - 1),
        r_x=math.sqrt(rx2),
        log_factor=math.sqrt(math.log(N)),
        domain=2 * math.sqrt(rx2) * math.log(N),
        levels=math.ceil(math.log2(N)),
    )


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_non_private_limit_converges(mode) -> None:
    """Varshney et al. 2022, Theorem 10 without privacy: alpha = 0 and no effective clipping: N
    excess / (sigma^2 d) averages about 1.1 (H = I). Six seeds (30 degrees of freedom): the mean
    stays in [0.4, 2.5] except with probability < 1e-4; a step that ignored the data, or a wrong
    block layout, is far out."""
    N, d, sigma = 2**15, 5, 0.5
    ratios = []
    for seed in range(6):
        X, y, w = _regression(N, d, sigma, seed)
        r = _run(d, X, y, seed=seed, **_noiseless(_paper_config(N, d, mode)))
        ratios.append(N * 0.5 * np.sum((r["weights"] - w) ** 2) / (sigma**2 * d))
        assert r["clipped"] <= 0.01 * N
    assert 0.4 <= np.mean(ratios) <= 2.5


def test_private_run_learns_in_the_feasible_regime() -> None:
    """epsilon = 2, delta = 1e-6 (alpha* = 3.85, V1 + V2 DP-STAT, s = 449 >= 2 Gamma = 158):
    the excess risk stays within 30x of sigma^2 d / N (measured 6-9x) and gamma_t adapts."""
    N, d, sigma, eps, delta = 2**19, 5, 0.5, 2.0, 1e-6
    alpha = (math.sqrt(math.log(1 / delta) + eps) + math.sqrt(math.log(1 / delta))) / eps
    X, y, w = _regression(N, d, sigma, 0)
    r = _run(d, X, y, seed=3, **_private(_paper_config(N, d, "adaptive"), alpha=alpha))
    excess = 0.5 * np.sum((r["weights"] - w) ** 2)
    assert excess < 30 * sigma**2 * d / N
    assert r["gammas"][-1] < r["gammas"][0]
    assert r["clipped"] < 0.01 * N


# ------------------------------------------------------------------------------ bad input

BAD = [
    ({"blocks": 5}, "blocks"),
    ({"blocks": 0}, "blocks"),
    ({"batch": 0}, "batch"),
    ({"stat": -1}, "stat"),
    ({"n_rows": 179}, "n_rows"),
    ({"alpha": float("nan")}, "alpha"),
    ({"alpha": -1.0}, "alpha"),
    ({"eta": 0.0}, "eta"),
    ({"eta": float("inf")}, "eta"),
    ({"r_x": 0.0}, "r_x"),
    ({"log_factor": -1.0}, "log_factor"),
    ({"domain": 0.0}, "domain"),
    ({"levels": -1}, "levels"),
    ({"sigma_c": -1.0}, "sigma_c"),
    ({"sigma_c": 0.0}, "sigma_c"),
    ({"theta": float("nan")}, "theta"),
    ({"zeta_fixed": 1.0}, "zeta_fixed"),
    ({"x_bound": -1.0}, "x_bound"),
    ({"r_x": 1e300, "domain": 1e300}, "overflows"),
    ({"stat": 0}, "zeta_fixed"),
]


@pytest.mark.parametrize("change,word", BAD, ids=[w for _, w in BAD])
def test_init_refuses_bad_parameters(change, word) -> None:
    cfg = {**_private(SMALL), **change}
    with pytest.raises(ValueError, match=word):
        _core.ambssgd_init(3, seed=1, **cfg)
    with pytest.raises(ValueError, match="dim"):
        _core.ambssgd_init(0, seed=1, **_private(SMALL))


def test_corrupt_states_are_refused_in_memory() -> None:
    s = _core.ambssgd_run(_core.ambssgd_init(3, seed=1, **_private(SMALL)), *_data(50, 3)[:2])
    f = _core.AMBSSGD_HEADER_FIELDS
    for field, value in [
        ("magic", 1.0),
        ("dim", 4.0),
        ("blocks", 7.0),
        ("block", 9.0),
        ("pos", 0.5),
        ("pos", 31.0),
        ("unused", 3.0),
        ("zeta", np.nan),
        ("levels", 1e9),
        ("stat", -1.0),
        ("alpha", np.inf),
    ]:
        bad = s.copy()
        bad[f.index(field)] = value
        with pytest.raises(ValueError, match="malformed"):
            _core.ambssgd_run(bad, np.zeros((1, 3)), np.zeros(1))
    for bad in (s[:-1], np.append(s, 0.0), s[:10], np.zeros(0)):
        with pytest.raises(ValueError, match="malformed"):
            _core.ambssgd_result(bad)
    bad = s.copy()
    bad[-2] = np.frombuffer(np.uint64(2**20).tobytes(), dtype=np.float64)[0]  # RNG index
    with pytest.raises(ValueError, match="malformed"):
        _core.ambssgd_check(bad)
    with pytest.raises(ValueError, match="features"):
        _core.ambssgd_run(s, np.zeros((2, 4)), np.zeros(2))


# ------------------------------------------------------------------ through the server

INIT_SQL = (
    "SELECT dpsql_internal._ambssgd_init(%(dim)s, %(intercept)s, %(x_bound)s, %(n_rows)s,"
    " %(blocks)s,"
    " %(batch)s, %(stat)s, %(alpha)s, %(eta)s, %(r_x)s, %(log_factor)s, %(domain)s,"
    " %(levels)s, %(sigma_c)s, %(theta)s, %(zeta_fixed)s, %(seed)s)"
)


def _sql_args(dim: int, seed, **cfg) -> dict:
    args = dict(
        dim=dim,
        intercept=False,
        x_bound=0.0,
        r_x=0.0,
        log_factor=0.0,
        domain=0.0,
        levels=0,
        sigma_c=0.0,
        theta=0.0,
        zeta_fixed=0.0,
        seed=seed,
    )
    return {**args, **cfg}


def _sql_pass(conn, table: str, args: dict):
    """(init state, final state) of one aggregate call in rid order; binary, bit-exact."""
    with conn.cursor(binary=True) as cur:
        row = cur.execute(
            f"WITH i AS ({INIT_SQL} AS st) SELECT (SELECT st FROM i),"
            f" (SELECT dpsql.ambssgd_pass(t.x, t.y, (SELECT st FROM i) ORDER BY t.rid)"
            f"  FROM {table} t)",
            args,
        ).fetchone()
    final = None if row[1] is None else np.array(row[1], dtype=np.float64)
    return np.array(row[0], dtype=np.float64), final


# rid -> SQL that makes that row malformed (a zero record), and whether x or y is touched
MALFORMED = {
    3: "x = NULL",  # stat row, block 0
    15: "y = NULL",  # gradient row, block 0
    40: "x = ARRAY[1.0, 2.0]",  # wrong length
    77: "x = ARRAY[1.0, 'NaN', 2.0]",
    100: "y = 'Infinity'",
    130: "x = ARRAY[1.0, NULL, 3.0]",
    150: "x = ARRAY[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]",
    160: "x = '{}'",
    183: "x = NULL, y = NULL",  # unused row
}


def test_sql_aggregate_matches_the_memory_engine_bit_for_bit(conn, scratch_schema) -> None:
    X, y, _ = _data(187, 3, seed=10)
    table = load(conn, scratch_schema, "src", X, y)
    for rid, change in MALFORMED.items():
        conn.execute(f"UPDATE {table} SET {change} WHERE rid = %s", (rid,))
    Xm = X.copy()
    Xm[list(MALFORMED)] = np.nan
    for cfg in (
        {**_private(SMALL), "theta": 7.0, "intercept": True, "x_bound": 3.0},
        dict(n_rows=187, blocks=6, batch=30, stat=0, alpha=2.0, eta=0.3, zeta_fixed=1.0),
    ):
        init, final = _sql_pass(conn, table, _sql_args(3, 42, **cfg))
        memory_init = _core.ambssgd_init(3, seed=42, **cfg)
        assert np.array_equal(init.view(np.uint64), memory_init.view(np.uint64))
        memory = _core.ambssgd_run(memory_init, Xm, y)
        assert np.array_equal(final.view(np.uint64), memory.view(np.uint64))
        with conn.cursor(binary=True) as cur:
            res = cur.execute(
                "SELECT * FROM dpsql_internal._ambssgd_result(%b)", (list(final),)
            ).fetchone()
        ref = _core.ambssgd_result(memory)
        np.testing.assert_array_equal(res[0], ref["weights"])
        np.testing.assert_array_equal(res[1], ref["gammas"])
        np.testing.assert_array_equal(res[2], ref["zetas"])
        np.testing.assert_array_equal(res[3], ref["draws"])
        assert (res[4], res[5]) == (180, 7)


def test_sql_init_keys_the_generator_from_the_os(conn) -> None:
    args = _sql_args(3, None, **_private(SMALL))
    with conn.cursor(binary=True) as cur:
        a = np.array(cur.execute(INIT_SQL, args).fetchone()[0])
        b = np.array(cur.execute(INIT_SQL, args).fetchone()[0])
    n = _core.AMBSSGD_HEADER_LEN
    assert np.array_equal(a[:n], b[:n])
    assert not np.array_equal(a.view(np.uint64), b.view(np.uint64))


@pytest.mark.parametrize("change,word", BAD[:6] + BAD[-3:], ids=[w for _, w in BAD[:6] + BAD[-3:]])
def test_sql_init_refuses_bad_parameters(conn, change, word) -> None:
    args = _sql_args(3, 1, **{**_private(SMALL), **change})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=word):
        conn.execute(INIT_SQL, args)
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="eta"):
        conn.execute(INIT_SQL, {**args, "eta": None})


def test_sql_aggregate_refuses_corrupt_states_without_crashing(conn, scratch_schema) -> None:
    X, y, _ = _data(187, 3, seed=11)
    table = load(conn, scratch_schema, "src", X, y)
    args = _sql_args(3, 1, **_private(SMALL))
    with conn.cursor(binary=True) as cur:
        good = np.array(cur.execute(INIT_SQL, args).fetchone()[0])
    f = _core.AMBSSGD_HEADER_FIELDS
    corrupt = [good[:-1], good[:5], np.append(good, 1.0), np.zeros(len(good))]
    for field, value in [
        ("magic", 0.0),
        ("p", 7.0),
        ("block", 1e12),
        ("stat", 1e15),
        ("levels", -2.0),
        ("pos", np.nan),
    ]:
        bad = good.copy()
        bad[f.index(field)] = value
        corrupt.append(bad)
    started = good.copy()
    started[f.index("pos")] = 1.0  # a state that has seen a row: not a fresh pass
    for bad in corrupt + [started]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="DP-AMBSSGD|dpsql"):
            conn.execute(
                f"SELECT dpsql.ambssgd_pass(x, y, %b ORDER BY rid) FROM {table}", (list(bad),)
            )
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT dpsql_internal._ambssgd_result(%b)", (list(bad),))
    for sql_state, err in [
        ("NULL::float8[]", psycopg.errors.NullValueNotAllowed),
        ("ARRAY[1.0, NULL]::float8[]", psycopg.errors.NullValueNotAllowed),
        ("ARRAY[[1.0, 2.0], [3.0, 4.0]]::float8[]", psycopg.errors.ArraySubscriptError),
    ]:
        with pytest.raises(err):
            conn.execute(f"SELECT dpsql.ambssgd_pass(x, y, {sql_state}) FROM {table}")
    # not as a window function, not called directly
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        conn.execute(
            f"SELECT dpsql.ambssgd_pass(x, y, %b) OVER (ORDER BY rid) FROM {table}", (list(good),)
        )
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        conn.execute(
            f"SELECT dpsql_internal._ambssgd_transition(NULL, x, y, %b) FROM {table}", (list(good),)
        )
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_sql_result_needs_a_complete_pass(conn, scratch_schema) -> None:
    X, y, _ = _data(100, 3, seed=12)
    table = load(conn, scratch_schema, "src", X, y)
    _, final = _sql_pass(conn, table, _sql_args(3, 1, **_private(SMALL)))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="incomplete"):
        conn.execute("SELECT dpsql_internal._ambssgd_result(%b)", (list(final),))
    empty = f"{scratch_schema}.empty"
    conn.execute(f"CREATE TABLE {empty} (rid bigint, x float8[], y float8)")
    _, final = _sql_pass(conn, empty, _sql_args(3, 1, **_private(SMALL)))
    assert final is None  # no row, no state
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="no rows"):
        conn.execute(
            f"SELECT dpsql_internal._ambssgd_result((SELECT dpsql.ambssgd_pass(x, y, NULL) FROM"
            f" {empty}))"
        )
