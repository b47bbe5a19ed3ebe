"""Issue 25 (findings 1 and 2): one model representation (docs/architecture.md, privacy rule 10).

For every mechanism of dpsql.mechanisms() and every case it trains (binary logistic with and
without an intercept, three classes, linear regression), at epsilon 1000 with a fixed noise
seed: the released coef and intercept applied by hand to the publicly transformed rows (the
registration's feature bounds, then its row clipping: public_rows), dpsql.predict,
dpsql.evaluate and Python's Model.predict give the same predictions and score, and with an
intercept the score is far from the trivial one (a model scored in another representation
than it was trained in flips labels).
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import dpsql
from tests.pg_helpers import load

N = 1500
EPSILON = 1000.0
# Arguments a mechanism needs on these small tables (test_released_fields.py).
# Regression mechanisms whose fit reaches the rule y = a . clip(x) + b at epsilon 1000 here
# (the others are limited by their own algorithm: one pass, a grid, tree-aggregated noise).
CONVERGED = {
    "objective_perturbation",
    "output_perturbation",
    "dpsgd_f",
    "adassp",
    "dp_ssgd",
    "dpgd",
}
# DP-GD: the plain run converges at epsilon 1000 on these heavily clipped rows (its default
# preconditioned run does not, and a weak fit witnesses no representation; tests/server/
# test_auto.py checks the preconditioned one on rows within the bound).
EXTRA: dict[str, dict[str, Any]] = {
    "dp_ambssgd": {"steps": 8},
    "dpgd": {"steps": 200, "options": Jsonb({"precondition": False})},
}


def public_rows(X: np.ndarray, model: dict[str, Any], other: bool = False) -> np.ndarray:
    """The documented public row transform of a model, with the intercept's column: the
    registration's feature bounds (clamp, map onto [-1, 1]), then the row transform (clip:
    x / max(1, ||x||); unit: x / ||x||) with the intercept's 1 appended before it when the
    model's flags say so (the SGD mechanisms: DPSQL_FLAG_INTERCEPT), or after it when the
    model records a preprocessing (DPSGD-F, the private-ERM fits with an intercept). other:
    the intercept at the other place (the representation the model does not record)."""
    params = model["params"] or {}
    rows = np.asarray(X, dtype=np.float64).copy()
    if params.get("feature_bounds") is not None:
        b = np.asarray(params["feature_bounds"], dtype=np.float64).reshape(-1, 2)
        lo, hi = b[:, 0], b[:, 1]
        rows = (2 * np.clip(rows, lo, hi) - lo - hi) / (hi - lo)
    pre = (params.get("privacy") or {}).get("preprocessing")
    ones = np.ones((len(rows), 1))

    def transform(r: np.ndarray, flags: int) -> np.ndarray:
        norms = np.linalg.norm(r, axis=1, keepdims=True)
        if flags & 1:
            return r / np.maximum(1.0, norms)
        if flags & 2:
            return r / np.where(norms > 0, norms, 1.0)
        return r

    row_flags = int(pre["row_flags"]) if pre is not None else model["flags"] & 3
    if not model["fit_intercept"]:
        return transform(rows, row_flags)
    if (pre is not None) != other:  # the row transform, then the 1
        # (no centre: a released centre must be folded into the intercept)
        return np.hstack([transform(rows, row_flags), ones])
    return transform(np.hstack([rows, ones]), row_flags)  # the 1, then the row transform


def _data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows with a non-zero mean, most of them outside the unit ball, labels of a rule with
    an offset on the clipped rows: centring, clipping and where the intercept enters all
    change the scores (a representation mismatch flips many labels)."""
    rng = np.random.default_rng(25)
    X = rng.normal(size=(N, 3)) * 1.5 + np.array([1.2, -0.8, 0.6])
    u = X / np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    t = u @ np.array([2.0, -1.5, 1.0])
    if kind == "binary":
        return X, (t - 0.8 + 0.1 * rng.normal(size=N) > 0).astype(float)
    if kind == "classes":
        return X, np.digitize(t, np.quantile(t, [1 / 3, 2 / 3])).astype(float)
    return X, np.clip(0.5 * t - 0.4, -2, 2)


