"""Runtime of private SGD in the server, like the bolt-on paper's Figure 5.

Epoch time (the models' ``train_seconds`` over their epochs: scans only, no shuffle) for
noiseless SGD, bolt-on (noise once at the end), SCS13, BST14 and DP-SGD shuffled and Poisson
(noise in every step),
by batch size, on a synthetic binary table. Prints a table and the ratios to noiseless.

    python -m bench.whitebox_runtime [--rows 200000] [--dim 50] [--repeats 3]
        [--batches 1,10,50,500] [--sampling-memory 0] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import dpsql
from dpsql import datasets, server

MECHANISMS = {
    "noiseless": "",
    "bolton": ", privacy => 'bolton', epsilon => 1, delta => 1e-6",
    "scs13": ", privacy => 'scs13', epsilon => 1, delta => 1e-6",
    "bst14": ", privacy => 'bst14', epsilon => 1, delta => 1e-6",
    "dpsgd": ", privacy => 'dpsgd', noise_multiplier => 1.0, delta => 1e-6, clip_norm => 1",
    "dpsgd_poisson": ", privacy => 'dpsgd', sampling => 'poisson', noise_multiplier => 1.0,"
    " delta => 1e-6, clip_norm => 1",
}


def _epoch_seconds(db: dpsql.Database, table: str, name: str, mech: str, b: int, k: int) -> float:
    source, feats, label = (
        (name, "NULL", "NULL") if mech != "noiseless" else (table, "'{x}'", "'y'")
    )
    extra = MECHANISMS[mech]
    labels = ", labels => '{-1,1}', row_norm => 'clip'" if mech == "noiseless" else ""
    (mid,) = db.execute(
        f"SELECT dpsql.train(%s, {feats}, {label}, 'logistic', epochs => {k},"
        f" batch_size => {b}, seed => 1{labels}{extra})",
        (source,),
    ).fetchone()
    (secs,) = db.execute(
        "SELECT train_seconds FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    return secs / k


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", default="1,10,50,500", help="comma-separated batch sizes")
    parser.add_argument(
        "--sampling-memory",
        default=None,
        help="dpsql.sampling_memory for the run (e.g. 0: Poisson and BST14 sort their batches)",
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats = 20_000, 1
    batches = [int(b) for b in args.batches.split(",")]
    with server.temporary_server() as uri, dpsql.connect(uri) as db:
        if args.sampling_memory is not None:
            db.execute(
                "SELECT set_config('dpsql.sampling_memory', %s, false)", (args.sampling_memory,)
            )
        X, y = datasets.synthetic_classification(args.rows, args.dim, seed=0)
        db.execute("CREATE TABLE wb (rid bigint, x float8[], y float8)")
        db.execute("ALTER TABLE wb ALTER COLUMN x SET STORAGE PLAIN")
        db.load_numpy("wb", X, y, schema="public", create=False)
        db.execute(
            "SELECT dpsql.register_dataset('public.wb', '{x}', 'y', epsilon_budget => 1e9,"
            " accept => true,"
            " delta_budget => 0.999, name => 'wb')"
        )
        print(
            f"# whitebox_runtime: {args.rows:,} x {args.dim}, {args.epochs} epochs per run,"
            f" {args.repeats} repeats, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        print(f"# server: PostgreSQL {db.execute('SHOW server_version').fetchone()[0]}")
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repeats):  # interleaved: drift hits every mechanism alike
            for b in batches:
                for mech in MECHANISMS:
                    t = _epoch_seconds(db, "public.wb", "wb", mech, b, args.epochs)
                    times.setdefault((mech, b), []).append(t)
        print(f"\n{'epoch seconds (median)':24s}" + "".join(f"{f'b={b}':>10s}" for b in batches))
        for mech in MECHANISMS:
            print(
                f"{mech:24s}"
                + "".join(f"{statistics.median(times[(mech, b)]):10.3f}" for b in batches)
            )
        med_noiseless = {b: statistics.median(times[("noiseless", b)]) for b in batches}
        print(f"\n{'ratio to noiseless':24s}" + "".join(f"{f'b={b}':>10s}" for b in batches))
        for mech in MECHANISMS:
            print(
                f"{mech:24s}"
                + "".join(
                    f"{statistics.median(times[(mech, b)]) / med_noiseless[b]:10.2f}"
                    for b in batches
                )
            )
        for b in batches:
            r = statistics.median(times[("dpsgd", b)]) / med_noiseless[b]
            print(f"dpsgd/noiseless at b={b}: {r:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
