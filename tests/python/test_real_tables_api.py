"""Tables as they come from Python (issue 27): register a table with a text label and a
categorical column, preview a release, and predict from a DataFrame with named columns as the
server does (dpsql.encoding against dpsql.predict_label)."""

from __future__ import annotations

import numpy as np
import pytest

import dpsql

pd = pytest.importorskip("pandas")


def test_register_preview_train_and_predict_a_dataframe(conn, server_uri, scratch_schema) -> None:
    conn.execute(
        """CREATE TABLE pets AS
           SELECT g AS id, (g % 10)::float8 / 10 AS weight,
                  (ARRAY['cat', 'dog', 'fish'])[1 + g % 3] AS kind, g % 4 = 0 AS indoor,
                  CASE WHEN g % 3 = 1 THEN 'bark' ELSE 'quiet' END AS sound
             FROM generate_series(1, 900) g"""
    )
    name = f"pets_{scratch_schema}"
    with dpsql.connect(server_uri) as db:
        db.register_dataset(
            f"{scratch_schema}.pets",
            ["weight", "kind", "indoor"],
            "sound",
            epsilon_budget=10,
            labels=["quiet", "bark"],
            categories={"kind": ["cat", "dog", "fish"]},
            feature_bounds=[[0, 1], [0, 1]],
            name=name,
        )
        plan = db.preview(name, dpsql.Auto(epsilon=2.0))
        assert "refused" not in plan and plan["dim"] == 5
        model = db.train(name, None, None, privacy=dpsql.Auto(epsilon=2.0), progress=False)
        assert model.row["privacy"] == plan["mechanism"]
        assert list(model.classes_) == ["quiet", "bark"]
        frame = pd.read_sql("SELECT weight, kind, indoor, sound FROM pets ORDER BY id", conn)
        # columns in another order, an unknown category: encoded by name, unknown as zeros
        frame.loc[0, "kind"] = "bird"
        shuffled = frame[["indoor", "kind", "weight"]]
        predicted = model.predict(shuffled)
        server = [
            row[0]
            for row in conn.execute(
                "SELECT dpsql.predict_label(%s, to_jsonb(p)) FROM"
                " (SELECT weight, CASE WHEN id = 1 THEN 'bird' ELSE kind END AS kind, indoor"
                "  FROM pets ORDER BY id) p",
                (model.model_id,),
            )
        ]
        assert list(predicted) == server
        assert np.mean(predicted == frame["sound"].to_numpy()) > 0.9
        # a refusal in the preview, not an exception; nothing charged
        refused = db.preview(name, dpsql.BoltOn(epsilon=100.0))["refused"]
        assert refused["sqlstate"] == "DP001"
        (charges,) = conn.execute(
            "SELECT count(*) FROM dpsql.ledger WHERE dataset = %s", (name,)
        ).fetchone()
        assert charges == 1
