"""The DP-SGD privacy accountant (dpsql/accounting.py), a thin layer over dp-accounting.

Test vectors (the Gaussian composition rule of Thakurta, "Private Optimization", §6.3.1, and the
RDP of the Poisson-subsampled Gaussian, Mironov, Talwar and Zhang 2019), the replace-one
trap of dp-accounting, shuffle vs Poisson, calibration, and the command line used by the server.
No database needed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

dpa = pytest.importorskip("dp_accounting")
from dp_accounting.pld import PLDAccountant  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402

from dpsql import accountant_requests  # noqa: E402
from dpsql import accounting as acc  # noqa: E402

NR = dpa.NeighboringRelation
DELTA = 1e-5

# RDP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019): (q, z, T) -> epsilon,
# add/remove, integer orders 2..256, standard conversion, delta = 1e-5, and the best order.
SPEC_VECTORS = [
    (250 / 60000, 1.3, 3600, 1.180, 17),
    (256 / 60000, 1.1, 14062, 3.009, 9),
]


def _standard_conversion(orders, rdp, delta):
    """epsilon = min_a [rdp_a + ln(1/delta) / (a - 1)] (Mironov 2017, Proposition 3)."""
    eps = [r + math.log(1 / delta) / (a - 1) for a, r in zip(orders, rdp, strict=True)]
    i = int(np.argmin(eps))
    return eps[i], orders[i]


def _strictly(op, values):
    return all(op(a, b) for a, b in zip(values, values[1:], strict=False))


# ---------------------------------------------------------------- RDP vectors


@pytest.mark.parametrize(("q", "z", "steps", "expected", "order"), SPEC_VECTORS)
def test_spec_rdp_vectors_integer_orders_standard_conversion(q, z, steps, expected, order):
    mech = acc.mechanism(z, scheme="poisson", steps=steps, sampling_rate=q)
    # The add/remove view of the run is the vectors' Poisson-subsampled Gaussian.
    assert mech.add_remove_event == dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps
    )
    orders = list(range(2, 257))
    rdp = RdpAccountant(orders).compose(mech.add_remove_event).rdp
    eps, best = _standard_conversion(orders, rdp, DELTA)
    assert eps == pytest.approx(expected, abs=5e-4)
    assert best == order
    # dp-accounting's improved conversion (and fractional orders) can only be smaller.
    ours = acc.epsilon(
        z, scheme="poisson", steps=steps, sampling_rate=q, delta=DELTA, accountant="rdp_add_remove"
    )
    assert ours <= RdpAccountant(orders).compose(mech.add_remove_event).get_epsilon(DELTA) <= eps


@pytest.mark.parametrize(
    ("q", "z", "steps", "add_remove", "pld", "rdp"),
    [
        (250 / 60000, 1.3, 3600, 0.9422, 1.5351, 2.0413),
        (256 / 60000, 1.1, 14062, 2.5966, 4.2214, 5.7797),
    ],
)
def test_spec_vectors_through_the_module(q, z, steps, add_remove, pld, rdp):
    """The add/remove reference (improved conversion, fractional orders) is below the
    integer-order figure; the replace-one guarantees are larger."""
    kw = dict(scheme="poisson", steps=steps, sampling_rate=q, delta=DELTA)
    eps_ar = acc.epsilon(z, accountant="rdp_add_remove", **kw)
    eps_pld = acc.epsilon(z, **kw)
    eps_rdp = acc.epsilon(z, accountant="rdp", **kw)
    assert eps_ar == pytest.approx(add_remove, abs=1e-3)
    assert eps_pld == pytest.approx(pld, abs=1e-3)
    assert eps_rdp == pytest.approx(rdp, abs=1e-3)
    # Replace-one costs more than add/remove; the RDP bound is looser than PLD, not absurdly.
    assert eps_ar < eps_pld < eps_rdp < 1.5 * eps_pld


def test_q_one_is_plain_gaussian_composition():
    z, steps = 5.0, 10
    orders = np.arange(2, 65)
    # Spec item 11: with q = 1 the subsampled-Gaussian RDP is T a / (2 z^2).
    rdp = (
        RdpAccountant(orders)
        .compose(
            dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(1.0, dpa.GaussianDpEvent(z)), steps)
        )
        .rdp
    )
    np.testing.assert_allclose(rdp, steps * orders / (2 * z**2), rtol=1e-12)
    kw = dict(scheme="poisson", steps=steps, sampling_rate=1.0, delta=DELTA)
    gaussian = RdpAccountant().compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), steps))
    assert acc.epsilon(z, accountant="rdp_add_remove", **kw) == pytest.approx(
        gaussian.get_epsilon(DELTA), rel=1e-12
    )
    # Replace-one: every record in every step is T Gaussians of sensitivity 2C, as for a shuffle
    # with T epochs.
    for accountant in ("pld", "rdp"):
        assert acc.epsilon(z, accountant=accountant, **kw) == pytest.approx(
            acc.epsilon(z, scheme="shuffle", epochs=steps, delta=DELTA, accountant=accountant),
            rel=1e-12,
        )
    # ... whose RDP is the zCDP line rho a with rho = T / (2 (z/2)^2).
    mech = acc.mechanism(z, scheme="poisson", steps=steps, sampling_rate=1.0)
    np.testing.assert_allclose(
        RdpAccountant(orders).compose(mech.event).rdp, orders * steps * 2 / z**2, rtol=1e-12
    )


# ---------------------------------------------------------------- Gaussian composition rule


@pytest.mark.parametrize("steps", [1, 100])
def test_spec_noise_multiplier_vectors_cross_check(steps):
    """Section 1.3 item 1: GaussNoiseMult and the tight zCDP inversion lambda* make T releases of
    sensitivity L (1, 1e-5)-DP. In replace-one the sensitivity is 2C, so z = 2 lambda; PLD and RDP
    are at least as tight as zCDP and the analytic Gaussian is exact."""
    book = math.sqrt(2 * steps * (math.log(1 / DELTA) + 1))
    rho = (math.sqrt(1 + math.log(1 / DELTA)) - math.sqrt(math.log(1 / DELTA))) ** 2
    tight = math.sqrt(steps / (2 * rho))
    assert book == pytest.approx(5.002584 * math.sqrt(steps), abs=1e-5)
    assert tight == pytest.approx(4.900555 * math.sqrt(steps), abs=1e-5)
    assert rho == pytest.approx(0.0208199, abs=1e-7)
    for lam in (book, tight):
        for accountant in ("pld", "rdp"):
            assert (
                acc.epsilon(
                    2 * lam, scheme="shuffle", epochs=steps, delta=DELTA, accountant=accountant
                )
                <= 1.0
            )
    z = acc.calibrate(1.0, DELTA, scheme="shuffle", epochs=steps)
    assert z <= 2 * tight
    # k Gaussians of std z C and sensitivity 2C are one Gaussian of std z / (2 sqrt(k)).
    analytic = 2 * math.sqrt(steps) * dpa.get_sigma_gaussian(1.0, DELTA)
    assert z == pytest.approx(analytic, rel=1e-4)
    z_rdp = acc.calibrate(1.0, DELTA, scheme="shuffle", epochs=steps, accountant="rdp")
    assert z < z_rdp <= 2 * tight
    # The Gaussian RDP curve is the zCDP line: rho = k / (2 (z/2)^2).
    mech = acc.mechanism(2 * tight, scheme="shuffle", epochs=steps)
    orders = np.arange(2, 33)
    np.testing.assert_allclose(
        RdpAccountant(orders).compose(mech.event).rdp, rho * orders, rtol=1e-9
    )


# ---------------------------------------------------------------- the REPLACE_ONE trap


@pytest.mark.parametrize(("z", "k"), [(2.0, 1), (6.0, 10)])
def test_dp_accounting_replace_one_trap(z, k):
    """PLD(REPLACE_ONE) doubles a Gaussian's sensitivity; RDP(REPLACE_ONE) does not, and refuses
    Poisson sampling. The module folds the factor 2 into z / 2 for Gaussians."""
    gauss = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), k)
    folded = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z / 2), k)

    def eps(accountant_cls, relation, event):
        return accountant_cls(neighboring_relation=relation).compose(event).get_epsilon(DELTA)

    pld_replace = eps(PLDAccountant, NR.REPLACE_ONE, gauss)
    pld_folded = eps(PLDAccountant, NR.ADD_OR_REMOVE_ONE, folded)
    assert pld_replace == pytest.approx(pld_folded, rel=1e-3)
    assert pld_replace > 1.8 * eps(PLDAccountant, NR.ADD_OR_REMOVE_ONE, gauss)
    # The trap: RdpAccountant(REPLACE_ONE) returns the add/remove value.
    rdp_replace = eps(RdpAccountant, NR.REPLACE_ONE, gauss)
    assert rdp_replace == eps(RdpAccountant, NR.ADD_OR_REMOVE_ONE, gauss)
    assert rdp_replace < 0.6 * eps(RdpAccountant, NR.ADD_OR_REMOVE_ONE, folded)
    # The module charges the doubled sensitivity with both accountants.
    kw = dict(scheme="shuffle", epochs=k, delta=DELTA)
    assert acc.epsilon(z, **kw) == pytest.approx(pld_replace, rel=1e-9)
    assert acc.epsilon(z, accountant="rdp", **kw) == pytest.approx(
        eps(RdpAccountant, NR.ADD_OR_REMOVE_ONE, folded), rel=1e-12
    )
    assert acc.epsilon(z, accountant="rdp", **kw) > acc.epsilon(z, **kw)
    poisson = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(z))
    assert not RdpAccountant(neighboring_relation=NR.REPLACE_ONE).supports(poisson)
    assert PLDAccountant(NR.REPLACE_ONE).supports(poisson)
    mech = acc.mechanism(z, scheme="poisson", steps=10, sampling_rate=0.01)
    assert mech.relation == NR.REPLACE_ONE and mech.event.event == poisson


@pytest.mark.parametrize(
    ("q", "z", "steps"), [(0.01, 1.0, 1000), (0.1, 2.0, 100), (0.001, 1.58, 20000), (0.5, 3.0, 20)]
)
def test_replace_one_rdp_bound_is_above_pld(q, z, steps):
    """The remove-then-add RDP bound is sound: never below the (near exact) PLD value, and above
    the add/remove RDP curve it is built from."""
    kw = dict(scheme="poisson", steps=steps, sampling_rate=q, delta=DELTA)
    eps_pld = acc.epsilon(z, **kw)
    eps_rdp = acc.epsilon(z, accountant="rdp", **kw)
    assert eps_pld <= eps_rdp <= 2 * eps_pld
    mech = acc.mechanism(z, scheme="poisson", steps=steps, sampling_rate=q)
    bound = acc.ReplaceOneRdpBound().compose(mech.event)
    add_remove = RdpAccountant(bound.orders).compose(mech.add_remove_event)
    # (dp-accounting drops fractional orders whose series does not converge: inf.)
    both = np.isfinite(bound.rdp) & np.isfinite(add_remove.rdp)
    assert both.sum() > 50
    assert np.all(bound.rdp[both] >= add_remove.rdp[both])
    assert bound.get_epsilon(DELTA) == eps_rdp


# ---------------------------------------------------------------- shuffle is not Poisson


def test_shuffle_is_accounted_without_amplification():
    """m = 60000, b = 250, 15 epochs, z = 1.3: the same training as the first RDP vector, once
    with shuffled disjoint batches and once with Poisson sampling at q = b/m."""
    m, b, k, z = 60000, 250, 15, 1.3
    shuffle = acc.epsilon(z, scheme="shuffle", epochs=k, delta=DELTA)
    poisson = acc.epsilon(z, scheme="poisson", steps=k * m // b, sampling_rate=b / m, delta=DELTA)
    assert poisson == pytest.approx(1.535, abs=1e-3)
    assert shuffle > 20 * poisson
    # Exactly k Gaussians of sensitivity 2C: the analytic Gaussian of std z / (2 sqrt(k)).
    assert shuffle == pytest.approx(
        dpa.get_epsilon_gaussian(z / (2 * math.sqrt(k)), DELTA), rel=1e-4
    )
    assert acc.mechanism(z, scheme="shuffle", epochs=k).event == dpa.SelfComposedDpEvent(
        dpa.GaussianDpEvent(z / 2), k
    )
    # A shuffle never takes Poisson parameters.
    with pytest.raises(ValueError, match="shuffle"):
        acc.epsilon(z, scheme="shuffle", epochs=k, sampling_rate=b / m, delta=DELTA)
    with pytest.raises(ValueError, match="shuffle"):
        acc.epsilon(z, scheme="shuffle", steps=k * m // b, delta=DELTA)


# ---------------------------------------------------------------- monotonicity and calibration


@pytest.mark.parametrize(
    ("kw", "noise"),
    [
        (dict(scheme="shuffle", epochs=5), (3, 4, 6, 10, 16)),
        (dict(scheme="poisson", steps=500, sampling_rate=0.02), (1, 1.5, 2, 4, 8)),
    ],
)
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_epsilon_decreasing_in_noise(kw, noise, accountant):
    eps = [acc.epsilon(z, delta=DELTA, accountant=accountant, **kw) for z in noise]
    assert _strictly(lambda a, b: a > b, eps)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_epsilon_increasing_in_steps(accountant):
    shuffle = [
        acc.epsilon(8.0, scheme="shuffle", epochs=k, delta=DELTA, accountant=accountant)
        for k in (1, 2, 5, 20)
    ]
    poisson = [
        acc.epsilon(
            1.0, scheme="poisson", steps=t, sampling_rate=0.01, delta=DELTA, accountant=accountant
        )
        for t in (10, 100, 1000)
    ]
    assert _strictly(lambda a, b: a < b, shuffle)
    assert _strictly(lambda a, b: a < b, poisson)
    # More sampling, more loss.
    assert (
        acc.epsilon(
            1.0, scheme="poisson", steps=100, sampling_rate=0.02, delta=DELTA, accountant=accountant
        )
        > poisson[1]
    )


@pytest.mark.parametrize(
    ("kw", "target", "accountant"),
    [
        (dict(scheme="shuffle", epochs=3), 2.0, "pld"),
        (dict(scheme="shuffle", epochs=3), 2.0, "rdp"),
        (dict(scheme="poisson", steps=1000, sampling_rate=0.01), 1.0, "pld"),
        (dict(scheme="poisson", steps=1000, sampling_rate=0.01), 1.0, "rdp"),
    ],
)
def test_calibrate_round_trip(kw, target, accountant):
    z = acc.calibrate(target, DELTA, accountant=accountant, **kw)
    assert acc.epsilon(z, delta=DELTA, accountant=accountant, **kw) <= target
    # Tight: 0.1% less noise overspends.
    assert acc.epsilon(z * (1 - 1e-3), delta=DELTA, accountant=accountant, **kw) > target
    assert acc.epsilon(2 * z, delta=DELTA, accountant=accountant, **kw) < target
    if accountant == "rdp" and kw["scheme"] == "shuffle":
        # The looser accountant needs more noise.
        assert z > acc.calibrate(target, DELTA, **kw)


def test_calibrate_refuses_the_add_remove_reference():
    with pytest.raises(ValueError, match="replace-one"):
        acc.calibrate(1.0, DELTA, scheme="shuffle", epochs=1, accountant="rdp_add_remove")


# ---------------------------------------------------------------- validation and report


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        (dict(noise_multiplier=0.0), ValueError),
        (dict(noise_multiplier=-1.0), ValueError),
        (dict(noise_multiplier=math.nan), ValueError),
        (dict(noise_multiplier=math.inf), ValueError),
        (dict(noise_multiplier="1"), TypeError),
        (dict(noise_multiplier=True), TypeError),
        (dict(delta=0.0), ValueError),
        (dict(delta=1.0), ValueError),
        (dict(delta=-1e-5), ValueError),
        (dict(delta=math.nan), ValueError),
        (dict(epochs=0), ValueError),
        (dict(epochs=2.0), TypeError),
        (dict(epochs=True), TypeError),
        (dict(epochs=None), ValueError),
        (dict(scheme="bst14"), ValueError),
        (dict(scheme="scs13"), ValueError),
        (dict(scheme="uniform"), ValueError),
        (dict(accountant="moments"), ValueError),
        (dict(scheme="poisson", epochs=None, steps=10, sampling_rate=0.0), ValueError),
        (dict(scheme="poisson", epochs=None, steps=10, sampling_rate=1.5), ValueError),
        (dict(scheme="poisson", epochs=None, steps=10, sampling_rate=math.nan), ValueError),
        (dict(scheme="poisson", epochs=None, steps=0, sampling_rate=0.1), ValueError),
        (dict(scheme="poisson", epochs=None, steps=10), ValueError),
        (dict(scheme="poisson", epochs=3, steps=10, sampling_rate=0.1), ValueError),
    ],
)
def test_epsilon_validates_its_input(kw, error):
    args = dict(noise_multiplier=1.0, scheme="shuffle", epochs=2, delta=DELTA)
    args.update(kw)
    z = args.pop("noise_multiplier")
    with pytest.raises(error):
        acc.epsilon(z, **args)


@pytest.mark.parametrize(
    ("target", "delta"),
    [(0.0, DELTA), (-1.0, DELTA), (math.inf, DELTA), (math.nan, DELTA), (1.0, 1.0), (1.0, 0.0)],
)
def test_calibrate_validates_its_input(target, delta):
    with pytest.raises(ValueError):
        acc.calibrate(target, delta, scheme="shuffle", epochs=1)


def test_report():
    rep = acc.report(1.3, scheme="poisson", steps=3600, sampling_rate=250 / 60000, delta=DELTA)
    assert rep["epsilon_pld"] == pytest.approx(1.5351, abs=1e-3)
    assert rep["epsilon_rdp"] == pytest.approx(2.0413, abs=1e-3)
    assert rep["epsilon_rdp_add_remove"] == pytest.approx(0.9422, abs=1e-3)
    assert rep["relation_pld"].startswith("replace-one")
    assert rep["relation_rdp"].startswith("replace-one")
    assert "not the replace-one guarantee" in rep["relation_rdp_add_remove"]
    assert rep["dp_event_relation"] == "REPLACE_ONE"
    assert (rep["scheme"], rep["steps"], rep["sampling_rate"]) == ("poisson", 3600, 250 / 60000)
    assert (rep["noise_multiplier"], rep["delta"]) == (1.3, DELTA)
    assert rep["accountant_versions"]["dp_accounting"].startswith("0.")
    shuffle = acc.report(8.0, scheme="shuffle", epochs=4, delta=DELTA)
    assert shuffle["unit_sensitivity_noise_multiplier"] == 4.0
    assert shuffle["dp_event_relation"] == "ADD_OR_REMOVE_ONE"
    assert shuffle["epsilon_pld"] < shuffle["epsilon_rdp"]
    assert shuffle["epsilon_rdp_add_remove"] < 0.6 * shuffle["epsilon_pld"]
    json.dumps(rep, allow_nan=False)


# ---------------------------------------------------------------- command line


def _cli(request: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpsql.accounting", request],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_subprocess():
    """As the server calls it: nulls for absent keys, one JSON line, nothing on stderr (the
    server reads 2>&1)."""
    request = {
        "op": "calibrate",
        "scheme": "shuffle",
        "delta": DELTA,
        "target_epsilon": 2,
        "noise_multiplier": None,
        "epochs": 3,
        "steps": None,
        "sampling_rate": None,
    }
    done = _cli(json.dumps(request))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "" and done.stdout.count("\n") == 1
    out = json.loads(done.stdout)
    assert out["noise_multiplier"] == acc.calibrate(2.0, DELTA, scheme="shuffle", epochs=3)
    assert out["epsilon"] == out["epsilon_pld"] <= 2.0
    assert out["epsilon_rdp"] > out["epsilon_pld"]
    assert out["accountant"] == "pld" and out["dp_accounting"].startswith("0.")

    done = _cli(
        '{"op": "epsilon", "scheme": "shuffle", "epochs": 3, "delta": 2, "noise_multiplier": 1}'
    )
    assert done.returncode == 2 and done.stderr == ""
    assert "delta" in json.loads(done.stdout)["error"]


def _main(capsys, request) -> tuple[int, dict]:
    line = request if isinstance(request, str) else json.dumps(request)
    status = accountant_requests.main([line])
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return status, json.loads(out)


def test_cli_ops(capsys):
    kw = {"scheme": "poisson", "steps": 3600, "sampling_rate": 250 / 60000, "delta": DELTA}
    status, out = _main(capsys, {"op": "epsilon", "noise_multiplier": 1.3, **kw})
    assert status == 0
    assert out["epsilon"] == acc.epsilon(1.3, **kw)
    status, out = _main(
        capsys, {"op": "report", "noise_multiplier": 1.3, "accountant": "rdp", **kw}
    )
    assert status == 0
    assert out["epsilon"] == out["epsilon_rdp"] == acc.epsilon(1.3, accountant="rdp", **kw)
    assert out["relation_rdp_add_remove"].startswith("add/remove")
    assert out["dp_event_relation"] == "REPLACE_ONE" and out["epochs"] is None
    status, out = _main(
        capsys,
        {
            "op": "calibrate",
            "scheme": "poisson",
            "steps": 100,
            "sampling_rate": 0.05,
            "delta": DELTA,
            "target_epsilon": 2.0,
            "accountant": "rdp",
        },
    )
    assert status == 0 and out["epsilon"] == out["epsilon_rdp"] <= 2.0
    assert out["target_epsilon"] == 2.0 and out["epsilon_pld"] < 2.0


def _gaussian_json(z: float) -> dict:
    return {"type": "Gaussian", "noise_multiplier": z}


@pytest.mark.parametrize(
    ("kw", "event"),
    [
        (
            {"scheme": "shuffle", "epochs": 3},
            lambda z: {"type": "SelfComposed", "event": _gaussian_json(z), "count": 3},
        ),
        (
            {"scheme": "poisson", "steps": 40, "sampling_rate": 0.05},
            lambda z: {
                "type": "SelfComposed",
                "event": {
                    "type": "PoissonSampled",
                    "sampling_probability": 0.05,
                    "event": _gaussian_json(z),
                },
                "count": 40,
            },
        ),
        (
            {
                "scheme": "poisson",
                "steps": 40,
                "sampling_rate": 1.0,
                "prefix_noise_multiplier": 4.5,
            },
            lambda z: {
                "type": "Composed",
                "events": [
                    _gaussian_json(4.5),
                    {"type": "SelfComposed", "event": _gaussian_json(z), "count": 40},
                ],
            },
        ),
    ],
)
def test_answers_carry_the_event_the_ledger_charges(capsys, kw, event):
    """The event the accountant composed, in the ledger's convention (REPLACE_ONE, unfolded
    multipliers) and jsonb's spelling of numbers (2, not 2.0): the server charges it as it is
    (issue 26: no longer rebuilt in SQL). Re-accounted, it gives the answer's epsilon."""
    from dpsql import ledger_events

    status, out = _main(capsys, {"op": "report", "noise_multiplier": 2.0, "delta": DELTA, **kw})
    assert status == 0 and out["ledger_event"] == event(2)
    assert '"noise_multiplier": 2}' in json.dumps(out["ledger_event"])  # not 2.0
    composed = ledger_events.compose([ledger_events.from_json(out["ledger_event"])], DELTA)
    assert composed["epsilon_pld"] == pytest.approx(out["epsilon_pld"], rel=1e-6)
    status, out = _main(capsys, {"op": "calibrate", "target_epsilon": 2.0, "delta": DELTA, **kw})
    assert status == 0 and out["ledger_event"] == event(out["noise_multiplier"])


