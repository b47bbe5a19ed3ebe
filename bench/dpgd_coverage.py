"""DP-GD's confidence intervals on California housing: do they cover what they name? (issue 25)

The registration of ``bench.linear_cal_housing`` (features rescaled onto [-1, 1] by public
bounds, |y| <= 5.00001, ||x|| <= sqrt(8)), intercept on, delta 1e-6, DP-GD at its defaults.
Per run, the released 95% intervals of the 9 coefficients (withheld ones, NULL, left out;
"intervals given" is their share) are checked against, pooled over runs and coefficients:

* OLS: the training rows' least-squares solution;
* the clipped target: the minimiser of the clipped (Huberised) loss with the run's released
  clip_norm gamma in the run's own representation (x clipped to the row bound, then the 1,
  then whitened by the run's released preconditioner): B_i = gamma / ||row_i||, computed
  non-privately here by iteratively reweighted least squares;
* the target the model names (``ci.target``): 'ols' -> OLS, else the clipped target.

Also per run: the fraction of rows clipped at the clipped target (non-private, evaluation
only), the model's released estimate of it, and the ``mixed`` diagnostic.

``--data ill_conditioned``: a synthetic set scaled by its features' full range (issue 42,
item 10): four heavy-tailed features and two highly correlated pairs, n 16,000.

``--data heavy_tails``: a synthetic set where the public rule clips most gradients (n 4000,
rows uniform in [-1, 1]^3, row bound sqrt 3, y = 1 + x.(2, -1, 0.5) + 12 t_3 clipped to
[-100, 100], label bound 100; the data of ``tests/server/test_dpgd_clip.py``).

Usage::

    .venv/bin/python -m bench.dpgd_coverage [--runs 20] [--eps 0.5 1 2] [--options '{}']
    .venv/bin/python -m bench.dpgd_coverage --data heavy_tails --eps 2 --runs 30 \
        --options '{"precondition": false}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

import dpsql
from bench.bolton_accuracy import bench_server, header_lines
from dpsql import datasets as dsets

LABEL_BOUND = 5.00001


def clipped_target(A: np.ndarray, y: np.ndarray, gamma: float, iters: int = 500) -> np.ndarray:
    """The minimiser of sum_i huber_{B_i}(y_i - a_i w), B_i = gamma / ||a_i|| (IRLS).

    Clipping the squared loss's gradient a_i r_i at norm gamma is exactly the Huber loss's
    gradient with that B_i (Brown et al. 2024, §2.5), so this is DP-GD's noiseless fixed point.
    """
    norms = np.linalg.norm(A, axis=1)
    bound = np.where(norms > 0, gamma / np.maximum(norms, 1e-300), np.inf)
    w: np.ndarray = np.linalg.lstsq(A, y, rcond=None)[0]
    for _ in range(iters):
        r = y - A @ w
        om = np.minimum(1.0, bound / np.maximum(np.abs(r), 1e-300))
        w_new: np.ndarray = np.linalg.solve(A.T @ (A * om[:, None]), A.T @ (om * y))
        if np.max(np.abs(w_new - w)) < 1e-12:
            return w_new
        w = w_new
    return w


def representation(
    X: np.ndarray, privacy: dict[str, Any], x_bound: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows the run's gradient steps saw, and the map back (L^{-T}) if whitened."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    Xc = X * np.minimum(1.0, x_bound / np.maximum(norms, 1e-300))
    A = np.column_stack([Xc, np.ones(len(X))])
    pre = privacy.get("preconditioner")
    if not pre:
        return A, None
    p = A.shape[1]
    G = np.asarray(pre["second_moment"], dtype=float).reshape(p, p) + pre["floor"] * np.eye(p)
    L = np.linalg.cholesky(G)
    return np.linalg.solve(L, A.T).T, np.linalg.inv(L).T


def _inside(ci: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per coefficient: 1 if its interval contains the target's, 0 if not, NaN if withheld
    (NULL bounds). The table pools these over runs and coefficients."""
    covered = ((ci[:, 0] <= target) & (target <= ci[:, 1])).astype(float)
    return np.where(np.isnan(ci[:, 0]), np.nan, covered)


