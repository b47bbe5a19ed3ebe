"""Privacy accounting for DP-SGD-style mechanisms: a thin layer over Google's dp-accounting.

The mechanism
-------------
Every step releases ``sum_i clip_C(g_i) + N(0, (z C)^2 I)``: the sum of the per-example
gradients of the step's records, each clipped to L2 norm ``C``, plus Gaussian noise with *noise
multiplier* ``z`` (standard deviation ``z C`` per coordinate). Neighbouring datasets are
**replace-one** and the number of rows ``m`` is public (docs/architecture.md, privacy rules 6 and
7). Replacing one record moves one step's sum by at most ``2 C``: the L2 sensitivity of a step is
``2 C`` and its unit-sensitivity noise multiplier is ``z / 2``.

Schemes (the accountant must match the sampling actually implemented)
---------------------------------------------------------------------
``"shuffle"``
    Disjoint batches of a data-independent permutation: each record is in exactly one step per
    epoch, ``k`` epochs. A record is seen by ``k`` adaptively composed Gaussian mechanisms of
    sensitivity ``2 C``, **without any amplification** (a shuffle is not Poisson sampling). The
    event is ``SelfComposedDpEvent(GaussianDpEvent(z / 2), k)``, with the sensitivity folded into
    the multiplier, so both dp-accounting accountants evaluate it with ``ADD_OR_REMOVE_ONE``
    semantics. Both values are exact for the Gaussian (PLD up to its pessimistic discretisation).
``"poisson"``
    Each record joins each of ``T`` steps independently with probability ``q``. The event is
    ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T)``, charged with the PLD
    accountant under ``REPLACE_ONE`` (dp-accounting's replace-one subsampled Gaussian: the pair
    ``(1-q) N(0, z^2) + q N(-1, z^2)`` vs ``(1-q) N(0, z^2) + q N(+1, z^2)``). With ``q = 1`` every
    record is in every step, and the event reduces exactly to ``T`` Gaussians of sensitivity ``2 C``
    as for ``"shuffle"``.

A run may also release one **prefix Gaussian** before its steps (DPSGD-F's private mean of the
rows, Sun et al. 2024, Algorithm 3): a sum of per-record vectors of norm at most ``C`` plus
``N(0, (p C)^2 I)`` (``prefix_noise_multiplier = p``; replace-one sensitivity ``2 C``, like a
step). It is composed with the steps in the same accountant, which is much tighter than
splitting epsilon.

The schemes ``"bst14"`` and ``"scs13"`` are accounted by their own papers' formulas elsewhere.

The dp-accounting trap (verified with dp-accounting 0.6, see ``tests/core/test_accounting.py``)
-------------------------------------------------------------------------------------------
For ``GaussianDpEvent(z)``, ``PLDAccountant(REPLACE_ONE)`` doubles the sensitivity, but
``RdpAccountant(REPLACE_ONE)`` does **not** (it returns the add/remove value, half the true
sensitivity). ``RdpAccountant(REPLACE_ONE)`` refuses ``PoissonSampledDpEvent`` altogether. Hence the
folding of ``2 C`` into ``z / 2`` for Gaussians, and the replace-one RDP bound below for Poisson.

Accountants
-----------
``"pld"``
    dp-accounting's pessimistic PLD: the value that is charged. Plain Gaussians through
    ``PLDAccountant``; a Poisson run through the same construction (``from_gaussian_mechanism``
    with the sampling rate, ``self_compose``) with the Gaussian's tails truncated to the run
    (:func:`poisson_log_mass_truncation`: at most ``1e-4 delta / 2`` of mass at infinity rather
    than dp-accounting's fixed ``e^-50``), which halves its cost and moves epsilon by under 1e-7.
``"rdp"``
    dp-accounting's ``RdpAccountant``: a second, looser replace-one guarantee. For ``"shuffle"``
    (and ``"poisson"`` with ``q = 1``) it is the exact Gaussian RDP of sensitivity ``2 C``. For
    ``"poisson"`` with ``q < 1`` it is :class:`ReplaceOneRdpBound`: replacing a record is removing
    it and adding another, and the weak triangle inequality of Renyi divergences bounds the
    replace-one RDP by dp-accounting's add/remove RDP curve at orders ``2a`` and ``2a - 1``.
``"rdp_add_remove"``
    The add/remove RDP epsilon of the same mechanism (``GaussianDpEvent(z)`` without the factor 2
    for ``"shuffle"``). A reference figure, **not** the replace-one guarantee: never charge it.

Modules
-------
This module is the math: it imports, of dpsql's, only the PLD's settings
(:mod:`dpsql.pld_settings`) and the calibration grid's reader (:mod:`dpsql.calibration_cache`).
On top of it: the ledger's events and their composition (:mod:`dpsql.ledger_events`), the grid's
generator (:mod:`dpsql.calibration_grid`), the accountant's requests and answers
(:mod:`dpsql.accountant_requests`) and the long-lived accountant (:mod:`dpsql.accountant_server`).
``python -m dpsql.accounting '<json>'`` and ``python -m dpsql.accounting --serve <socket>``, the
command lines the PostgreSQL server runs, are the last two (the block at the end of this file).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import mechanism_calibration
from dp_accounting.pld import PLDAccountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import RdpAccountant, compute_epsilon
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from dpsql import calibration_cache
from dpsql.pld_settings import (
    PLD_DISCRETIZATION,
    PLD_FULL_PRECISION_UP_TO,
    PLD_LOG_MASS_TRUNCATION_RANGE,
    PLD_TAIL_SHARE,
    dp_accounting_version,
)

__all__ = [
    "ACCOUNTANTS",
    "SCHEMES",
    "Mechanism",
    "ReplaceOneRdpBound",
    "calibrate",
    "epsilon",
    "mechanism",
    "report",
]

NeighboringRelation = dp_accounting.NeighboringRelation

SCHEMES = ("shuffle", "poisson")
ACCOUNTANTS = ("pld", "rdp", "rdp_add_remove")

#: Relative tolerance of :func:`calibrate` on the noise multiplier.
CALIBRATION_RTOL = 1e-4
#: Range searched by :func:`calibrate`.
MIN_NOISE_MULTIPLIER = 1e-3
MAX_NOISE_MULTIPLIER = 1e7
#: Largest number of epochs or steps accepted (no training run composes more releases).
MAX_COUNT = 10**9

# Orders a of the replace-one RDP bound; it reads the add/remove curve at 2a and 2a - 1.
_REPLACE_ONE_ORDERS = tuple(a for a in DEFAULT_RDP_ORDERS if a <= 256)


# ---------------------------------------------------------------------------------------------
# Validation


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return x


def _positive(name: str, value: Any) -> float:
    x = _real(name, value)
    if not x > 0:
        raise ValueError(f"{name} must be > 0, got {x!r}")
    return x


def _delta(value: Any) -> float:
    x = _real("delta", value)
    if not 0 < x < 1:
        raise ValueError(f"delta must be in (0, 1), got {x!r}")
    return x


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    n = int(value)
    if not 1 <= n <= MAX_COUNT:
        raise ValueError(f"{name} must be an integer in [1, {MAX_COUNT}], got {n!r}")
    return n


def _accountant(value: Any) -> str:
    if value not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {value!r}")
    return str(value)


def _scheme_args(
    scheme: Any, epochs: Any, steps: Any, sampling_rate: Any
) -> tuple[str, int | None, int | None, float | None]:
    if scheme in ("bst14", "scs13"):
        raise ValueError(
            f"scheme {scheme!r} is accounted by its own paper's formula, not by dpsql.accounting"
        )
    if scheme == "shuffle":
        if steps is not None or sampling_rate is not None:
            raise ValueError(
                "scheme 'shuffle' is accounted per epoch (one step per record per epoch, no "
                "amplification): give epochs only; steps and sampling_rate describe Poisson "
                "sampling"
            )
        if epochs is None:
            raise ValueError("scheme 'shuffle' needs epochs")
        return "shuffle", _count("epochs", epochs), None, None
    if scheme == "poisson":
        if epochs is not None:
            raise ValueError("scheme 'poisson' takes steps and sampling_rate, not epochs")
        if steps is None or sampling_rate is None:
            raise ValueError("scheme 'poisson' needs steps and sampling_rate")
        q = _real("sampling_rate", sampling_rate)
        if not 0 < q <= 1:
            raise ValueError(f"sampling_rate must be in (0, 1], got {q!r}")
        return "poisson", None, _count("steps", steps), q
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


# ---------------------------------------------------------------------------------------------
# The mechanism as dp-accounting events


@dataclass(frozen=True)
class Mechanism:
    """One training run as dp-accounting sees it, for one record.

    Attributes
    ----------
    event : dp_accounting.DpEvent
        The event whose value under ``relation`` is the replace-one guarantee.
    relation : dp_accounting.NeighboringRelation
        ``ADD_OR_REMOVE_ONE`` when the factor 2 of replace-one is folded into a Gaussian's
        multiplier (``"shuffle"``, ``"poisson"`` with ``q = 1``); ``REPLACE_ONE`` otherwise.
    add_remove_event : dp_accounting.DpEvent
        The same mechanism under add/remove neighbouring (sensitivity ``C``), for reference.
    scheme : str
    noise_multiplier : float
    epochs, steps : int or None
    sampling_rate : float or None
    prefix_noise_multiplier : float or None
        The one-shot Gaussian released before the steps, if any.
    """

    event: dp_accounting.DpEvent
    relation: dp_accounting.NeighboringRelation
    add_remove_event: dp_accounting.DpEvent
    scheme: str
    noise_multiplier: float
    epochs: int | None
    steps: int | None
    sampling_rate: float | None
    prefix_noise_multiplier: float | None = None

    @property
    def gaussian_only(self) -> bool:
        """True when the record's view is a composition of plain Gaussians (no sampling)."""
        return bool(self.relation == NeighboringRelation.ADD_OR_REMOVE_ONE)

    @property
    def ledger_event(self) -> dp_accounting.DpEvent:
        """The run in the ledger's convention (:mod:`dpsql.ledger_events`: read under
        ``REPLACE_ONE``, every Gaussian with its own multiplier, unfolded): the event a release
        charges, recorded from this accountant rather than rebuilt from the plan."""
        return self.add_remove_event if self.gaussian_only else self.event