@pytest.fixture
def datasets(conn: psycopg.Connection, scratch_schema: str) -> dict[str, Any]:
    out = {}
    for kind in ("binary", "classes", "regression"):
        X, y = _data(kind)
        if kind == "binary":
            kw: dict[str, Any] = {"labels": [0, 1], "row_norm": "clip"}
        elif kind == "classes":
            kw = {"labels": [0, 1, 2], "row_norm": "clip"}
        else:
            kw = {"label_bound": 2.0, "row_bound": 1.0, "row_norm": "clip"}
        source = load(conn, scratch_schema, f"t_{uuid.uuid4().hex[:6]}", X, y)
        extra = "".join(f", {k} => %({k})s" for k in kw)
        conn.execute(
            f"SELECT dpsql.register_dataset(%(t)s, '{{x}}', 'y', epsilon_budget => 1e7,"
            f" delta_budget => 0.99, name => %(n)s{extra})",
            {"t": source, "n": f"mr_{uuid.uuid4().hex[:8]}", **kw},
        )
        out[kind] = (source, X, y)
    return out


def _cases(models: list[str]) -> list[tuple[str, str, bool]]:
    cases = []
    if "logistic" in models:
        cases += [("binary", "logistic", False), ("binary", "logistic", True)]
    if "multinomial" in models:
        cases.append(("classes", "multinomial", True))
    elif "logistic" in models:
        cases.append(("classes", "logistic", True))  # one-vs-rest where supported
    if "linear" in models:
        cases += [("regression", "linear", False), ("regression", "linear", True)]
    return cases


def _train(conn, source: str, mech: dict, model: str, intercept: bool) -> int | str:
    args = {
        "model": model,
        "privacy": mech["name"],
        "epsilon": EPSILON,
        "delta": 1e-5 if mech["needs_delta"] else 0.0,
        "noise_seed": 7,
        "intercept": intercept,
        **EXTRA.get(mech["name"], {}),
    }
    names = ", ".join(f"{k} => %({k})s" for k in args)
    try:
        row = conn.execute(
            f"SELECT dpsql.train(%(source)s, NULL, NULL, {names})", {"source": source, **args}
        ).fetchone()
    except psycopg.Error as err:
        return f"refused: {err.diag.message_primary}"
    return "released nothing" if row is None or row[0] is None else int(row[0])


def test_every_path_scores_the_released_coefficients(conn, datasets) -> None:  # noqa: C901, PLR0915
    db = dpsql.Database(conn, owns_connection=False, embedded=False)
    with conn.cursor(row_factory=dict_row) as cur:
        mechanisms = cur.execute(
            "SELECT name, task, models, needs_delta FROM dpsql.mechanisms()"
        ).fetchall()
    failures: list[str] = []
    checked: list[str] = []
    for mech in mechanisms:
        for kind, model, intercept in _cases(mech["models"]):
            source, X, y = datasets[kind]
            where = f"{mech['name']}/{model}/{kind}/intercept={intercept}"
            mid = _train(conn, source, mech, model, intercept)
            if isinstance(mid, str):
                checked.append(f"{where}: {mid}")
                continue
            with conn.cursor(row_factory=dict_row) as cur:
                m = cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()
            assert m is not None
            coef = np.asarray(m["coef"], dtype=float)
            if m["intercept"] is not None:
                coef = np.column_stack([coef.reshape(-1, coef.shape[-1]), m["intercept"]])
            scores, other = (public_rows(X, m, o) @ coef.T for o in (False, True))
            if np.asarray(m["coef"]).ndim == 1:
                scores, other = scores.ravel(), other.ravel()
            classes = None if m["classes"] is None else np.asarray(m["classes"], dtype=float)

            def labels(z: np.ndarray, model: str = model, classes: Any = classes) -> np.ndarray:
                if model == "linear":
                    return z
                if z.ndim == 2:
                    return classes[np.argmax(z, axis=1)]
                return np.where(z >= 0, classes[1], classes[0])

            hand, hand_other = labels(scores), labels(other)
            sql_p = np.array(
                [
                    r[0]
                    for r in conn.execute(
                        f"SELECT dpsql.predict(%s, x) FROM {source} ORDER BY rid", (mid,)
                    ).fetchall()
                ],
                dtype=float,
            )
            if model == "logistic" and scores.ndim == 1:
                sql_p = np.where(sql_p >= 0.5, classes[1], classes[0])
            py_p = np.asarray(dpsql.models.Model(db, m).predict(X), dtype=float)
            metric, value, _ = conn.execute(
                "SELECT metric, value, rows FROM dpsql.evaluate(%s, %s)", (mid, source)
            ).fetchone()
            if model == "linear":
                score = float(np.mean((hand - y) ** 2))
                # the representation the model records is the one it was trained in: at
                # epsilon 1000 its coefficients fit the rows better there than elsewhere
                other_score = float(np.mean((hand_other - y) ** 2))
                trained = score <= other_score + 1e-3
                same = np.allclose(sql_p, hand, atol=1e-9) and np.allclose(py_p, hand, atol=1e-9)
                good = score < 0.9 * float(np.var(y)) or not intercept
                if intercept and mech["name"] in CONVERGED:
                    # these fit the rows' exact linear rule at epsilon 1000: only a model
                    # scored in another representation than its fit's misses it
                    good = score < 0.01 * float(np.var(y))
            else:
                score = float(np.mean(hand == y))
                other_score = float(np.mean(hand_other == y))
                # (binary labels are a weak witness: only the three classes are checked)
                # and only where one of the two fits well (a weak fit is no witness)
                trained = (
                    score >= other_score - 0.01 or kind == "binary" or max(score, other_score) < 0.8
                )
                same = (sql_p == hand).all() and (py_p == hand).all()
                majority = max(np.mean(y == c) for c in np.unique(y))
                good = score > majority + 0.08 or not intercept
            checked.append(
                f"{where}: hand {score:.4f}, evaluate {metric} {value:.4f}, intercept at the"
                f" other place {other_score:.4f}"
            )
            if not same:
                failures.append(
                    f"{where}: predictions differ: hand vs predict {np.mean(sql_p != hand):.3f},"
                    f" hand vs Python {np.mean(py_p != hand):.3f} of the rows"
                )
            if abs(value - score) > 1e-9:
                failures.append(f"{where}: evaluate {metric} {value:.4f}, by hand {score:.4f}")
            if not trained:
                failures.append(
                    f"{where}: {score:.4f} as recorded, better with the intercept"
                    " at the other place: not the representation it trained in"
                )
            if not good:
                failures.append(f"{where}: score {score:.4f} at epsilon {EPSILON}")
    print("\n".join(checked))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("privacy", ["dpgd", "adassp", "objective_perturbation", "dp_ftrl"])
