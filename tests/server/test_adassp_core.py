"""AdaSSP's C core (core/adassp.h, linalg.h) through dpsql._core and the server:
symmetric eigenvalues and the LU solve against numpy, the gram aggregate (SQL == Cython ==
numpy on clipped rows, malformed records as zero records, parallel partial sums), the
replace-one sensitivities on adversarial neighbours, the law of the release's noise, the
noiseless release against OLS, and bad input.

Statistical tests are seeded (the seeds were not tuned), so every run draws the same numbers.
Each goodness-of-fit test has false-failure probability ALPHA = 1e-3 for a correct sampler
and a random choice of seeds; the file runs 9 of them (<= 0.9% in all, by the union bound).
They were checked to fail with the noise removed, every sigma doubled, the off-diagonal of E
drawn with variance 1/2 or its diagonal with variance 2 (mutations of adassp.c); the
sensitivity tests fail without the row clipping or with an unclipped intercept.
"""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest
from scipy import stats

from dpsql import _core

ALPHA = 1e-3
EPS = np.finfo(float).eps


def _ks_normal(sample: np.ndarray) -> float:
    """p-value of "sample ~ N(0, 1)" (Kolmogorov-Smirnov)."""
    return stats.kstest(sample, "norm").pvalue


def _uncorrelated(Z: np.ndarray) -> float:
    """p-value of "columns uncorrelated": N * sum_{i<j} r_ij^2 ~ chi2(d(d-1)/2) under H0."""
    n, d = Z.shape
    r = np.corrcoef(Z, rowvar=False)[np.triu_indices(d, 1)]
    return stats.chi2.sf(n * np.sum(r**2), d * (d - 1) // 2)


def _sym(rng, p, eigs=None):
    """A random symmetric matrix, with the given eigenvalues when eigs is given."""
    if eigs is None:
        A = rng.normal(size=(p, p))
        return (A + A.T) / 2
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    A = (Q * eigs) @ Q.T
    return (A + A.T) / 2


# ---------------------------------------------------------------------------------------------
# Linear algebra
# ---------------------------------------------------------------------------------------------


def _matrices():
    rng = np.random.default_rng(20180501)
    out = {}
    for p in (1, 2, 3, 7, 40, 120):
        out[f"random{p}"] = _sym(rng, p)
    out["ill_conditioned"] = _sym(rng, 30, np.logspace(-10, 0, 30))
    out["indefinite"] = _sym(rng, 25, np.r_[-np.logspace(-6, 2, 12), np.logspace(-3, 3, 13)])
    out["psd_rank_deficient"] = (lambda B: B @ B.T)(rng.normal(size=(20, 5)))
    out["repeated"] = _sym(rng, 12, np.r_[np.full(6, 2.0), np.full(6, -1.0)])
    out["diagonal"] = np.diag(rng.normal(size=9))
    out["zero"] = np.zeros((4, 4))
    out["huge"] = _sym(rng, 10) * 1e250
    out["tiny"] = _sym(rng, 10) * 1e-250
    out["gram"] = (lambda X: X.T @ X)(rng.normal(size=(500, 15)) + 3.0)
    return out


MATRICES = _matrices()


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_eigvalsh_matches_numpy(name) -> None:
    A = MATRICES[name]
    p = A.shape[0]
    ours = _core.sym_eigvalsh(A)
    ref = np.linalg.eigvalsh(A)
    scale = max(np.max(np.abs(ref)), np.finfo(float).tiny)
    assert np.all(np.diff(ours) >= 0)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=20 * p * EPS * scale)


def test_eigvalsh_reads_the_upper_triangle_only() -> None:
    rng = np.random.default_rng(1)
    A = _sym(rng, 8)
    garbage = np.triu(A) + np.tril(rng.normal(size=(8, 8)) * 100, -1)
    np.testing.assert_array_equal(_core.sym_eigvalsh(garbage), _core.sym_eigvalsh(A))


