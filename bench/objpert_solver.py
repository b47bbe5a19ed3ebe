"""Objective perturbation's fixed-work Newton solver (issue 30): one release with the rows kept
in memory (one scan) against the same solver by scans (`dpsql.sampling_memory = 0`: 2 S + 1
scans), and a noiseless 10-epoch SGD run, on Protein's training half (m = 72,876, d = 74).
Each release trains on a fresh random permutation of the rows, so two releases with the same
noise seed differ by the sums' rounding (checked: within 1e-9). The solver alone
(`dpsql_internal._erm_solve` on the loaded table, one fixed row order, the release's
regulariser and certificate) is timed both ways too and must give the same bits; and the
smallest S whose iterate equals the default S's is the step count Newton needed (a certified
iterate is kept, so the iterate no longer changes once certified)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from psycopg.types.json import Jsonb

import dpsql
from bench.bolton_accuracy import BenchData
from bench.protein_releases import load_average, protein_session


def _release(
    db: dpsql.Database, dataset: str, args: argparse.Namespace, steps: int | None = None
) -> tuple[float, dict, list]:
    options = {} if steps is None else {"newton_steps": steps}
    t0 = time.perf_counter()
    row = db.execute(
        "SELECT dpsql.train(%s, NULL, NULL, %s, privacy => 'objective_perturbation',"
        " epsilon => %s, delta => %s, noise_seed => 7, options => %s)",
        (dataset, args.model, args.epsilon, args.delta, Jsonb(options)),
    ).fetchone()
    seconds = time.perf_counter() - t0
    assert row is not None
    params, weights = db.execute(
        "SELECT params->'privacy', weights FROM dpsql.models WHERE model_id = %s", (row[0],)
    ).fetchone()
    return seconds, params, weights


# 0.7.0's solver (Newton with backtracking, one scan per iterate, stopping at the certificate),
# on today's scan kernels: the same-run reference
OLD_SOLVER = """
CREATE OR REPLACE FUNCTION bench_objpert._erm_solve_0_7(train_table text, plan jsonb, b float8[],
                                                     positive float8 DEFAULT NULL,
                                                     OUT theta float8[], OUT grad_norm float8,
                                                     OUT scans int, OUT certified boolean)
LANGUAGE plpgsql AS $$
DECLARE
    reg float8 := (plan->>'regularizer')::float8;
    tolerance float8 := (plan->>'tolerance')::float8;
    max_scans int := (plan->>'max_scans')::int;
    -- one-vs-rest: the class index positive against the rest (a NULL label stays NULL)
    q text := format('SELECT dpsql_internal._glm_sums(x, %s, $1, $2, $3, $4, $5, $6) FROM %s',
                     CASE WHEN positive IS NULL THEN 'y'
                          ELSE format('CASE WHEN y = %s THEN 1.0 WHEN y IS NOT NULL THEN -1.0 END',
                                      positive) END,
                     train_table);
    loss int := (plan->>'loss')::int;
    param float8 := (plan->>'param')::float8;
    y_bound float8 := (plan->>'y_bound')::float8;
    x_bound float8 := (plan->>'x_bound')::float8;
    intercept boolean := (plan->>'intercept')::boolean;
    sums float8[];
    here record;
    there record;
    candidate float8[];
    step float8;
    accepted boolean;
BEGIN
    theta := array_fill(0::float8, ARRAY[(plan->>'p')::int]);
    EXECUTE q INTO sums USING theta, loss, param, y_bound, x_bound, intercept;
    scans := 1;
    IF sums IS NULL THEN
        PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
    END IF;
    here := dpsql_internal._glm_newton(sums, theta, reg, b);
    WHILE here.grad_norm > tolerance AND scans < max_scans LOOP
        step := 1;
        LOOP
            candidate := ARRAY(SELECT t + step * dd
                                 FROM unnest(theta, here.direction) WITH ORDINALITY AS u(t, dd, i)
                                ORDER BY i);
            EXECUTE q INTO sums USING candidate, loss, param, y_bound, x_bound, intercept;
            scans := scans + 1;
            there := dpsql_internal._glm_newton(sums, candidate, reg, b);
            -- A shrinking gradient alone must not accept a step that raises the objective:
            -- on piecewise-quadratic losses (Huber) Newton then cycles between two points.
            accepted := there.objective <= here.objective + 1e-4 * step * here.slope
                        OR (there.grad_norm < 0.5 * here.grad_norm
                            AND there.objective <= here.objective + 1e-12 * abs(here.objective));
            -- a step below 1e-12 makes no progress (and bounds the arithmetic above)
            EXIT WHEN accepted OR scans >= max_scans OR step < 1e-12;
            step := step / 2;
        END LOOP;
        EXIT WHEN NOT accepted;
        theta := candidate;
        here := there;
    END LOOP;
    grad_norm := here.grad_norm;
    certified := grad_norm <= tolerance;
