"""The C core of the fixed-work Newton solver (core/erm_solver.h), through the Cython bindings:
the minimiser of numpy's objective, a certified gradient, 2 S + 1 evaluations whatever the
rows, zero records that change nothing, and bad settings refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpsql import _core


def _clip(X, bound):
    norms = np.linalg.norm(X, axis=1)
    return X * np.minimum(1.0, bound / np.maximum(norms, 1e-300))[:, None]


def _numpy_newton(X, y, loss, reg, b, k=1.0, iters=60):
    """The exact minimiser of J by undamped-then-damped Newton in numpy (reference)."""
    theta = np.zeros(X.shape[1])

    def parts(t):
        z = X @ t
        if loss == 1:
            m = y * z
            s = 1 / (1 + np.exp(m))
            val = np.logaddexp(0, -m).sum()
            d1, d2 = -y * s, s * (1 - s)
        else:  # Huber regression, threshold k
            r = z - y
            inside = np.abs(r) <= k
            val = np.where(inside, r * r / 2, k * np.abs(r) - k * k / 2).sum()
            d1, d2 = np.where(inside, r, k * np.sign(r)), inside.astype(float)
        g = X.T @ d1 + reg * t + b
        h = (X * d2[:, None]).T @ X + reg * np.eye(len(t))
        return val + reg / 2 * t @ t + b @ t, g, h

    for _ in range(iters):
        j, g, h = parts(theta)
        d = -np.linalg.solve(h, g)
        step = 1.0
        while parts(theta + step * d)[0] > j + 1e-4 * step * (g @ d) and step > 1e-10:
            step /= 2
        theta = theta + step * d
    return theta, np.linalg.norm(parts(theta)[1])


@pytest.mark.parametrize("loss", [1, 3])
def test_solver_reaches_numpys_minimiser(loss) -> None:
    rng = np.random.default_rng(loss)
    X = rng.normal(size=(500, 6)) / 2
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=500)) if loss == 1 else X @ rng.normal(size=6)
    b = rng.normal(size=7) * 3
    theta, grad_norm, passes = _core.glm_solve(X, y, loss, 1.0, 2.0, 1.0, True, 2.0, b, 1e-9, 16)
    assert passes == 33 and grad_norm <= 1e-9
    Xi = np.hstack([_clip(X, 1.0), np.ones((500, 1))])
    ref, ref_norm = _numpy_newton(Xi, y if loss == 1 else np.clip(y, -2, 2), loss, 2.0, b)
    assert ref_norm < 1e-9
    assert np.allclose(theta, ref, atol=1e-9)


def test_zero_records_change_nothing_and_the_work_is_fixed() -> None:
    """NaN features or labels and labels outside {-1, 1} are zero records: the model of the
    other rows, bit for bit, after the same 2 S + 1 evaluations (whatever the rows: here
    Newton certifies after different numbers of steps)."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 4))
    y = np.sign(X[:, 1] + 0.2 * rng.normal(size=300))
    bad_X, bad_y = X.copy(), y.copy()
    bad_X[[3, 50]] = np.nan
    bad_y[[7, 90]] = [0.5, np.nan]
    keep = np.setdiff1d(np.arange(300), [3, 50, 7, 90])
    b = rng.normal(size=4)
    args = (1, 0.0, 1.0, 1.0, False, 1.5, b, 1e-10, 12)
    full = _core.glm_solve(bad_X, bad_y, *args)
    clean = _core.glm_solve(X[keep], y[keep], *args)
    assert np.array_equal(full[0], clean[0]) and full[1:] == clean[1:]
    # an easier problem (a larger regulariser) certifies sooner; the work does not change
    easy = _core.glm_solve(X, y, 1, 0.0, 1.0, 1.0, False, 500.0, b, 1e-10, 12)
    assert easy[2] == full[2] == 25

    def certified_at(reg):
        last = _core.glm_solve(X, y, 1, 0.0, 1.0, 1.0, False, reg, b, 1e-10, 12)[0]
        return next(
            s
            for s in range(1, 13)
            if np.array_equal(
                _core.glm_solve(X, y, 1, 0.0, 1.0, 1.0, False, reg, b, 1e-10, s)[0], last
            )
        )

    assert certified_at(500.0) < certified_at(1.5)


@pytest.mark.parametrize(
    "kw",
    [
        dict(reg=0.0),
        dict(reg=float("nan")),
        dict(steps=101),
        dict(steps=-1),
        dict(tolerance=-1.0),
        dict(loss=9),
        dict(b=np.zeros(3)),
    ],
)
def test_bad_settings_are_refused(kw) -> None:
    X, y = np.ones((5, 2)), np.ones(5)
    args: dict[str, Any] = dict(
        loss=1,
        param=0.0,
        y_bound=1.0,
        x_bound=1.0,
        intercept=False,
        reg=1.0,
        b=None,
        tolerance=0.0,
        steps=3,
    )
    args.update(kw)
    with pytest.raises(ValueError, match="dpsql"):
        _core.glm_solve(X, y, **args)