def _after_prefix(event: dp_accounting.DpEvent, prefix: float | None) -> dp_accounting.DpEvent:
    """``event`` preceded by a one-shot Gaussian of multiplier ``prefix`` (none if None)."""
    if prefix is None:
        return event
    return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(prefix), event])


def _mechanism(
    z: float,
    scheme: str,
    epochs: int | None,
    steps: int | None,
    q: float | None,
    prefix: float | None = None,
) -> Mechanism:
    if scheme == "shuffle" or q == 1.0:
        count = epochs if scheme == "shuffle" else steps
        assert count is not None
        # The factor 2 of replace-one folded into every multiplier, the prefix's included.
        return Mechanism(
            event=_after_prefix(
                dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z / 2), count),
                None if prefix is None else prefix / 2,
            ),
            relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            add_remove_event=_after_prefix(
                dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), count), prefix
            ),
            scheme=scheme,
            noise_multiplier=z,
            epochs=epochs,
            steps=steps,
            sampling_rate=q,
            prefix_noise_multiplier=prefix,
        )
    assert steps is not None and q is not None
    # REPLACE_ONE: the PLD accountant doubles the prefix Gaussian's sensitivity itself.
    event = _after_prefix(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
        ),
        prefix,
    )
    return Mechanism(
        event=event,
        relation=NeighboringRelation.REPLACE_ONE,
        add_remove_event=event,
        scheme=scheme,
        noise_multiplier=z,
        epochs=None,
        steps=steps,
        sampling_rate=q,
        prefix_noise_multiplier=prefix,
    )


