"""Objective perturbation and output perturbation (Thakurta, "Private Optimization", §6.2.2;
Chaudhuri et al. 2011): calibration test vectors, the noise actually used by the release, the
coupling that proves privacy on adversarial neighbours, the certified solver, refusals and
releases."""

from __future__ import annotations

import math
import uuid
import warnings

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from scipy import stats

from tests.pg_helpers import (
    binary_dataset,
    leftovers,
    one_hot_design,
    register,
    regression_dataset,
    release,
)


def _register(conn, schema, X, y, **kw) -> tuple[int, str]:
    return register(conn, schema, X, y, prefix="op", **kw)


@pytest.fixture
def binary(conn, scratch_schema):
    return binary_dataset(conn, scratch_schema)


@pytest.fixture
def regression(conn, scratch_schema):
    return regression_dataset(conn, scratch_schema)


def _train(conn, source, privacy="objective_perturbation", model="logistic", **kw):
    # (written for models without an intercept, the default before issue 25)
    return release(
        conn, source, privacy=privacy, model=model, **{"epsilon": 1.0, "intercept": False, **kw}
    )


def _calibrate(conn, epsilon, delta, p=3, lipschitz=1.0, curvature=0.25, n=1000):
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM dpsql_internal._objpert_calibrate(%s, %s, %s, %s, %s, %s)",
            (epsilon, delta, p, lipschitz, curvature, n),
        ).fetchone()


# ------------------------------------------------------------------------- calibration


@pytest.mark.parametrize(("eps", "expected"), [(1.0, 0.635374), (0.1, 5.126042), (2.0, 0.395494)])
def test_min_regularizer_matches_the_spec_vectors(conn, eps, expected) -> None:
    # Claim 6.8: Delta_priv(r = 1, lambda_max = 1/4) at eps_det = eps / 2; our
    # eps_det is half of 99% of epsilon, so pass epsilon / 0.99.
    cal = _calibrate(conn, eps / 0.99, 0.0)
    assert cal["eps_det"] == pytest.approx(eps / 2)
    assert cal["min_reg"] == pytest.approx(expected, abs=1e-6)


def test_gamma_and_gaussian_scales(conn) -> None:
    cal = _calibrate(conn, 1.0, 0.0, p=10, lipschitz=3.0)
    # replace-one: -grad J moves by <= 2L, density exp(-eps_noise ||b|| / (2L))
    assert cal["noise_scale"] == pytest.approx(2 * 3.0 / cal["eps_noise"])
    assert cal["noise_sq_norm"] == pytest.approx(10 * 11 * cal["noise_scale"] ** 2)
    gauss = _calibrate(conn, 1.0, 1e-5, p=10, lipschitz=3.0)
    z = stats.norm.isf(gauss["delta_noise"] / 4)
    eps = gauss["eps_noise"]
    assert gauss["noise_scale"] == pytest.approx(3.0 * (z + math.sqrt(z * z + 2 * eps)) / eps)
    # The privacy loss of the noise term, (2 <b, v> + ||v||^2) / (2 sigma^2) with
    # v = c x - c' x' (|c| ||x||, |c'| ||x'|| <= L), exceeds eps only when |<b, u>| or
    # |<b, u'>| exceeds t; those events have probability <= 4 Phi(-t / sigma) = delta.
    sigma, L = gauss["noise_scale"], 3.0
    t = (eps * sigma**2 - 2 * L**2) / (2 * L)
    assert 4 * stats.norm.sf(t / sigma) == pytest.approx(gauss["delta_noise"], rel=1e-6)
    assert gauss["delta_noise"] + gauss["delta_extra"] == pytest.approx(1e-5)
    assert gauss["eps_noise"] + gauss["eps_det"] + gauss["eps_extra"] == pytest.approx(1.0)


