"""The privacy ledger's releases as dp-accounting events, and their composition.

Every ledger entry (``dpsql.ledger_entries.dp_event``) stores the release it charged as a
dp-accounting ``DpEvent`` serialised to plain JSON, so that anyone can re-account a dataset's
total spend: ``dpsql.budget_report`` sends the events here (through the accountant command, op
``"compose"``), and ``dpsql_internal._charge`` does for a dataset charged by composition
(``dpsql.datasets.composition = 'pld'``).

What an event means (one convention for the whole ledger)
----------------------------------------------------------
Neighbouring datasets are **replace-one** (docs/architecture.md, privacy rules 6 and 7), and an
event means what dp-accounting's ``PLDAccountant(REPLACE_ONE)`` makes of it: ``GaussianDpEvent(z)``
is a sum of per-record vectors of norm at most ``C`` plus ``N(0, (z C)^2 I)``, whose replace-one
sensitivity is ``2 C`` (the PLD accountant doubles it itself); ``PoissonSampledDpEvent(q,
GaussianDpEvent(z))`` is its Poisson-subsampled version (dp-accounting's replace-one subsampled
Gaussian). A DP-SGD run is therefore ``SelfComposedDpEvent(GaussianDpEvent(z), epochs)``
(shuffled disjoint batches) or ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(z)), steps)`` (Poisson), preceded by ``GaussianDpEvent(p)`` for DPSGD-F's mean:
the events :mod:`dpsql.accounting` builds, with the multiplier ``z`` rather than the folded
``z / 2`` (which means the same under ``ADD_OR_REMOVE_ONE``). ``LaplaceDpEvent(b)`` is noise of
scale ``b`` on a unit-sensitivity sum (replace-one sensitivity 2).

A release without a tighter description is ``EpsilonDeltaDpEvent(epsilon, delta)``: any
mechanism that is (epsilon, delta)-DP. dp-accounting has no such event, so it is defined here
(a ``DpEvent`` subclass).

Composition
-----------
PLD (the tight value)
    Each event becomes a dp-accounting ``PrivacyLossDistribution`` (pessimistic discretisation,
    so every value is an upper bound) and they are composed. Gaussians and Poisson-subsampled
    Gaussians are built exactly as ``PLDAccountant(REPLACE_ONE)`` builds them; plain Gaussians
    (of any multipliers) are first merged into one Gaussian of multiplier ``(sum 1/z_i^2)^-1/2``,
    which is exact (a composition of Gaussian mechanisms is the Gaussian mechanism of the summed
    squared signal-to-noise ratios) and keeps long ledgers fast. An (epsilon, delta) event, which
    ``PLDAccountant`` refuses, is dp-accounting's ``from_privacy_parameters`` PLD: the privacy
    loss of the worst (epsilon, delta)-DP pair (Kairouz, Oh and Viswanath 2015), which dominates
    every (epsilon, delta)-DP mechanism, and dominating pairs compose adaptively (Zhu, Dong and
    Wang 2022): the composed PLD is sound for a mix of events.
RDP (a second, looser guarantee), only when no event is an (epsilon, delta) event
    RDP curves add up at each order. Events without subsampling are evaluated exactly by
    dp-accounting's ``RdpAccountant(ADD_OR_REMOVE_ONE)`` with the factor 2 of replace-one folded
    into the noise (``z / 2``; dp-accounting's RDP accountant does not double it under
    ``REPLACE_ONE``); Poisson-subsampled ones by :class:`dpsql.accounting.ReplaceOneRdpBound`
    (remove, then add). The summed curve is converted by dp-accounting's ``compute_epsilon``.

Request (``python -m dpsql.accounting '<json>'``, :mod:`dpsql.accountant_requests`; the server
checks its characters, so the JSON stays plain)::

    {"op": "compose", "events": [<event>, ...], "delta": 1e-05, "epsilon": 2.0}

``epsilon`` is optional (it asks for the delta at that epsilon too). The answer is
``{"op": "compose", "epsilon_pld", "epsilon_rdp", "delta", "delta_pld", "events",
"discretization", "relation", "dp_accounting"}``; an infinite epsilon (e.g. an event whose delta
exceeds the target) is ``null``.
"""

from __future__ import annotations

import json
import math
import numbers
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attr
import dp_accounting
import numpy as np
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import RdpAccountant, compute_epsilon

from dpsql.accounting import _REPLACE_ONE_ORDERS, ReplaceOneRdpBound, poisson_gaussian_pld
from dpsql.pld_settings import (
    PLD_DISCRETIZATION,
    PLD_FULL_PRECISION_UP_TO,
    dp_accounting_version,
)

__all__ = [
    "EVENT_TYPES",
    "EpsilonDeltaDpEvent",
    "compose",
    "from_json",
    "loads",
    "run",
    "to_json",
    "to_jsonb_json",
]

