"""The prologue of the Protein release benchmarks (frank_wolfe_scans, objpert_solver): the
header with the command and the load, Protein's training half installed and registered, and
the yardstick, a noiseless 10-epoch SGD run on it."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

import dpsql
from bench.bolton_accuracy import (
    BenchData,
    bench_server,
    header_lines,
    install_data,
    load_bench_data,
)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def protein_session(
    name: str, dsn: str | None
) -> Iterator[tuple[dpsql.Database, BenchData, float]]:
    """(connection, Protein's data, seconds of 10 noiseless epochs) on the bench's server."""
    lines = header_lines(name)
    lines.append(f"# command: python -m bench.{name} {' '.join(sys.argv[1:])}")
    lines.append(f"# load average before: {load_average()}")
    print("\n".join(lines), flush=True)
    (data,), _ = load_bench_data(["protein"])
    with bench_server(dsn, None) as (uri, where), dpsql.connect(uri) as db:
        print(f"# server: {where}", flush=True)
        db.execute("SET client_min_messages = error")
        install_data(db, data, "")
        t0 = time.perf_counter()
        db.execute(
            "SELECT dpsql.train(%s, '{x}', 'y', 'logistic', epochs => 10, row_norm => 'unit',"
            " labels => %s, seed => 1)",
            (data.train_table, data.labels),
        )
        yield db, data, time.perf_counter() - t0