def test_gamma_noise_norm_and_gaussian_std(conn) -> None:
    """The sampler the fit uses: fails without noise or at 10% mis-scale. 3000 draws: the
    mean of Gamma(p, s) norms has sd s sqrt(p) / sqrt(3000); 4.5 sd bands (false failure
    < 1e-5), and 10% mis-scale is 13 sd away."""
    p, s = 6, 2.0
    rows = conn.execute(
        "SELECT (dpsql_internal._perturb(%s, %s, 1, 0, seed, 1)).weights"
        "  FROM generate_series(1, 3000) seed",
        ([0.0] * p, s),
    ).fetchall()
    norms = np.linalg.norm(np.array([r[0] for r in rows]), axis=1)
    band = 4.5 * s * math.sqrt(p / 3000)
    assert abs(np.mean(norms) - p * s) < band
    assert abs(np.mean(norms) - 1.1 * p * s) > band
    draws = np.concatenate(
        [
            conn.execute(
                "SELECT dpsql_internal._add_gaussian(%s, 1.5, %s, 1)", ([0.0] * 50, seed)
            ).fetchone()[0]
            for seed in range(40)
        ]
    )
    # 2000 normals: the sample sd is within 3% of sigma with prob. > 1 - 1e-5
    assert abs(np.std(draws) / 1.5 - 1) < 0.03
    assert abs(np.std(draws) / 1.65 - 1) > 0.03


# ------------------------------------------------------------------ the release's noise


def _logistic_grad(theta, X, y, x_bound=1.0):
    norms = np.linalg.norm(X, axis=1)
    Xc = X * np.minimum(1, x_bound / np.maximum(norms, 1e-300))[:, None]
    ypm = 2 * y - 1
    m = ypm * (Xc @ theta)
    return -(Xc * (ypm / (1 + np.exp(m)))[:, None]).sum(0)


def test_release_is_the_minimiser_for_the_server_noise(conn, binary) -> None:
    """KKT: grad L(theta) + reg theta + b = 0 for the b the server drew with the
    same noise seed; the extra certificate noise is far below the tolerance used here."""
    ds, source, X, y = binary
    # (the radius of the default before issue 42: a well-conditioned objective, whose extra
    # certificate noise stays far below the tolerance checked here)
    m = _train(conn, source, noise_seed=3, options={"radius": 10})
    info = m["params"]["privacy"]
    assert info["noise"] == "gamma-norm"
    # the solver's scan count and certificate depend on the rows: not released (issue 24)
    assert "certified" not in info and "scans" not in info
    reg, L = info["regularizer"], info["lipschitz"]
    (b,) = conn.execute(
        "SELECT (dpsql_internal._perturb(%s, %s, %s, 0, 3, 1)).weights",
        ([0.0] * 4, 2 * L, info["epsilon_split"]["noise"]),
    ).fetchone()
    b = np.asarray(b)
    theta = np.asarray(m["weights"])
    # the training table is the registered rows, order aside: the gradient is order-free
    kkt = _logistic_grad(theta, X, y) + reg * theta + b
    assert np.linalg.norm(kkt) < 1e-3 * np.linalg.norm(b)
    # without the noise the KKT residual would be ||b|| (the noise is in the release)
    assert np.linalg.norm(_logistic_grad(theta, X, y) + reg * theta) > 0.5 * np.linalg.norm(b)


def _solve(conn, table, plan, b):
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            f"SELECT * FROM dpsql_internal._erm_solve('{table}',"
            " jsonb_populate_record(NULL::dpsql_internal.erm_plan, %s), %s)",
            (Jsonb(plan), b),
        ).fetchone()


def _table(conn, schema, X, y):
    name = f"{schema}.tt_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE TABLE {name} (rid bigint, x float8[], y float8)")
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {name} VALUES (%s, %s, %s)",
            [(i + 1, list(map(float, X[i])), float(y[i])) for i in range(len(y))],
        )
    return name