def _heavy_tails(n: int = 4000, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    y = 1.0 + X @ [2.0, -1.0, 0.5] + 12 * rng.standard_t(3, size=n)
    return X, np.clip(y, -100, 100)


def _ill_conditioned(n: int = 16000, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Eight features as raw tables have them (four log-normal, heavy tailed; two pairs
    correlated 0.95), mapped onto [-1, 1] by each feature's full range (the "public bounds"
    an owner reads off a code book's extremes), so that most rows crowd into a corner and
    X'X is ill-conditioned; y linear in them plus noise, |y| <= 5."""
    rng = np.random.default_rng(seed)
    cov = np.eye(8)
    for i, j in ((4, 5), (6, 7)):
        cov[i, j] = cov[j, i] = 0.95
    Z = rng.multivariate_normal(np.zeros(8), cov, size=n)
    raw = np.column_stack([np.exp(1.2 * Z[:, :4]), Z[:, 4:]])
    lo, hi = raw.min(axis=0), raw.max(axis=0)
    X = 2 * (raw - lo) / (hi - lo) - 1
    y = X @ rng.normal(size=8) + 0.5 * rng.normal(size=n)
    return X, np.clip(y, -5, 5)


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--options", default="{}", help="DP-GD options (JSON)")
    parser.add_argument("--params", default="{}", help="other dpsql.train arguments (JSON)")
    parser.add_argument(
        "--data", choices=("cal_housing", "heavy_tails", "ill_conditioned"), default="cal_housing"
    )
    args = parser.parse_args(argv)
    print("\n".join(header_lines("dpgd_coverage")))
    print(f"# command: .venv/bin/python -m bench.dpgd_coverage {' '.join(argv or sys.argv[1:])}")
    if args.data == "heavy_tails":
        Xtr, ytr = _heavy_tails()
        label_bound = 100.0
    elif args.data == "ill_conditioned":
        Xtr, ytr = _ill_conditioned()
        label_bound = LABEL_BOUND
    else:
        raw, value = dsets.load_cal_housing()
        X = dsets.cal_housing_features(raw)
        y = value / 100_000.0
        tr, _ = dsets.train_test_split(len(y), test_fraction=0.2, seed=0)
        Xtr, ytr = X[tr], y[tr]
        label_bound = LABEL_BOUND
    x_bound = float(np.sqrt(Xtr.shape[1]))
    ols = np.linalg.lstsq(np.column_stack([Xtr, np.ones(len(ytr))]), ytr, rcond=None)[0]
    extra = json.loads(args.params)
    with bench_server(None, None) as (_, where), dpsql.connect(_) as db:
        print(f"# server: {where}")
        db.load_numpy("houses", Xtr, ytr, schema="public")
        db.execute(
            "SELECT dpsql.register_dataset('houses', '{x}', 'y', 1e9, 0.99,"
            " label_bound => %s, row_bound => %s, accept => true)",
            (label_bound, x_bound),
        )
        print(
            "| eps | runs | cover OLS | cover clipped target | cover named target | named"
            " 'ols' | rows clipped at clipped target | released clipped-fraction estimate"
            " | mixed | median CI width | median clip_norm | sec/run | intervals given |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for eps in args.eps:
            rows: dict[str, list[float]] = {
                k: []
                for k in (
                    "is_ols",
                    "frac",
                    "est",
                    "mixed",
                    "w",
                    "g",
                    "t",
                    "given",
                )
            }
            per_coef: list[np.ndarray] = []
            pooled: dict[str, list[float]] = {"ols": [], "huber": [], "named": []}
            for seed in range(1, args.runs + 1):
                t0 = time.perf_counter()
                names = "".join(f", {k} => %({k})s" for k in extra)
                row = db.execute(
                    "SELECT dpsql.train('houses', NULL, NULL, 'linear', intercept => true,"
                    " privacy => 'dpgd', epsilon => %(eps)s, delta => 1e-6, seed => %(seed)s,"
                    f" options => %(options)s{names})",
                    {"eps": eps, "seed": seed, "options": Jsonb(json.loads(args.options)), **extra},
                ).fetchone()
                assert row is not None
                mid = row[0]
                rows["t"].append(time.perf_counter() - t0)
                privacy = db.model(mid).row["params"]["privacy"]
                ci = np.array(
                    db.execute(
                        "SELECT lower, upper FROM dpsql.confint(%s, 0.05) ORDER BY coef_index",
                        (mid,),
                    ).fetchall(),
                    dtype=float,
                )  # a withheld interval's NULLs become NaN
                rows["given"].append(float(np.mean(~np.isnan(ci[:, 0]))))
                A, back = representation(Xtr, privacy, x_bound)
                gamma = float(privacy["clip_norm"])  # the one the steps after the pilot used
                w = clipped_target(A, ytr, gamma)
                huber = back @ w if back is not None else w
                frac = float(np.mean(np.linalg.norm(A, axis=1) * np.abs(ytr - A @ w) > gamma))
                named = privacy["ci"].get("target", "clipped")
                pooled["ols"].extend(_inside(ci, ols))
                pooled["huber"].extend(_inside(ci, huber))
                per_coef.append(_inside(ci, ols if named == "ols" else huber))
                pooled["named"].extend(per_coef[-1])
                rows["is_ols"].append(float(named == "ols"))
                rows["frac"].append(frac)
                est = privacy["ci"].get("clipped_fraction")
                rows["est"].append(float("nan") if est is None else float(est))
                rows["mixed"].append(float(bool(privacy["ci"].get("mixed"))))
                rows["w"].append(float(np.nanmean(ci[:, 1] - ci[:, 0])))
                rows["g"].append(gamma)
            m = {k: float(np.nanmean(v)) for k, v in rows.items() if v}
            m.update({k: float(np.nanmean(v)) for k, v in pooled.items()})
            m["w"], m["g"] = float(np.nanmedian(rows["w"])), float(np.median(rows["g"]))
            print(
                f"| {eps:g} | {args.runs} | {m['ols']:.3f} | {m['huber']:.3f} | {m['named']:.3f}"
                f" | {m['is_ols']:.2f} | {m['frac']:.4f} | {m['est']:.4f} | {m['mixed']:.2f}"
                f" | {m['w']:.4f} | {m['g']:.3g} | {m['t']:.1f} | {m['given']:.2f} |",
                flush=True,
            )
            by_coef = ", ".join(f"{v:.2f}" for v in np.nanmean(per_coef, axis=0))
            print(f"#   eps {eps:g}: coverage of the named target by coefficient: {by_coef}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
