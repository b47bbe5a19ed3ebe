import numpy as np
from psycopg.types.json import Jsonb
from tests.server.test_objective_perturbation import _table


def test_scratch(conn, scratch_schema):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 3)) / 2
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=500))
    t = _table(conn, scratch_schema, X, y)
    plan = {"loss": 1, "param": 0, "y_bound": 1.0, "x_bound": 1.0, "intercept": True, "p": 4,
            "regularizer": 5.0, "tolerance": 1e-10, "newton_steps": 12}
    b = [0.3, -0.2, 0.1, 0.5]
    out = []
    for rows in (None, 500):
        pl = dict(plan, **({"rows": rows} if rows else {}))
        r = conn.execute(f"SELECT theta, grad_norm, scans, certified FROM dpsql_internal._erm_solve('{t}', %s, %s)", (Jsonb(pl), b)).fetchone()
        print(rows, r)
        out.append(r)
    assert out[0] == out[1]
