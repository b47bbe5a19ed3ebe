"""Bolt-on in the database vs IBM diffprivlib's LogisticRegression on exported data.

The same tables and budgets as ``bench.bolton_accuracy`` (Protein, binary; MNIST projected to
50 dimensions, ten classes), eps in {0.1, 0.5, 1, 2, 4}, eps-DP on both sides:

* bolt-on, convex (Algorithm 1: lambda = 0, eta = 1/sqrt(m)) and strongly convex (Algorithm 2:
  lambda = 1e-4, R = 1/lambda), b = 50, 10 passes, released by the server; on MNIST
  one-vs-all (eps/10 per class, as the paper), and the multinomial model (one noise draw);
* diffprivlib ``LogisticRegression(epsilon=eps, data_norm=1.0, fit_intercept=False)``
  (objective perturbation, Chaudhuri et al. 2011; L-BFGS; one-vs-rest with eps/10 per class on
  MNIST), trained on the training table exported with ``dpsql.loading.fetch_numpy`` (binary
  COPY) and normalised to unit rows in numpy, as the server does with ``row_norm => 'unit'``.

Test accuracy (balanced accuracy too: Protein is 99% negatives) is the mean over ``--seeds``
runs (bolt-on: shuffle seed and fresh noise; diffprivlib: its own fresh noise). Wall times are
client-side medians: for bolt-on the ``dpsql.train`` call (shuffle into a training table, 10
epochs, release); for diffprivlib the export, the normalisation and ``fit``.

Usage::

    .venv/bin/python -m bench.bolton_vs_diffprivlib [--seeds 3] [--dsn DSN]
    .venv/bin/python -m bench.bolton_vs_diffprivlib --quick    # 1 seed, eps in {0.1, 1}

diffprivlib is in the ``bench`` extra (``pip install -e '.[bench]'``); diffprivlib 0.6.6 needs
scikit-learn < 1.8. The script says so and exits when it cannot import it.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import dpsql
from bench.bolton_accuracy import (
    BenchData,
    balanced_accuracy,
    bench_server,
    drop_data,
    evaluate,
    header_lines,
    install_data,
    load_bench_data,
    ms,
    run_tag,
    train_bolton,
    train_noiseless,
)
from dpsql import datasets as dsets
from dpsql import server
from dpsql.loading import fetch_numpy

EPS_GRID = (0.1, 0.5, 1.0, 2.0, 4.0)
QUICK_EPS = (0.1, 1.0)
DIFFPRIVLIB = "diffprivlib LogisticRegression"


def _diffprivlib() -> tuple[Any, str] | str:
    """(the LogisticRegression class, version) or why it cannot be used."""
    try:
        import diffprivlib
        from diffprivlib.models import LogisticRegression

        LogisticRegression(epsilon=1.0, data_norm=1.0, fit_intercept=False)
    except Exception as err:  # ImportError, or scikit-learn API drift (TypeError)
        import sklearn

        return (
            f"diffprivlib unusable ({type(err).__name__}: {err}); scikit-learn "
            f"{sklearn.__version__}. Install the bench extra: pip install -e '.[bench]' "
            "(diffprivlib 0.6.6 needs scikit-learn < 1.8)"
        )
    return LogisticRegression, diffprivlib.__version__


def _methods(data: BenchData) -> list[tuple[str, str, int]]:
    """(label, model, test) of the bolt-on releases compared."""
    ovr = " one-vs-all" if data.multiclass else ""
    out = [
        (f"bolt-on convex eps-DP (Alg. 1){ovr}", "logistic", 1),
        (f"bolt-on SC eps-DP (Alg. 2){ovr}", "logistic", 3),
    ]
    if data.multiclass:
        out += [
            ("bolt-on convex eps-DP multinomial", "multinomial", 1),
            ("bolt-on SC eps-DP multinomial", "multinomial", 3),
        ]
    return out


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_dataset(  # noqa: C901, PLR0915
    db: dpsql.Database,
    data: BenchData,
    seeds: Sequence[int],
    eps_grid: Sequence[float],
    dpl_class: Any,
) -> list[str]:
    conn = db.conn
    acc: dict[tuple[str, float], list[float]] = defaultdict(list)
    bal: dict[tuple[str, float], list[float]] = defaultdict(list)
    secs: dict[tuple[str, float], list[float]] = defaultdict(list)
    export_secs: list[float] = []

    # Test data as the server holds it (exported once, not timed).
    X_test, y_test = fetch_numpy(conn, data.test_table, ordered=True)
    X_test = dsets.normalize_rows(X_test)

    def diffprivlib_fit(eps: float) -> tuple[float, Any]:
        t_export, (X, y) = _timed(lambda: fetch_numpy(conn, data.train_table, ordered=False))
        export_secs.append(t_export)
        t0 = time.perf_counter()
        X = dsets.normalize_rows(X)
        with warnings.catch_warnings():
            # Convergence warnings of L-BFGS under heavy noise; data_norm is given.
            warnings.simplefilter("ignore")
            clf = dpl_class(epsilon=eps, data_norm=1.0, fit_intercept=False).fit(X, y)
        return t_export + time.perf_counter() - t0, clf

    # Non-private references (one run each), first so that they also warm up the server and
    # the caches: the noiseless SGD models the releases perturb, and diffprivlib at a huge
    # epsilon (its objective without noise, in effect).
    refs: list[tuple[str, float, float, float]] = []
    models = ["logistic", "multinomial"] if data.multiclass else ["logistic"]
    for model in models:
        for variant, name in (("convex", "convex SGD"), ("sc", "SC SGD")):
            t, mid = _timed(functools.partial(train_noiseless, db, data, model, variant, seeds[0]))
            r = evaluate(db, data, mid)
            suffix = " one-vs-all" if model == "logistic" and data.multiclass else ""
            if model == "multinomial":
                suffix = " multinomial"
            refs.append((f"noiseless {name}{suffix} (server)", r.accuracy, r.balanced, t))
    t, clf = diffprivlib_fit(1e6)
    pred = clf.predict(X_test)
    refs.append(
        (
            "diffprivlib, eps = 1e6 (noise-free limit)",
            float(np.mean(pred == y_test)),
            balanced_accuracy(y_test, pred),
            t,
        )
    )

    for s_i, seed in enumerate(seeds):
        t_seed = time.perf_counter()
        for eps in eps_grid:
            for label, model, test in _methods(data):
                t, mid = _timed(functools.partial(train_bolton, db, data, model, test, eps, seed))
                r = evaluate(db, data, mid)
                acc[(label, eps)].append(r.accuracy)
                bal[(label, eps)].append(r.balanced)
                secs[(label, eps)].append(t)
            t, clf = diffprivlib_fit(eps)
            pred = clf.predict(X_test)
            acc[(DIFFPRIVLIB, eps)].append(float(np.mean(pred == y_test)))
            bal[(DIFFPRIVLIB, eps)].append(balanced_accuracy(y_test, pred))
            secs[(DIFFPRIVLIB, eps)].append(t)
        print(
            f"#   {data.name}: seed {seed} done ({s_i + 1}/{len(seeds)}, "
            f"{time.perf_counter() - t_seed:.1f} s)",
            flush=True,
        )

    labels = [m[0] for m in _methods(data)] + [DIFFPRIVLIB]
    lines = [
        f"## {data.name}: {data.note}; m = {data.m:,} train / {len(y_test):,} test, d = {data.d};"
        f" {len(seeds)} seeds (mean ± std)",
        "",
    ]
    width = max(len(s) for s in labels)

    def table(title: str, cell: Callable[[str, float], str]) -> None:
        cells = [[cell(lab, e) for e in eps_grid] for lab in labels]
        cw = max(len(title), *(len(c) for row in cells for c in row))
        lines.append(f"{title:<{width}}  " + "  ".join(f"eps={e:g}".rjust(cw) for e in eps_grid))
        for lab, row in zip(labels, cells, strict=True):
            lines.append(f"{lab:<{width}}  " + "  ".join(c.rjust(cw) for c in row))
        lines.append("")

    table("test accuracy", lambda lab, e: ms(acc[(lab, e)]))
    table("balanced accuracy", lambda lab, e: ms(bal[(lab, e)]))
    table("median wall time (s)", lambda lab, e: f"{statistics.median(secs[(lab, e)]):.2f}")
    lines.append(
        f"diffprivlib time includes the export: fetch_numpy median "
        f"{statistics.median(export_secs):.2f} s (binary COPY of {data.m:,} rows)"
    )
    lines.append("")
    rw = max(len(r[0]) for r in refs)
    lines.append(f"{'non-private references':<{rw}}  accuracy  balanced  wall s")
    for name, a, b, t in refs:
        lines.append(f"{name:<{rw}}  {a:8.4f}  {b:8.4f}  {t:6.2f}")
    return lines


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.bolton_vs_diffprivlib",
        description="Bolt-on (in PostgreSQL) vs diffprivlib LogisticRegression (exported data).",
    )
    p.add_argument("--seeds", type=int, default=3, help="runs per point (default 3)")
    p.add_argument("--eps", type=float, nargs="+", default=None, help="total epsilons")
    p.add_argument("--datasets", default="protein,mnist", help="comma list (protein,mnist)")
    p.add_argument(
        "--dsn",
        default=None,
        help="server to use (default: $DPSQL_DSN, else a temporary embedded server)",
    )
    p.add_argument("--pg-version", type=int, default=None, choices=server.SUPPORTED_PG_VERSIONS)
    p.add_argument("--quick", action="store_true", help="1 seed, eps in {0.1, 1}")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds = 1
        args.eps = args.eps or list(QUICK_EPS)
    args.eps = sorted(args.eps or EPS_GRID)
    if args.seeds < 1 or any(e <= 0 for e in args.eps):
        p.error("--seeds must be >= 1 and every eps > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    t_start = time.perf_counter()
    for line in header_lines("bolton_vs_diffprivlib"):
        print(line)
    dpl = _diffprivlib()
    if isinstance(dpl, str):
        print(f"# skipped: {dpl}")
        return 0
    dpl_class, dpl_version = dpl
    import sklearn

    print(f"# diffprivlib {dpl_version}, scikit-learn {sklearn.__version__}")
    data, skipped = load_bench_data(args.datasets.split(","))
    for note in skipped:
        print(f"# {note}")
    if not data:
        print("# no dataset available: nothing to do")
        return 0
    seeds = list(range(1, args.seeds + 1))
    dsn_given = bool(args.dsn or os.environ.get("DPSQL_DSN"))
    out: list[str] = []
    with bench_server(args.dsn, args.pg_version) as (uri, where), dpsql.connect(uri) as db:
        version = db.execute("SHOW server_version").fetchone()[0]
        print(f"# server: PostgreSQL {version} ({where})")
        print(f"# seeds {seeds}, eps {args.eps}", flush=True)
        tag = run_tag(dsn_given)
        try:
            for d in data:
                install_data(db, d, tag)
                out += run_dataset(db, d, seeds, args.eps, dpl_class)
                out.append("")
        finally:
            for d in data:
                drop_data(db, d)
    print()
    for line in out:
        print(line)
    print(f"total time: {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