def test_lambda_min_of_a_gram_is_accurate() -> None:
    # X^T X of nearly collinear columns: lambda_min ~ 1e-6 relative to lambda_max
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 4))
    X[:, 3] = X[:, 2] + 1e-4 * rng.normal(size=200)
    G = X.T @ X
    G = (G + G.T) / 2
    lam = np.linalg.eigvalsh(G)
    assert abs(_core.sym_eigvalsh(G)[0] - lam[0]) <= 100 * EPS * lam[-1]


@pytest.mark.parametrize(
    "name", ["random3", "random40", "random120", "ill_conditioned", "indefinite", "huge", "tiny"]
)
def test_solve_matches_numpy(name) -> None:
    A = MATRICES[name]
    p = A.shape[0]
    rng = np.random.default_rng(p)
    b = rng.normal(size=p) * np.max(np.abs(A))
    x = _core.solve(A, b)
    ref = np.linalg.solve(A, b)
    # backward stable: small residual; forward error within cond(A) eps
    s = np.max(np.abs(A))  # residual of the scaled system (no overflow for "huge")
    res = (A / s) @ x - b / s
    assert np.linalg.norm(res) <= 50 * p * EPS * np.linalg.norm(A / s) * np.linalg.norm(x)
    cond = np.linalg.cond(A)
    assert np.linalg.norm(x - ref) <= 50 * p * EPS * cond * np.linalg.norm(ref)


def test_solve_nonsymmetric_and_pivoting() -> None:
    # a zero leading entry needs a row exchange
    A = np.array([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 1.0]])
    b = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(_core.solve(A, b), np.linalg.solve(A, b), rtol=1e-14)


@pytest.mark.parametrize(
    "A",
    [
        np.zeros((3, 3)),
        np.array([[1.0, 2.0], [1.0, 2.0]]),  # equal rows: an exact zero pivot
        np.array([[1.0, 0.0, 2.0], [3.0, 0.0, 4.0], [5.0, 0.0, 6.0]]),  # a zero column
        np.array([[1.0, 1.0], [1.0, 1.0 + 1e-17]]),  # singular to working precision
    ],
)
def test_solve_reports_singular(A) -> None:
    with pytest.raises(_core.SingularSystemError, match="singular"):
        _core.solve(A, np.ones(A.shape[0]))


def test_linalg_bad_input() -> None:
    with pytest.raises(ValueError, match="NaN"):
        _core.sym_eigvalsh(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="square"):
        _core.sym_eigvalsh(np.ones((2, 3)))
    with pytest.raises(ValueError, match="square"):
        _core.sym_eigvalsh(np.ones((0, 0)))
    with pytest.raises(ValueError, match="NaN"):
        _core.solve(np.eye(2), np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="shape"):
        _core.solve(np.eye(2), np.ones(3))


# ---------------------------------------------------------------------------------------------
# The gram aggregate
# ---------------------------------------------------------------------------------------------


