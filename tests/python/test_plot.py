"""dpsql.plot.privacy_utility, draw_utility, ``dpsql plot`` and Model.plot_loss: real trainings,
real PNG files."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import dpsql
from dpsql.plot import draw_utility, privacy_utility, series_label

ErrorbarContainer = pytest.importorskip("matplotlib.container").ErrorbarContainer
to_hex = pytest.importorskip("matplotlib.colors").to_hex

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


def _legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _majority(db, table: str) -> float:
    (majority,) = db.execute(f"SELECT greatest(avg(y), 1 - avg(y)) FROM {table}").fetchone()
    return float(majority)


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
    lines = [line for line in ax.get_lines() if not str(line.get_label()).startswith("_")]
    *curves, baseline = lines
    assert [line.get_label() for line in curves] == ["bolton", "objective_perturbation"]
    assert _legend_texts(ax) == ["bolton", "objective_perturbation", "baseline (majority class)"]
    # one run per point: no error bars
    assert not [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    # the majority class's accuracy on the test rows (issue 27)
    majority = _majority(db, table)
    assert np.asarray(baseline.get_ydata(), dtype=float)[0] == pytest.approx(majority)
    for line in curves:
        assert np.asarray(line.get_xdata()).tolist() == [0.5, 1, 2]
        accuracy = np.asarray(line.get_ydata(), dtype=float)
        assert np.all((accuracy >= 0) & (accuracy <= 1)) and accuracy[-1] > 0.6
    assert _spent(db, name)[0] == pytest.approx(7)

    # A plan beyond what is left is refused before anything is spent.
    with pytest.raises(ValueError, match="spends epsilon 2, .* has epsilon 1, delta 0 left"):
        privacy_utility(db, name, ["bolton", "auto"], [1], test=table)
    with pytest.raises(ValueError, match="spends epsilon 3, .* has epsilon 1"):
        privacy_utility(db, name, ["bolton"], [1], test=table, runs=3)
    with pytest.raises(ValueError, match="runs must be a positive integer"):
        privacy_utility(db, name, ["bolton"], [0.1], test=table, runs=0)
    with pytest.raises(ValueError, match="metric 'mse' does not fit classification"):
        privacy_utility(db, name, ["bolton"], [0.1], test=table, metric="mse")
    with pytest.raises(ValueError, match="no mechanism 'nope'"):
        privacy_utility(db, name, ["nope"], [0.1], test=table)
    with pytest.raises(ValueError, match="does not train logistic"):
        privacy_utility(db, name, ["adassp"], [0.1], test=table)
    with pytest.raises(dpsql.NotRegistered):
        privacy_utility(db, "no_such_dataset", ["bolton"], [0.1])
    assert _spent(db, name)[0] == pytest.approx(7)


def test_privacy_utility_error_bars_axis_legend_and_report(db, scratch_schema) -> None:
    """Issue 42, item 8: several runs per point give error bars; the y axis is fixed from the
    majority class up to 1 (a wobble in the third digit must not look like a collapse);
    ``auto`` names the mechanism it chose; colours and markers differ; the legend is outside
    the data; the numbers and the epsilon spent are printed."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(600, 3)) * 0.4
    y = (X @ [1.0, -2.0, 1.0] > 0.3).astype(float)
    name, table = _register(
        db, scratch_schema, X, y, epsilon_budget=10, delta_budget=1e-3, labels=[0, 1]
    )
    report = io.StringIO()
    fig = privacy_utility(
        db,
        name,
        ["auto", "bolton"],
        [0.5, 1],
        test=table,
        seed=3,
        delta=1e-6,
        runs=3,
        report=report,
    )
    (ax,) = fig.axes
    majority = _majority(db, table)
    low, high = ax.get_ylim()
    assert high == 1.0
    assert low == pytest.approx(majority - 0.05 * (1 - majority))
    assert low < majority < high
    # auto with delta > 0 on a classification: Poisson DP-SGD (docs/auto.md), named
    assert _legend_texts(ax) == [
        "auto → dpsgd (poisson)",
        "bolton",
        "baseline (majority class)",
    ]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [c.get_label() for c in bars] == ["auto → dpsgd (poisson)", "bolton"]
    for bar in bars:
        assert bar.has_yerr
        data_line, _caps, (segments,) = bar.lines
        # at the epsilons, shifted a few percent apart on the log axis
        assert np.asarray(data_line.get_xdata()) == pytest.approx([0.5, 1], rel=0.05)
        assert len(segments.get_segments()) == 2  # one bar per epsilon
    colours = [to_hex(c[0].get_color()) for c in bars]
    markers = [c[0].get_marker() for c in bars]
    assert len(set(colours)) == len(colours) and len(set(markers)) == len(markers)
    # the legend sits outside the axes (to their right): it covers no data
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    legend_box = ax.get_legend().get_window_extent(renderer)
    axes_box = ax.get_window_extent(renderer)
    assert legend_box.x0 >= axes_box.x1

    # the printed table: one row per (epsilon, mechanism), mean ± sd over 3 runs, the baseline
    text = report.getvalue().splitlines()
    assert text[0].split() == ["epsilon", "mechanism", "accuracy", "mean", "±", "sd", "runs"]
    rows = [line for line in text[2:] if line.strip() and not line.startswith("spent")]
    assert len(rows) == 5  # 2 epsilons x 2 mechanisms, and the baseline
    for row, (eps, mech) in zip(
        rows,
        [
            (0.5, "auto → dpsgd (poisson)"),
            (1, "auto → dpsgd (poisson)"),
            (0.5, "bolton"),
            (1, "bolton"),
        ],
        strict=False,
    ):
        assert row.startswith(f"{eps:g} ") and mech in row and " ± " in row
        assert row.rstrip().endswith(" 3")
    # the table's means and sds are what the error bars show
    for bar, row_pair in zip(bars, (rows[0:2], rows[2:4]), strict=True):
        data_line, _caps, (segments,) = bar.lines
        for y_mean, seg, row in zip(
            data_line.get_ydata(), segments.get_segments(), row_pair, strict=True
        ):
            mean, sd = (float(v) for v in re.search(r"(\S+) ± (\S+)", row).groups())
            assert y_mean == pytest.approx(mean, abs=5e-5)
            assert (seg[1][1] - seg[0][1]) / 2 == pytest.approx(sd, abs=5e-5)
    assert rows[4].split()[-1] == f"{majority:.4f}" and "baseline (majority class)" in rows[4]
    assert text[-1] == f"spent on {name}: epsilon 9, delta 1.2e-05"
    assert _spent(db, name) == pytest.approx((9, 1.2e-5))


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
        epsilon_budget=8,
        delta_budget=1e-3,
        label_bound=1.0,
        row_norm="clip",
    )
    fig = Figure()
    ax = fig.add_subplot()
    out = privacy_utility(db, name, ["adassp", "auto"], [1, 2], test=table, ax=ax, delta=1e-5)
    assert out is fig and ax.get_ylabel() == "test MSE"
    # the mean predictor's MSE on the test rows: the axis runs from 0 to a quarter above it
    (variance,) = db.execute(f"SELECT var_pop(y) FROM {table}").fetchone()
    assert ax.get_ylim() == pytest.approx((0, 1.25 * float(variance)))
    texts = _legend_texts(ax)
    assert texts[0] == "adassp" and texts[-1] == "baseline (mean predictor)"
    # 400 rows: n epsilon < 20,000, so auto trains DPSGD-F (docs/auto.md)
    assert texts[1] == "auto → dpsgd_f"
    assert _spent(db, name) == pytest.approx((6, 4e-5))

    # R^2: from the mean predictor's (0 on the test rows) up to 1
    fig = privacy_utility(db, name, ["adassp"], [2], test=table, metric="r2", delta=1e-5)
    (ax,) = fig.axes
    assert ax.get_ylabel() == "test R²" and ax.get_ylim() == pytest.approx((-0.05, 1.0))