NeighboringRelation = dp_accounting.NeighboringRelation
PLD = pld_lib.PrivacyLossDistribution

#: Largest count of a self-composed event (no ledger composes more releases).
MAX_COUNT = 10**9


# dp-accounting is untyped (its classes are Any to mypy), so subclassing one needs the ignore.
@attr.s(frozen=True, slots=True, auto_attribs=True)
class EpsilonDeltaDpEvent(dp_accounting.DpEvent):  # type: ignore[misc]
    """A release known only to be (epsilon, delta)-DP (replace-one)."""

    epsilon: float
    delta: float


# JSON "type" -> (class, its fields in order). The names are dp-accounting's without "DpEvent".
EVENT_TYPES: dict[str, tuple[type, tuple[str, ...]]] = {
    "NoOp": (dp_accounting.NoOpDpEvent, ()),
    "EpsilonDelta": (EpsilonDeltaDpEvent, ("epsilon", "delta")),
    "Gaussian": (dp_accounting.GaussianDpEvent, ("noise_multiplier",)),
    "Laplace": (dp_accounting.LaplaceDpEvent, ("noise_multiplier",)),
    "PoissonSampled": (dp_accounting.PoissonSampledDpEvent, ("sampling_probability", "event")),
    "SelfComposed": (dp_accounting.SelfComposedDpEvent, ("event", "count")),
    "Composed": (dp_accounting.ComposedDpEvent, ("events",)),
}
_TYPE_OF = {cls: name for name, (cls, _) in EVENT_TYPES.items()}


# ---------------------------------------------------------------------------------------------
# Serialisation


