"""A candidate noise multiplier for a Poisson DP-SGD run, read from a shipped grid (issue 30).

The first calibration at a new configuration searches dp-accounting's charged PLD, each
evaluation 0.1 to 0.5 s for a Protein-size run. The grid (``dpsql/data/calibration_poisson.json``,
built by ``python -m dpsql.calibration_grid`` from that same PLD) holds, for log-spaced
``(steps, sampling_rate)`` nodes, the epsilon at each grid delta of log-spaced noise multipliers.
:func:`candidate` interpolates it (cubic, in log space) to the requested ``(steps, sampling_rate,
delta, target epsilon)``: within about 1% of the answer (0.04% to 0.6% on held-out runs), where
:func:`dpsql.accounting.calibrate` starts its search, which returns only a ``z`` that passed the
charged PLD.

Soundness never depends on this module: a missing, corrupted or stale file, or a wrong value in
it, gives no candidate or a poor one, and the charged evaluation (or the search it falls back to)
decides. The file is ignored when it was computed by another dp-accounting version than the one
installed, another PLD interval or another layout (:data:`FORMAT`): its :func:`provenance`.

This module imports, of dpsql's, only :mod:`dpsql.pld_settings`: the accounting math
(:mod:`dpsql.accounting`) reads the grid, and the generator is on top of both.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsql.pld_settings import PLD_DISCRETIZATION, dp_accounting_version

__all__ = ["FORMAT", "Candidate", "Grid", "candidate", "load", "path", "provenance"]

#: Bumped when the file's layout or meaning changes; the cache ignores other formats.
FORMAT = 1

_DEFAULT = Path(__file__).parent / "data" / "calibration_poisson.json"


def provenance() -> dict[str, Any]:
    """What a grid is computed with (:mod:`dpsql.calibration_grid` records it in the file); a
    file that differs is ignored."""
    return {
        "format": FORMAT,
        "scheme": "poisson",
        "relation": "REPLACE_ONE",
        "discretization": PLD_DISCRETIZATION,
        "dp_accounting": dp_accounting_version(),
    }


def path() -> Path:
    """Where the grid is read from."""
    return _DEFAULT


@dataclass(frozen=True)
class Candidate:
    """An interpolated noise multiplier and the local slope of log epsilon in log z."""

    noise_multiplier: float
    slope: float


@dataclass(frozen=True)
class Grid:
    """The grid file, checked: axes (log10) and, per ``(i, j)`` node, log z and log epsilon."""

    log10_steps: list[float]
    log10_q: list[float]
    log10_delta: list[float]
    log_z: dict[tuple[int, int], list[float]]
    log_eps: dict[tuple[int, int], list[list[float]]]


def _axis(axis: Any) -> list[float] | None:
    """An increasing list of at least two numbers, or None."""
    if not isinstance(axis, list) or len(axis) < 2:
        return None
    if not all(isinstance(x, float | int) and not isinstance(x, bool) for x in axis):
        return None
    values = [float(x) for x in axis]
    if not all(x < y for x, y in zip(values, values[1:], strict=False)):
        return None
    return values


def _parse(obj: Any) -> Grid | None:
    """The grid, or None if its provenance differs from this installation or it is malformed."""
    if not isinstance(obj, dict):
        return None
    if any(obj.get(k) != v for k, v in provenance().items()):
        return None
    grid, cells = obj.get("grid"), obj.get("cells")
    if not isinstance(grid, dict) or not isinstance(cells, dict):
        return None
    axes = [_axis(grid.get(k)) for k in ("log10_steps", "log10_sampling_rate", "log10_delta")]
    if any(a is None for a in axes):
        return None
    log_z: dict[tuple[int, int], list[float]] = {}
    log_eps: dict[tuple[int, int], list[list[float]]] = {}
    steps, rates, deltas = (a for a in axes if a is not None)
    n_delta = len(deltas)
    for key, cell in cells.items():
        try:
            i, j = (int(s) for s in key.split(","))
            zs = [float(x) for x in cell["log_z"]]
            eps = [[float(x) for x in row] for row in cell["log_eps"]]
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        if len(eps) != len(zs) or any(len(row) != n_delta for row in eps) or len(zs) < 2:
            return None
        log_z[i, j], log_eps[i, j] = zs, eps
    return Grid(steps, rates, deltas, log_z, log_eps)


_LOADED: dict[Path, Grid | None] = {}


def load(file: Path | None = None) -> Grid | None:
    """The grid at ``file`` (default :func:`path`), read once per process; None if unusable."""
    where = path() if file is None else file
    if where not in _LOADED:
        try:
            obj = json.loads(where.read_text())
        except (OSError, ValueError):
            obj = None
        _LOADED[where] = _parse(obj)
    return _LOADED[where]


# ---------------------------------------------------------------------------------------------
# Interpolation (Lagrange through four neighbouring nodes, in log space)


def _window(axis: list[float], x: float, width: int = 4) -> list[int] | None:
    """Indices of ``width`` consecutive nodes around ``x`` (None: x outside the axis)."""
    if not axis[0] <= x <= axis[-1]:
        return None
    k = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)  # axis[k] <= x <= axis[k+1]
    width = min(width, len(axis))
    first = min(max(k - (width - 2) // 2, 0), len(axis) - width)
    return list(range(first, first + width))


def _lagrange(xs: list[float], ys: list[float], x: float) -> float:
    total = 0.0
    for a, (xa, ya) in enumerate(zip(xs, ys, strict=True)):
        w = 1.0
        for b, xb in enumerate(xs):
            if a != b:
                w *= (x - xb) / (xa - xb)
        total += w * ya
    return total


def _node_log_z(
    grid: Grid, key: tuple[int, int], log10_delta: float, log_target: float
) -> tuple[float, float] | None:
    """(log z, slope) at which the node's epsilon is the target at this delta, or None."""
    zs, rows = grid.log_z.get(key), grid.log_eps.get(key)
    if zs is None or rows is None:
        return None
    dwin = _window(grid.log10_delta, log10_delta)
    if dwin is None:
        return None
    dx = [grid.log10_delta[k] for k in dwin]
    curve = [_lagrange(dx, [row[k] for k in dwin], log10_delta) for row in rows]
    # log epsilon decreases along z: the first node at or below the target
    k = next((n for n, e in enumerate(curve) if e <= log_target), None)
    if k is None or k == 0:
        return None
    first = min(max(k - 2, 0), len(zs) - 4) if len(zs) >= 4 else 0
    sel = list(range(first, min(first + 4, len(zs))))
    es = [curve[n] for n in sel]
    if any(b >= a for a, b in zip(es, es[1:], strict=False)):
        return None  # not monotone here: no inverse interpolation
    u = _lagrange(es, [zs[n] for n in sel], log_target)
    slope = (curve[k] - curve[k - 1]) / (zs[k] - zs[k - 1])
    return u, slope


