"""DP-GD's private preconditioner (issue 10): the released second-moment matrix's noise and
its calibration, the rho it takes, the whitening and the mapped-back iterates and intervals,
and what it buys on an ill-conditioned design."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from scipy import stats

from tests.pg_helpers import load


def _register(conn, schema, X, y, row_bound) -> str:
    source = load(conn, schema, f"t_{uuid.uuid4().hex[:6]}", X, y)
    name = f"pre_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 1e6, 0.5, label_bound => 10,"
        " row_bound => %s, name => %s)",
        (source, row_bound, name),
    )
    return name


def _train(conn, name, precondition: bool, **kw) -> dict:
    args = {"epsilon": 1.0, "delta": 1e-6, "options": Jsonb({"precondition": precondition}), **kw}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(n)s, NULL, NULL, 'linear', privacy => 'dpgd', {names})",
        {"n": name, **args},
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()


def test_second_moment_noise_is_calibrated(conn, scratch_schema) -> None:
    """All-zero rows, no intercept: the released matrix is E / n, E symmetric with N(0, s^2)
    entries, s = sqrt(2) x_bound^2 / sqrt(2 rho / 10). 10 seeded runs x 15 upper-triangle
    entries: chi-square test of the scale at alpha = 1e-3 (false-failure rate 1e-3,
    deterministic under the seeds); the same draws are rejected at a std off by 20%."""
    n, d, xb = 500, 8, 2.0
    name = _register(conn, scratch_schema, np.zeros((n, d)), np.zeros(n), xb)
    (rho,) = conn.execute("SELECT dpsql.zcdp_rho(1, 1e-6)").fetchone()
    s = np.sqrt(2) * xb**2 / np.sqrt(2 * rho / 10)
    draws: list[float] = []
    for seed in range(20):
        pre = _train(conn, name, True, noise_seed=seed, steps=60, intercept=False)
        pre = pre["params"]["privacy"]
        pre = pre["preconditioner"]
        assert pre["noise_std"] == pytest.approx(s)
        g = np.asarray(pre["second_moment"]).reshape(d, d)
        assert np.array_equal(g, g.T)
        draws.extend(g[np.triu_indices(d)] * n / s)
    z = np.asarray(draws)

    def pvalue(v: np.ndarray) -> float:
        q = stats.chi2.cdf(float(np.sum(v**2)), df=len(v))
        return 2 * min(q, 1 - q)

    assert pvalue(z) > 1e-3
    assert pvalue(z / 1.2) < 1e-3 and pvalue(z * 1.2) < 1e-3


def test_rho_is_split_and_charged_once(conn, scratch_schema) -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(2000, 3))
    name = _register(conn, scratch_schema, X, X @ [1.0, 0.5, -0.5], 2.0)
    with_pre = _train(conn, name, True, noise_seed=1, steps=60)["params"]["privacy"]
    without = _train(conn, name, False, noise_seed=1, steps=60)["params"]["privacy"]
    # the steps keep rho (1 - 1/50 - 1/10 - 1/10) instead of rho (1 - 1/50 - 1/10) (the clip
    # quantile takes its tenth in both): their noise per unit of clip norm grows by
    # sqrt(0.88 / 0.78)
    ratio = with_pre["noise_multiplier"] / without["noise_multiplier"]
    assert ratio == pytest.approx(np.sqrt(0.88 / 0.78), rel=1e-9)
    for priv in (with_pre, without):
        assert priv["noise_std"] == pytest.approx(priv["noise_multiplier"] * priv["clip_norm"])
    charged = conn.execute(
        "SELECT epsilon, delta FROM dpsql.ledger_entries l JOIN dpsql.datasets d USING (dataset_id)"
        " WHERE d.name = %s",
        (name,),
    ).fetchall()
    assert charged == [(1.0, 1e-6), (1.0, 1e-6)]


def test_whitening_helps_an_ill_conditioned_design(conn, scratch_schema) -> None:
    """Two correlated features (X^T X / n with eigenvalues about 1 and 0.04) and an offset
    mean: plain DP-GD moves slowly along the small direction; the whitened run reaches the OLS
    solution, and its intervals (mapped back) contain it. Seeded: deterministic."""
    rng = np.random.default_rng(7)
    n = 50000
    u = rng.normal(size=n)
    X = np.column_stack([u + 0.2 * rng.normal(size=n), u - 0.2 * rng.normal(size=n)]) * 0.7 + 0.5
    y = X @ np.array([1.5, -0.5]) + 0.2 + 0.1 * rng.normal(size=n)
    name = _register(conn, scratch_schema, X, y, 4.0)
    A = np.column_stack([X, np.ones(n)])
    ols = np.linalg.lstsq(A, y, rcond=None)[0]
    errors = {}
    for pre in (False, True):
        m = _train(conn, name, pre, noise_seed=3, intercept=True, epsilon=4.0)
        w = np.append(m["coef"], m["intercept"])
        errors[pre] = np.linalg.norm(w - ols)
        ci = conn.execute(
            "SELECT lower, upper FROM dpsql.confint(%s, 0.05) ORDER BY coef_index", (m["model_id"],)
        ).fetchall()
        assert len(ci) == 3
        if pre:
            lo, hi = np.array(ci).T
            assert np.all((lo <= ols) & (ols <= hi)), (lo, ols, hi)
            # the estimate is the mean of the mapped draws
            (est,) = conn.execute(
                "SELECT array_agg(estimate ORDER BY coef_index) FROM dpsql.confint(%s, 0.05)",
                (m["model_id"],),
            ).fetchone()
            np.testing.assert_allclose(est, w, rtol=1e-9)
    assert errors[True] < errors[False] / 3, errors


def test_preconditioner_needs_a_row_bound(conn, scratch_schema) -> None:
    source = load(conn, scratch_schema, "nobound", np.zeros((100, 2)), np.zeros(100))
    name = f"nb_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 10, 0.5, label_bound => 1, name => %s)",
        (source, name),
    )
    with pytest.raises(Exception, match="needs a public bound"):
        _train(conn, name, True)


def test_small_row_bound_with_an_intercept(conn, scratch_schema) -> None:
    """||x|| <= 0.5 and an intercept: (x, 1) has norm <= sqrt(1.25), the bound the noisy
    matrix's rows are clipped to and its noise is calibrated with."""
    rng = np.random.default_rng(2)
    X = rng.uniform(-0.3, 0.3, size=(3000, 2))
    name = _register(conn, scratch_schema, X, X @ [1.0, -1.0] + 0.5, 0.5)
    m = _train(conn, name, True, noise_seed=4, intercept=True, steps=60)
    pre = m["params"]["privacy"]["preconditioner"]
    (rho,) = conn.execute("SELECT dpsql.zcdp_rho(1, 1e-6)").fetchone()
    assert pre["noise_std"] == pytest.approx(np.sqrt(2) * 1.25 / np.sqrt(2 * rho / 10))
    assert len(m["coef"]) == 2 and len(m["intercept"]) == 1