def _reference_gram(X, y, x_bound, y_bound, intercept):
    """numpy: [n, p, X^T X, X^T y] of the clipped rows; a row with NaN/Inf is the zero record."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    bad = ~np.isfinite(X).all(axis=1) | ~np.isfinite(y)
    A = np.c_[X, np.ones(len(X))] if intercept else X.copy()
    A[bad] = 0.0
    m = np.maximum(np.max(np.abs(A), axis=1), 1e-300)  # no overflow for huge finite rows
    norms = m * np.linalg.norm(A / m[:, None], axis=1)
    scale = np.ones(len(A))
    big = norms > x_bound
    scale[big] = x_bound / norms[big]
    A = A * scale[:, None]
    yc = np.where(bad, 0.0, np.clip(y, -y_bound, y_bound))
    p = A.shape[1]
    return np.r_[len(X), p, (A.T @ A).ravel(), A.T @ yc]


def _split(gram):
    p = int(gram[1])
    return gram[0], gram[2 : 2 + p * p].reshape(p, p), gram[2 + p * p :]


def _data(seed, n=300, d=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.choice([0.3, 1.0, 4.0], size=(n, 1))  # some rows clipped
    y = X @ rng.normal(size=d) + rng.normal(size=n) * 2  # some labels clipped
    return X, y


@pytest.mark.parametrize("intercept", [False, True])
def test_gram_cython_matches_numpy(intercept) -> None:
    X, y = _data(3)
    X[5, 1] = np.nan
    X[9, 0] = np.inf
    y[11] = np.nan
    y[12] = -np.inf
    X[20] = [1e300, -1e300, 1e300, 0.0]  # finite but its squared norm overflows: clipped
    x_bound, y_bound = 2.5, 1.5
    gram = _core.adassp_gram(X, y, x_bound, y_bound, intercept)
    ref = _reference_gram(X, y, x_bound, y_bound, intercept)
    assert gram[0] == len(X) and gram[1] == X.shape[1] + intercept
    np.testing.assert_allclose(gram, ref, rtol=1e-12, atol=1e-9)
    # the clipping is active: the unclipped statistics differ
    assert not np.allclose(gram, _reference_gram(X, y, 1e9, 1e9, intercept))
    _, S, _ = _split(gram)
    np.testing.assert_array_equal(S, S.T)


def _rows_with_malformed_records(d=3):
    """(SQL rows, numpy X, numpy y): the malformed records' numpy rows are NaN (zero records)."""
    X, y = _data(4, n=60, d=d)
    sql_rows, xs, ys = [], [], []
    malformed = {
        3: (None, 1.0),  # NULL x
        7: ([1.0, 2.0, 3.0], None),  # NULL y
        11: ([1.0, 2.0], 1.0),  # too short
        13: ([1.0, 2.0, 3.0, 4.0], 1.0),  # too long
        17: ([1.0, float("nan"), 3.0], 1.0),  # NaN feature
        19: ([1.0, 2.0, 3.0], float("inf")),  # infinite label
        23: ([[1.0, 2.0, 3.0]], 1.0),  # 2-D array
        29: ([1.0, None, 3.0], 1.0),  # NULL element
        31: ([], 1.0),  # empty array
    }
    for i in range(len(X)):
        if i in malformed:
            sql_rows.append((i, *malformed[i]))
            xs.append(np.full(d, np.nan))
            ys.append(np.nan)
        else:
            sql_rows.append((i, [float(v) for v in X[i]], float(y[i])))
            xs.append(X[i])
            ys.append(y[i])
    return sql_rows, np.array(xs), np.array(ys)


def _sql_table(conn, rows) -> None:
    conn.execute("CREATE TABLE pts (id int, x float8[], y float8)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO pts VALUES (%s, %s::float8[], %s)", rows)


@pytest.mark.parametrize("intercept", [False, True])
def test_gram_sql_matches_cython_and_numpy(conn, scratch_schema, intercept) -> None:
    rows, X, y = _rows_with_malformed_records()
    _sql_table(conn, rows)
    x_bound, y_bound = 2.0, 1.0
    (gram,) = conn.execute(
        "SELECT dpsql.adassp_gram(x, y, %s, %s, %s, %s ORDER BY id) FROM pts",
        (x_bound, y_bound, intercept, 3),
    ).fetchone()
    gram = np.array(gram)
    cy = _core.adassp_gram(X, y, x_bound, y_bound, intercept)
    np.testing.assert_array_equal(gram, cy)  # the same C code in the same row order
    ref = _reference_gram(X, y, x_bound, y_bound, intercept)
    np.testing.assert_allclose(gram, ref, rtol=1e-12, atol=1e-12)
    assert gram[0] == len(rows)