def mechanism(
    noise_multiplier: float,
    *,
    scheme: str,
    epochs: int | None = None,
    steps: int | None = None,
    sampling_rate: float | None = None,
    prefix_noise_multiplier: float | None = None,
) -> Mechanism:
    """The dp-accounting events of a run (validated), e.g. for a ledger's audit trail.

    Parameters
    ----------
    noise_multiplier : float
        ``z``: noise standard deviation divided by the clipping norm ``C``.
    scheme : {"shuffle", "poisson"}
    epochs : int, optional
        Number of epochs (``"shuffle"`` only).
    steps : int, optional
        Number of steps ``T`` (``"poisson"`` only).
    sampling_rate : float, optional
        Per-step inclusion probability ``q`` in (0, 1] (``"poisson"`` only).
    prefix_noise_multiplier : float, optional
        ``p > 0``: a one-shot Gaussian (noise ``p C``, replace-one sensitivity ``2 C``) released
        before the steps, composed with them.

    Returns
    -------
    Mechanism
    """
    z = _positive("noise_multiplier", noise_multiplier)
    return _mechanism(
        z, *_scheme_args(scheme, epochs, steps, sampling_rate), _prefix(prefix_noise_multiplier)
    )


def _prefix(value: Any) -> float | None:
    return None if value is None else _positive("prefix_noise_multiplier", value)


# dp-accounting is untyped (its classes are Any to mypy), so subclassing one needs the ignore.
class ReplaceOneRdpBound(dp_accounting.PrivacyAccountant):  # type: ignore[misc]
    """Replace-one RDP bound from dp-accounting's add/remove RDP curve (remove, then add).

    A replace-one neighbour ``D'`` of ``D`` is reached by removing a record (``D0``) and adding
    another. With ``P = M(D)``, ``Q = M(D0)``, ``R = M(D')``, the weak triangle inequality of Renyi
    divergences (Mironov 2017, "Renyi Differential Privacy", Proposition 11 with ``p = q = 2``,
    which is Hoelder's inequality) gives, for every order ``a > 1``,

        D_a(P || R) <= (a - 1/2) / (a - 1) * D_{2a}(P || Q) + D_{2a - 1}(Q || R).

    ``D`` and ``D0``, and ``D0`` and ``D'``, are add/remove neighbours, so both divergences on the
    right are bounded by the add/remove RDP curve of the (adaptively composed) mechanism, which
    dp-accounting's ``RdpAccountant(ADD_OR_REMOVE_ONE)`` computes and which holds in both
    directions (for the Poisson-subsampled Gaussian: Mironov, Talwar and Zhang 2019). The bound
    is converted to (epsilon, delta) by dp-accounting's ``compute_epsilon``. It is sound but looser
    than the PLD accountant (1.2 to 1.7 times the PLD epsilon in our checks, 1.33 and 1.37 on the
    TF-Privacy MNIST tutorial's two settings): a cross-check; the PLD value is the one to charge.

    Parameters
    ----------
    orders : sequence of float, optional
        Orders ``a > 1`` of the replace-one bound.
    """

    def __init__(self, orders: Sequence[float] | None = None) -> None:
        super().__init__(NeighboringRelation.REPLACE_ONE)
        alphas = np.asarray(_REPLACE_ONE_ORDERS if orders is None else orders, dtype=np.float64)
        if alphas.ndim != 1 or alphas.size == 0 or not np.all(alphas > 1):
            raise ValueError("orders must be a non-empty sequence of numbers > 1")
        self._orders = alphas
        inner = np.unique(np.concatenate([2 * alphas, 2 * alphas - 1]))
        self._inner_index = {float(a): i for i, a in enumerate(inner)}
        self._add_remove = RdpAccountant(inner, NeighboringRelation.ADD_OR_REMOVE_ONE)

    def _maybe_compose(
        self, event: dp_accounting.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if not self._add_remove.supports(event):
            return self.CompositionErrorDetails(
                invalid_event=event,
                error_message="the add/remove RDP accountant does not support this event",
            )
        if do_compose:
            self._add_remove.compose(event, count)
        return None

    @property
    def orders(self) -> np.ndarray:
        """The orders ``a`` of the replace-one bound."""
        return np.copy(self._orders)

    @property
    def rdp(self) -> np.ndarray:
        """The replace-one RDP bound at :attr:`orders`."""
        curve = self._add_remove.rdp
        at = self._inner_index
        a = self._orders
        return np.array(
            [(x - 0.5) / (x - 1) * curve[at[float(2 * x)]] + curve[at[float(2 * x - 1)]] for x in a]
        )

    def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float]:
        """Epsilon at ``target_delta`` and the order that attains it."""
        eps, order = compute_epsilon(self._orders, self.rdp, target_delta)
        return float(eps), float(order)

    def get_epsilon(self, target_delta: float) -> float:
        return self.get_epsilon_and_optimal_order(target_delta)[0]


