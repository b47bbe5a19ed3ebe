"""Fingerprints of seeded releases: does a refactor change what any release is?

The safety net of issue 45 (one typed plan and one controller per release): every seeded
release must be identical before and after, its weights and every parameter it records.

On a fresh temporary embedded PostgreSQL, as the superuser (who may pass noise seeds), the
script loads small synthetic tables drawn with a fixed numpy seed, each with a holdout table
registered as a dataset of its own (2,000 + 600 rows):

* ``binary``: three numeric features on [-1, 1] and one categorical column (three colours,
  one-hot), labels {0, 1}; ``binary_numeric``, its numeric columns alone (for the
  exponential mechanism, which is for at most 5 coordinates);
* ``multiclass``: three numeric features, three classes;
* ``regression``: four numeric features, the label bounded by 3 (``label_bound``).

It then releases, each with ``seed``, ``noise_seed`` and every privacy argument given
(epsilon 1; delta 1e-6 where the mechanism needs one, else 0):

* every mechanism of ``dpsql.mechanisms()`` (read from the registry, not listed here) for every
  model it lists: ``logistic`` and ``huber`` on ``binary``, ``multinomial`` on ``multiclass``,
  ``linear`` and ``lasso`` on ``regression``, and ``logistic`` one-vs-rest on ``multiclass``
  for the mechanisms without a multinomial model. A mechanism that refuses at its defaults is
  recorded as refused (the message and hint are part of the fingerprint); the ones in
  ``OVERRIDES`` are released again with the setting their hint names;
* DP-SGD with ``schedule => 'constant'`` spelled out (issue 45's first bug), and the
  exponential mechanism on ``binary_numeric``;
* ``auto`` on each dataset with delta 1e-6 and 0, and with ``validation`` (private selection);
* ``dpsql.describe``, private ``dpsql.evaluate`` (of auto's models, on the holdouts) and
  ``dpsql.tune`` with its default candidates: their outputs are releases too.

A release's fingerprint is its ``dpsql.model_store`` row less the volatile columns (model_id,
created_at, prepare_seconds, train_seconds, and ``params->'privacy'->'ledger_entry'``), the
weights included as exact float64 (JSON floats are Python's ``repr``, which reads back
bit-identical, and ``weights_hex``, the big-endian bytes of each double as PostgreSQL's
``float8send`` writes them), the result rows of describe and evaluate, and the ledger
entries the call wrote (dataset, mechanism, epsilon, delta, dp_event); or ``refused`` with the
error's message, detail, hint and SQLSTATE (and the entries, none for a refusal before the
charge). One entry per (dataset, mechanism, model[, variant]), written as JSON with
sorted keys.

Usage::

    .venv/bin/python -m bench.release_fingerprints [--out bench/fingerprints.json]
    .venv/bin/python -m bench.release_fingerprints --check bench/fingerprints.json
    .venv/bin/python -m bench.release_fingerprints --compare BEFORE.json AFTER.json

``--check FILE`` recomputes the fingerprints and prints every difference from FILE (which
release, which field, before and after); it exits 1 if any differ. Run it after every step of
a refactor of the release pipeline: a difference is a behaviour change, to be fixed or listed
here with its reason.

Known changes already in the baseline: issue 45's two bugs were fixed (commit 424bf4b) before
bench/fingerprints.json was first written, so the baseline already has both fixes:

* DP-SGD with ``schedule => 'constant'`` spelled out trained with step 0.5, where the same
  call with ``schedule`` left to its default got the default step; now both get the default
  (``binary/dpsgd/logistic schedule=constant`` equals ``binary/dpsgd/logistic``);
* plan-and-fit models (AdaSSP, objective and output perturbation, ...) recorded SGD fields
  (epochs 10, batch_size 1, schedule 'constant', a step size) they never ran; now NULL.

The script talks SQL only (``dpsql.train`` and friends), so an older checkout runs it too.
It runs the default embedded PostgreSQL (``server.DEFAULT_PG_VERSION``) and draws its tables
with numpy: compare runs of the same major version and numpy's same random streams. About 20 s
on 2 busy cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from dpsql import extension, server

DEFAULT_OUT = Path(__file__).with_name("fingerprints.json")
DATA_SEED = 45
SEED = 3  # the shuffle seed
NOISE_SEED = 7
EPSILON = 1.0
DELTA = 1e-6
TRAIN_ROWS = 2000
HOLDOUT_ROWS = 600
COLOURS = ("red", "green", "blue")

# The dataset each model is trained on (logistic also one-vs-rest on multiclass, below).
MODEL_DATASETS = {
    "logistic": "binary",
    "huber": "binary",
    "multinomial": "multiclass",
    "linear": "regression",
    "lasso": "regression",
}
# Settings that run a mechanism refusing at its defaults on these tables, as its hint names
# them: (mechanism, dataset) -> extra dpsql.train arguments. Each is released both ways.
OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    ("bst14", "binary"): {"batch_size": 50},  # noise 4.3 times the gradient bound
    ("bst14", "multiclass"): {"batch_size": 50},
    ("dp_ftrl", "binary"): {"batch_size": 128},  # its lazy steps stay at the majority class
    ("scs13", "binary"): {"batch_size": 10},  # one pass of 1/sqrt(t) steps: majority class
    ("frank_wolfe", "binary"): {"options": {"steps": 4}},  # its 16 steps choose at random
    ("dp_ssgd", "regression"): {"options": {"baseline": True}},  # the paper's baseline
    # DP-STAT is infeasible on 2,000 rows at epsilon 1 (it needs about 5,200 at 2 blocks)
    ("dp_ambssgd", "regression"): {"steps": 2, "epsilon": 4.0},
}
# Extra releases: (dataset, mechanism, model, variant label, extra arguments).
VARIANTS: tuple[tuple[str, str, str, str, dict[str, Any]], ...] = (
    # issue 45's first bug: the spelled-out default schedule gets the default step
    ("binary", "dpsgd", "logistic", "schedule=constant", {"schedule": "constant"}),
    # the exponential mechanism is for p <= 5 (binary has 6 coordinates with the one-hot
    # colour): the binary table's numeric columns alone
    ("binary_numeric", "exponential_mechanism", "logistic", "", {}),
    ("binary_numeric", "exponential_mechanism", "huber", "", {}),
)
# auto, describe, evaluate and tune: the model trained on each dataset
AUTO_MODELS = {"binary": "logistic", "multiclass": "multinomial", "regression": "linear"}
# model_store columns that change from run to run (params->'privacy'->'ledger_entry' too)
VOLATILE = ("model_id", "created_at", "prepare_seconds", "train_seconds")


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def _tables(rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    """Each dataset's columns (train + holdout rows) and its registration arguments."""
    n = TRAIN_ROWS + HOLDOUT_ROWS
    X = rng.uniform(-1, 1, size=(n, 3))
    colour = rng.integers(0, len(COLOURS), size=n)
    score = X @ np.array([1.5, -1.0, 0.5]) + np.array([0.6, 0.0, -0.6])[colour]
    y_bin = (score + rng.normal(0, 0.5, n) > 0).astype(int)
    Xm = rng.uniform(-1, 1, size=(n, 3))
    W = np.array([[2.0, -1.0, 0.0], [-1.0, 2.0, 0.5], [0.0, -0.5, 2.0]])
    y_multi = np.argmax(Xm @ W + rng.normal(0, 0.5, (n, 3)), axis=1)
    Xr = rng.uniform(-1, 1, size=(n, 4))
    y_reg = np.clip(Xr @ np.array([1.0, -0.5, 0.25, 0.0]) + 0.5 + rng.normal(0, 0.2, n), -3, 3)
    num = "{{-1,1},{-1,1},{-1,1}}"
    return {
        "binary": {
            "columns": {"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "colour": colour, "y": y_bin},
            "types": {"colour": "text", "y": "int"},
            "register": {
                "labels": [0, 1],
                "categories": Jsonb({"colour": list(COLOURS)}),
                "feature_bounds": num,
            },
        },
        "binary_numeric": {
            "columns": {"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": y_bin},
            "types": {"y": "int"},
            "register": {"labels": [0, 1], "feature_bounds": num},
        },
        "multiclass": {
            "columns": {"a": Xm[:, 0], "b": Xm[:, 1], "c": Xm[:, 2], "y": y_multi},
            "types": {"y": "int"},
            "register": {"labels": [0, 1, 2], "feature_bounds": num},
        },
        "regression": {
            "columns": {"a": Xr[:, 0], "b": Xr[:, 1], "c": Xr[:, 2], "d": Xr[:, 3], "y": y_reg},
            "types": {},
            "register": {"label_bound": 3.0, "feature_bounds": "{{-1,1},{-1,1},{-1,1},{-1,1}}"},
        },
    }


def _value(v: Any, sqltype: str) -> Any:
    return COLOURS[int(v)] if sqltype == "text" else int(v) if sqltype == "int" else float(v)


def _load(conn: psycopg.Connection[Any]) -> None:
    """Create, fill and register fp_<kind> and fp_<kind>_holdout for each dataset."""
    rng = np.random.default_rng(DATA_SEED)
    conn.execute("CREATE SCHEMA fp")
    for kind, spec in _tables(rng).items():
        cols: dict[str, np.ndarray] = spec["columns"]
        names = list(cols)
        types = {c: spec["types"].get(c, "float8") for c in names}
        features = [c for c in names if c != "y"]
        for part, rows in (
            ("", range(TRAIN_ROWS)),
            ("_holdout", range(TRAIN_ROWS, TRAIN_ROWS + HOLDOUT_ROWS)),
        ):
            table = f"fp.{kind}{part}"
            ddl = ", ".join(f"{c} {types[c]}" for c in names)
            conn.execute(f"CREATE TABLE {table} (rid bigint PRIMARY KEY, {ddl})")
            with conn.cursor().copy(f"COPY {table} (rid, {', '.join(names)}) FROM STDIN") as cp:
                for i in rows:
                    cp.write_row([i, *(_value(cols[c][i], types[c]) for c in names)])
            conn.execute(f"ANALYZE {table}")
            reg = spec["register"]
            args = ", ".join(f"{k} => %s" for k in reg)
            conn.execute(
                f"SELECT dpsql.register_dataset(%s, %s, 'y', 1e9, 0.9, name => %s, {args})",
                [table, features, f"fp_{kind}{part}", *reg.values()],
            )


# --------------------------------------------------------------------------------------------
# Releases
# --------------------------------------------------------------------------------------------


def _refusal(err: psycopg.Error) -> dict[str, Any]:
    return {
        "refused": err.diag.message_primary,
        "detail": err.diag.message_detail,
        "hint": err.diag.message_hint,
        "sqlstate": err.sqlstate,
    }


def _last_entry(conn: psycopg.Connection[Any]) -> int:
    (last,) = conn.execute("SELECT coalesce(max(entry_id), 0) FROM dpsql.ledger_entries").fetchone()
    return int(last)


def _entries(conn: psycopg.Connection[Any], after: int) -> list[dict[str, Any]]:
    """The ledger entries written after entry ``after``: what the call charged."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT d.name AS dataset, e.mechanism, e.epsilon, e.delta, e.dp_event"
            " FROM dpsql.ledger_entries e JOIN dpsql.datasets d USING (dataset_id)"
            " WHERE e.entry_id > %s ORDER BY e.entry_id",
            (after,),
        ).fetchall()


def _model_row(conn: psycopg.Connection[Any], model_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT m.*, (SELECT string_agg(encode(float8send(w), 'hex'), ' ' ORDER BY i)"
            "  FROM unnest(m.weights) WITH ORDINALITY AS u(w, i)) AS weights_hex"
            " FROM dpsql.model_store m WHERE m.model_id = %s",
            (model_id,),
        ).fetchone()
    assert row is not None
    for col in VOLATILE:
        row.pop(col)
    privacy = row["params"].get("privacy")
    if isinstance(privacy, dict):
        privacy.pop("ledger_entry", None)
    return row


def _call(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> tuple[Any, dict[str, Any]]:
    """Run a release; (its result rows or None, its fingerprint so far)."""
    before = _last_entry(conn)
    try:
        rows = conn.execute(sql, params).fetchall()
        out: dict[str, Any] = {}
    except psycopg.Error as err:
        rows, out = None, _refusal(err)
    out["ledger"] = _entries(conn, before)
    return rows, out


def _train(
    conn: psycopg.Connection[Any], dataset: str, model: str, args: dict[str, Any]
) -> tuple[int | None, dict[str, Any]]:
    args = {"seed": SEED, "noise_seed": NOISE_SEED, "epsilon": EPSILON, **args}
    names = "".join(f", {k} => %s" for k in args)
    values = [Jsonb(v) if isinstance(v, dict) else v for v in args.values()]
    rows, out = _call(
        conn, f"SELECT dpsql.train(%s, NULL, NULL, %s{names})", [dataset, model, *values]
    )
    if rows is None:
        return None, out
    model_id = int(rows[0][0])
    out["model"] = _model_row(conn, model_id)
    return model_id, out


def _label(extra: dict[str, Any]) -> str:
    return ",".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(extra.items()))


def _mechanism_releases(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every registered mechanism on every model it lists, OVERRIDES and VARIANTS."""
    registry = conn.execute(
        'SELECT name, task, models, needs_delta FROM dpsql.mechanisms() ORDER BY name COLLATE "C"'
    ).fetchall()
    deltas = {name: DELTA if needs_delta else 0.0 for name, _, _, needs_delta in registry}
    for name, task, models, _ in registry:
        default_kind = "regression" if task == "regression" else "binary"
        cases = [(MODEL_DATASETS.get(m, default_kind), m) for m in models]
        if "logistic" in models and "multinomial" not in models:
            cases.append(("multiclass", "logistic"))  # one-vs-rest
        for kind, model in cases:
            key = f"{kind}/{name}/{model}"
            base = {"privacy": name, "delta": deltas[name]}
            yield key, _train(conn, f"fp_{kind}", model, base)[1]
            extra = OVERRIDES.get((name, kind))
            if extra is not None:
                yield (
                    f"{key} {_label(extra)}",
                    _train(conn, f"fp_{kind}", model, {**base, **extra})[1],
                )
    for kind, name, model, label, extra in VARIANTS:
        base = {"privacy": name, "delta": deltas[name]}
        yield (
            f"{kind}/{name}/{model} {label}".rstrip(),
            _train(conn, f"fp_{kind}", model, {**base, **extra})[1],
        )


def _rows_release(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> dict[str, Any]:
    """A release whose output is its result rows (describe, evaluate)."""
    rows, out = _call(conn, sql, params)
    if rows is not None:
        out["rows"] = [list(r) for r in rows]
    return out


def _other_releases(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """auto (with and without delta, with validation), describe, evaluate and tune."""
    auto_ids: dict[str, int | None] = {}
    for kind, model in AUTO_MODELS.items():
        for delta in (DELTA, 0.0):
            mid, out = _train(conn, f"fp_{kind}", model, {"privacy": "auto", "delta": delta})
            if delta:
                auto_ids[kind] = mid
            yield f"{kind}/auto/{model} delta={delta:g}", out
        args = {"privacy": "auto", "delta": DELTA, "validation": f"fp_{kind}_holdout"}
        yield f"{kind}/auto/{model} validation", _train(conn, f"fp_{kind}", model, args)[1]
    for kind in AUTO_MODELS:
        yield (
            f"{kind}/describe",
            _rows_release(
                conn,
                "SELECT feature, statistic, key, value, noise_sd FROM dpsql.describe(%s, 0.5, 0,"
                " noise_seed => %s) ORDER BY 1, 2, 3",
                [f"fp_{kind}", NOISE_SEED],
            ),
        )
    for kind, mid in auto_ids.items():
        if mid is not None:  # of auto with delta, on the holdout
            yield (
                f"{kind}/evaluate",
                _rows_release(
                    conn,
                    "SELECT metric, value, rows, baseline, metrics FROM dpsql.evaluate(%s, %s,"
                    " epsilon => 0.5, noise_seed => %s)",
                    [mid, f"fp_{kind}_holdout", NOISE_SEED],
                ),
            )
    for kind in AUTO_MODELS:
        for delta in (DELTA, 0.0):
            rows, out = _call(
                conn,
                "SELECT dpsql.tune(%s, %s, %s, %s, noise_seed => %s)",
                [f"fp_{kind}", f"fp_{kind}_holdout", EPSILON, delta, NOISE_SEED],
            )
            if rows is not None:
                out["model"] = _model_row(conn, int(rows[0][0]))
            yield f"{kind}/tune delta={delta:g}", out


def fingerprints(verbose: bool = True) -> dict[str, Any]:
    """Every release's fingerprint, on a fresh temporary server."""
    version = server.DEFAULT_PG_VERSION
    out: dict[str, Any] = {}
    with server.temporary_server(version) as uri:
        extension.ensure_available(uri, server.pg_config_path(version))
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("SET extra_float_digits = 3")  # shortest exact text of a float8
            conn.execute("CREATE EXTENSION dpsql CASCADE")
            _load(conn)
            for key, fp in itertools.chain(_mechanism_releases(conn), _other_releases(conn)):
                if verbose:
                    state = f"refused: {fp['refused']}" if "refused" in fp else "released"
                    print(f"  {key}: {state}", flush=True)
                out[key] = fp
    # through JSON, so that a fresh run compares like a loaded file (tuples are lists, ...)
    return json.loads(_dump(out))


def _dump(fps: dict[str, Any]) -> str:
    return json.dumps(fps, indent=1, sort_keys=True, default=str) + "\n"


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def _canon(value: Any) -> str:
    """Exact text of a value: -0.0 and 0.0 differ, 1 and 1.0 differ."""
    return json.dumps(value, sort_keys=True)


def _diffs(path: str, a: Any, b: Any) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from _diffs(f"{path}.{k}", a.get(k, "<absent>"), b.get(k, "<absent>"))
    elif (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b)
        and any(isinstance(v, (dict, list)) for v in a)
    ):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _diffs(f"{path}[{i}]", x, y)
    elif _canon(a) != _canon(b):
        yield path, a, b


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Print every difference; the number of releases that differ."""
    changed = 0
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            changed += 1
            print(f"{key}: only {'after' if key not in before else 'before'}")
            continue
        found = list(_diffs("", before[key], after[key]))
        if found:
            changed += 1
            for field, a, b in found:
                print(f"{key} {field.lstrip('.')}:\n  before: {_canon(a)}\n  after:  {_canon(b)}")
    refused = sum("refused" in v for v in after.values())
    print(f"{len(after)} releases ({refused} refused), {changed} differ")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    parser.add_argument(
        "--check", type=Path, metavar="FILE", help="recompute and compare with FILE"
    )
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        return 1 if compare(before, after) else 0
    started = time.monotonic()
    result = fingerprints()
    took = time.monotonic() - started
    if args.check:
        changed = compare(json.loads(args.check.read_text()), result)
        print(f"{took:.0f} s")
        return 1 if changed else 0
    args.out.write_text(_dump(result))
    refused = sum("refused" in v for v in result.values())
    print(f"{len(result)} releases ({refused} refused) -> {args.out}, {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