def test_gram_parallel_partial_sums(conn, scratch_schema) -> None:
    conn.execute("CREATE TABLE pts (id int, x float8[], y float8)")
    conn.execute(
        "INSERT INTO pts SELECT i, ARRAY[sin(i), cos(3 * i) * 2, (i % 7)::float8 / 3],"
        " 3 * sin(0.37 * i) FROM generate_series(1, 40000) i"
    )
    conn.execute("ANALYZE pts")
    for setting in (
        "max_parallel_workers_per_gather = 2",
        "parallel_setup_cost = 0",
        "parallel_tuple_cost = 0",
        "min_parallel_table_scan_size = 0",
    ):
        conn.execute(f"SET {setting}")
    query = "SELECT dpsql.adassp_gram(x, y, 1.5, 2.0, true, 3) FROM pts"
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + query).fetchall())
    assert "Partial Aggregate" in plan
    (gram,) = conn.execute(query).fetchone()
    data = conn.execute("SELECT x, y FROM pts ORDER BY id").fetchall()
    X = np.array([r[0] for r in data])
    y = np.array([r[1] for r in data])
    np.testing.assert_allclose(gram, _core.adassp_gram(X, y, 1.5, 2.0, True), rtol=1e-10)
    conn.execute("RESET ALL")


def test_gram_of_no_rows_is_null(conn, scratch_schema) -> None:
    conn.execute("CREATE TABLE pts (id int, x float8[], y float8)")
    (gram,) = conn.execute("SELECT dpsql.adassp_gram(x, y, 1.0, 1.0, false, 3) FROM pts").fetchone()
    assert gram is None


# ---------------------------------------------------------------------------------------------
# Sensitivities
# ---------------------------------------------------------------------------------------------


def test_sensitivities_values(conn) -> None:
    X, Y = 2.5, 0.75
    expected = (X**2, math.sqrt(2) * X**2, 2 * X * Y)
    assert _core.adassp_sensitivities(X, Y) == pytest.approx(expected, rel=1e-15)
    row = conn.execute("SELECT * FROM dpsql.adassp_sensitivities(%s, %s)", (X, Y)).fetchone()
    assert row == pytest.approx(expected, rel=1e-15)


def _statistics(X, y, x_bound, y_bound, intercept):
    _, S, b = _split(_core.adassp_gram(X, y, x_bound, y_bound, intercept))
    return _core.sym_eigvalsh(S)[0], S, b


def _changes(D, Dp, x_bound, y_bound, intercept):
    lam, S, b = _statistics(*D, x_bound, y_bound, intercept)
    lam2, S2, b2 = _statistics(*Dp, x_bound, y_bound, intercept)
    dS = S2 - S
    upper = dS[np.triu_indices(len(dS))]
    return (
        abs(lam2 - lam),
        max(np.linalg.norm(dS), np.linalg.norm(upper)),
        np.linalg.norm(b2 - b),
    )


def _adversarial_rows(rng, d, x_bound, y_bound, x_old):
    """Replacement candidates: rows at (and beyond) the bound, the opposite row, orthogonal
    rows, the zero row, random rows, each with extreme and random labels."""
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    v = rng.normal(size=d)
    v -= (v @ u) * u
    v /= np.linalg.norm(v)
    old = x_old if np.linalg.norm(x_old) > 0 else u
    ortho = rng.normal(size=d)
    ortho -= (ortho @ old) * old / (old @ old)
    ortho /= max(np.linalg.norm(ortho), 1e-300)
    xs = [
        x_bound * u,
        -x_old,
        -x_old * 1e6,
        x_bound * ortho,
        x_bound * v,
        10 * x_bound * v,
        np.zeros(d),
        rng.normal(size=d),
        x_bound * np.eye(d)[rng.integers(d)],
    ]
    return [(x, t) for x in xs for t in (y_bound, -y_bound, 5 * y_bound, rng.uniform(-1, 1))]