@pytest.mark.parametrize(
    "request_",
    [
        "not json",
        "[1, 2]",
        {"op": "report"},
        {"scheme": "shuffle", "epochs": 1, "delta": DELTA, "noise_multiplier": 1},
        {"op": "train", "scheme": "shuffle", "epochs": 1, "delta": DELTA, "noise_multiplier": 1},
        {"op": "epsilon", "scheme": "shuffle", "epochs": 1, "noise_multiplier": 1},
        {"op": "epsilon", "scheme": "shuffle", "epochs": 1, "delta": DELTA},
        {
            "op": "epsilon",
            "scheme": "shuffle",
            "epochs": 1,
            "delta": DELTA,
            "noise_multiplier": 1,
            "target_epsilon": 1,
        },
        {
            "op": "calibrate",
            "scheme": "shuffle",
            "epochs": 1,
            "delta": DELTA,
            "noise_multiplier": 1,
        },
        {"op": "calibrate", "scheme": "shuffle", "epochs": 1, "delta": DELTA, "target_epsilon": 0},
        {
            "op": "epsilon",
            "scheme": "shuffle",
            "epochs": 1,
            "delta": DELTA,
            "noise_multiplier": 1,
            "seed": 3,
        },
        {
            "op": "epsilon",
            "scheme": "shuffle",
            "epochs": 1.5,
            "delta": DELTA,
            "noise_multiplier": 1,
        },
        {
            "op": "epsilon",
            "scheme": "poisson",
            "steps": 10,
            "sampling_rate": 0,
            "delta": DELTA,
            "noise_multiplier": 1,
        },
        {"op": "epsilon", "scheme": "bst14", "delta": DELTA, "noise_multiplier": 1},
        {
            "op": "calibrate",
            "scheme": "shuffle",
            "epochs": 1,
            "delta": DELTA,
            "target_epsilon": 1,
            "accountant": "rdp_add_remove",
        },
        '{"op": "epsilon", "scheme": "shuffle", "epochs": 1, "delta": 1e-5, '
        '"noise_multiplier": Infinity}',
    ],
)
def test_cli_refuses_bad_input(capsys, request_):
    status, out = _main(capsys, request_)
    assert status == 2 and set(out) == {"error"} and out["error"]


def test_cli_needs_exactly_one_argument(capsys):
    assert accountant_requests.main([]) == 2
    assert "usage" in json.loads(capsys.readouterr().out)["error"]