def to_json(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """The JSON object of an event (``{"type": ..., <its fields>}``)."""
    name = _TYPE_OF.get(type(event))
    if name is None:
        raise ValueError(f"the ledger does not record {type(event).__name__}")
    out: dict[str, Any] = {"type": name}
    for field in EVENT_TYPES[name][1]:
        value = getattr(event, field)
        if field == "event":
            out[field] = to_json(value)
        elif field == "events":
            out[field] = [to_json(e) for e in value]
        elif field == "count":
            out[field] = int(value)
        else:
            out[field] = float(value)
    return out


def to_jsonb_json(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """:func:`to_json` with its numbers spelled as the server's jsonb spells a float8 (shortest
    digits, an integral value without ``.0``), so that an event the accountant sends is stored
    exactly as the server would write it (``2``, not ``2.0``)."""

    def spelled(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: spelled(v) for k, v in value.items()}
        if isinstance(value, list):
            return [spelled(v) for v in value]
        if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**53:
            return int(value)
        return value

    out: dict[str, Any] = spelled(to_json(event))
    return out


def _number(what: str, value: Any, lo: float, hi: float, *, open_lo: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r}")
    x = float(value)
    if not (math.isfinite(x) and (x > lo if open_lo else x >= lo) and x <= hi):
        raise ValueError(f"{what} must be in {'(' if open_lo else '['}{lo:g}, {hi:g}], got {x!r}")
    return x


def _field(name: str, field: str, value: Any) -> Any:
    what = f"{name}.{field}"
    if field == "event":
        return from_json(value)
    if field == "events":
        if not isinstance(value, list):
            raise TypeError(f"{what} must be a list of events")
        return [from_json(e) for e in value]
    if field == "count":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{what} must be an integer, got {value!r}")
        if not 1 <= int(value) <= MAX_COUNT:
            raise ValueError(f"{what} must be in [1, {MAX_COUNT}], got {value!r}")
        return int(value)
    if field == "sampling_probability":
        return _number(what, value, 0.0, 1.0, open_lo=False)
    if field == "delta":
        x = _number(what, value, 0.0, 1.0, open_lo=False)
        if x >= 1.0:
            raise ValueError(f"{what} must be < 1, got {x!r}")
        return x
    # epsilon and noise multipliers: 0 is allowed (no privacy: an infinite epsilon)
    return _number(what, value, 0.0, math.inf, open_lo=False)


def from_json(obj: Any) -> dp_accounting.DpEvent:
    """The event of a JSON object written by :func:`to_json` (validated)."""
    if not isinstance(obj, dict):
        raise TypeError(f"an event must be a JSON object, got {obj!r}")
    name = obj.get("type")
    if name not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {sorted(EVENT_TYPES)}, got {name!r}")
    cls, fields = EVENT_TYPES[name]
    unknown = sorted(set(obj) - {"type", *fields})
    missing = [f for f in fields if f not in obj]
    if unknown or missing:
        raise ValueError(
            f"{name} event takes {', '.join(fields) or 'no fields'}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    return cls(**{f: _field(name, f, obj[f]) for f in fields})


def loads(text: str) -> dp_accounting.DpEvent:
    """The event of a JSON text."""
    return from_json(json.loads(text))


# ---------------------------------------------------------------------------------------------
# Composition


class _Leaves:
    """An event tree flattened into what is composed: repeated leaves counted once."""

    def __init__(self) -> None:
        self.gaussian: Counter[float] = Counter()  # plain Gaussians: z -> count
        self.non_private = False  # a zero noise multiplier: no guarantee
        self.laplace: Counter[float] = Counter()
        self.poisson: Counter[tuple[float, float]] = Counter()  # (q, z) -> count, 0 < q < 1
        self.epsilon_delta: Counter[tuple[float, float]] = Counter()

    def add(self, event: dp_accounting.DpEvent, count: int = 1) -> None:  # noqa: C901
        if isinstance(event, dp_accounting.NoOpDpEvent):
            return
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            self.add(event.event, count * event.count)
        elif isinstance(event, dp_accounting.ComposedDpEvent):
            for e in event.events:
                self.add(e, count)
        elif isinstance(event, dp_accounting.GaussianDpEvent):
            if event.noise_multiplier == 0:
                self.non_private = True
            else:
                self.gaussian[event.noise_multiplier] += count
        elif isinstance(event, dp_accounting.LaplaceDpEvent):
            if event.noise_multiplier == 0:
                self.non_private = True
            else:
                self.laplace[event.noise_multiplier] += count
        elif isinstance(event, dp_accounting.PoissonSampledDpEvent):
            inner = event.event
            if not isinstance(inner, dp_accounting.GaussianDpEvent):
                raise ValueError("the ledger composes Poisson sampling of Gaussians only")
            q = event.sampling_probability
            if q == 0:
                return
            if q == 1:  # every record in every step: plain Gaussians
                self.add(inner, count)
            elif inner.noise_multiplier == 0:
                self.non_private = True
            else:
                self.poisson[(q, inner.noise_multiplier)] += count
        elif isinstance(event, EpsilonDeltaDpEvent):
            self.epsilon_delta[(event.epsilon, event.delta)] += count
        else:
            raise ValueError(f"the ledger does not compose {type(event).__name__}")

    def gaussian_noise_multiplier(self) -> float | None:
        """The one Gaussian all plain Gaussians compose to (exact), or None."""
        if len(self.gaussian) == 1:  # as dp-accounting composes a SelfComposedDpEvent
            ((z, count),) = self.gaussian.items()
            return z / math.sqrt(count)
        if not self.gaussian:
            return None
        return 1.0 / math.sqrt(sum(n / z**2 for z, n in sorted(self.gaussian.items())))


def _pld(
    leaves: _Leaves, discretization: float, delta: float
) -> pld_lib.PrivacyLossDistribution | None:
    """The composed replace-one PLD of the leaves read at ``delta`` (None when nothing was
    released)."""
    relation = NeighboringRelation.REPLACE_ONE
    parts: list[pld_lib.PrivacyLossDistribution] = []
    z = leaves.gaussian_noise_multiplier()
    if z is not None:
        # As PLDAccountant(REPLACE_ONE) builds a GaussianDpEvent: sensitivity doubled.
        parts.append(
            pld_lib.from_gaussian_mechanism(
                z, value_discretization_interval=discretization, neighboring_relation=relation
            )
        )
    for (q, zq), count in sorted(leaves.poisson.items()):
        # accounting.py's construction (tails truncated to the run and delta): a run
        # re-accounts to what it was charged
        parts.append(poisson_gaussian_pld(zq, q, count, discretization, delta))
    for b, count in sorted(leaves.laplace.items()):
        # Replace-one moves a unit-sensitivity sum by at most 2.
        parts.append(
            pld_lib.from_laplace_mechanism(
                b, sensitivity=2, value_discretization_interval=discretization
            ).self_compose(count)
        )
    for (eps, delta), count in sorted(leaves.epsilon_delta.items()):
        parts.append(
            pld_lib.from_privacy_parameters(
                pld_common.DifferentialPrivacyParameters(eps, delta),
                value_discretization_interval=discretization,
            ).self_compose(count)
        )
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total.compose(p)
    return total


def rdp_curve(leaves: _Leaves) -> np.ndarray | None:
    """Replace-one RDP curve of the leaves at the accountant's orders (``inf`` without noise),
    or None if an event has no RDP curve here."""
    orders = np.asarray(_REPLACE_ONE_ORDERS, dtype=np.float64)
    if leaves.epsilon_delta:
        return None
    if leaves.non_private:
        return np.full_like(orders, math.inf)
    exact = RdpAccountant(list(orders), NeighboringRelation.ADD_OR_REMOVE_ONE)
    z = leaves.gaussian_noise_multiplier()
    if z is not None:
        exact.compose(dp_accounting.GaussianDpEvent(z / 2))  # the factor 2 folded in
    for b, count in leaves.laplace.items():
        exact.compose(dp_accounting.LaplaceDpEvent(b / 2), count)
    curve = np.asarray(exact.rdp, dtype=np.float64)
    if leaves.poisson:
        bound = ReplaceOneRdpBound(_REPLACE_ONE_ORDERS)
        for (q, zq), count in leaves.poisson.items():
            bound.compose(
                dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(zq)), count
            )
        curve = curve + bound.rdp
    return curve


def _rdp_epsilon(leaves: _Leaves, delta: float) -> float | None:
    """Replace-one RDP epsilon of the leaves, or None if an event has no RDP curve here."""
    if delta <= 0:
        return None
    curve = rdp_curve(leaves)
    if curve is None:
        return None
    if leaves.non_private:
        return math.inf
    if not np.any(curve > 0):
        return 0.0
    eps, _ = compute_epsilon(np.asarray(_REPLACE_ONE_ORDERS, dtype=np.float64), curve, delta)
    return float(eps)


def _discretization(leaves: _Leaves, rdp: float | None) -> float:
    """The PLD interval: dp-accounting's default, coarser for large epsilons (as accounting.py).

    The estimate is the RDP epsilon, or basic composition of the (epsilon, delta) events plus
    the RDP of the rest; the value stays a pessimistic (sound) PLD bound either way.
    """
    estimate = sum(eps * n for (eps, _), n in leaves.epsilon_delta.items())
    if rdp is not None:
        estimate = max(estimate, rdp)
    if not math.isfinite(estimate):
        return PLD_DISCRETIZATION * 1e3
    return PLD_DISCRETIZATION * max(1.0, estimate / PLD_FULL_PRECISION_UP_TO)


def compose(
    events: Sequence[dp_accounting.DpEvent], delta: float, epsilon: float | None = None
) -> dict[str, Any]:
    """Replace-one composition of ledger events by PLD (and RDP where every event has a curve).

    Parameters
    ----------
    events : sequence of DpEvent
        The releases, in the ledger's convention (module docstring).
    delta : float
        Target delta in [0, 1).
    epsilon : float, optional
        Also report the PLD delta at this epsilon.

    Returns
    -------
    dict
        ``epsilon_pld`` (``inf`` without any guarantee), ``epsilon_rdp`` (None when some event
        has no RDP curve), ``delta``, ``delta_pld`` (None without ``epsilon``), ``events``,
        ``discretization``, ``relation``.
    """
    d = _number("delta", delta, 0.0, 1.0, open_lo=False)
    if d >= 1:
        raise ValueError(f"delta must be < 1, got {d!r}")
    eps_target = None if epsilon is None else _number("epsilon", epsilon, 0, math.inf, open_lo=True)
    leaves = _Leaves()
    for event in events:
        leaves.add(event)
    rdp = _rdp_epsilon(leaves, d)
    # A coarse bound first when the RDP estimate cannot size the interval: a long ledger of
    # (epsilon, delta) events at 1e-4 would take minutes.
    discretization = _discretization(leaves, rdp)
    pld = None if leaves.non_private else _pld(leaves, discretization, d)
    if leaves.non_private:
        eps_pld, delta_pld = math.inf, (None if eps_target is None else 1.0)
    elif pld is None:
        eps_pld, delta_pld = 0.0, (None if eps_target is None else 0.0)
    else:
        eps_pld = float(pld.get_epsilon_for_delta(d))
        delta_pld = None if eps_target is None else float(pld.get_delta_for_epsilon(eps_target))
    return {
        "epsilon_pld": max(eps_pld, 0.0),
        "epsilon_rdp": rdp,
        "delta": d,
        "delta_pld": delta_pld,
        "events": len(events),
        "discretization": discretization,
        "relation": "REPLACE_ONE",
    }


# ---------------------------------------------------------------------------------------------
# The accountant command's op "compose"

_KEYS = {"op", "events", "delta", "epsilon"}


def _json_number(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Answer ``{"op": "compose", "events": [...], "delta": d, "epsilon": e (optional)}``."""
    unknown = sorted(set(request) - _KEYS)
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    if request.get("op") != "compose":
        raise ValueError("op must be 'compose'")
    events = request.get("events")
    if not isinstance(events, list):
        raise ValueError("compose needs events, a list of serialised DpEvents")
    if "delta" not in request or request["delta"] is None:
        raise ValueError("compose needs delta")
    answer = compose([from_json(e) for e in events], request["delta"], request.get("epsilon"))
    return {
        "op": "compose",
        **answer,
        "epsilon_pld": _json_number(answer["epsilon_pld"]),
        "epsilon_rdp": _json_number(answer["epsilon_rdp"]),
        "dp_accounting": dp_accounting_version(),
    }
