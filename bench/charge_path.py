"""The cost of the durable charge (issue 24): a ledger entry committed in a background
worker's transaction of its own, against the same charge made inside the caller's transaction
(what dpsql did before 0.8.0, and still does for a dataset registered by that transaction).

Prints, in one run on a throw-away embedded server:

1. one charge, sequentially: ``dpsql_internal._charge`` (durable: worker start, connection,
   commit) against ``dpsql_internal._charge_committed`` in the caller's transaction, each
   committed by the caller (autocommit), median and p90 of ``--charges`` calls;
2. a whole bolt-on release (``dpsql.train``, 1 epoch on 20,000 rows), for scale;
3. 16 sessions charging one dataset at once (``--charges`` each): wall time, charges per
   second, and whether the ledger stayed within the budget.

    python -m bench.charge_path [--charges 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import psycopg

from dpsql import server


def _times(conn: psycopg.Connection, query: str, args: tuple, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        conn.execute(query, args)
        out.append(time.perf_counter() - start)
    return out


def _line(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[int(0.9 * (len(ms) - 1))]
    return f"{label:<48} median {statistics.median(ms):7.2f} ms   p90 {p90:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=200)
    n = parser.parse_args().charges
    with server.temporary_server() as uri, psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION dpsql")
        conn.execute(
            "CREATE TABLE t AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
            " CASE WHEN g % 3 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 20000) g"
        )
        (ds,) = conn.execute(
            "SELECT dpsql.register_dataset('public.t', '{a,b}', 'y', 1e9, 0, name => 'bench',"
            " accept => true)"
        ).fetchone()
        request = json.dumps(
            {"dataset_id": ds, "epsilon": 1e-3, "delta": 0, "mechanism": "bench", "role": "bench"}
        )
        print(f"PostgreSQL {conn.info.server_version}; {n} charges each")
        durable = _times(conn, "SELECT dpsql_internal._charge(%s, 1e-3, 0, 'bench')", (ds,), n)
        inline = _times(conn, "SELECT dpsql_internal._charge_committed(%s)", (request,), n)
        print(_line("durable charge (background worker)", durable))
        print(_line("charge in the caller's transaction", inline))
        print(
            f"{'extra cost of the durable charge':<48} "
            f"{(statistics.median(durable) - statistics.median(inline)) * 1000:7.2f} ms per release"
        )
        release = _times(
            conn,
            "SELECT dpsql.train('bench', NULL, NULL, privacy => 'bolton', epsilon => 1,"
            " epochs => 1)",
            (),
            10,
        )
        print(_line("whole bolt-on release, 1 epoch on 20,000 rows", release))

        # The race: 16 sessions ask for twice what is left; exactly half may be charged.
        budget = 16 * n * 1e-3 / 2
        (spent_before,) = conn.execute(
            "SELECT coalesce(sum(epsilon), 0) FROM dpsql.ledger_entries WHERE dataset_id = %s",
            (ds,),
        ).fetchone()
        conn.execute(
            "UPDATE dpsql.datasets SET epsilon_budget = %s WHERE dataset_id = %s",
            (spent_before + budget, ds),
        )
        refused = [0]
        lock = threading.Lock()

        def session() -> None:
            with psycopg.connect(uri, autocommit=True) as c:
                for _ in range(n):
                    try:
                        c.execute("SELECT dpsql_internal._charge(%s, 1e-3, 0, 'race')", (ds,))
                    except psycopg.Error as err:
                        if err.sqlstate != "DP001":
                            raise
                        with lock:
                            refused[0] += 1

        threads = [threading.Thread(target=session) for _ in range(16)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        (spent,) = conn.execute(
            "SELECT coalesce(sum(epsilon), 0) FROM dpsql.ledger_entries WHERE dataset_id = %s"
            " AND mechanism = 'race'",
            (ds,),
        ).fetchone()
        made = 16 * n - refused[0]
        print(
            f"16 sessions x {n} charges: {wall:.2f} s wall, {made / wall:.0f} charges/s; "
            f"{made} charged, {refused[0]} refused; spent {spent:.3f} of {budget:.3f} "
            f"({'within' if spent <= budget * (1 + 1e-12) else 'OVER'} the budget)"
        )


if __name__ == "__main__":
    main()