@pytest.mark.parametrize("intercept", [False, True])
def test_sensitivities_hold_on_adversarial_neighbours(intercept) -> None:
    rng = np.random.default_rng(77)
    x_bound, y_bound = 1.7, 0.9
    bounds = np.array(_core.adassp_sensitivities(x_bound, y_bound))
    worst = np.zeros(3)
    d = 3
    for trial in range(60):
        n = int(rng.integers(2, 7))
        X = rng.normal(size=(n, d)) * rng.choice([0.1, 1.0, 3.0], size=(n, 1))
        if trial % 3 == 0:  # rows on the bound along the axes (small lambda_min directions)
            X = x_bound * np.eye(d)[rng.integers(d, size=n)]
        y = rng.uniform(-2, 2, size=n) * y_bound
        i = int(rng.integers(n))
        for x_new, y_new in _adversarial_rows(rng, d, x_bound, y_bound, X[i]):
            Xp, yp = X.copy(), y.copy()
            Xp[i], yp[i] = x_new, y_new
            ch = np.array(_changes((X, y), (Xp, yp), x_bound, y_bound, intercept))
            assert np.all(ch <= bounds * (1 + 1e-12)), (trial, ch, bounds)
            worst = np.maximum(worst, ch)
    assert np.all(worst <= bounds * (1 + 1e-12))
    if not intercept:
        assert np.all(worst >= 0.99 * bounds), worst / bounds


