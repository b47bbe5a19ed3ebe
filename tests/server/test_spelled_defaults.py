"""Issue 45's two bugs: a default spelled out gives the release the unspelled call gives
(DP-SGD with schedule => 'constant' trained with step 0.5, the same call without it with 2.0),
and plan-and-fit models record no SGD fields they never ran (AdaSSP and objective perturbation
showed epochs 10, batch_size 1, schedule 'constant')."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from dpsql.loading import load_numpy

SGD_FIELDS = (
    "epochs",
    "epochs_run",
    "batch_size",
    "schedule",
    "step_size",
    "step_offset",
    "shuffle",
)


@pytest.fixture
def datasets(conn, scratch_schema) -> dict[str, str]:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(2000, 3)) / 3
    y = np.where(X @ np.array([1.0, -0.5, 0.25]) > 0, 1.0, -1.0)
    out = {}
    for kind in ("cls", "reg"):
        load_numpy(conn, f"{scratch_schema}.{kind}", X, y if kind == "cls" else X @ [0.5, 0.2, 0.1])
        name = f"sd_{uuid.uuid4().hex[:8]}"
        extra = ", labels => NULL, label_bound => 1, row_bound => 1" if kind == "reg" else ""
        conn.execute(
            f"SELECT dpsql.register_dataset(%s, '{{x}}', 'y', 1000, 0.5, name => %s,"
            f" row_norm => 'clip'{extra})",
            (f"{scratch_schema}.{kind}", name),
        )
        out[kind] = name
    return out


def _model(conn, mid: int) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.model_store WHERE model_id = %s", (mid,)).fetchone()


@pytest.mark.parametrize("privacy", ["dpsgd", "bolton", "dpsgd_f"])
def test_constant_spelled_out_is_the_default_schedule(conn, datasets, privacy) -> None:
    delta = 0 if privacy == "bolton" else 1e-6
    releases = []
    for spelled in ("", ", schedule => 'constant'"):
        (mid,) = conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, privacy => %s, epsilon => 1, delta => %s,"
            f" seed => 3, noise_seed => 4, epochs => 2{spelled})",
            (datasets["cls"], privacy, delta),
        ).fetchone()
        releases.append(_model(conn, mid))
    unspelled, spelled_out = releases
    assert spelled_out["step_size"] == unspelled["step_size"]
    assert spelled_out["weights"] == unspelled["weights"]
    assert spelled_out["schedule"] == unspelled["schedule"] == "constant"


@pytest.mark.parametrize(
    ("privacy", "kind"),
    [("adassp", "reg"), ("dpgd", "reg"), ("objective_perturbation", "cls"),
     ("output_perturbation", "reg")],
)  # fmt: skip
def test_plan_and_fit_models_record_no_sgd_fields(conn, datasets, privacy, kind) -> None:
    model = ", model => 'linear'" if kind == "reg" else ", lambda => 0.01"
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%s, NULL, NULL, privacy => %s, epsilon => 10, delta => %s{model})",
        (datasets[kind], privacy, 1e-6 if privacy in ("adassp", "dpgd") else 0),
    ).fetchone()
    row = _model(conn, mid)
    assert {f: row[f] for f in SGD_FIELDS} == dict.fromkeys(SGD_FIELDS)
    assert row["params"]["privacy"]  # what it did run is recorded there


def test_every_default_spelled_out_gives_the_same_release(conn, datasets) -> None:
    """Issue 45: for every mechanism of the registry, the release with every default the server
    fills in (the preview's "defaults") spelled out as an argument is the release without them,
    weights and recorded fields alike (seeded). A mechanism its defaults refuse on these small
    tables is skipped in this test (its refusal is tested with its mechanism)."""
    rows = conn.execute("SELECT name, task, models, needs_delta FROM dpsql.mechanisms()").fetchall()
    checked, differ = [], []
    for name, task, models, needs_delta in rows:
        model = "linear" if task == "regression" else ("logistic" if "logistic" in models else None)
        if model is None or model not in models:
            continue
        ds = datasets["reg" if model == "linear" else "cls"]
        base = {"privacy": name, "epsilon": 4.0, "delta": 1e-6 if needs_delta else 0.0,
                "model": model, "seed": 3, "noise_seed": 4}  # fmt: skip
        call = ", ".join(f"{k} => %({k})s" for k in base)
        (preview,) = conn.execute(f"SELECT dpsql.preview(%(ds)s, NULL, NULL, {call})",
                                  {"ds": ds, **base}).fetchone()  # fmt: skip
        if "refused" in preview:
            continue
        spelled = {k: v for k, v in (preview.get("defaults") or {}).items() if k not in base}
        releases = []
        for extra in ({}, spelled):
            args = {**base, **{k: Jsonb(v) if isinstance(v, dict) else v for k, v in extra.items()}}
            names = ", ".join(f"{k} => %({k})s" for k in args)
            (mid,) = conn.execute(f"SELECT dpsql.train(%(ds)s, NULL, NULL, {names})",
                                  {"ds": ds, **args}).fetchone()  # fmt: skip
            row = _model(conn, mid)
            releases.append({k: row[k] for k in ("weights", "epsilon", "delta", *SGD_FIELDS)})
        checked.append((name, sorted(spelled)))
        if releases[0] != releases[1]:
            differ.append((name, spelled, releases))
    assert len(checked) >= 8, checked
    assert differ == [], differ
