"""Empirical privacy lower bounds from attack outcomes (``dpsql.audit``, docs/audit.md).

The server trains, scores the released models and sends the scores here (through the
accountant command, op ``audit_bound``); this module turns them into an epsilon that the
mechanism provably exceeds with the stated confidence *if* its claimed guarantee were false.
A lower bound is evidence against a broken implementation, never a proof of privacy.

``distinguish`` (many runs; Jagielski, Ullman and Oprea 2020; Nasr et al. 2021)
    Scores of the released models on neighbouring datasets D0 and D1 (replace-one). A few
    thresholds are chosen on a calibration half of the runs and the counts are taken on the
    other half (Bonferroni over the thresholds), so the tests are fixed before they see the
    data they are judged on. For any (eps, delta)-DP
    mechanism and any threshold test, FPR and FNR satisfy ``1 - delta - FNR <= e^eps FPR`` (and
    symmetrically); with one-sided Clopper-Pearson upper bounds on FPR and FNR (each at
    significance (1 - confidence) / 2, so both hold together), the largest eps these
    inequalities force is a lower bound.
``one_run`` (Steinke, Nasr and Jagielski 2023, "Privacy auditing with one (1) training run")
    m canary slots, each holding its canary or a neutral record by a fair secret coin; one
    training run; the auditor guesses "in" for the k highest scores and "out" for the k lowest.
    For an (eps, delta)-DP mechanism the number of correct guesses among r = 2k is dominated by
    Binomial(r, e^eps / (1 + e^eps)) up to the delta term of their Theorem 5.2; the bound is
    the largest eps whose p-value is below the significance. k runs over a fixed grid with a
    Bonferroni correction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize, special, stats  # type: ignore[import-untyped]

__all__ = [
    "clopper_pearson_upper",
    "distinguish_bound",
    "distinguish_lower_bound",
    "one_run_lower_bound",
    "one_run_p_value",
    "run",
]

# Fractions of the m canaries guessed on each side in the one-run audit (fixed in advance).
ONE_RUN_GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5)
_EPS_MAX = 50.0


def clopper_pearson_upper(k: int, n: int, significance: float) -> float:
    """One-sided upper confidence bound on a binomial rate after k successes in n trials."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(1.0 - significance, k + 1, n - k))


def distinguish_lower_bound(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float,
) -> float:
    """The eps that observed error counts of one threshold test force, at this confidence."""
    half = (1.0 - confidence) / 2.0
    fpr = clopper_pearson_upper(false_positives, negatives, half)
    fnr = clopper_pearson_upper(false_negatives, positives, half)
    best = 0.0
    for a, b in ((fnr, fpr), (fpr, fnr)):
        if b > 0.0 and 1.0 - delta - a > 0.0:
            best = max(best, math.log((1.0 - delta - a) / b))
    return best


def _counts(s0: np.ndarray, s1: np.ndarray, t: float) -> tuple[int, int]:
    """False positives (D0 scored above t) and false negatives (D1 at or below t)."""
    return int(np.sum(s0 > t)), int(np.sum(s1 <= t))


# Thresholds carried from the calibration half to the evaluation half (Bonferroni-corrected):
# more than one blunts the winner's curse of a single threshold picked in a noisy tail.
DISTINGUISH_THRESHOLDS = 5


def distinguish_bound(
    calibration0: Sequence[float],
    calibration1: Sequence[float],
    evaluation0: Sequence[float],
    evaluation1: Sequence[float],
    delta: float,
    confidence: float,
) -> dict[str, Any]:
    """Choose thresholds on the calibration scores (D1 expected higher), bound on the
    evaluation scores. The candidates are the thresholds with the best bound on the
    calibration half itself, kept apart (their calibration error counts differ by at least
    5% of the runs); each is judged on the evaluation half at significance / their number,
    and the best bound is reported."""
    c0, c1 = np.asarray(calibration0, float), np.asarray(calibration1, float)
    e0, e1 = np.asarray(evaluation0, float), np.asarray(evaluation1, float)
    if min(len(c0), len(c1), len(e0), len(e1)) == 0:
        raise ValueError("distinguish needs scores of both datasets in both halves")
    scored = []
    for t in np.unique(np.concatenate([c0, c1])):
        fp, fn = _counts(c0, c1, float(t))
        scored.append(
            (distinguish_lower_bound(fp, len(c0), fn, len(c1), delta, confidence), fp, fn, float(t))
        )
    scored.sort(reverse=True)
    gap = 0.05 * (len(c0) + len(c1)) / 2
    picked: list[tuple[float, int, int, float]] = []
    for cand in scored:
        if all(abs(cand[1] - p[1]) + abs(cand[2] - p[2]) >= gap for p in picked):
            picked.append(cand)
        if len(picked) == DISTINGUISH_THRESHOLDS:
            break
    corrected = 1.0 - (1.0 - confidence) / len(picked)
    best: dict[str, Any] = {}
    for _, _, _, t in picked:
        fp, fn = _counts(e0, e1, t)
        eps = distinguish_lower_bound(fp, len(e0), fn, len(e1), delta, corrected)
        if not best or eps > best["epsilon_lower"]:
            best = {
                "epsilon_lower": eps,
                "threshold": t,
                "false_positives": fp,
                "false_negatives": fn,
            }
    return {**best, "negatives": len(e0), "positives": len(e1), "thresholds_tried": len(picked)}