def test_draw_utility_marks_points_off_the_axis_and_repeats_no_colour() -> None:
    """The bench figures' drawing: a fixed axis whatever the numbers, a mean beyond it marked
    on the edge, twelve series in twelve colours and markers pairs, references drawn flat."""
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    eps = [0.1, 1.0]
    series = {f"m{i}": {0.1: [0.7 + 0.01 * i, 0.72], 1.0: [0.8, 0.81]} for i in range(12)}
    series["m0"][0.1] = [0.05, 0.07]  # far below the majority class: marked, not rescaled
    draw_utility(
        ax,
        eps,
        series,
        metric="accuracy",
        baseline=0.6,
        references={"non-private": 0.85},
        labels={"m1": series_label("auto", {0.1: ["dpsgd_f"], 1.0: ["dpgd", "dpgd"]})},
    )
    assert ax.get_ylim() == pytest.approx((0.58, 1.0))
    texts = _legend_texts(ax)
    assert texts[1] == "auto → dpsgd_f (ε 0.1), dpgd (ε 1)"
    assert texts[-2:] == ["non-private", "baseline (majority class)"]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    styles = {(to_hex(c[0].get_color()), c[0].get_marker()) for c in bars}
    assert len(bars) == 12 and len({colour for colour, _ in styles}) == 12
    edge = [
        line
        for line in ax.get_lines()
        if line.get_marker() == "v" and line.get_linestyle() == "None" and not line.get_clip_on()
    ]
    # (at its series' place beside epsilon 0.1)
    points = [(np.asarray(line.get_xdata()), np.asarray(line.get_ydata())) for line in edge]
    assert [(float(x[0]), float(y[0])) for x, y in points] == [
        (pytest.approx(0.1, rel=0.3), pytest.approx(0.58))
    ]
    # ... and no line or error bar reaches into the data from it
    m0 = np.asarray(bars[0][0].get_ydata(), dtype=float)
    assert np.isnan(m0[0]) and m0[1] == pytest.approx(0.805)
    assert series_label("auto", {}) == "auto"
    assert series_label("auto", {0.5: ["bolton"], 1.0: ["bolton"]}) == "auto → bolton"


def test_cli_plot_prints_the_numbers_and_the_epsilon_spent(
    db, scratch_schema, server_uri, tmp_path
) -> None:
    rng = np.random.default_rng(12)
    X = rng.normal(size=(400, 3)) * 0.4
    y = (X @ [1.0, -2.0, 1.0] > 0).astype(float)
    name, table = _register(db, scratch_schema, X, y, epsilon_budget=5, labels=[0, 1])
    out = tmp_path / "cli.png"
    env = {k: v for k, v in os.environ.items() if k != "DPSQL_PGDATA"} | {"DPSQL_DSN": server_uri}
    script = Path(sys.executable).with_name("dpsql")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "dpsql.cli"]
    args = ["plot", name, "--mechanisms", "bolton", "--epsilons", "0.5,1", "--test", table]
    done = subprocess.run(
        [*cmd, *args, "--runs", "2", "--seed", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["epsilon", "mechanism", "accuracy"]
    assert [line.split()[0] for line in lines[2:4]] == ["0.5", "1"]
    assert all(" ± " in line and line.rstrip().endswith(" 2") for line in lines[2:4])
    assert "baseline (majority class)" in lines[4]
    assert lines[-2] == f"spent on {name}: epsilon 3, delta 0"
    assert lines[-1] == f"wrote {out}"
    assert out.read_bytes()[:8] == PNG
    assert _spent(db, name)[0] == pytest.approx(3)


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