# ---------------------------------------------------------------------------------------------
# Epsilon


def _rdp_accountant(mech: Mechanism) -> dp_accounting.PrivacyAccountant:
    """Fresh replace-one RDP accountant for ``mech.event``."""
    if mech.gaussian_only:
        return RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    return ReplaceOneRdpBound()


def _pld_accountant(mech: Mechanism, discretization: float = PLD_DISCRETIZATION) -> PLDAccountant:
    return PLDAccountant(mech.relation, value_discretization_interval=discretization)


def _rdp_epsilon_and_order(mech: Mechanism, delta: float) -> tuple[float, float]:
    key = _mechanism_key(mech, delta)
    cached = _RDP_CACHE.get(key)
    if cached is not None:
        return cached
    eps, order = _rdp_accountant(mech).compose(mech.event).get_epsilon_and_optimal_order(delta)
    if len(_RDP_CACHE) >= _CACHE_SIZE:
        _RDP_CACHE.clear()
    _RDP_CACHE[key] = value = (float(eps), float(order))
    return value


def _eps_rdp(mech: Mechanism, delta: float) -> float:
    return _rdp_epsilon_and_order(mech, delta)[0]


def _eps_rdp_add_remove(mech: Mechanism, delta: float) -> float:
    acc = RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    return float(acc.compose(mech.add_remove_event).get_epsilon(delta))


def poisson_log_mass_truncation(steps: int, delta: float) -> float:
    """dp-accounting's ``log_mass_truncation_bound`` for ``steps`` Poisson-subsampled Gaussian
    steps read at ``delta``: each step puts at most ``e^bound / 2`` at infinity, so the run puts
    at most ``PLD_TAIL_SHARE * delta / 2`` there (clamped to PLD_LOG_MASS_TRUNCATION_RANGE)."""
    lo, hi = PLD_LOG_MASS_TRUNCATION_RANGE
    if not delta > 0:
        return lo
    return min(max(math.log(PLD_TAIL_SHARE * delta / steps), lo), hi)


def poisson_gaussian_pld(
    z: float, q: float, steps: int, discretization: float, delta: float
) -> pld_lib.PrivacyLossDistribution:
    """dp-accounting's pessimistic replace-one PLD of ``steps`` Poisson-subsampled Gaussians, as
    ``PLDAccountant(REPLACE_ONE)`` builds it, with the tail truncation sized to the run. The one
    construction both the charge (:func:`epsilon`) and the ledger (:mod:`dpsql.ledger_events`)
    use, so that a run re-accounts to what it was charged."""
    return pld_lib.from_gaussian_mechanism(
        z,
        value_discretization_interval=discretization,
        sampling_prob=q,
        log_mass_truncation_bound=poisson_log_mass_truncation(steps, delta),
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
    ).self_compose(steps)


def _pld_discretization(mech: Mechanism, delta: float) -> float:
    estimate = _eps_rdp(mech, delta)
    if not math.isfinite(estimate):
        return PLD_DISCRETIZATION * 1e3
    return PLD_DISCRETIZATION * max(1.0, estimate / PLD_FULL_PRECISION_UP_TO)


def _mechanism_key(mech: Mechanism, delta: float) -> tuple[Any, ...]:
    return (
        mech.scheme,
        mech.noise_multiplier,
        mech.epochs,
        mech.steps,
        mech.sampling_rate,
        mech.prefix_noise_multiplier,
        delta,
    )


# The last PLD and RDP values computed (a long-lived accountant answers a calibration and then
# reports the same z: each value is computed once). Values are exact functions of the key.
_PLD_CACHE: dict[tuple[Any, ...], float] = {}
_RDP_CACHE: dict[tuple[Any, ...], tuple[float, float]] = {}
_CACHE_SIZE = 64


def _pld_epsilon(mech: Mechanism, delta: float, interval: float) -> float:
    """The charged construction's epsilon at PLD interval ``interval`` (see _eps_pld)."""
    if mech.gaussian_only:
        return float(_pld_accountant(mech, interval).compose(mech.event).get_epsilon(delta))
    assert mech.steps is not None and mech.sampling_rate is not None
    pld = poisson_gaussian_pld(
        mech.noise_multiplier, mech.sampling_rate, mech.steps, interval, delta
    )
    if mech.prefix_noise_multiplier is not None:
        # first, as PLDAccountant composes _after_prefix's event (REPLACE_ONE doubles it)
        pld = pld_lib.from_gaussian_mechanism(
            mech.prefix_noise_multiplier,
            value_discretization_interval=interval,
            neighboring_relation=NeighboringRelation.REPLACE_ONE,
        ).compose(pld)
    return float(pld.get_epsilon_for_delta(delta))


def _eps_pld(mech: Mechanism, delta: float) -> float:
    key = _mechanism_key(mech, delta)
    cached = _PLD_CACHE.get(key)
    if cached is not None:
        return cached
    value = _pld_epsilon(mech, delta, _pld_discretization(mech, delta))
    if len(_PLD_CACHE) >= _CACHE_SIZE:
        _PLD_CACHE.clear()
    _PLD_CACHE[key] = value
    return value