def test_sensitivities_are_attained() -> None:
    X, Y = 1.3, 0.6
    bounds = np.array(_core.adassp_sensitivities(X, Y))
    e = np.eye(3) * X
    y = np.full(5, Y)
    # lambda_min: the zero row becomes X e3 (diag(2X^2, 2X^2, 0) -> diag(2X^2, 2X^2, X^2))
    D = np.array([e[0], e[0], e[1], e[1], np.zeros(3)])
    Dp = D.copy()
    Dp[4] = e[2]
    assert _changes((D, y), (Dp, y), X, Y, False)[0] == pytest.approx(bounds[0], rel=1e-12)
    # X^T X: a row at the bound replaced by an orthogonal one
    Dp = D.copy()
    Dp[0] = e[2]
    assert _changes((D, y), (Dp, y), X, Y, False)[1] == pytest.approx(bounds[1], rel=1e-12)
    # X^T y: x -> -x at the bound, same label Y
    Dp = D.copy()
    Dp[0] = -e[0]
    assert _changes((D, y), (Dp, y), X, Y, False)[2] == pytest.approx(bounds[2], rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The release: noiseless values, and the law of the noise
# ---------------------------------------------------------------------------------------------


def _ols_gram(seed, n=400, d=4, intercept=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + 0.5 + rng.normal(size=n) * 0.3
    return X, y, _core.adassp_gram(X, y, 1e6, 1e6, intercept)


@pytest.mark.parametrize("intercept", [False, True])
def test_noiseless_release_is_ols(conn, intercept) -> None:
    X, y, gram = _ols_gram(5, intercept=intercept)
    A = np.c_[X, np.ones(len(X))] if intercept else X
    ols = np.linalg.lstsq(A, y, rcond=None)[0]
    w, ridge, lam = _core.adassp_release(gram, 0, 0, 0, 0, 0, seed=1)
    np.testing.assert_allclose(w, ols, rtol=0, atol=1e-9)
    assert ridge == 0.0
    assert lam == pytest.approx(np.linalg.eigvalsh(A.T @ A)[0], rel=1e-12)
    row = conn.execute(
        "SELECT * FROM dpsql_internal._adassp_release(%s, 0, 0, 0, 0, 0)", (list(gram),)
    ).fetchone()
    np.testing.assert_allclose(row[0], ols, rtol=0, atol=1e-9)
    assert row[1] == 0.0 and row[2] == pytest.approx(lam, rel=1e-12)


def test_ridge_and_shift_formulas() -> None:
    _, _, gram = _ols_gram(6)
    _, S, b = _split(gram)
    lam_min = np.linalg.eigvalsh(S)[0]
    # lambda_tilde = lambda_min - shift; ridge = ridge_factor - lambda_tilde
    w, ridge, lam = _core.adassp_release(gram, 0, 0, 0, 10.0, lam_min + 5.0)
    assert lam == pytest.approx(lam_min - 10.0, rel=1e-12)
    assert ridge == pytest.approx(15.0, rel=1e-9)
    np.testing.assert_allclose(w, np.linalg.solve(S + ridge * np.eye(4), b), rtol=1e-12)
    # shift above lambda_min: lambda_tilde = 0, ridge = ridge_factor
    w, ridge, lam = _core.adassp_release(gram, 0, 0, 0, 2 * lam_min, 7.0)
    assert lam == 0.0 and ridge == 7.0
    # ridge_factor below lambda_tilde: no ridge
    _, ridge, _ = _core.adassp_release(gram, 0, 0, 0, 0, lam_min / 2)
    assert ridge == 0.0


def _gram_of(S, b, n=100):
    return np.r_[n, len(b), np.asarray(S, dtype=float).ravel(), b]


N_RELEASES = 400


def test_noise_on_lambda_min_is_standard_normal_times_sigma() -> None:
    p = 3
    gram = _gram_of(100 * np.eye(p), np.array([1.0, 2.0, 3.0]))
    sigma, shift = 2.0, 0.5
    Z = np.empty(N_RELEASES)
    for s in range(N_RELEASES):
        w, ridge, lam = _core.adassp_release(gram, sigma, 0, 0, shift, 300.0, seed=s)
        Z[s] = (lam - 100 + shift) / sigma
        assert ridge == pytest.approx(300.0 - lam, rel=1e-13)
        np.testing.assert_allclose(w, np.array([1.0, 2.0, 3.0]) / (100 + ridge), rtol=1e-12)
    assert _ks_normal(Z) > ALPHA


def test_noise_on_xty_is_standard_normal_times_sigma() -> None:
    _, _, gram = _ols_gram(8)
    _, S, b = _split(gram)
    sigma = 3.0
    z = np.empty((N_RELEASES, 4))
    for s in range(N_RELEASES):
        w, ridge, _ = _core.adassp_release(gram, 0, 0, sigma, 0, 0, seed=1000 + s)
        assert ridge == 0.0
        z[s] = (S @ w - b) / sigma
    assert _ks_normal(z.ravel()) > ALPHA
    assert _uncorrelated(z) > ALPHA


def _noise_matrix(gram, sigma_xx, seed):
    """E read back from p releases with the same seed and X^T y = e_k: they give the columns
    of (X^T X + sigma_xx E)^{-1}."""
    n, S, _ = _split(gram)
    p = len(S)
    cols = []
    for k in range(p):
        g = _gram_of(S, np.eye(p)[k], n)
        cols.append(_core.adassp_release(g, 0, sigma_xx, 0, 0, 0, seed=seed)[0])
    return (np.linalg.inv(np.array(cols).T) - S) / sigma_xx


def test_noise_on_xtx_is_symmetric_standard_normal_times_sigma() -> None:
    p = 3
    S = 10 * np.eye(p) + np.ones((p, p))
    gram = _gram_of(S, np.zeros(p))
    sigma = 0.5
    iu = np.triu_indices(p, 1)
    diag, off, upper = [], [], []
    for s in range(N_RELEASES):
        E = _noise_matrix(gram, sigma, seed=5000 + s)
        np.testing.assert_allclose(E, E.T, rtol=0, atol=1e-9)
        diag.append(np.diag(E))
        off.append(E[iu])
        upper.append(E[np.triu_indices(p)])
    assert _ks_normal(np.ravel(diag)) > ALPHA  # variance 1 on the diagonal
    assert _ks_normal(np.ravel(off)) > ALPHA  # and off it (not (G + G^T)/sqrt 2)
    assert _uncorrelated(np.array(upper)) > ALPHA  # independent entries


def test_noise_sources_are_independent() -> None:
    # Z (lambda_min) and z (X^T y) of the same releases are uncorrelated
    _, _, gram = _ols_gram(9, d=3)
    _, S, b = _split(gram)
    lam_min = np.linalg.eigvalsh(S)[0]
    released: list[np.ndarray] = []
    for s in range(N_RELEASES):
        w, _, lam = _core.adassp_release(gram, 1.0, 0, 1.0, 0, 0, seed=9000 + s)
        released.append(np.r_[lam - lam_min, S @ w - b])
    rows = np.array(released)
    assert _ks_normal(rows[:, 0]) > ALPHA
    assert _uncorrelated(rows) > ALPHA


def test_sql_release_equals_cython_release(conn) -> None:
    _, _, gram = _ols_gram(10)
    args = (1.0, 0.5, 2.0, 0.3, 40.0)
    for seed in (1, 2, 12345):
        w, ridge, lam = _core.adassp_release(gram, *args, seed=seed)
        row = conn.execute(
            "SELECT * FROM dpsql_internal._adassp_release(%s, %s, %s, %s, %s, %s, %s)",
            (list(gram), *args, seed),
        ).fetchone()
        np.testing.assert_array_equal(row[0], w)
        assert (row[1], row[2]) == (ridge, lam)


def test_sql_release_noise_law(conn) -> None:
    # lambda_tilde = 100 + 2 Z through the server, for 300 seeds in one query
    gram = _gram_of(100 * np.eye(2), np.ones(2))
    lams = conn.execute(
        "SELECT (dpsql_internal._adassp_release(%s, 2, 0, 0, 0, 0, s)).lambda_min_noisy"
        " FROM generate_series(1, 300) s",
        (list(gram),),
    ).fetchall()
    assert _ks_normal((np.array([r[0] for r in lams]) - 100) / 2) > ALPHA


def test_unseeded_releases_differ(conn) -> None:
    _, _, gram = _ols_gram(11)
    a = _core.adassp_release(gram, 1, 1, 1, 0, 0)[0]
    b = _core.adassp_release(gram, 1, 1, 1, 0, 0)[0]
    assert not np.array_equal(a, b)
    q = "SELECT (dpsql_internal._adassp_release(%s, 1, 1, 1, 0, 0)).weights"
    assert conn.execute(q, (list(gram),)).fetchone() != conn.execute(q, (list(gram),)).fetchone()


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors, no crash
# ---------------------------------------------------------------------------------------------

BAD_BOUNDS = [
    (0.0, 1.0, False),
    (-1.0, 1.0, False),
    (float("nan"), 1.0, False),
    (float("inf"), 1.0, False),
    (1.0, 0.0, False),
    (1.0, -2.0, False),
    (1.0, float("nan"), False),
    (0.5, 1.0, True),  # the intercept's 1 does not fit in the bound
]


@pytest.mark.parametrize("x_bound, y_bound, intercept", BAD_BOUNDS)
def test_gram_bad_bounds(conn, scratch_schema, x_bound, y_bound, intercept) -> None:
    X, y = _data(12, n=5, d=2)
    with pytest.raises(ValueError, match="x_bound"):
        _core.adassp_gram(X, y, x_bound, y_bound, intercept)
    _sql_table(conn, [(0, [1.0, 2.0], 1.0)])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="adassp_gram"):
        conn.execute(
            "SELECT dpsql.adassp_gram(x, y, %s, %s, %s, 2) FROM pts", (x_bound, y_bound, intercept)
        )
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_gram_bad_arguments(conn, scratch_schema) -> None:
    _sql_table(conn, [(0, [1.0, 2.0], 1.0), (1, [1.0, 2.0], 2.0)])
    for dim in (0, -1, 5000):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT dpsql.adassp_gram(x, y, 1, 1, false, %s) FROM pts", (dim,))
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        conn.execute("SELECT dpsql.adassp_gram(x, y, NULL, 1, false, 2) FROM pts")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="same for every row"):
        conn.execute("SELECT dpsql.adassp_gram(x, y, 1 + id, 1, false, 2) FROM pts")
    with pytest.raises(psycopg.Error, match="outside an aggregate"):
        conn.execute(
            "SELECT dpsql_internal._adassp_gram_transition(NULL, '{1,2}', 1, 1, 1, false, 2)"
        )
    with pytest.raises(psycopg.Error, match="AdaSSP gram state"):
        conn.execute("SELECT dpsql_internal._adassp_gram_final('{4433, 1, 2, 2, 1, 1, 0}')")
    with pytest.raises(ValueError, match="rows"):
        _core.adassp_gram(np.ones((3, 2)), np.ones(4), 1.0, 1.0)
    assert conn.execute("SELECT 1").fetchone() == (1,)


