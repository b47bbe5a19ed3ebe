"""Frank-Wolfe logistic: one release with the rows kept in memory (20 scans) against one
gradient scan per step (`dpsql.sampling_memory = 0`), and a noiseless 10-epoch SGD run, on
Protein's training half (m = 72,876, d = 74; the issue-30 case). The same noise seed gives the
same model both ways (checked)."""

from __future__ import annotations

import argparse
import time

from psycopg.types.json import Jsonb

import dpsql
from bench.protein_releases import load_average, protein_session


def _release(
    db: dpsql.Database, dataset: str, args: argparse.Namespace
) -> tuple[float, dict, list]:
    t0 = time.perf_counter()
    row = db.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => 'frank_wolfe',"
        " epsilon => %s, delta => 1e-6, noise_seed => 7, options => %s)",
        (dataset, args.epsilon, Jsonb({"steps": args.steps})),
    ).fetchone()
    seconds = time.perf_counter() - t0
    assert row is not None
    params, weights = db.execute(
        "SELECT params->'privacy', weights FROM dpsql.models WHERE model_id = %s", (row[0],)
    ).fetchone()
    return seconds, params, weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    # K of the measurement; the default K at eps 1 is refused on Protein since issue 25
    parser.add_argument("--steps", type=int, default=1745, help="K (options.steps)")
    parser.add_argument("--dsn", help="server (default: a temporary embedded one)")
    parser.add_argument(
        "--in-memory-only",
        action="store_true",
        help="skip the one-scan-per-step release (and so the same-model check)",
    )
    args = parser.parse_args(argv)
    with protein_session("frank_wolfe_scans", args.dsn) as (db, data, noiseless):
        kept, info, w_kept = _release(db, data.dataset, args)
        runs = [("Frank-Wolfe, rows in memory", kept, info)]
        if not args.in_memory_only:
            db.execute("SET dpsql.sampling_memory = 0")
            scanned, info_scanned, w_scanned = _release(db, data.dataset, args)
            assert w_kept == w_scanned, "the two paths released different models"
            runs.append(("Frank-Wolfe, one scan per step", scanned, info_scanned))
    print(f"# m = {data.m:,}, d = {data.d}, eps {args.epsilon}, K = {info['steps']}")
    print("| what | scans | seconds | / noiseless 10 epochs |")
    print("|---|---|---|---|")
    print(f"| noiseless SGD, 10 epochs | 10 | {noiseless:.2f} | 1.00 |")
    for label, seconds, inf in runs:
        print(f"| {label} | {inf['scans']} | {seconds:.2f} | {seconds / noiseless:.2f} |")
    if not args.in_memory_only:
        print(f"# speed-up {scanned / kept:.1f}x; same model: yes")
    print(f"# load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