_EPSILON = {"pld": _eps_pld, "rdp": _eps_rdp, "rdp_add_remove": _eps_rdp_add_remove}


def epsilon(
    noise_multiplier: float,
    *,
    scheme: str,
    epochs: int | None = None,
    steps: int | None = None,
    sampling_rate: float | None = None,
    delta: float,
    accountant: str = "pld",
    prefix_noise_multiplier: float | None = None,
) -> float:
    """Replace-one (epsilon, delta) guarantee of a run with noise multiplier ``z``.

    Parameters
    ----------
    noise_multiplier : float
        ``z > 0``: per-coordinate noise standard deviation divided by the clipping norm ``C``.
    scheme : {"shuffle", "poisson"}
        ``"shuffle"``: disjoint batches, each record in one step per epoch (needs ``epochs``;
        no amplification). ``"poisson"``: each record in each step with probability
        ``sampling_rate`` (needs ``steps`` and ``sampling_rate``).
    epochs : int, optional
        Number of epochs, ``>= 1`` (``"shuffle"``).
    steps : int, optional
        Number of steps ``T >= 1`` (``"poisson"``).
    sampling_rate : float, optional
        ``q`` in (0, 1] (``"poisson"``).
    delta : float
        Target delta in (0, 1).
    accountant : {"pld", "rdp", "rdp_add_remove"}
        ``"pld"`` (charged) and ``"rdp"`` are replace-one guarantees; ``"rdp_add_remove"`` is the
        add/remove reference value, which is not a replace-one guarantee.

    Returns
    -------
    float
        Epsilon (``inf`` if no order of the RDP curve gives a finite value).

    Raises
    ------
    ValueError, TypeError
        On invalid arguments.
    """
    acc = _accountant(accountant)
    mech = mechanism(
        noise_multiplier,
        scheme=scheme,
        epochs=epochs,
        steps=steps,
        sampling_rate=sampling_rate,
        prefix_noise_multiplier=prefix_noise_multiplier,
    )
    return _EPSILON[acc](mech, _delta(delta))


# ---------------------------------------------------------------------------------------------
# Calibration


def _bracket(
    eps_of: Callable[[float], float], target: float, guess: float, factor: float
) -> tuple[float, float]:
    """``lo < hi`` with ``eps_of(lo) > target >= eps_of(hi)`` (finite), searched around guess."""
    hi = min(max(guess, MIN_NOISE_MULTIPLIER), MAX_NOISE_MULTIPLIER)
    while not eps_of(hi) <= target:
        if hi >= MAX_NOISE_MULTIPLIER:
            raise ValueError(
                f"target_epsilon {target!r} needs a noise multiplier above {MAX_NOISE_MULTIPLIER:g}"
            )
        hi = min(hi * factor, MAX_NOISE_MULTIPLIER)
    while True:
        lo = hi / factor
        if lo < MIN_NOISE_MULTIPLIER:
            raise ValueError(
                f"target_epsilon {target!r} is reached with a noise multiplier below "
                f"{MIN_NOISE_MULTIPLIER:g}: no meaningful privacy"
            )
        if not eps_of(lo) <= target:
            return lo, hi
        hi = lo


# Calibration on the PLD (issue 17). Brent's method on the charged PLD costs about ten evaluations
# of it, each up to a second for a Poisson-subsampled Gaussian at a 1e-4 interval. Instead a start
# close to the answer, then secant steps in (log z, log epsilon) on the charged PLD itself, usually
# two evaluations:
# - Poisson: the root of secant searches on PLDs thirty, then ten times coarser (about twenty
#   and five to ten times cheaper; pessimistic, so their roots are a little above the charged
#   one);
# - plain Gaussians (shuffle, q = 1, a prefix): their composition is one Gaussian, calibrated
#   exactly by dp-accounting's get_sigma_gaussian (the PLD's pessimistic discretisation is a
#   little above it).
# Every z returned passed _eps_pld, the very function epsilon() charges: the search only decides
# where to look, and when it does not settle, Brent's method runs as before.

#: The coarse search's levels: (interval in multiples of the charged one, stop when
#: |log epsilon - log target| is below this). A 30x PLD costs about 1/20 of the charged one.
_COARSE_LEVELS = ((30.0, 2e-2), (10.0, 5e-3))
#: Charged-PLD steps aim this far (relative) above the predicted root, so that they pass.
_FINE_MARGIN = 2e-4
#: Stop when the next charged-PLD step would lower z by less than this (relative), or when the
#: failing and passing z are this close: the returned z is within about this much of the smallest
#: passing one (tests/core/test_accounting.py measures it).
_FINE_RTOL = 5e-4
#: The same for plain Gaussians, whose PLD evaluations are cheap.
#: And this share of the step, for the error of the slope (a coarse PLD's, or the grid's).
_STEP_MARGIN = 0.1
_GAUSSIAN_MARGIN = 2e-5
_GAUSSIAN_RTOL = 5e-5
_MAX_COARSE = 40
_MAX_FINE = 10


def _coarse_log_eps(mech: Mechanism, delta: float, interval_scale: float) -> float:
    """log of a PLD epsilon at a coarser interval than the charged one (a search aid, never
    charged)."""
    eps = _pld_epsilon(mech, delta, PLD_DISCRETIZATION * interval_scale)
    return math.log(eps) if eps > 0 and math.isfinite(eps) else math.inf


