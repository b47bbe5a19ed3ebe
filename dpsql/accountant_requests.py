"""The accountant's requests and answers: what ``python -m dpsql.accounting`` takes and prints.

PostgreSQL cannot import Python, so the server sends its accounting questions to a Python process
(sql/src/accountant_fmgr.c): one JSON object per request, one JSON object per answer.

Command line
------------
``python -m dpsql.accounting '<json>'`` where the JSON object has ``"op"`` (``"calibrate"``,
``"epsilon"`` or ``"report"``) and the keyword arguments of :func:`dpsql.accounting.calibrate`,
:func:`dpsql.accounting.epsilon` and :func:`report` (``null`` means absent). It prints one line
of JSON ``{"noise_multiplier", "epsilon", "epsilon_pld", "epsilon_rdp", "accountant",
"dp_accounting", "ledger_event", ...}`` (``ledger_event``: the run as the ledger records it, which
the server charges) and exits 0, or prints ``{"error": "..."}`` and exits 2 on bad input (1 on an
unexpected failure). Nothing is written to stderr (the server reads ``2>&1``).

Other ops are answered by their own modules (:data:`MODULE_OPS`): ``"compose"`` (the ledger's
composition, :mod:`dpsql.ledger_events`), ``"select"`` (private selection,
:mod:`dpsql.selection`) and ``"audit_bound"`` (:mod:`dpsql.audit_stats`).

``python -m dpsql.accounting --serve <socket>`` answers the same requests, one line each, on a
Unix socket: the server's long-lived accountant (:mod:`dpsql.accountant_server`, on top of this
module; the block at the end of dpsql/accounting.py starts one or the other).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from dpsql import accounting, ledger_events

__all__ = ["MODULE_OPS", "answer", "dumps", "main", "quiet", "report"]


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
    """:func:`dpsql.accounting.report` and ``ledger_event``: the same run as the ledger records
    it (:attr:`dpsql.accounting.Mechanism.ledger_event` in
    :func:`dpsql.ledger_events.to_jsonb_json`), the event the release charges."""
    run: dict[str, Any] = {
        "scheme": scheme,
        "epochs": epochs,
        "steps": steps,
        "sampling_rate": sampling_rate,
        "prefix_noise_multiplier": prefix_noise_multiplier,
    }
    rep = accounting.report(noise_multiplier, delta=delta, **run)
    mech = accounting.mechanism(noise_multiplier, **run)
    return {**rep, "ledger_event": ledger_events.to_jsonb_json(mech.ledger_event)}


_OPS = ("calibrate", "epsilon", "report")
_KEYS = {
    "op",
    "noise_multiplier",
    "target_epsilon",
    "delta",
    "scheme",
    "epochs",
    "steps",
    "sampling_rate",
    "accountant",
    "prefix_noise_multiplier",
}


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


#: Other requests the server sends through the same command, each answered by its own module
#: (op -> "module:function", imported on demand; the function takes the request dict and returns
#: the answer dict).
MODULE_OPS = {
    "audit_bound": "dpsql.audit_stats:run",
    "compose": "dpsql.ledger_events:run",
    "select": "dpsql.selection:run",
}


def _run(request: Any) -> dict[str, Any]:  # noqa: C901
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object")
    if request.get("op") in MODULE_OPS:
        import importlib

        module, function = MODULE_OPS[request["op"]].split(":")
        answer: dict[str, Any] = getattr(importlib.import_module(module), function)(request)
        return answer
    unknown = sorted(set(request) - _KEYS)
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    args = {k: v for k, v in request.items() if v is not None}  # null means absent
    op = args.pop("op", None)
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    accountant = accounting._accountant(args.pop("accountant", "pld"))
    for key in ("scheme", "delta"):
        if key not in args:
            raise ValueError(f"{key} is required")
    if op == "calibrate":
        if "noise_multiplier" in args:
            raise ValueError("calibrate takes target_epsilon, not noise_multiplier")
        if "target_epsilon" not in args:
            raise ValueError("calibrate needs target_epsilon")
        target = args.pop("target_epsilon")
        z = accounting.calibrate(target, accountant=accountant, **args)
    else:
        if "target_epsilon" in args:
            raise ValueError(f"{op} takes noise_multiplier, not target_epsilon")
        if "noise_multiplier" not in args:
            raise ValueError(f"{op} needs noise_multiplier")
        z = args.pop("noise_multiplier")
    rep = report(z, **args)
    primary = {
        "pld": rep["epsilon_pld"],
        "rdp": rep["epsilon_rdp"],
        "rdp_add_remove": rep["epsilon_rdp_add_remove"],
    }[accountant]
    if not math.isfinite(primary):
        raise ValueError(f"the {accountant} epsilon is not finite: no privacy at this noise")
    out: dict[str, Any] = {
        "op": op,
        "noise_multiplier": float(rep["noise_multiplier"]),
        "epsilon": primary,
        "epsilon_pld": _json_number(rep["epsilon_pld"]),
        "epsilon_rdp": _json_number(rep["epsilon_rdp"]),
        "accountant": accountant,
        "dp_accounting": rep["accountant_versions"]["dp_accounting"],
        "scheme": rep["scheme"],
        "delta": rep["delta"],
        # what the release charges (the ledger's dp_event): the event accounted here
        "ledger_event": rep["ledger_event"],
    }
    if op == "calibrate":
        out["target_epsilon"] = float(request["target_epsilon"])
    if op == "report":
        for key, value in rep.items():
            out.setdefault(key, _json_number(value) if isinstance(value, float) else value)
    return out


def quiet() -> None:
    """Keep absl's and Python's warnings off the answer (the server reads stdout and stderr)."""
    import logging
    import warnings

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


def answer(request_json: str) -> tuple[int, dict[str, Any]]:
    """The exit status and the JSON object of one request (see the module's docstring)."""
    try:
        try:
            request = json.loads(request_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
        return 0, _run(request)
    except (ValueError, TypeError) as exc:
        return 2, {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the server needs a JSON line whatever happens
        return 1, {"error": f"{type(exc).__name__}: {exc}"}


def dumps(obj: dict[str, Any]) -> str:
    """One line of strict JSON (no NaN or Infinity)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpsql.accounting '<json>'``: print one JSON line.

    (``python -m dpsql.accounting --serve <socket>`` is :func:`dpsql.accountant_server.main`.)

    Returns the exit status: 0 on success, 2 on bad input, 1 on an unexpected failure.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet()
    if len(argv) != 1:
        status, obj = 2, {"error": "usage: python -m dpsql.accounting '<json object>'"}
    else:
        status, obj = answer(argv[0])
    sys.stdout.write(dumps(obj) + "\n")
    sys.stdout.flush()
    return status
