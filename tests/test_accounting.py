"""The DP-SGD accountant (dpsql.accounting, over dp-accounting) and its command line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting import rdp  # noqa: E402

from dpsql import accounting  # noqa: E402


def test_spec_rdp_vectors() -> None:
    """Spec 004 s. 1.3 item 4: Poisson-subsampled Gaussian, add/remove, integer orders 2..256,
    standard conversion, delta = 1e-5: epsilon 1.180 (alpha 17) and 3.009 (alpha 9). The same
    RDP curve from dp-accounting, converted the standard way, reproduces them; the accountant
    dpsql reports uses the improved conversion, which can only be smaller."""
    vectors = [(250 / 60000, 1.3, 3600, 1.180, 17), (256 / 60000, 1.1, 14062, 3.009, 9)]
    for q, z, steps, expected, order in vectors:
        acc = rdp.RdpAccountant(orders=list(range(2, 257)))
        acc.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps))
        orders, curve = np.asarray(acc.orders), np.asarray(acc.rdp)
        standard = curve + np.log(1 / 1e-5) / (orders - 1)
        assert standard.min() == pytest.approx(expected, abs=1e-3)
        assert orders[standard.argmin()] == order
        ours = accounting.epsilon(z, scheme="poisson", steps=steps, sampling_rate=q, delta=1e-5,
                                  accountant="rdp_add_remove")
        assert ours <= standard.min()


def test_q_one_is_plain_gaussian_composition() -> None:
    """Spec 004 s. 5.1 item 11: with q = 1 the sampled Gaussian is the plain Gaussian
    (RDP alpha T / (2 z^2) for add/remove, unit sensitivity)."""
    for z, steps in [(1.0, 10), (3.0, 100)]:
        a = accounting.epsilon(z, scheme="poisson", steps=steps, sampling_rate=1.0, delta=1e-5,
                               accountant="rdp_add_remove")
        acc = rdp.RdpAccountant()
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), steps))
        assert a == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_replace_one_trap_of_dp_accounting() -> None:
    """For a plain Gaussian event, PLD under REPLACE_ONE doubles the sensitivity, RDP does not:
    the shuffle scheme therefore folds the sensitivity 2C into the multiplier (z/2) itself."""
    rel = dp_accounting.NeighboringRelation
    from dp_accounting import pld

    def eps(acc, z):
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 5))
        return acc.get_epsilon(1e-5)

    pld_replace = eps(pld.PLDAccountant(neighboring_relation=rel.REPLACE_ONE), 2.0)
    pld_half = eps(pld.PLDAccountant(), 1.0)
    rdp_replace = eps(rdp.RdpAccountant(neighboring_relation=rel.REPLACE_ONE), 2.0)
    rdp_plain = eps(rdp.RdpAccountant(), 2.0)
    assert pld_replace == pytest.approx(pld_half, rel=1e-6)
    assert rdp_replace == pytest.approx(rdp_plain, rel=1e-9)  # not doubled
    ours = accounting.epsilon(2.0, scheme="shuffle", epochs=5, delta=1e-5, accountant="pld")
    assert ours == pytest.approx(pld_replace, rel=1e-6)
    ours_rdp = accounting.epsilon(2.0, scheme="shuffle", epochs=5, delta=1e-5, accountant="rdp")
    assert ours_rdp > rdp_plain  # the replace-one sensitivity is counted


def test_calibration_round_trip_and_monotonicity() -> None:
    schemes = [("shuffle", dict(epochs=4)), ("poisson", dict(steps=500, sampling_rate=0.02))]
    for scheme, kw in schemes:
        z = accounting.calibrate(1.0, 1e-5, scheme=scheme, **kw)
        assert accounting.epsilon(z, scheme=scheme, delta=1e-5, **kw) <= 1.0
        assert accounting.epsilon(z * 0.99, scheme=scheme, delta=1e-5, **kw) > 1.0 - 1e-3
        assert accounting.epsilon(2 * z, scheme=scheme, delta=1e-5, **kw) < 1.0
    e_short = accounting.epsilon(1.0, scheme="poisson", steps=100, sampling_rate=0.01, delta=1e-5)
    e_long = accounting.epsilon(1.0, scheme="poisson", steps=1000, sampling_rate=0.01, delta=1e-5)
    assert e_short < e_long


def test_shuffle_is_never_accounted_as_poisson() -> None:
    """Same noise and batch fraction (b/m = 0.01, 10 epochs = 1000 steps): shuffled disjoint
    batches get no amplification, so their epsilon is much larger."""
    shuffle = accounting.epsilon(1.0, scheme="shuffle", epochs=10, delta=1e-5)
    poisson = accounting.epsilon(1.0, scheme="poisson", steps=1000, sampling_rate=0.01, delta=1e-5)
    assert shuffle > 5 * poisson


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        accounting.epsilon(1.0, scheme="uniform", epochs=1, delta=1e-5)
    with pytest.raises(ValueError):
        accounting.epsilon(1.0, scheme="shuffle", epochs=0, delta=1e-5)
    with pytest.raises(ValueError):
        accounting.epsilon(1.0, scheme="poisson", steps=10, sampling_rate=1.5, delta=1e-5)
    with pytest.raises(ValueError):
        accounting.epsilon(-1.0, scheme="shuffle", epochs=1, delta=1e-5)
    with pytest.raises(ValueError):
        accounting.calibrate(1.0, 1.0, scheme="shuffle", epochs=1)


def test_command_line() -> None:
    def run(arg: str) -> tuple[int, dict]:
        out = subprocess.run([sys.executable, "-m", "dpsql.accounting", arg],
                             capture_output=True, text=True, timeout=120)
        return out.returncode, json.loads(out.stdout)

    code, ans = run(json.dumps({"op": "report", "scheme": "shuffle", "epochs": 2,
                                "delta": 1e-5, "noise_multiplier": 4.0}))
    assert code == 0 and ans["epsilon"] == ans["epsilon_pld"] > 0 and ans["epsilon_rdp"] > 0
    assert ans["epsilon"] == pytest.approx(
        accounting.epsilon(4.0, scheme="shuffle", epochs=2, delta=1e-5))
    code, ans = run(json.dumps({"op": "calibrate", "scheme": "poisson", "steps": 100,
                                "sampling_rate": 0.05, "delta": 1e-5, "target_epsilon": 2.0}))
    assert code == 0 and ans["epsilon"] <= 2.0
    for bad in ["not json", json.dumps({"op": "report"}), json.dumps([1, 2])]:
        code, ans = run(bad)
        assert code == 2 and "error" in ans
