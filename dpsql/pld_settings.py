"""The settings of the charged PLD, and the dp-accounting that computes it.

Every charged epsilon is a function of the run and of these: the PLD's discretisation interval,
its tail truncation, and the installed dp-accounting. The accounting math
(:mod:`dpsql.accounting`) and the ledger's composition (:mod:`dpsql.ledger_events`) compute with
them; the calibration grid records them as its provenance (:mod:`dpsql.calibration_cache`), so
that a grid computed otherwise is ignored. They live here, below all three, so that the cache
imports nothing else of dpsql's.
"""

from __future__ import annotations

__all__ = [
    "PLD_DISCRETIZATION",
    "PLD_FULL_PRECISION_UP_TO",
    "PLD_LOG_MASS_TRUNCATION_RANGE",
    "PLD_TAIL_SHARE",
    "dp_accounting_version",
]

#: PLD discretisation of the privacy loss (dp-accounting's default). The PLD accountant rounds
#: pessimistically, so any interval gives an upper bound; finer is tighter and slower.
PLD_DISCRETIZATION = 1e-4
#: Above this epsilon (estimated by the fast RDP bound) the PLD interval grows in proportion to
#: epsilon, so that a tiny noise multiplier costs seconds rather than minutes. Such guarantees are
#: meaningless anyway; the value stays a pessimistic (sound) PLD bound.
PLD_FULL_PRECISION_UP_TO = 64.0
#: Share of delta the Poisson steps' PLD may place at infinity when dp-accounting truncates the
#: Gaussian's tails (its ``log_mass_truncation_bound``, -50 by default whatever the run). The
#: truncated mass is counted as privacy loss infinity, so every bound stays pessimistic; a bound
#: sized to the run (see :func:`dpsql.accounting.poisson_log_mass_truncation`) halves the cost of
#: a charged evaluation and moves epsilon by under 1e-7 relative (bench/RESULTS.md, issue 30).
PLD_TAIL_SHARE = 1e-4
#: Clamp of that bound: never finer than dp-accounting's default, never coarser than e^-25.
PLD_LOG_MASS_TRUNCATION_RANGE = (-50.0, -25.0)


def dp_accounting_version() -> str:
    """The installed dp-accounting's version (recorded in every answer of the accountant)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-accounting")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"