def _corrupt_grams():
    _, _, gram = _ols_gram(13, d=2)
    g = list(gram)
    asym = g.copy()
    asym[3] += 1e-9  # X^T X[0, 1] != X^T X[1, 0]
    negdiag = g.copy()
    negdiag[2] = -1.0
    nan = g.copy()
    nan[7] = float("nan")
    return {
        "empty": [],
        "short": g[:-1],
        "long": [*g, 0.0],
        "p_fraction": [g[0], 2.5, *g[2:]],
        "p_zero": [g[0], 0.0],
        "p_huge": [g[0], 1e9, *g[2:]],
        "n_negative": [-1.0, *g[1:]],
        "n_fraction": [0.5, *g[1:]],
        "nan": nan,
        "inf_n": [float("inf"), *g[1:]],
        "asymmetric": asym,
        "negative_diagonal": negdiag,
    }


@pytest.mark.parametrize("name", sorted(_corrupt_grams()))
def test_release_corrupt_gram(conn, name) -> None:
    gram = _corrupt_grams()[name]
    with pytest.raises(ValueError, match="malformed AdaSSP gram"):
        _core.adassp_release(gram, 1, 1, 1, 0, 0, seed=1)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="malformed AdaSSP gram"):
        conn.execute(
            "SELECT * FROM dpsql_internal._adassp_release(%s::float8[], 1, 1, 1, 0, 0, 1)", (gram,)
        )
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_release_gram_not_a_vector(conn) -> None:
    with pytest.raises(psycopg.Error, match="one-dimensional"):
        conn.execute(
            "SELECT * FROM dpsql_internal._adassp_release('{{1,1},{1,1}}', 1, 1, 1, 0, 0, 1)"
        )
    with pytest.raises(psycopg.Error, match="NULL"):
        conn.execute(
            "SELECT * FROM dpsql_internal._adassp_release('{1,1,NULL,1}', 1, 1, 1, 0, 0, 1)"
        )
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        conn.execute("SELECT * FROM dpsql_internal._adassp_release(NULL, 1, 1, 1, 0, 0, 1)")
    assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("position", range(5))