def one_run_p_value(m: int, guesses: int, correct: int, eps: float, delta: float) -> float:
    """P-value of ``correct`` right guesses out of ``guesses`` under an (eps, delta)-DP claim
    (Steinke, Nasr and Jagielski 2023, Theorem 5.2)."""
    q = float(special.expit(eps))
    beta = float(stats.binom.sf(correct - 1, guesses, q))
    if delta == 0.0 or correct == 0:
        return beta
    i = np.arange(1, correct + 1)
    alpha = float(np.max((stats.binom.sf(correct - i - 1, guesses, q) - beta) / i, initial=0.0))
    return min(beta + alpha * delta * 2 * m, 1.0)


def one_run_lower_bound(
    m: int, guesses: int, correct: int, delta: float, significance: float
) -> float:
    """The largest eps whose (eps, delta) claim the guesses reject at this significance."""

    def rejected_by(eps: float) -> float:
        return significance - one_run_p_value(m, guesses, correct, eps, delta)

    if guesses == 0 or rejected_by(0.0) <= 0.0:
        return 0.0
    if rejected_by(_EPS_MAX) > 0.0:
        return _EPS_MAX
    return float(optimize.brentq(rejected_by, 0.0, _EPS_MAX, xtol=1e-6))


def one_run_bound(
    scores: Sequence[float], included: Sequence[bool], delta: float, confidence: float
) -> dict[str, Any]:
    """Guess "in" for the k highest scores and "out" for the k lowest, k over the fixed grid
    (Bonferroni), and bound eps from the best k."""
    s = np.asarray(scores, float)
    inc = np.asarray(included, bool)
    m = len(s)
    if m < 2 or len(inc) != m:
        raise ValueError("one_run needs a score and a coin for each of at least 2 canaries")
    order = np.argsort(s, kind="stable")
    ks = sorted({max(1, int(f * m / 2)) for f in ONE_RUN_GUESS_FRACTIONS})
    significance = (1.0 - confidence) / len(ks)
    best: dict[str, Any] = {"epsilon_lower": 0.0, "guesses": 0, "correct": 0}
    for k in ks:
        correct = int(inc[order[-k:]].sum() + (~inc[order[:k]]).sum())
        eps = one_run_lower_bound(m, 2 * k, correct, delta, significance)
        if eps > best["epsilon_lower"] or best["guesses"] == 0:
            best = {"epsilon_lower": eps, "guesses": 2 * k, "correct": correct}
    best["canaries"] = m
    best["guess_grid"] = [2 * k for k in ks]
    return best


def _unit(name: str, value: Any) -> float:
    x = float(value)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return x


def run(request: dict[str, Any]) -> dict[str, Any]:
    """The accountant command's ``audit_bound`` op: ``method`` ``distinguish`` (``calibration0``,
    ``calibration1``, ``evaluation0``, ``evaluation1``) or ``one_run`` (``scores``,
    ``included``), with ``delta`` and ``confidence``."""
    delta = _unit("delta", request.get("delta", 0.0))
    confidence = float(request.get("confidence", 0.95))
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")
    method = request.get("method")
    if method == "distinguish":
        out = distinguish_bound(
            request["calibration0"],
            request["calibration1"],
            request["evaluation0"],
            request["evaluation1"],
            delta,
            confidence,
        )
    elif method == "one_run":
        out = one_run_bound(request["scores"], request["included"], delta, confidence)
    else:
        raise ValueError(f"method must be distinguish or one_run, got {method!r}")
    return {"op": "audit_bound", "method": method, "confidence": confidence, **out}