@pytest.mark.parametrize("loss", [1, 2, 3])
def test_coupling_on_adversarial_neighbours(conn, scratch_schema, loss) -> None:
    """The privacy proof's coupling (Theorem 6.7), replace-one: D' swaps one row for an extreme
    one (norm 1e6, flipped label). With b' = b + grad l(theta; d) - grad l(theta; d'), D' gives
    the same minimiser theta, and ||b - b'|| <= 2L: the noise densities at b and b' are
    within e^{eps_noise}."""
    rng = np.random.default_rng(loss)
    X = rng.normal(size=(300, 3)) / 2
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=300)) if loss < 3 else X[:, 0]
    X2, y2 = X.copy(), y.copy()
    X2[0] = [1e6, -1e6, 1e6]
    y2[0] = -y[0] if loss < 3 else -2.0
    x_bound = 1.0
    plan = {
        "loss": loss,
        "param": 0.1 if loss == 2 else 1.0,
        "y_bound": 2.0,
        "x_bound": x_bound,
        "intercept": True,
        "p": 4,
        "regularizer": 5.0,
        "tolerance": 1e-10,
        "newton_steps": 12,
    }
    (L,) = conn.execute(
        "SELECT lipschitz FROM dpsql_internal._glm_constants(%s, %s, 2, %s, true, 4)",
        (loss, plan["param"], x_bound),
    ).fetchone()
    b = list(rng.normal(size=4) * 3)
    first = _solve(conn, _table(conn, scratch_schema, X, y), plan, b)
    assert first["certified"]
    theta = np.asarray(first["theta"])

    def grad(x, yy):
        x = np.asarray(x, float)
        x = x * min(1.0, x_bound / np.linalg.norm(x))
        xt = np.append(x, 1.0)
        z = xt @ theta
        if loss == 1:
            return -yy / (1 + np.exp(yy * z)) * xt
        if loss == 2:
            m = yy * z
            d = 0 if m > 1.1 else (-yy if m < 0.9 else -yy * (1.1 - m) / 0.2)
            return d * xt
        return float(np.clip(z - np.clip(yy, -2, 2), -1.0, 1.0)) * xt

    b2 = np.asarray(b) + grad(X[0], y[0]) - grad(X2[0], y2[0])
    assert np.linalg.norm(b2 - np.asarray(b)) <= 2 * L + 1e-9
    second = _solve(conn, _table(conn, scratch_schema, X2, y2), plan, list(b2))
    assert np.allclose(second["theta"], theta, atol=1e-8)


def test_output_perturbation_sensitivity_agrees_with_the_bolt_on(conn, scratch_schema) -> None:
    """A10's 2L / (n lambda) for the exact minimiser is the bolt-on's strongly convex
    sensitivity 2L / (lambda m); and it holds on adversarial neighbours."""
    n, lam, L = 1000, 0.01, 1.0
    (ours,) = conn.execute(
        "SELECT dpsql_internal._output_perturbation_sensitivity(%s, %s, 0)", (L, n * lam)
    ).fetchone()
    (bolton,) = conn.execute(
        "SELECT dpsql.bolton_sensitivity('decreasing', 0, 0, %s, %s, %s, %s, 1, 5)",
        (L, 1 + lam, lam, n),
    ).fetchone()
    assert ours == pytest.approx(bolton) == pytest.approx(2 * L / (n * lam))
    rng = np.random.default_rng(5)
    X = rng.normal(size=(n, 3)) / 2
    y = np.sign(X[:, 1] + 0.5 * rng.normal(size=n))
    X2, y2 = X.copy(), y.copy()
    X2[7], y2[7] = [-1e6, 1e6, 0.0], -y[7]
    plan = {
        "loss": 1,
        "param": 0,
        "y_bound": 1.0,
        "x_bound": 1.0,
        "intercept": False,
        "p": 3,
        "regularizer": n * lam,
        "tolerance": 1e-10,
        "newton_steps": 12,
    }
    a = _solve(conn, _table(conn, scratch_schema, X, y), plan, None)
    c = _solve(conn, _table(conn, scratch_schema, X2, y2), plan, None)
    gap = np.linalg.norm(np.asarray(a["theta"]) - np.asarray(c["theta"]))
    assert 0 < gap <= ours


