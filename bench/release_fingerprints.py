"""Fingerprints of seeded releases: does a refactor change what any mechanism releases?

Trains every registered mechanism on every model it lists, and ``auto`` with and without
delta, on three small synthetic datasets (binary, three classes, regression), each with a fixed
noise seed and shuffle seed and every privacy argument given explicitly (epsilon 1, delta 1e-6
where the mechanism needs it, else 0), so that the releases are deterministic. Writes each
release's weights and recorded privacy parameters (less the ledger entry's id), or its refusal,
as JSON; ``--compare A B`` prints the cases whose releases differ.

Run it with two checkouts' virtualenvs, before and after a change, and compare:

    (cd ../before && .venv/bin/python -m bench.release_fingerprints /tmp/before.json)
    .venv/bin/python -m bench.release_fingerprints /tmp/after.json
    .venv/bin/python -m bench.release_fingerprints --compare /tmp/before.json /tmp/after.json

It talks SQL only (``dpsql.train``), so older versions of the Python API run it too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from dpsql import server
from dpsql.loading import load_numpy

_MODELS = {
    "binary": ("logistic", "huber"),
    "multiclass": ("multinomial",),
    "regression": ("linear", "lasso"),
}


def _datasets(conn: psycopg.Connection) -> dict[str, str]:
    rng = np.random.default_rng(26)
    X = rng.uniform(-1, 1, size=(20000, 3))
    made = {
        "binary": ((X[:, 0] > 0).astype(float), "labels => '{0,1}', row_norm => 'clip'"),
        "multiclass": (
            np.digitize(X[:, 0], [-0.3, 0.3]).astype(float),
            "labels => '{0,1,2}', row_norm => 'clip'",
        ),
        "regression": (
            X @ np.array([1.0, -0.5, 0.25]) + 1,
            "label_bound => 3, feature_bounds => '{{-1,1},{-1,1},{-1,1}}'",
        ),
    }
    names = {}
    for kind, (y, extra) in made.items():
        load_numpy(conn, f"fp_{kind}", X, y)
        conn.execute(
            f"SELECT dpsql.register_dataset('fp_{kind}', '{{x}}', 'y', 1e9, 0.9,"
            f" name => 'fp_{kind}', accept => true, {extra})"
        )
        names[kind] = f"fp_{kind}"
    return names


def _release(conn: psycopg.Connection, dataset: str, model: str, privacy: str, delta: float):
    try:
        (mid,) = conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, %s, privacy => %s, epsilon => 1, delta => %s,"
            " noise_seed => 7, seed => 3)",
            (dataset, model, privacy, delta),
        ).fetchone()
    except psycopg.Error as err:
        return {"refused": err.diag.message_primary}
    (weights, record) = conn.execute(
        "SELECT weights, (params->'privacy') - 'ledger_entry' FROM dpsql.model_store"
        " WHERE model_id = %s",
        (mid,),
    ).fetchone()
    return {"weights": weights, "privacy": record}


def fingerprints() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with (
        server.temporary_server(server.DEFAULT_PG_VERSION) as uri,
        psycopg.connect(uri, autocommit=True) as conn,
    ):
        conn.execute("CREATE EXTENSION dpsql CASCADE")
        names = _datasets(conn)
        mechanisms = conn.execute(
            "SELECT name, models, needs_delta FROM dpsql.mechanisms() ORDER BY name"
        ).fetchall()
        for name, models, needs_delta in mechanisms:
            for kind, kind_models in _MODELS.items():
                for model in kind_models:
                    if model in models:
                        delta = 1e-6 if needs_delta else 0.0
                        out[f"{name}/{model}"] = _release(conn, names[kind], model, name, delta)
        for kind, model in (("binary", "logistic"), ("regression", "linear")):
            for delta in (0.0, 1e-6):
                out[f"auto/{model}/delta={delta:g}"] = _release(
                    conn, names[kind], model, "auto", delta
                )
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    changed = 0
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        changed += 1
        if a is None or b is None:
            print(f"{key}: only {'after' if a is None else 'before'}")
        elif "refused" in a or "refused" in b:
            print(f"{key}: {a.get('refused', 'released')} -> {b.get('refused', 'released')}")
        else:
            keys = sorted(
                k
                for k in set(a["privacy"]) | set(b["privacy"])
                if a["privacy"].get(k) != b["privacy"].get(k)
            )
            same_weights = a["weights"] == b["weights"]
            print(f"{key}: weights {'identical' if same_weights else 'differ'}; record: {keys}")
    released = sum("weights" in v for v in after.values())
    print(f"{len(after)} cases ({released} released), {changed} differ")
    return 1 if changed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, help="JSON file to write")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        return compare(before, after)
    if args.out is None:
        parser.error("give the JSON file to write, or --compare BEFORE AFTER")
    result = fingerprints()
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{len(result)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
