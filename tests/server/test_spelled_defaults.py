"""Issue 45's two bugs: a default spelled out gives the release the unspelled call gives
(DP-SGD with schedule => 'constant' trained with step 0.5, the same call without it with 2.0),
and plan-and-fit models record no SGD fields they never ran (AdaSSP and objective perturbation
showed epochs 10, batch_size 1, schedule 'constant')."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from psycopg.rows import dict_row

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
