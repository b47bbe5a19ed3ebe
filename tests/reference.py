"""A plain numpy re-implementation of PSGD (Wu et al. 2017, "Bolt-on DP", §3.2.3), written
independently of the C core, to check it (and the PostgreSQL aggregate) against."""

from __future__ import annotations

import numpy as np


def _row(x: np.ndarray, intercept: bool, row_norm: str) -> np.ndarray:
    v = np.append(x, 1.0) if intercept else x.astype(np.float64)
    n = np.linalg.norm(v)
    if (row_norm == "clip" and n > 1.0) or (row_norm == "unit" and n > 0.0):
        v = v / n
    return v


def example_gradient(model: str, W: np.ndarray, v: np.ndarray, y: float, h: float) -> np.ndarray:
    """Gradient of the data loss in W (n_out x dim) at one transformed row v."""
    if model == "multinomial":
        z = W @ v
        p = np.exp(z - z.max())
        p /= p.sum()
        p[int(y)] -= 1.0
        return np.outer(p, v)
    z = float(W[0] @ v)
    if model == "logistic":
        dz = -y / (1.0 + np.exp(y * z))
    elif model == "linear":
        dz = z - y
    else:  # huber
        m = y * z
        dz = 0.0 if m > 1 + h else (-y if m < 1 - h else -y * (1 + h - m) / (2 * h))
    return dz * v[None, :]


def step_size(schedule: str, s: int, eta: float, offset: float, beta: float, lam: float) -> float:
    if schedule == "constant":
        return eta
    if schedule == "decreasing":
        return min(1.0 / beta, 1.0 / (lam * s))
    if schedule == "inverse":
        return eta / (s + offset)
    return eta / (np.sqrt(s) + offset)


def psgd(
    X: np.ndarray,
    y: np.ndarray,
    *,
    model: str = "logistic",
    epochs: int = 1,
    b: int = 1,
    lam: float = 0.0,
    schedule: str = "constant",
    eta: float = 0.1,
    offset: float = 0.0,
    beta: float = 1.0,
    radius: float = 0.0,
    h: float = 0.1,
    n_classes: int = 1,
    intercept: bool = False,
    row_norm: str = "none",
    W0: np.ndarray | None = None,
    step0: int = 0,
) -> tuple[np.ndarray, int]:
    """k passes in the given row order; returns (W, final global step)."""
    dim = X.shape[1] + (1 if intercept else 0)
    n_out = n_classes if model == "multinomial" else 1
    W = np.zeros((n_out, dim)) if W0 is None else W0.copy()
    s = step0
    for _ in range(epochs):
        g = np.zeros_like(W)
        inb = 0
        for i in range(X.shape[0]):
            v = _row(X[i], intercept, row_norm)
            g += example_gradient(model, W, v, y[i], h)
            inb += 1
            if inb == b:
                s += 1
                e = step_size(schedule, s, eta, offset, beta, lam)
                W = W - e * (lam * W + g / b)
                if radius > 0:
                    n = np.linalg.norm(W)
                    if n > radius:
                        W = W * (radius / n)
                g = np.zeros_like(W)
                inb = 0
    return W, s
