"""The privacy of private selection (``dpsql.tune``): run a uniformly drawn candidate a random
number of times, score each run privately, and release only the best run.

One run is the pair (train a candidate on the training dataset, score it on the validation
dataset). Its privacy is counted per dataset: on the training dataset a run is as private as
the candidate's training (the score is post-processing of the model and of rows that do not
change), on the validation dataset as private as the scoring. The candidate is drawn with
public coins, so a run's Renyi divergence at each order is at most the largest of the
candidates' (the mixture's ``exp((a - 1) D_a)`` is an average of theirs).

The number of runs is geometric: after each run, stop with probability ``gamma = 1 / mean``.

Pure candidates (every run epsilon-DP, delta 0)
    Liu and Talwar, "Private selection from private candidates", STOC 2019, Theorem 3.4: random
    stopping releases the best of the runs at ``3 epsilon`` (pure), for any ``gamma``.
Approximate candidates (Renyi curves)
    Papernot and Steinke, "Hyperparameter tuning with Renyi differential privacy", ICLR 2022,
    Theorem 2 with the truncated negative binomial of shape ``eta = 1`` (the geometric):
    ``eps'(a) = eps(a) + (1 + eta) min_b [(1 - 1/b) eps(b) + log(1/gamma) / b]
    + log(E[K]) / (a - 1)``, as dp-accounting implements it for its
    ``RepeatAndSelectDpEvent`` (``shape = 1``). The curve is converted to (epsilon, delta) by
    dp-accounting's ``compute_epsilon``.

Every curve is a replace-one curve (:mod:`dpsql.ledger_events`' convention); an (epsilon, 0)
event's curve is ``min(epsilon, a epsilon^2 / 2)`` (pure DP is ``epsilon^2 / 2``-zCDP: Bun and
Steinke, "Concentrated differential privacy", TCC 2016, Proposition 3.3). An (epsilon, delta)
event with delta > 0 has no curve: such candidates are refused.

Request (the accountant command, op ``"select"``)::

    {"op": "select", "events": [<event>, ...], "mean": 4, "delta": 1e-6}
        -> {"epsilon": <the selection's epsilon at delta>, "order": <its Renyi order>}
    {"op": "select", "pure_epsilon": 0.3}
        -> {"epsilon": 0.9}                                    (Liu-Talwar)
    {"op": "select", "run_epsilon_for": 1.0, "mean": 4, "delta": 1e-6}
        -> {"run_epsilon": <the largest pure epsilon per run whose selection is at most 1.0>}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting.rdp import compute_epsilon
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpsql.accounting import _REPLACE_ONE_ORDERS
from dpsql.ledger_events import EpsilonDeltaDpEvent, _Leaves, _number, from_json, rdp_curve
from dpsql.pld_settings import dp_accounting_version

#: The geometric distribution of the number of runs (dp-accounting's shape parameter).
GEOMETRIC = 1.0


def liu_talwar_epsilon(run_epsilon: float) -> float:
    """The epsilon of random stopping over ``run_epsilon``-DP runs (Theorem 3.4: 3 epsilon)."""
    return 3.0 * _number("run epsilon", run_epsilon, 0.0, math.inf, open_lo=True)


def run_curve(events: Sequence[dp_accounting.DpEvent]) -> np.ndarray:
    """A run's replace-one RDP curve at the accountant's orders: the pointwise largest of the
    candidates' curves (module docstring)."""
    if not events:
        raise ValueError("a selection needs at least one candidate")
    orders = np.asarray(_REPLACE_ONE_ORDERS, dtype=np.float64)
    worst = np.zeros_like(orders)
    for event in events:
        if isinstance(event, EpsilonDeltaDpEvent):
            if event.delta > 0:
                raise ValueError(
                    "a candidate known only as (epsilon, delta)-DP with delta > 0 has no Renyi "
                    "curve: the selection bound needs one"
                )
            curve = np.minimum(event.epsilon, orders * event.epsilon**2 / 2)
        else:
            leaves = _Leaves()
            leaves.add(event)
            if leaves.epsilon_delta:
                raise ValueError("a candidate's event mixes (epsilon, delta) parts: no Renyi curve")
            found = rdp_curve(leaves)
            if found is None:
                raise ValueError(f"no Renyi curve for {type(event).__name__}")
            curve = found
        worst = np.maximum(worst, curve)
    return worst


def selection_epsilon(
    events: Sequence[dp_accounting.DpEvent], mean: float, delta: float
) -> tuple[float, float]:
    """(epsilon, order) of releasing the best of a geometric number of runs (mean ``mean``)
    at ``delta``, by Papernot and Steinke's Theorem 2 (module docstring)."""
    m = _number("mean", mean, 1.0, math.inf, open_lo=False)
    d = _number("delta", delta, 0.0, 1.0, open_lo=True)
    orders = np.asarray(_REPLACE_ONE_ORDERS, dtype=np.float64)
    curve = run_curve(events)
    if not np.all(np.isfinite(curve)):
        return math.inf, math.nan
    selected = rdp_lib._compute_rdp_repeat_and_select(orders, curve, m, GEOMETRIC)
    eps, order = compute_epsilon(orders, selected, d)
    return float(eps), float(order)


def run_epsilon_for(target: float, mean: float, delta: float) -> float:
    """The largest pure epsilon per run whose selection (Papernot-Steinke, at ``delta``) is at
    most ``target``; 0 when even a run that reveals nothing exceeds it (the bound's
    ``log(E[K]) / (a - 1)`` and ``log(1 / delta) / (a - 1)`` terms)."""
    t = _number("target epsilon", target, 0.0, math.inf, open_lo=True)

    def total(e: float) -> float:
        return selection_epsilon([EpsilonDeltaDpEvent(e, 0.0)], mean, delta)[0]

    if total(1e-12) > t:
        return 0.0
    lo, hi = 1e-12, t  # a run is at most the whole: total(t) >= t
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if total(mid) <= t:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-6:
            break
    return lo


# ---------------------------------------------------------------------------------------------
# The accountant command's op "select"

_KEYS = {"op", "events", "mean", "delta", "pure_epsilon", "run_epsilon_for"}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Answer one ``select`` request (module docstring)."""
    unknown = sorted(set(request) - _KEYS)
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    if "pure_epsilon" in request:
        return {"op": "select", "epsilon": liu_talwar_epsilon(request["pure_epsilon"])}
    if "run_epsilon_for" in request:
        e = run_epsilon_for(request["run_epsilon_for"], request["mean"], request["delta"])
        return {"op": "select", "run_epsilon": e}
    events = request.get("events")
    if not isinstance(events, list):
        raise ValueError("events must be a list of events")
    eps, order = selection_epsilon(
        [from_json(e) for e in events], request["mean"], request["delta"]
    )
    return {
        "op": "select",
        "epsilon": eps if math.isfinite(eps) else None,
        "order": order if math.isfinite(order) else None,
        "dp_accounting": dp_accounting_version(),
    }