# ------------------------------------------------------- the fixed-work solver (issue 30)


def _solver_plan(loss, p, n=None, **kw):
    plan = {
        "loss": loss,
        "param": 0.1 if loss == 2 else (1.0 if loss == 3 else 0),
        "y_bound": 2.0,
        "x_bound": 1.0,
        "intercept": True,
        "p": p,
        "regularizer": 3.0,
        "tolerance": 1e-9,
    }
    if n is not None:
        plan["rows"] = n  # the in-memory path (when the rows fit in dpsql.sampling_memory)
    return {**plan, **kw}


def _solve_logged(conn, table, plan, b, positive=None):
    """_erm_solve's result and its DEBUG messages (which path, S, evaluations: public)."""
    notes: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        notes.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    conn.execute("SET client_min_messages = debug1")
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                f"SELECT * FROM dpsql_internal._erm_solve('{table}',"
                " jsonb_populate_record(NULL::dpsql_internal.erm_plan, %s), %s, %s)",
                (Jsonb(plan), b, positive),
            ).fetchone()
    finally:
        conn.execute("RESET client_min_messages")
        conn.remove_notice_handler(keep)
    return row, [m for m in notes if "_erm_solve" in m]


def _awkward_rows(rng, n, loss, classes=2):
    """Rows with every kind of zero record: NULL x, NaN, a wrong length, a bad label."""
    X = rng.normal(size=(n, 3)) / 2
    if loss == 3:
        y = X @ [1.0, -0.5, 0.2] + 0.1 * rng.normal(size=n)
    elif classes > 2:
        y = rng.integers(0, classes, size=n).astype(float)
    else:
        y = np.sign(X[:, 0] + 0.3 * rng.normal(size=n))
    rows = [(list(map(float, X[i])), float(y[i])) for i in range(n)]
    rows[3] = (None, rows[3][1])
    rows[5] = ([float("nan"), 0.0, 1.0], rows[5][1])
    rows[7] = ([1.0, 2.0], rows[7][1])
    rows[9] = (rows[9][0], 0.5 if loss < 3 and classes == 2 else None)
    rows[11] = ([5.0, -7.0, 3.0], rows[11][1])  # clipped to x_bound
    return rows


def _raw_table(conn, schema, rows):
    name = f"{schema}.tr_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE TABLE {name} (x float8[], y float8)")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {name} VALUES (%s, %s)", rows)
    return name


@pytest.mark.parametrize(("loss", "classes"), [(1, 2), (2, 2), (3, 2), (1, 3)])
def test_in_memory_solver_is_the_scanned_solver(conn, scratch_schema, loss, classes) -> None:
    """One scan keeping the rows (and solving in its final function) gives the model of the
    2 S + 1 scans, bit for bit: the same clipping, zero records and one-vs-rest labels, the
    same sums in the same order. Each path says it ran (DEBUG1) and does 2 S + 1 evaluations."""
    rng = np.random.default_rng(10 + loss)
    rows = _awkward_rows(rng, 400, loss, classes)
    table = _raw_table(conn, scratch_schema, rows)
    b = list(rng.normal(size=4) * 2)
    positive = 1.0 if classes > 2 else None
    kept, kept_notes = _solve_logged(conn, table, _solver_plan(loss, 4, 400), b, positive)
    scanned, scanned_notes = _solve_logged(conn, table, _solver_plan(loss, 4), b, positive)
    steps = 24 if loss == 2 else 16
    assert kept == scanned
    assert kept["certified"] and kept["scans"] == 2 * steps + 1
    assert any("kept in memory" in m for m in kept_notes)
    assert any("by scans" in m for m in scanned_notes)
    # dpsql.sampling_memory too small: the scanned path, the same model
    conn.execute("SET dpsql.sampling_memory = 0")
    try:
        small, small_notes = _solve_logged(conn, table, _solver_plan(loss, 4, 400), b, positive)
    finally:
        conn.execute("RESET dpsql.sampling_memory")
    assert small == kept and any("by scans" in m for m in small_notes)