def _interval_scale(mech: Mechanism, delta: float) -> float:
    """As in _pld_discretization: large epsilons get a proportionally coarser interval."""
    estimate = _eps_rdp(mech, delta)
    return 1e3 if not math.isfinite(estimate) else max(1.0, estimate / PLD_FULL_PRECISION_UP_TO)


def _secant_log(u: float, f: float, slope: float, lo: float | None, hi: float | None) -> float:
    """Next log z: a secant step on ``f`` (log epsilon - log target, decreasing in u), kept
    inside the bracket ``lo < root <= hi`` when known and to at most a factor 8 per step."""
    if math.isfinite(f):
        nxt = u + max(-math.log(8.0), min(math.log(8.0), -f / slope))
    else:
        nxt = u + math.log(4.0)
    if lo is not None and hi is not None and not lo < nxt < hi:
        nxt = (lo + hi) / 2
    return nxt


_LOG_RANGE = (math.log(MIN_NOISE_MULTIPLIER), math.log(MAX_NOISE_MULTIPLIER))


def _narrow(
    u: float,
    f: float,
    passes: bool,
    lo: float | None,
    hi: float | None,
    prev: tuple[float, float] | None,
    slope: float,
) -> tuple[float | None, float | None, float]:
    """The bracket [lo, hi] of log z after evaluating f at u (hi passes, lo fails), and the
    slope of f: the secant through the previous point where it is finite and decreasing."""
    if passes:
        hi = u if hi is None else min(hi, u)
    else:
        lo = u if lo is None else max(lo, u)
    if prev is not None and math.isfinite(f) and math.isfinite(prev[1]) and u != prev[0]:
        secant = (f - prev[1]) / (u - prev[0])
        if secant < 0:
            slope = secant
    return lo, hi, slope


def _coarse_root(
    mech_of: Callable[[float], Mechanism],
    target: float,
    delta: float,
    u: float,
    slope: float,
    factor: float,
    tol: float,
    scale: float | None = None,
) -> tuple[float, float, float] | None:
    """(log z, slope, interval scale) where the PLD epsilon at ``factor`` times the charged
    interval is about the target, by secant steps from log z ``u``; None if unsettled."""
    log_target = math.log(target)
    lo: float | None = None
    hi: float | None = None
    prev: tuple[float, float] | None = None
    for _ in range(_MAX_COARSE):
        if not _LOG_RANGE[0] <= u <= _LOG_RANGE[1]:
            return None
        mech = mech_of(math.exp(u))
        # the RDP bound (0.03 s) sizes the interval, only where epsilon may be large (> e^2.8)
        if scale is None or scale > 1 or (prev is not None and prev[1] + log_target > 2.8):
            scale = _interval_scale(mech, delta)
        f = _coarse_log_eps(mech, delta, factor * scale) - log_target
        lo, hi, slope = _narrow(u, f, not f > 0, lo, hi, prev, slope)
        prev = (u, f)
        if abs(f) < tol:
            # the secant's root (a passing side's start saves a charged evaluation)
            return u - f / slope, slope, scale
        u = _secant_log(u, f, slope, lo, hi)
    return None


def _gaussian_start(mech: Mechanism, target: float, delta: float) -> float | None:
    """log z at which the plain-Gaussian mechanism's exact epsilon is the target."""
    from dp_accounting.gaussian_mechanism import get_sigma_gaussian

    # k Gaussians of std z C, sensitivity 2C, and a prefix of std p C: one Gaussian of
    # sensitivity 1 and std sigma with 1 / sigma^2 = 4 k / z^2 + 4 / p^2.
    count = mech.epochs if mech.scheme == "shuffle" else mech.steps
    assert count is not None
    sigma = float(get_sigma_gaussian(target, delta))
    rest = 1 / sigma**2
    if mech.prefix_noise_multiplier is not None:
        rest -= 4 / mech.prefix_noise_multiplier**2
    if not (sigma > 0 and rest > 0):
        return None
    return math.log(2 * math.sqrt(count / rest))


def _fine_search(
    mech_of: Callable[[float], Mechanism],
    target: float,
    delta: float,
    u: float,
    slope: float,
    margin: float,
    rtol: float,
    settle_within: int | None = None,
) -> float | None:
    """Smallest z (within about rtol) with ``_eps_pld <= target``, by secant steps from log z
    ``u``; None if unsettled (with ``settle_within``, also when that many steps do not settle
    it)."""
    log_target = math.log(target)
    lo: float | None = None
    hi: float | None = None
    prev: tuple[float, float] | None = None
    for _ in range(_MAX_FINE if settle_within is None else settle_within):
        if not _LOG_RANGE[0] <= u <= _LOG_RANGE[1]:
            return None
        eps = _eps_pld(mech_of(math.exp(u)), delta)
        f = math.log(eps) - log_target if eps > 0 and math.isfinite(eps) else math.inf
        lo, hi, slope = _narrow(u, f, eps <= target, lo, hi, prev, slope)
        prev = (u, f)
        if hi is not None and lo is not None and hi - lo <= rtol:
            break
        # aimed above the secant's root by margin, plus a share of the step for the slope's error
        sec = _secant_log(u, f, slope, lo, hi)
        nxt = sec + math.log1p(margin) + _STEP_MARGIN * abs(sec - u)
        if lo is not None and hi is not None and not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if hi is not None and nxt >= hi + math.log1p(-rtol):
            break  # the next step would gain less than rtol
        u = nxt
    else:
        if settle_within is not None:
            return None  # the start was poor (a wrong or stale cache): search instead
    if hi is None:
        return None
    z = math.exp(hi)
    # the value charged for z (cached): the returned z passes it exactly
    return z if _eps_pld(mech_of(z), delta) <= target else None


