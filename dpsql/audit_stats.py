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
``dirac`` (white-box canaries of the SGD family, over one run or a few)
    The same guessing game on Dirac canaries, with the counts (``canaries``, and ``correct`` of
    each of the ``guesses`` highest scores) sent by the server. ``test="dp"`` bounds eps by
    Steinke et al.'s Theorem 5.2 as above. ``test="gdp"`` tests the claim as mu-GDP instead
    (Mahloujifar, Melis and Chaudhuri 2025, "Auditing f-differential privacy in one run": an
    f-DP mechanism's guesses obey a bound that reads the whole trade-off curve, not one
    (eps, delta) point), and reports the eps at delta of the largest mu rejected: valid for
    mechanisms that are exact compositions of Gaussians, such as shuffled DP-SGD.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize, special, stats  # type: ignore[import-untyped]

__all__ = [
    "clopper_pearson_upper",
    "dirac_bound",
    "fdp_one_run_rejects",
    "gdp_one_run_lower_bound",
    "gdp_epsilon",
    "gdp_lower_bound",
    "distinguish_bound",
    "distinguish_counts",
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


def gdp_lower_bound(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    confidence: float,
) -> float:
    """The mu that observed error counts of one threshold test force on a mu-GDP mechanism
    (Dong, Roth and Su 2022): every test of one has FNR >= Phi(Phi^-1(1 - FPR) - mu), so
    mu >= Phi^-1(1 - FPR) - Phi^-1(FNR), here with both rates at their upper confidence
    bounds."""
    half = (1.0 - confidence) / 2.0
    fpr = clopper_pearson_upper(false_positives, negatives, half)
    fnr = clopper_pearson_upper(false_negatives, positives, half)
    if fpr >= 1.0 or fnr >= 1.0:
        return 0.0
    return max(0.0, float(stats.norm.isf(fpr) - stats.norm.ppf(fnr)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon of a mu-GDP mechanism at delta: delta(eps) = Phi(-eps/mu + mu/2) -
    e^eps Phi(-eps/mu - mu/2)."""
    if mu <= 0.0:
        return 0.0

    def excess(eps: float) -> float:
        tail = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(
            -eps / mu - mu / 2
        )
        return float(tail) - delta

    if excess(0.0) <= 0.0:
        return 0.0
    if excess(_EPS_MAX) > 0.0:
        return _EPS_MAX
    hi = 1.0
    while excess(hi) > 0.0:
        hi *= 2
    return float(optimize.brentq(excess, 0.0, min(hi, _EPS_MAX), xtol=1e-9))


def _upper(k: np.ndarray, n: int, significance: float) -> np.ndarray:
    """clopper_pearson_upper of many counts."""
    b = np.maximum(n - k, 1)
    upper: np.ndarray = np.where(k < n, stats.beta.ppf(1.0 - significance, k + 1, b), 1.0)
    return upper


def _bounds(
    fp: np.ndarray, neg: int, fn: np.ndarray, pos: int, delta: float, confidence: float, test: str
) -> np.ndarray:
    """distinguish_lower_bound (test "dp") or gdp_lower_bound (test "gdp") of many counts."""
    half = (1.0 - confidence) / 2.0
    fpr, fnr = _upper(fp, neg, half), _upper(fn, pos, half)
    with np.errstate(divide="ignore", invalid="ignore"):
        if test == "gdp":
            mu = stats.norm.isf(fpr) - stats.norm.ppf(fnr)
            out: np.ndarray = np.where((fpr < 1) & (fnr < 1), np.maximum(mu, 0.0), 0.0)
            return out
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
        best: np.ndarray = np.nan_to_num(np.maximum(np.maximum(a, b), 0.0), nan=0.0, posinf=0.0)
        return best


# Thresholds carried from the calibration half to the evaluation half (Bonferroni-corrected):
# more than one blunts the winner's curse of a single threshold picked in a noisy tail.
DISTINGUISH_THRESHOLDS = 5


def distinguish_bound(
    calibration0: Sequence[float] | np.ndarray,
    calibration1: Sequence[float] | np.ndarray,
    evaluation0: Sequence[float] | np.ndarray,
    evaluation1: Sequence[float] | np.ndarray,
    delta: float,
    confidence: float,
    test: str = "dp",
) -> dict[str, Any]:
    """:func:`distinguish_counts` with every calibration score as a candidate threshold."""
    c0, c1 = np.asarray(calibration0, float), np.asarray(calibration1, float)
    e0, e1 = np.asarray(evaluation0, float), np.asarray(evaluation1, float)
    if min(len(c0), len(c1), len(e0), len(e1)) == 0:
        raise ValueError("distinguish needs scores of both datasets in both halves")
    thresholds = np.unique(np.concatenate([c0, c1]))

    def counts(s0: np.ndarray, s1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # D0 scored above t (false positives), D1 at or below t (false negatives)
        fp = len(s0) - np.searchsorted(np.sort(s0), thresholds, side="right")
        return fp, np.searchsorted(np.sort(s1), thresholds, side="right")

    fp_c, fn_c = counts(c0, c1)
    fp_e, fn_e = counts(e0, e1)
    out = distinguish_counts(
        fp_c, fn_c, (len(c0), len(c1)), fp_e, fn_e, (len(e0), len(e1)), delta, confidence, test
    )
    out["threshold"] = float(thresholds[out.pop("candidate")])
    return out


def distinguish_counts(
    fp_calibration: Sequence[int] | np.ndarray,
    fn_calibration: Sequence[int] | np.ndarray,
    calibration_sizes: tuple[int, int],
    fp_evaluation: Sequence[int] | np.ndarray,
    fn_evaluation: Sequence[int] | np.ndarray,
    evaluation_sizes: tuple[int, int],
    delta: float,
    confidence: float,
    test: str = "dp",
) -> dict[str, Any]:
    """The bound from the error counts of candidate thresholds (D1 expected higher) on the
    calibration half and on the evaluation half of the runs. The thresholds picked are those
    with the best bound on the calibration half itself, kept apart (their calibration error
    counts differ by at least 5% of the runs); each is judged on the evaluation half at
    significance / their number, and the best bound is reported.

    ``test="gdp"`` bounds mu instead (valid for mechanisms whose guarantee is a composition of
    Gaussians, which are exactly mu-GDP) and reports the epsilon at delta of that mu: it reads
    the middle of the distributions, where a tail test needs far more runs."""
    if test not in ("dp", "gdp"):
        raise ValueError(f"test must be dp or gdp, got {test!r}")
    fp_c, fn_c = np.asarray(fp_calibration, int), np.asarray(fn_calibration, int)
    fp_e, fn_e = np.asarray(fp_evaluation, int), np.asarray(fn_evaluation, int)
    (n0c, n1c), (n0e, n1e) = calibration_sizes, evaluation_sizes
    if not (len(fp_c) == len(fn_c) == len(fp_e) == len(fn_e) > 0) or min(n0c, n1c, n0e, n1e) < 1:
        raise ValueError("distinguish needs counts of the same candidates in both halves")
    values = _bounds(fp_c, n0c, fn_c, n1c, delta, confidence, test)
    order = sorted(range(len(values)), key=lambda j: -values[j])
    gap = 0.05 * (n0c + n1c) / 2
    picked: list[int] = []
    for j in order:
        if all(abs(fp_c[j] - fp_c[p]) + abs(fn_c[j] - fn_c[p]) >= gap for p in picked):
            picked.append(j)
        if len(picked) == DISTINGUISH_THRESHOLDS:
            break
    corrected = 1.0 - (1.0 - confidence) / len(picked)
    judged = _bounds(fp_e[picked], n0e, fn_e[picked], n1e, delta, corrected, test)
    k = int(np.argmax(judged))
    j = picked[k]
    out: dict[str, Any] = {
        "candidate": j,
        "false_positives": int(fp_e[j]),
        "false_negatives": int(fn_e[j]),
        "negatives": n0e,
        "positives": n1e,
        "thresholds_tried": len(picked),
        "test": test,
    }
    if test == "gdp":
        out["mu_lower"] = float(judged[k])
        out["epsilon_lower"] = gdp_epsilon(float(judged[k]), delta)
    else:
        out["epsilon_lower"] = float(judged[k])
    return out


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
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    delta: float,
    confidence: float,
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


def fdp_one_run_rejects(mu: float, m: int, guesses: int, correct: int, significance: float) -> bool:
    """Whether ``correct`` right guesses among ``guesses`` (all "in") of ``m`` canaries with
    fair coins reject mu-GDP at this significance (Mahloujifar, Melis and Chaudhuri 2025).

    Their bound for an f-DP mechanism: walk back from the observed counts, turning the mass
    ``r`` of right guesses into the least mass ``h`` of wrong ones that f allows (for
    G_mu, h >= Phi(Phi^-1(r) - mu)), one right guess at a time; the claim is rejected when
    the masses exceed the guesses' share ``guesses / m`` of the canaries."""
    if not (0 < guesses <= m and 0 <= correct <= guesses):
        raise ValueError("need 0 < guesses <= canaries and 0 <= correct <= guesses")
    right = significance * correct / m
    wrong = significance * (guesses - correct) / m
    for i in range(correct - 1, -1, -1):
        least = max(wrong, float(special.ndtr(special.ndtri(right) - mu)))
        if least == wrong:
            break  # neither mass moves again
        right = min(right + i / (guesses - i) * (least - wrong), 1.0)
        wrong = least
    return right + wrong > guesses / m


def gdp_one_run_lower_bound(m: int, guesses: int, correct: int, significance: float) -> float:
    """The largest mu whose mu-GDP claim the guesses reject (0 when none is)."""
    if not fdp_one_run_rejects(1e-6, m, guesses, correct, significance):
        return 0.0
    lo, hi = 1e-6, 1.0
    while fdp_one_run_rejects(hi, m, guesses, correct, significance):
        lo, hi = hi, hi * 2
        if hi > _EPS_MAX:
            return _EPS_MAX
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        if fdp_one_run_rejects(mid, m, guesses, correct, significance):
            lo = mid
        else:
            hi = mid
    return lo


def dirac_bound(
    canaries: int,
    guesses: Sequence[int],
    correct: Sequence[int],
    delta: float,
    confidence: float,
    test: str = "gdp",
) -> dict[str, Any]:
    """The bound from the counts of a dirac audit: for each guess count k, the number of "in"
    canaries among the k highest scores; Bonferroni over the guess counts."""
    if test not in ("dp", "gdp"):
        raise ValueError(f"test must be dp or gdp, got {test!r}")
    m = int(canaries)
    ks, cs = [int(k) for k in guesses], [int(c) for c in correct]
    if m < 2 or not 0 < len(ks) == len(cs) <= 50:
        raise ValueError("dirac needs at least 2 canaries and 1 to 50 guess counts")
    if any(not (0 < k <= min(m, 20000) and 0 <= c <= k) for k, c in zip(ks, cs, strict=True)):
        raise ValueError(
            "each guess count must be in [1, min(canaries, 20000)], each correct in [0, k]"
        )
    significance = (1.0 - confidence) / len(ks)
    best: dict[str, Any] = {"epsilon_lower": 0.0, "guesses": ks[0], "correct": cs[0]}
    for k, c in zip(ks, cs, strict=True):
        if test == "gdp":
            mu = gdp_one_run_lower_bound(m, k, c, significance)
            eps = gdp_epsilon(mu, delta) if delta > 0 else 0.0
        else:
            mu, eps = 0.0, one_run_lower_bound(m, k, c, delta, significance)
        if eps > best["epsilon_lower"]:
            best = {"epsilon_lower": eps, "guesses": k, "correct": c}
            if test == "gdp":
                best["mu_lower"] = mu
    best.update(canaries=m, guess_grid=ks, test=test)
    return best


def _unit(name: str, value: Any) -> float:
    x = float(value)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return x


def run(request: dict[str, Any]) -> dict[str, Any]:
    """The accountant command's ``audit_bound`` op: ``method`` ``distinguish`` (error counts
    ``fp_calibration``, ``fn_calibration``, ``fp_evaluation``, ``fn_evaluation`` at candidate
    ``thresholds``, and the run counts ``calibration0``, ``calibration1``, ``evaluation0``,
    ``evaluation1``) or ``one_run`` (``scores``, ``included``), with ``delta`` and
    ``confidence`` (and ``test``, ``dp`` or ``gdp``, for distinguish)."""
    delta = _unit("delta", request.get("delta", 0.0))
    confidence = float(request.get("confidence", 0.95))
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")
    method = request.get("method")
    if method == "distinguish":
        # the server sends error counts at candidate thresholds: a few kilobytes whatever the
        # number of runs (the request is one command-line argument)
        out = distinguish_counts(
            request["fp_calibration"],
            request["fn_calibration"],
            (int(request["calibration0"]), int(request["calibration1"])),
            request["fp_evaluation"],
            request["fn_evaluation"],
            (int(request["evaluation0"]), int(request["evaluation1"])),
            delta,
            confidence,
            request.get("test", "dp"),
        )
        out["threshold"] = request.get("thresholds", [None] * (out["candidate"] + 1))[
            out["candidate"]
        ]
        del out["candidate"]
    elif method == "one_run":
        out = one_run_bound(request["scores"], request["included"], delta, confidence)
    elif method == "dirac":
        out = dirac_bound(
            request["canaries"],
            request["guesses"],
            request["correct"],
            delta,
            confidence,
            request.get("test", "gdp"),
        )
    else:
        raise ValueError(f"method must be distinguish, one_run or dirac, got {method!r}")
    return {"op": "audit_bound", "method": method, "confidence": confidence, **out}