def test_solver_work_does_not_depend_on_the_rows(conn, scratch_schema) -> None:
    """Replace-one neighbours on which Newton certifies after different numbers of steps (6
    against 7 on this Huber SVM: the old solver stopped there, and its scan count, hence the
    release's time, told them apart) do the same work: S steps and 2 S + 1 evaluations over
    the rows, the same messages. A certified iterate is kept, so the step that certified is
    the smallest S whose iterate equals the default S's."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3)) / 2
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=300))
    X2, y2 = X.copy(), y.copy()
    X2[0], y2[0] = [1e6, -1e6, 1e6], -y[0]
    b = list(rng.normal(size=4) * 5)
    certified_at = []
    for XX, yy in ((X, y), (X2, y2)):
        rows = [(list(map(float, a)), float(c)) for a, c in zip(XX, yy, strict=True)]
        table = _raw_table(conn, scratch_schema, rows)
        plan = _solver_plan(2, 4, 300, regularizer=3.0)
        full, notes = _solve_logged(conn, table, plan, b)
        assert full["certified"] and full["scans"] == 49
        assert notes == [
            "dpsql: _erm_solve: 24 Newton steps over the rows kept in memory, 49 evaluations"
        ]
        certified_at.append(
            next(
                s
                for s in range(1, 25)
                if _solve(conn, table, {**plan, "newton_steps": s}, b)["theta"] == full["theta"]
            )
        )
    assert certified_at[0] != certified_at[1]


@pytest.mark.parametrize(
    ("plan_change", "message"),
    [
        ({"newton_steps": 0}, "newton_steps"),
        ({"newton_steps": 101}, "newton_steps"),
        ({"regularizer": 0.0}, "reg"),
        ({"loss": 7}, "loss"),
    ],
)
def test_solver_refuses_bad_settings(conn, scratch_schema, plan_change, message) -> None:
    rows = _awkward_rows(np.random.default_rng(1), 50, 1)
    table = _raw_table(conn, scratch_schema, rows)
    for n in (50, None):
        with pytest.raises(psycopg.Error, match=message):
            _solve(conn, table, {**_solver_plan(1, 4, n), **plan_change}, [0.0] * 4)


def test_solver_c_functions_check_their_inputs(conn) -> None:
    """Called by hand with nonsense (a superuser can): clear errors, no crash."""
    calls = [
        (
            "SELECT dpsql_internal._glm_line_choose(ARRAY[1]::float8[], ARRAY[0.1]::float8[],"
            " ARRAY[0.1]::float8[], 1, NULL, 1, 1, -1, 1)",
            "different dimensions",
        ),
        (
            "SELECT dpsql_internal._glm_line_choose(array_fill(0::float8, ARRAY[18]),"
            " ARRAY[0.1]::float8[], ARRAY['NaN']::float8[], 1, NULL, 1, 1, -1, 1)",
            "finite",
        ),
        (
            "SELECT dpsql_internal._glm_line_choose(array_fill(0::float8, ARRAY[18]),"
            " ARRAY[0.1]::float8[], ARRAY[0.1]::float8[], 1, NULL, 1, 1, -1, 9)",
            "loss",
        ),
        (
            "SELECT dpsql_internal._glm_solve_rows(x, 1.0, 2, 1, 0, 1, 1, false, 1, NULL, 0,"
            " 500, 1)"
            " FROM (VALUES (ARRAY[1, 2]::float8[])) AS t(x)",
            "steps",
        ),
        (
            "SELECT dpsql_internal._glm_solve_rows(x, 1.0, 2, 1, 0, 1, 1, false, 1,"
            " ARRAY[1]::float8[], 0, 5, 1) FROM (VALUES (ARRAY[1, 2]::float8[])) AS t(x)",
            "same length",
        ),
        (
            "SELECT dpsql_internal._glm_solve_rows(x, 1.0, 600, 1, 0, 1, 1, false, 1, NULL, 0,"
            " 5, 1)"
            " FROM (VALUES (ARRAY[1, 2]::float8[])) AS t(x)",
            "coefficients",
        ),
        (
            "SELECT dpsql_internal._glm_solve_rows(x, 1.0, 2, 1, 0, 1, 1, false, 1, NULL, 0,"
            " 5, -1) FROM (VALUES (ARRAY[1, 2]::float8[])) AS t(x)",
            "rows",
        ),
        (
            "SELECT dpsql_internal._glm_line(x, 1.0, ARRAY[0.1, 0.1]::float8[],"
            " ARRAY[0.1]::float8[], 1, 0, 1, 1, false)"
            " FROM (VALUES (ARRAY[1, 2]::float8[])) AS t(x)",
            "same length",
        ),
    ]
    for sql, message in calls:
        with pytest.raises(psycopg.Error, match=message):
            conn.execute(sql)
    # malformed rows are zero records, never errors (and more rows than announced still fit)
    (out,) = conn.execute(
        "SELECT dpsql_internal._glm_solve_rows(x, y, 2, 1, 0, 1, 1, false, 1, NULL, 0, 3, 1)"
        " FROM (VALUES (NULL::float8[], 1.0::float8), (ARRAY[1]::float8[], 1.0),"
        " (ARRAY[1, 'Infinity']::float8[], -1.0), (ARRAY[1, 2]::float8[], 7.0)) AS t(x, y)"
    ).fetchone()
    assert out == [0.0, 0.0, 0.0, 7.0]


# ------------------------------------------------------------------------------ releases


@pytest.mark.parametrize("privacy", ["objective_perturbation", "output_perturbation"])
def test_private_classifier_beats_majority_and_is_charged(conn, binary, privacy) -> None:
    ds, source, X, y = binary
    (before,) = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    m = _train(conn, source, privacy=privacy, epsilon=1.0, intercept=True)
    (after,) = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    assert after - before == pytest.approx(1.0)
    (acc,) = conn.execute(
        "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], source)
    ).fetchone()
    # (output perturbation on fresh noise: mean 0.90, sd 0.04 over 12 noise seeds at the default
    # radius of issue 42, 0.91 and 0.03 at 10; its bar is 4 sds below the mean)
    bar = 0.85 if privacy == "objective_perturbation" else 0.75
    assert acc > bar > max(y.mean(), 1 - y.mean())
    assert m["params"]["privacy"]["neighbouring"] == "replace-one, n public"


def test_gaussian_variant_and_huber(conn, binary) -> None:
    ds, source, X, y = binary
    m = _train(conn, source, model="huber", epsilon=1.0, delta=1e-6)
    info = m["params"]["privacy"]
    assert info["noise"].startswith("gaussian") and info["loss"] == "huber svm"
    assert m["delta"] == 1e-6


def test_huber_newton_does_not_cycle(conn, binary) -> None:
    """Noise seed 25 made Newton cycle between two points on the Huber SVM objective (a step
    accepted because the gradient shrank while the objective rose) until the scan cap: the fit
    released nothing in ~1% of calls. Descent now never raises the objective (the scan count
    is no longer released: test_solver_certifies_adversarial_neighbours checks the solver)."""
    ds, source, X, y = binary
    m = _train(conn, source, model="huber", epsilon=1.0, delta=1e-6, noise_seed=25)
    assert m is not None and np.all(np.isfinite(m["weights"]))


def test_huber_regression(conn, regression) -> None:
    ds, source, X, y = regression
    m = _train(conn, source, model="linear", epsilon=2.0, intercept=True)
    info = m["params"]["privacy"]
    assert info["loss"] == "huber regression" and info["huber_threshold"] == 2.0
    w = np.asarray(m["weights"])
    pred = X @ w[:3] + w[3]
    assert np.mean((pred - y) ** 2) < 0.5 * np.var(y)


def test_uncertified_minimiser_is_released_like_a_certified_one(conn, binary) -> None:
    """Whether Newton certifies depends on the rows (issue 24): a data owner's tiny newton_steps
    releases the last iterate with the same noise, and no field says it was uncertified."""
    ds, source, X, y = binary
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = _train(conn, source, options={"newton_steps": 1})
    assert m is not None and np.all(np.isfinite(m["weights"]))
    assert "certified" not in m["params"]["privacy"] and "scans" not in m["params"]["privacy"]
    (note,) = conn.execute(
        "SELECT mechanism FROM dpsql.ledger WHERE dataset_id = %s ORDER BY entry_id DESC LIMIT 1",
        (ds,),
    ).fetchone()
    assert note == "objective_perturbation"


def test_max_scans_is_read_as_newton_steps(conn, binary) -> None:
    """options.max_scans, the solver's cap before 0.8.0, still works (a data owner's option):
    read as newton_steps, so the same seeded release (up to the rounding of the fresh row order
    each release's training table has); both at once are refused."""
    ds, source, X, y = binary
    old = _train(conn, source, noise_seed=5, options={"max_scans": 3})
    new = _train(conn, source, noise_seed=5, options={"newton_steps": 3})
    other = _train(conn, source, noise_seed=5, options={"newton_steps": 2})
    np.testing.assert_allclose(old["weights"], new["weights"], rtol=1e-12)
    assert not np.allclose(other["weights"], new["weights"], rtol=1e-6)
    with pytest.raises(psycopg.Error, match="older name of newton_steps"):
        _train(conn, source, options={"max_scans": 3, "newton_steps": 3})
    conn.rollback()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(model="lasso"), "not 'lasso'"),
        (dict(model="multinomial"), "not 'multinomial'"),
        (dict(options={"bogus": 1}), "unknown options"),
        (dict(options={"radius": -1}), "radius"),
        (dict(options={"newton_steps": 2.5}), "newton_steps"),
        (dict(options={"newton_steps": 0}), "newton_steps"),
        (dict(options={"max_scans": 0}), "max_scans"),
        (dict(huber_h=2.0, model="huber"), "huber_h"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(lambda_=-1.0), "lambda"),
        (dict(noise_multiplier=1.0), "noise_multiplier"),
    ],
)
def test_refusals_charge_nothing(conn, binary, kw, message) -> None:
    ds, source, X, y = binary
    if "lambda_" in kw:
        kw["lambda"] = kw.pop("lambda_")
    ledger = conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()
    before = leftovers(conn)
    with pytest.raises(psycopg.Error, match=message):
        _train(conn, source, **kw)
    conn.rollback() if not conn.autocommit else None
    assert conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone() == ledger
    assert leftovers(conn) == before