def _calibrate_pld_fast(
    mech_of: Callable[[float], Mechanism], target: float, delta: float
) -> float | None:
    """Smallest z with ``_eps_pld <= target`` (see above); None: run Brent's method instead,
    which also reports out-of-range targets."""
    probe = mech_of(1.0)
    if probe.gaussian_only:
        u = _gaussian_start(probe, target, delta)
        if u is None:
            return None
        return _fine_search(mech_of, target, delta, u, -1.0, _GAUSSIAN_MARGIN, _GAUSSIAN_RTOL)
    u, slope, scale = 0.0, -2.0, None
    for factor, tol in _COARSE_LEVELS:
        root = _coarse_root(mech_of, target, delta, u, slope, factor, tol, scale)
        if root is None:
            return None
        u, slope, scale = root
    return _fine_search(mech_of, target, delta, u, slope, _FINE_MARGIN, _FINE_RTOL)


# The calibration cache (issue 30): for a Poisson run without a prefix, a candidate z
# interpolated from a grid of charged PLD values shipped with the package
# (dpsql/calibration_cache.py), aimed a hair above the interpolated root so that it passes, then
# the same secant steps on the charged PLD as above: usually one charged evaluation. The cache
# only decides where to look; a z is returned only if it passed _eps_pld, and when the steps do
# not settle (a wrong or stale grid) the search above runs instead.

#: Charged evaluations the cache's start may take before the search takes over.
_CACHE_STEPS = 4


def _calibrate_from_cache(
    mech_of: Callable[[float], Mechanism], target: float, delta: float
) -> float | None:
    probe = mech_of(1.0)
    if probe.gaussian_only or probe.prefix_noise_multiplier is not None:
        return None
    assert probe.steps is not None and probe.sampling_rate is not None
    guess = calibration_cache.candidate(target, delta, probe.steps, probe.sampling_rate)
    if guess is None or not MIN_NOISE_MULTIPLIER <= guess.noise_multiplier <= MAX_NOISE_MULTIPLIER:
        return None
    # The last coarse level from the candidate (two or three cheap steps: the start is close).
    # Its root is at or above the charged one (a coarser PLD is more pessimistic): by under
    # rtol for most runs, where it is the better start, but by about 1% for long runs at small
    # rates (Protein's), where the candidate is closer. The gap is estimated from the PLD three
    # times coarser still (discretisation errors grow about as the interval to the power 1.5
    # to 2: the 10x gap is about a sixth of the 30x - 10x difference).
    (wide, _), (factor, tol) = _COARSE_LEVELS
    guessed = math.log(guess.noise_multiplier)
    root = _coarse_root(mech_of, target, delta, guessed, guess.slope, factor, tol)
    if root is None:
        return None
    u, slope, scale = root
    mech = mech_of(math.exp(u))
    spread = _coarse_log_eps(mech, delta, wide * scale) - _coarse_log_eps(
        mech, delta, factor * scale
    )
    gap = spread / 6 / -slope  # in log z
    if math.isfinite(gap) and gap > _FINE_RTOL:
        u = min(u, max(guessed + math.log1p(_FINE_MARGIN), u - 1.5 * gap))
    return _fine_search(
        mech_of, target, delta, u, slope, _FINE_MARGIN, _FINE_RTOL, settle_within=_CACHE_STEPS
    )


def _calibrate(
    mech_of: Callable[[float], Mechanism], target: float, delta: float, accountant: str, rtol: float
) -> float:
    def make_accountant() -> dp_accounting.PrivacyAccountant:
        if accountant == "pld":
            return _pld_accountant(mech_of(1.0))
        return _rdp_accountant(mech_of(1.0))

    def eps_of(z: float) -> float:
        # The very accountant calibrate_dp_mechanism uses (the PLD at full precision).
        return float(make_accountant().compose(mech_of(z).event).get_epsilon(delta))

    if accountant == "pld":
        fast = _calibrate_from_cache(mech_of, target, delta)
        if fast is not None:
            return fast
        fast = _calibrate_pld_fast(mech_of, target, delta)
        if fast is not None:
            return fast
    if accountant == "pld":
        # The RDP bound is fast and never below the PLD value: a tight upper start.
        guess = _calibrate(mech_of, target, delta, "rdp", rtol=1e-2)
        lo, hi = _bracket(eps_of, target, guess, factor=1.25)
    else:
        lo, hi = _bracket(eps_of, target, 1.0, factor=2.0)
    z = float(
        mechanism_calibration.calibrate_dp_mechanism(
            make_accountant,
            lambda z: mech_of(z).event,
            target,
            delta,
            mechanism_calibration.ExplicitBracketInterval(lo, hi),
            tol=rtol * lo,
        )
    )
    # calibrate_dp_mechanism guarantees epsilon(z) <= target for its accountant; epsilon() may
    # discretise the PLD more coarsely for large epsilon. Step up until epsilon() agrees.
    step = rtol
    for _ in range(60):
        if _EPSILON[accountant](mech_of(z), delta) <= target:
            return z
        z *= 1 + step
        step *= 2
    raise RuntimeError("calibration did not converge")  # pragma: no cover


