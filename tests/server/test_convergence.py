"""Convergence to the non-private optimum on a real dataset (KDD Cup 2004 Protein)."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql import datasets
from tests.pg_helpers import load


def _objective(w: np.ndarray, X: np.ndarray, y: np.ndarray, lam: float) -> float:
    z = y * (X @ w)
    return float(np.mean(np.logaddexp(0.0, -z)) + 0.5 * lam * w @ w)


@pytest.mark.slow
def test_protein_logistic_reaches_the_sklearn_optimum(conn, scratch_schema, datasets_dir) -> None:
    sklearn = pytest.importorskip("sklearn.linear_model")
    X, y01 = datasets.load_protein(datasets_dir / "kdd04_protein" / "bio_train.dat.gz")
    train, _ = datasets.train_test_split(len(y01), 0.5, seed=0)
    X = datasets.normalize_rows(X[train])  # the bolt-on paper's per-record normalisation
    y = np.where(y01[train] > 0, 1.0, -1.0)
    m, lam = len(y), 1e-3

    ref = sklearn.LogisticRegression(
        C=1.0 / (lam * m), fit_intercept=False, tol=1e-10, max_iter=10_000
    ).fit(X, y)
    w_star = ref.coef_[0]
    f_star = _objective(w_star, X, y, lam)

    load(conn, scratch_schema, "protein", X, y)
    (mid,) = conn.execute(
        "SELECT dpsql.train('protein', '{x}', 'y', 'logistic', epochs => 8, lambda => %s,"
        " schedule => 'decreasing', batch_size => 10, seed => 1, intercept => false)",
        (lam,),
    ).fetchone()
    coef, history = conn.execute(
        "SELECT coef, loss_history FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    w = np.asarray(coef)
    gap = _objective(w, X, y, lam) - f_star
    print(f"objective gap {gap:.3e} (optimum {f_star:.6f})")
    assert 0 <= gap < 1e-6, (gap, f_star)
    cosine = w @ w_star / (np.linalg.norm(w) * np.linalg.norm(w_star))
    assert cosine > 0.99
    # The per-epoch objective accumulated in the scan approaches the optimum too.
    assert history[-1] < history[0] and abs(history[-1] - f_star) < 0.05 * f_star
