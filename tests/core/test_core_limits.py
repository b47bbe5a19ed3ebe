"""The C core's size limits and state checks, through the Cython bindings (issue 9 F2/F3).

The server's tests (test_c_fuzz.py, test_interrupts.py) reach the same core functions; these
check the in-memory engine gives the same answers without a server.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpsql import _core


def test_exact_sensitivity_step_limit() -> None:
    assert _core.SENSITIVITY_MAX_STEPS == 2**32
    with pytest.raises(ValueError, match="limited to 4294967296 steps"):
        _core.exact_sensitivity(
            "constant", eta=0.1, lipschitz=1, smoothness=1, rows=10**15, fresh=True
        )


def test_exact_sensitivity_work_area_limit() -> None:
    assert _core.SENSITIVITY_MAX_POSITIONS == 2**24
    with pytest.raises(ValueError, match="16777216 per pass"):
        _core.exact_sensitivity(
            "constant", eta=0.1, lipschitz=1, smoothness=1, rows=200_000_000, fresh=False
        )


def test_exact_sensitivity_below_the_limits_matches_the_closed_form() -> None:
    exact = _core.exact_sensitivity(
        "constant", eta=0.1, lipschitz=1, smoothness=1, rows=1000, epochs=3
    )
    closed = _core.bolton_sensitivity(
        "constant", eta=0.1, lipschitz=1, smoothness=1, rows=1000, epochs=3
    )
    assert exact == pytest.approx(closed)


def test_forged_generator_position_is_rejected() -> None:
    state = _core.init_state("logistic", 3, noise="gaussian", noise_scale=1.0, noise_seed=7)
    forged = np.array(state)
    # DpsqlRng.used is the low half of the tail's double 70
    used = forged[len(forged) - 72 + 70 : len(forged) - 72 + 71].view(np.uint32)
    used[0] = 10**6
    with pytest.raises(ValueError, match="malformed model state"):
        _core.check_state(forged)


def test_steps_per_epoch_limit_in_the_state_check() -> None:
    state = np.array(_core.init_state("logistic", 3))
    fields = list(_core.HEADER_FIELDS)
    state[fields.index("steps_per_epoch")] = 2.0**31
    with pytest.raises(ValueError, match="malformed model state"):
        _core.check_state(state)