@pytest.mark.parametrize("value", [float("nan"), -1.0, float("inf")])
def test_release_bad_noise_parameters(conn, position, value) -> None:
    _, _, gram = _ols_gram(14, d=2)
    args = [1.0, 1.0, 1.0, 0.0, 0.0]
    args[position] = value
    with pytest.raises(ValueError, match="noise parameters"):
        _core.adassp_release(gram, *args, seed=1)  # type: ignore[misc, arg-type]  # 5 floats
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="noise parameters"):
        conn.execute(
            "SELECT * FROM dpsql_internal._adassp_release(%s, %s, %s, %s, %s, %s, 1)",
            (list(gram), *args),
        )
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_release_singular_system(conn) -> None:
    gram = _gram_of(np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(_core.SingularSystemError, match="nothing released"):
        _core.adassp_release(gram, 0, 0, 0, 0, 0, seed=1)
    with pytest.raises(psycopg.errors.FloatingPointException, match="singular"):
        conn.execute(
            "SELECT * FROM dpsql_internal._adassp_release(%s, 0, 0, 0, 0, 0, 1)", (list(gram),)
        )
    assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("x_bound, y_bound", [(0, 1), (1, 0), (-1, 1), (float("nan"), 1)])
def test_sensitivities_bad_bounds(conn, x_bound, y_bound) -> None:
    with pytest.raises(ValueError, match="x_bound"):
        _core.adassp_sensitivities(x_bound, y_bound)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="x_bound"):
        conn.execute("SELECT * FROM dpsql.adassp_sensitivities(%s, %s)", (x_bound, y_bound))