def test_three_classes_train_one_vs_rest(conn, scratch_schema) -> None:
    """Three labels: three binary models on all the rows, (epsilon, delta) / 3 each."""
    rng = np.random.default_rng(2)
    centres = np.array([[1.0, 0.0], [-0.5, 0.8], [-0.5, -0.8]])
    y = rng.integers(0, 3, size=1500)
    X = centres[y] * 0.6 + 0.15 * rng.normal(size=(1500, 2))
    ds, source = _register(conn, scratch_schema, X, y.astype(float), labels=[0, 1, 2])
    for privacy in ("objective_perturbation", "output_perturbation"):
        m = _train(conn, source, privacy=privacy, epsilon=3.0)
        assert np.asarray(m["weights"]).shape == (3, 2)
        assert m["params"]["privacy"]["one_vs_rest"] is True
        assert m["params"]["privacy"]["model_epsilon"] == pytest.approx(1.0)
        (acc,) = conn.execute(
            "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], source)
        ).fetchone()
        assert acc > 0.8


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_output_perturbation_release_is_minimiser_plus_calibrated_noise(
    conn, scratch_schema, binary, delta
) -> None:
    """The release minus the certified noiseless minimiser is exactly the noise vector the
    server draws for the recorded sensitivity (same noise seed): Gamma-norm with scale
    sensitivity / epsilon, or the analytic Gaussian. The noise scale itself is checked by
    test_gamma_noise_norm_and_gaussian_std."""
    ds, source, X, y = binary
    m = _train(conn, source, privacy="output_perturbation", epsilon=1.0, delta=delta, noise_seed=9)
    info = m["params"]["privacy"]
    plan = {
        "loss": 1,
        "param": 0,
        "y_bound": 1.0,
        "x_bound": 1.0,
        "intercept": False,
        "p": 4,
        "regularizer": info["regularizer"],
        "tolerance": info["tolerance"],
        "newton_steps": 12,
    }
    exact = _solve(conn, _table(conn, scratch_schema, X, 2 * y - 1), plan, None)
    (noise, scale) = conn.execute(
        "SELECT weights, noise_scale FROM dpsql_internal._perturb(%s, %s, 1, %s, 9, 1)",
        ([0.0] * 4, info["sensitivity"], delta),
    ).fetchone()
    released = np.asarray(m["weights"])
    assert np.allclose(released - np.asarray(exact["theta"]), noise, atol=1e-6)
    assert np.linalg.norm(noise) > 100 * 1e-6
    assert info["sensitivity"] == pytest.approx(
        2 * (info["lipschitz"] + info["tolerance"]) / info["regularizer"]
    )
    if delta == 0:
        assert scale == pytest.approx(info["sensitivity"])