def test_rows_beyond_the_row_bound_are_scored_clipped(
    conn, scratch_schema, privacy: str, intercept: bool
) -> None:
    """A regression registered with row_bound R and no row transform: the fit clips x to R,
    and the model records preprocessing.clip_radius = R, so that a row beyond the bound is
    scored as it was trained: clip(x, R) . coef + intercept by hand, dpsql.predict, Python
    and dpsql.evaluate agree, and fit the rule on the clipped rows (epsilon 1000)."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N, 3)) * 1.5 + np.array([1.2, -0.8, 0.6])
    radius = 2.0
    clipped = X * np.minimum(1.0, radius / np.linalg.norm(X, axis=1, keepdims=True))
    y = clipped @ np.array([0.8, -0.6, 0.4]) + (0.5 if intercept else 0.0)
    assert np.mean(np.linalg.norm(X, axis=1) > radius) > 0.3
    source = load(conn, scratch_schema, f"r_{uuid.uuid4().hex[:6]}", X, y)
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e7,"
        " delta_budget => 0.99, label_bound => 4, row_bound => %s, name => %s)",
        (source, radius, f"rb_{uuid.uuid4().hex[:8]}"),
    )
    extra = ", steps => 200, options => '{\"precondition\": false}'" if privacy == "dpgd" else ""
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => %s, epsilon => {EPSILON},"
        # seeded shuffle and noise: one deterministic release (the bound below is a property
        # of it, not of every draw: unseeded, DP-FTRL missed it about once in 150)
        f" delta => 1e-5, noise_seed => 7, seed => 3, intercept => %s{extra})",
        (source, privacy, intercept),
    ).fetchone()
    with conn.cursor(row_factory=dict_row) as cur:
        m = cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (mid,)).fetchone()
    assert m["params"]["privacy"]["preprocessing"]["clip_radius"] == radius
    hand = clipped @ np.asarray(m["coef"]) + (m["intercept"][0] if intercept else 0.0)
    sql_p = np.array(
        [
            r[0]
            for r in conn.execute(f"SELECT dpsql.predict(%s, x) FROM {source} ORDER BY rid", (mid,))
        ]
    )
    db = dpsql.Database(conn, owns_connection=False, embedded=False)
    py_p = np.asarray(dpsql.models.Model(db, m).predict(X), dtype=float)
    np.testing.assert_allclose(sql_p, hand, atol=1e-9)
    np.testing.assert_allclose(py_p, hand, atol=1e-9)
    (mse,) = conn.execute("SELECT value FROM dpsql.evaluate(%s, %s)", (mid, source)).fetchone()
    assert mse == pytest.approx(float(np.mean((hand - y) ** 2)), abs=1e-9)
    # the rule on the clipped rows, fitted (DP-FTRL's regulariser keeps it a little short)
    assert mse < (0.01 if privacy in CONVERGED else 0.05) * float(np.var(y))