END $$;
"""


def _solve(
    db: dpsql.Database, table: str, plan: dict, b: list, function: str = "dpsql_internal._erm_solve"
) -> tuple[float, tuple]:
    # today's solver takes its plan typed (dpsql_internal.erm_plan), 0.7's as jsonb
    typed = function == "dpsql_internal._erm_solve"
    arg = "jsonb_populate_record(NULL::dpsql_internal.erm_plan, %s)" if typed else "%s"
    t0 = time.perf_counter()
    row = db.execute(
        f"SELECT theta, grad_norm, scans, certified FROM {function}('{table}', {arg}, %s, 1)",
        (Jsonb(plan), b),
    ).fetchone()
    assert row is not None
    return time.perf_counter() - t0, tuple(row)


def _solver_alone(
    db: dpsql.Database, data: BenchData, args: argparse.Namespace, info: dict
) -> dict[str, Any]:
    """The solver alone on the loaded table (one fixed row order) with the release's public
    numbers: both paths (the same bits: checked), 0.7.0's loop, and the S it needed."""
    p = data.d
    steps = 24 if args.model == "huber" else 16  # the default S (_erm_newton_steps)
    plan = {
        "loss": 1 if args.model == "logistic" else 2,
        "param": 0.1 if args.model == "huber" else 0,
        "y_bound": 1.0,
        "x_bound": 1.0,
        "intercept": False,
        "p": p,
        "regularizer": info["regularizer"],
        "tolerance": info["tolerance"],
        "newton_steps": steps,
        "rows": data.m,
    }
    (b,) = db.execute(
        "SELECT (dpsql_internal._perturb(%s, %s, %s, 0, 7, 1)).weights",
        ([0.0] * p, 2 * info["lipschitz"], info["epsilon_split"]["noise"]),
    ).fetchone()
    solve_kept = [_solve(db, data.train_table, plan, b) for _ in range(args.repeat)]
    db.execute("SET dpsql.sampling_memory = 0")
    solve_scanned = [_solve(db, data.train_table, plan, b) for _ in range(args.repeat)]
    db.execute("RESET dpsql.sampling_memory")
    db.execute("CREATE SCHEMA IF NOT EXISTS bench_objpert")
    db.execute(OLD_SOLVER)
    old_plan = dict(plan, max_scans=100)
    old = [
        _solve(db, data.train_table, old_plan, b, "bench_objpert._erm_solve_0_7")
        for _ in range(args.repeat)
    ]
    db.execute("DROP SCHEMA bench_objpert CASCADE")
    ref = solve_kept[0][1]
    assert all(r[1] == ref for r in solve_kept + solve_scanned), "the paths differ"
    needed = next(
        (
            s
            for s in range(1, steps + 1)
            if _solve(db, data.train_table, dict(plan, newton_steps=s), b)[1][0] == ref[0]
        ),
        None,
    )
    return {
        "steps": steps,
        "best": {
            "solve_kept": min(r[0] for r in solve_kept),
            "solve_scanned": min(r[0] for r in solve_scanned),
            "old": min(r[0] for r in old),
        },
        "old_scans": old[0][1][2],
        "certified": ref[3],
        "evaluations": ref[2],
        "needed": needed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=0.0)
    parser.add_argument("--model", default="logistic", choices=["logistic", "huber"])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each timing (best taken)")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    args = parser.parse_args(argv)
    with protein_session("objpert_solver", args.dsn) as (db, data, noiseless):
        kept = [_release(db, data.dataset, args) for _ in range(args.repeat)]
        db.execute("SET dpsql.sampling_memory = 0")
        scanned = [_release(db, data.dataset, args) for _ in range(args.repeat)]
        db.execute("RESET dpsql.sampling_memory")
        w0 = kept[0][2]
        gap = max(abs(a - b) for r in kept + scanned for a, b in zip(r[2], w0, strict=True))
        assert gap <= 1e-9 * max(1.0, max(abs(a) for a in w0)), f"releases differ by {gap}"
        solver = _solver_alone(db, data, args, kept[0][1])
    steps = solver["steps"]
    best = {
        "kept": min(r[0] for r in kept),
        "scanned": min(r[0] for r in scanned),
        **solver["best"],
    }
    print(f"# m = {data.m:,}, d = {data.d}, {args.model}, eps {args.epsilon}, delta {args.delta}")
    print(
        f"# best of {args.repeat} per line; S = {steps} Newton steps, {2 * steps + 1} "
        "evaluations over the rows"
    )
    print("| what | scans | seconds | / noiseless 10 epochs |")
    print("|---|---|---|---|")
    print(f"| noiseless SGD, 10 epochs | 10 | {noiseless:.3f} | 1.00 |")
    for label, key, scans in [
        ("release, rows in memory", "kept", 1),
        ("release, by scans", "scanned", 2 * steps + 1),
        ("solver alone, rows in memory", "solve_kept", 1),
        ("solver alone, by scans", "solve_scanned", 2 * steps + 1),
        ("solver alone, 0.7.0's loop (stops when certified)", "old", solver["old_scans"]),
    ]:
        print(f"| {label} | {scans} | {best[key]:.3f} | {best[key] / noiseless:.2f} |")
    print(
        f"# releases (fresh row permutations) within {gap:.2g} of each other; the solver "
        f"alone: the same bits both ways (certified: {solver['certified']}, evaluations "
        f"{solver['evaluations']})"
    )
    needed = solver["needed"]
    print(f"# the iterate is fixed from S = {needed} on (Newton certified within {needed} steps)")
    print(f"# load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