# ---------------------------------------------------------------- defaults (issue 25, item 3)


def _ledger_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()[0]


@pytest.mark.parametrize("privacy", ["objective_perturbation", "output_perturbation"])
def test_defaults_beat_the_majority_class_on_one_hot_rows(conn, scratch_schema, privacy) -> None:
    """Epsilon 1, delta 1e-6, nothing else given: above the majority class (0.784) on each of
    three noise seeds. Measured: objective 0.839-0.843, output 0.825-0.832 (its old
    regulariser 0.817-0.821); a seed below 0.794 would be a 5-sigma draw (rate < 0.1%)."""
    X, y = one_hot_design()
    ds, source = _register(conn, scratch_schema, X, y, labels=[0, 1])
    majority = max(y.mean(), 1 - y.mean())
    for s in (1, 2, 3):
        m = _train(conn, source, privacy=privacy, delta=1e-6, noise_seed=s)
        (acc,) = conn.execute(
            "SELECT value FROM dpsql.evaluate(%s, %s)", (m["model_id"], source)
        ).fetchone()
        assert acc > majority + 0.01, (s, acc, majority)


@pytest.mark.parametrize("privacy", ["objective_perturbation", "output_perturbation"])
def test_defaults_refuse_a_useless_release_before_charging(conn, scratch_schema, privacy) -> None:
    """Ten classes on 1,000 rows of 64 features at epsilon 1: ten one-vs-rest models at
    epsilon 0.1 each, whose excess bound is far above the zero model's loss (on such data,
    sklearn's digits, the releases were at the majority class). Refused with the reason and
    what to do; nothing charged. An analyst's lambda is not judged."""
    rng = np.random.default_rng(12)
    X = rng.normal(size=(1000, 64)) / 8
    y = rng.integers(0, 10, size=1000).astype(float)
    ds, source = _register(conn, scratch_schema, X, y, labels=list(range(10)))
    before, rest = _ledger_count(conn), leftovers(conn)
    with pytest.raises(psycopg.Error, match="cannot learn here") as err:
        _train(conn, source, privacy=privacy, delta=1e-6, intercept=True)
    assert "epsilon" in (err.value.diag.message_hint or "")
    conn.rollback()
    assert _ledger_count(conn) == before
    assert leftovers(conn) == rest
    _train(conn, source, privacy=privacy, delta=1e-6, intercept=True, **{"lambda": 0.1})
    assert _ledger_count(conn) == before + 1