def candidate(
    target_epsilon: float, delta: float, steps: int, sampling_rate: float, grid: Grid | None = None
) -> Candidate | None:
    """The interpolated smallest ``z`` whose charged epsilon is the target, or None.

    None when the grid is unusable or the request is outside it (steps, sampling rate, delta or
    epsilon beyond the grid's nodes). The value is a guess: verify it with the charged PLD.
    """
    g = load() if grid is None else grid
    if g is None or not (target_epsilon > 0 and 0 < delta < 1 and steps >= 1):
        return None
    if not 0 < sampling_rate < 1:
        return None
    x, y = math.log10(steps), math.log10(sampling_rate)
    log_target, log10_delta = math.log(target_epsilon), math.log10(delta)
    for width in (4, 2):  # cubic where the 4 x 4 nodes exist, else bilinear
        iw, jw = _window(g.log10_steps, x, width), _window(g.log10_q, y, width)
        if iw is None or jw is None:
            return None
        at = {(i, j): _node_log_z(g, (i, j), log10_delta, log_target) for i in iw for j in jw}
        found = {k: v for k, v in at.items() if v is not None}
        if len(found) < len(at):
            continue
        qs = [g.log10_q[j] for j in jw]
        cols = [_lagrange(qs, [found[i, j][0] for j in jw], y) for i in iw]
        u = _lagrange([g.log10_steps[i] for i in iw], cols, x)
        slope = sum(v[1] for v in found.values()) / len(found)
        if not (math.isfinite(u) and math.isfinite(slope) and slope < 0):
            return None
        return Candidate(math.exp(u), slope)
    return None