def calibrate(
    target_epsilon: float,
    delta: float,
    *,
    scheme: str,
    epochs: int | None = None,
    steps: int | None = None,
    sampling_rate: float | None = None,
    accountant: str = "pld",
    prefix_noise_multiplier: float | None = None,
) -> float:
    """Smallest noise multiplier (within a relative 1e-4) whose epsilon is at most the target.

    The returned ``z`` satisfies ``epsilon(z, ..., accountant=accountant) <= target_epsilon``:
    it passed that very evaluation. For the PLD, where to evaluate is decided by, in turn, the
    calibration cache (a Poisson run inside its grid: a candidate read from
    ``dpsql/data/calibration_poisson.json``, usually one charged evaluation; issue 30), a secant
    search from coarser PLDs or the exact Gaussian (issue 17), and dp-accounting's
    ``calibrate_dp_mechanism`` (Brent's method) around the RDP calibration. The first two return
    a ``z`` within about 5e-4 (relative) of the smallest passing one.

    Parameters
    ----------
    target_epsilon : float
        Target epsilon ``> 0``.
    delta : float
        Target delta in (0, 1).
    scheme, epochs, steps, sampling_rate
        As in :func:`epsilon`.
    accountant : {"pld", "rdp"}
        A replace-one accountant; ``"rdp_add_remove"`` is refused (not a replace-one guarantee).

    Returns
    -------
    float
        The noise multiplier ``z``.

    Raises
    ------
    ValueError, TypeError
        On invalid arguments, or if the target needs ``z`` outside [1e-3, 1e7].
    """
    target = _positive("target_epsilon", target_epsilon)
    acc = _accountant(accountant)
    if acc == "rdp_add_remove":
        raise ValueError(
            "calibrate with a replace-one accountant ('pld' or 'rdp'); 'rdp_add_remove' is only a "
            "reference value"
        )
    args = _scheme_args(scheme, epochs, steps, sampling_rate)
    prefix = _prefix(prefix_noise_multiplier)
    return _calibrate(
        lambda z: _mechanism(z, *args, prefix), target, _delta(delta), acc, CALIBRATION_RTOL
    )


# ---------------------------------------------------------------------------------------------
# Report


def report(
    noise_multiplier: float,
    *,
    scheme: str,
    epochs: int | None = None,
    steps: int | None = None,
    sampling_rate: float | None = None,
    delta: float,
    prefix_noise_multiplier: float | None = None,
) -> dict[str, Any]:
    """Every accountant's epsilon for a run, with the neighbouring relation each one uses.

    Parameters
    ----------
    noise_multiplier, scheme, epochs, steps, sampling_rate, delta
        As in :func:`epsilon`.

    Returns
    -------
    dict
        ``epsilon_pld`` / ``relation_pld`` (charged), ``epsilon_rdp`` / ``relation_rdp`` and
        ``rdp_order``, ``epsilon_rdp_add_remove`` / ``relation_rdp_add_remove`` (reference only),
        ``scheme``, ``epochs``, ``steps``, ``sampling_rate``, ``noise_multiplier``,
        ``unit_sensitivity_noise_multiplier`` (``z / 2`` when the record's view is plain
        Gaussians), ``delta``, ``dp_event`` and ``dp_event_relation`` (what was accounted),
        ``accountant_versions``. The accountant's answer adds the same run as the ledger records
        it (:func:`dpsql.accountant_requests.report`).
    """
    mech = mechanism(
        noise_multiplier,
        scheme=scheme,
        epochs=epochs,
        steps=steps,
        sampling_rate=sampling_rate,
        prefix_noise_multiplier=prefix_noise_multiplier,
    )
    d = _delta(delta)
    eps_rdp, order = _rdp_epsilon_and_order(mech, d)
    if mech.gaussian_only:
        relation_rdp = "replace-one (exact Gaussian RDP, sensitivity 2C)"
        relation_pld = "replace-one (Gaussian PLD, sensitivity 2C)"
    else:
        relation_rdp = (
            "replace-one (bound: remove then add, Renyi weak triangle inequality on the "
            "add/remove RDP curve)"
        )
        relation_pld = "replace-one (PLD of the Poisson-subsampled Gaussian, REPLACE_ONE)"
    return {
        "scheme": mech.scheme,
        "epochs": mech.epochs,
        "steps": mech.steps,
        "sampling_rate": mech.sampling_rate,
        "noise_multiplier": mech.noise_multiplier,
        "prefix_noise_multiplier": mech.prefix_noise_multiplier,
        "unit_sensitivity_noise_multiplier": (
            mech.noise_multiplier / 2 if mech.gaussian_only else None
        ),
        "delta": d,
        "epsilon_pld": _eps_pld(mech, d),
        "relation_pld": relation_pld,
        "epsilon_rdp": float(eps_rdp),
        "relation_rdp": relation_rdp,
        "rdp_order": float(order),
        "epsilon_rdp_add_remove": _eps_rdp_add_remove(mech, d),
        "relation_rdp_add_remove": "add/remove (reference, not the replace-one guarantee)",
        "dp_event": str(mech.event),
        "dp_event_relation": mech.relation.name,
        "accountant_versions": {"dp_accounting": dp_accounting_version()},
    }


if __name__ == "__main__":
    # The program ``python -m dpsql.accounting`` (the command line the server runs): this block
    # runs as the module ``__main__``, not as dpsql.accounting, so the modules on top of this one
    # are imported from here without a circle (tests/python/test_module_graph.py).
    if sys.argv[1:2] == ["--serve"]:
        from dpsql import accountant_server

        sys.exit(accountant_server.main(sys.argv[2:]))
    from dpsql import accountant_requests

    sys.exit(accountant_requests.main())
