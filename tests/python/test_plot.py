"""dpsql.plot.privacy_utility and Model.plot_loss: real trainings, real PNG files."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import dpsql
from dpsql.plot import privacy_utility

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def db(server_uri):
    with dpsql.connect(server_uri) as database:
        yield database


def _register(db, schema: str, X, y, **kw) -> tuple[str, str]:
    """(dataset name, its table) of (X, y) loaded into schema and registered."""
    name = f"plot_{uuid.uuid4().hex[:8]}"
    db.load_numpy(name, X, y, schema=schema)
    db.register_dataset(f"{schema}.{name}", "x", "y", name=name, **kw)
    return name, f"{schema}.{name}"


def _spent(db, name: str) -> tuple[float, float]:
    row = db.execute(
        "SELECT epsilon_spent, delta_spent FROM dpsql.my_datasets WHERE name = %s", (name,)
    ).fetchone()
    return float(row[0]), float(row[1])


def test_privacy_utility_draws_one_line_per_mechanism(db, scratch_schema, tmp_path) -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=(500, 3)) * 0.4
    y = (X @ [1.0, -2.0, 1.0] > 0).astype(float)
    name, table = _register(db, scratch_schema, X, y, epsilon_budget=8, labels=[0, 1])
    path = tmp_path / "pu.png"
    fig = privacy_utility(
        db,
        name,
        ["bolton", "objective_perturbation"],
        [0.5, 1, 2],
        test=table,
        seed=1,
        path=str(path),
    )
    assert path.read_bytes()[:8] == PNG
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel() == "epsilon" and ax.get_ylabel() == "test accuracy"
    *lines, baseline = ax.get_lines()
    assert [line.get_label() for line in lines] == ["bolton", "objective_perturbation"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "bolton",
        "objective_perturbation",
        "baseline (majority class)",
    ]
    # the majority class's accuracy on the test rows (issue 27)
    (majority,) = db.execute(f"SELECT greatest(avg(y), 1 - avg(y)) FROM {table}").fetchone()
    assert np.asarray(baseline.get_ydata(), dtype=float)[0] == pytest.approx(float(majority))
    for line in lines:
        assert np.asarray(line.get_xdata()).tolist() == [0.5, 1, 2]
        accuracy = np.asarray(line.get_ydata(), dtype=float)
        assert np.all((accuracy >= 0) & (accuracy <= 1)) and accuracy[-1] > 0.6
    assert _spent(db, name)[0] == pytest.approx(7)

    # A plan beyond what is left is refused before anything is spent.
    with pytest.raises(ValueError, match="spends epsilon 2, .* has epsilon 1, delta 0 left"):
        privacy_utility(db, name, ["bolton", "auto"], [1], test=table)
    with pytest.raises(ValueError, match="no mechanism 'nope'"):
        privacy_utility(db, name, ["nope"], [0.1], test=table)
    with pytest.raises(ValueError, match="does not train logistic"):
        privacy_utility(db, name, ["adassp"], [0.1], test=table)
    with pytest.raises(dpsql.NotRegistered):
        privacy_utility(db, "no_such_dataset", ["bolton"], [0.1])
    assert _spent(db, name)[0] == pytest.approx(7)


def test_privacy_utility_regression_on_given_axes(db, scratch_schema) -> None:
    from matplotlib.figure import Figure

    rng = np.random.default_rng(9)
    X = rng.normal(size=(400, 2)) * 0.4
    y = np.clip(X @ [1.0, 0.5], -1, 1)
    name, table = _register(
        db,
        scratch_schema,
        X,
        y,
        epsilon_budget=6,
        delta_budget=1e-3,
        label_bound=1.0,
        row_norm="clip",
    )
    fig = Figure()
    ax = fig.add_subplot()
    out = privacy_utility(db, name, ["adassp", "auto"], [1, 2], test=table, ax=ax, delta=1e-5)
    assert out is fig and ax.get_ylabel() == "test MSE"
    assert len(ax.get_lines()) == 3  # two mechanisms and the mean predictor
    assert _spent(db, name) == pytest.approx((6, 4e-5))


def test_model_plot_loss(db, scratch_schema, tmp_path) -> None:
    rng = np.random.default_rng(10)
    X = rng.normal(size=(200, 2)) * 0.5
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    db.load_numpy("pts", X, y, schema=scratch_schema)
    model = db.train(f"{scratch_schema}.pts", "x", "y", epochs=4, seed=1, progress=False)
    path = tmp_path / "loss.png"
    fig = model.plot_loss(path=str(path))
    assert path.read_bytes()[:8] == PNG
    (ax,) = fig.axes
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "training objective"
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [1, 2, 3, 4]
    assert list(line.get_ydata()) == model.loss_history_

    # The server stores no loss history with a private model.
    name, _ = _register(db, scratch_schema, X, y, epsilon_budget=1)
    private = db.train(name, None, None, privacy=dpsql.BoltOn(epsilon=1), epochs=2)
    assert private.loss_history_ == []
    with pytest.raises(ValueError, match="private runs release no loss history"):
        private.plot_loss()
