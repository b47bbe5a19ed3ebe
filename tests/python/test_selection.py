"""dpsql.selection: the privacy of private selection (dpsql.tune), against the papers' closed
forms, dp-accounting's own event, and the exact privacy loss of a selection small enough to
compute by hand."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant, compute_epsilon

from dpsql import accountant_requests, selection
from dpsql.accounting import _REPLACE_ONE_ORDERS
from dpsql.ledger_events import EpsilonDeltaDpEvent, to_json

ORDERS = np.asarray(_REPLACE_ONE_ORDERS, dtype=np.float64)


def test_liu_talwar_is_three_epsilon() -> None:
    assert selection.liu_talwar_epsilon(0.25) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        selection.liu_talwar_epsilon(0)


@pytest.mark.parametrize(("z", "mean", "delta"), [(4.0, 4, 1e-6), (10.0, 20, 1e-5), (2.0, 2, 1e-7)])
def test_papernot_steinke_theorem_2_closed_form(z, mean, delta) -> None:
    """Theorem 2 with eta = 1 (geometric, gamma = 1/mean, E[K] = mean), written out here for a
    Gaussian run of replace-one curve eps(a) = 2a / z^2 (sensitivity 2, noise z), then the
    monotone envelope and dp-accounting's RDP-to-DP conversion."""
    run = 2 * ORDERS / z**2
    gamma = 1 / mean
    c = 2 * np.min((1 - 1 / ORDERS) * run + math.log(1 / gamma) / ORDERS)
    out = np.where(ORDERS > 1, run + c + math.log(mean) / np.maximum(ORDERS - 1, 1e-300), np.inf)
    out = np.array([out[a <= ORDERS].min() for a in ORDERS])
    expected, _ = compute_epsilon(ORDERS, out, delta)
    got, _ = selection.selection_epsilon([dp_accounting.GaussianDpEvent(z)], mean, delta)
    assert got == pytest.approx(expected, rel=1e-9)


def test_it_is_dp_accountings_repeat_and_select_event() -> None:
    """For a Gaussian run, the bound is exactly dp-accounting's RepeatAndSelectDpEvent (the
    replace-one factor 2 folded into the noise, as the ledger does)."""
    z, mean, delta = 3.0, 5, 1e-6
    acc = RdpAccountant(list(ORDERS), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_event.RepeatAndSelectDpEvent(dp_accounting.GaussianDpEvent(z / 2), mean, 1))
    got, _ = selection.selection_epsilon([dp_accounting.GaussianDpEvent(z)], mean, delta)
    assert got == pytest.approx(acc.get_epsilon(delta), rel=1e-9)


def test_a_run_is_bounded_by_its_worst_candidate() -> None:
    strong, weak = dp_accounting.GaussianDpEvent(8.0), dp_accounting.GaussianDpEvent(2.0)
    both = selection.selection_epsilon([strong, weak], 4, 1e-6)[0]
    assert both == pytest.approx(selection.selection_epsilon([weak], 4, 1e-6)[0])
    assert both > selection.selection_epsilon([strong], 4, 1e-6)[0]


def test_the_selection_costs_more_than_one_run() -> None:
    event = dp_accounting.GaussianDpEvent(5.0)
    one = dp_accounting.GaussianDpEvent(5.0 / 2)
    acc = RdpAccountant(list(ORDERS), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(one)
    single = acc.get_epsilon(1e-6)
    assert selection.selection_epsilon([event], 1, 1e-6)[0] >= single
    assert (
        selection.selection_epsilon([event], 10, 1e-6)[0]
        > selection.selection_epsilon([event], 2, 1e-6)[0]
    )


def _exact_selection_epsilon(eps0: float, gamma: float) -> float:
    """The exact privacy loss of random stopping over randomized response.

    One run answers 1 with probability e^eps0 / (1 + e^eps0) on D and 1 / (1 + e^eps0) on D'
    (eps0-DP, replace-one), its score is its answer, and the best of the runs is 1 unless every
    run answered 0: P(0) = sum_k gamma (1 - gamma)^(k-1) p^k = gamma p / (1 - (1 - gamma) p).
    """
    hi, lo = math.exp(eps0) / (1 + math.exp(eps0)), 1 / (1 + math.exp(eps0))

    def zero(p: float) -> float:
        return gamma * p / (1 - (1 - gamma) * p)

    # D answers 0 with probability 1 - hi, D' with 1 - lo; the worst log ratio of both outputs
    p0, q0 = zero(1 - hi), zero(1 - lo)
    return max(abs(math.log(p0 / q0)), abs(math.log((1 - p0) / (1 - q0))))


@pytest.mark.parametrize(("eps0", "mean"), [(0.1, 2), (0.5, 4), (1.0, 10), (2.0, 50)])
def test_the_bounds_hold_on_a_selection_computed_exactly(eps0, mean) -> None:
    """Brute force where the two meet: random stopping over randomized response, its exact
    epsilon, under Liu-Talwar's 3 eps0 and (delta 1e-9, so almost pure) Papernot-Steinke's."""
    exact = _exact_selection_epsilon(eps0, 1 / mean)
    assert exact <= selection.liu_talwar_epsilon(eps0)
    ps, _ = selection.selection_epsilon([EpsilonDeltaDpEvent(eps0, 0.0)], mean, 1e-9)
    assert exact <= ps
    assert exact > eps0 / 2  # (the exact loss is not trivially small: the test has power)


def test_run_epsilon_for_inverts_the_bound() -> None:
    e = selection.run_epsilon_for(1.0, 4, 1e-6)
    assert 0 < e < 1
    total = selection.selection_epsilon([EpsilonDeltaDpEvent(e, 0.0)], 4, 1e-6)[0]
    assert total == pytest.approx(1.0, rel=1e-4) and total <= 1.0
    assert selection.run_epsilon_for(1e-4, 100, 1e-12) == 0.0  # the log terms alone exceed it


def test_candidates_without_a_curve_are_refused() -> None:
    with pytest.raises(ValueError, match="no Renyi curve"):
        selection.selection_epsilon([EpsilonDeltaDpEvent(1.0, 1e-6)], 4, 1e-6)


def test_the_accountant_command_answers_select() -> None:
    status, out = accountant_requests.answer(
        json.dumps(
            {
                "op": "select",
                "events": [to_json(dp_accounting.GaussianDpEvent(4.0))],
                "mean": 3,
                "delta": 1e-6,
            }
        )
    )
    assert status == 0 and out["epsilon"] == pytest.approx(
        selection.selection_epsilon([dp_accounting.GaussianDpEvent(4.0)], 3, 1e-6)[0]
    )
    _, out = accountant_requests.answer(json.dumps({"op": "select", "pure_epsilon": 0.2}))
    assert out["epsilon"] == pytest.approx(0.6)
    status, out = accountant_requests.answer(json.dumps({"op": "select", "bogus": 1}))
    assert status == 2 and "unknown keys" in out["error"]
