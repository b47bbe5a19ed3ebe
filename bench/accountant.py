"""The DP-SGD accountant's cost at new configurations (issue 17; target 0.5 s,
docs/architecture.md, "Performance and utility targets").

Prints, in one run:

1. calibration at new configurations: the previous way (a new ``python -m dpsql.accounting``
   process per call, Brent's method on the charged PLD) against a process per call with the
   new search, and against the server's long-lived accountant (warm), through
   ``dpsql_internal._account`` (what a private DP-SGD run calls, cache table included); then
   in this process (no server, no imports), issue 17's search against issue 30's calibration
   cache (a candidate from dpsql/data/calibration_poisson.json verified by the charged PLD),
   with the charged evaluations each took;
2. the first call after a server start (the background worker starts the Python process);
3. 16 concurrent private DP-SGD releases (``dpsql.train``, Poisson sampling) at 16 distinct
   configurations: the most accountant processes alive at once (polled in ``/proc``, this
   server's only: their working directory is its data directory) and the batch's wall time,
   with the long-lived accountant and with one process per call (``dpsql.accountant_server =
   off``); and, for the previous server, 16 previous-accountant processes started at once (the
   accountant part of the same 16 requests only).

    python -m bench.accountant [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import psutil
import psycopg

import dpsql
from dpsql import accountant_requests, accounting, datasets, server

# (label, request without op/target) at new configurations; the brief's hard case last.
CONFIGS = [
    ("shuffle, 5 epochs", {"scheme": "shuffle", "epochs": 5}),
    ("poisson, 200 steps, q=0.01", {"scheme": "poisson", "steps": 200, "sampling_rate": 0.01}),
    ("poisson, 1000 steps, q=0.01", {"scheme": "poisson", "steps": 1000, "sampling_rate": 0.01}),
    ("poisson, 400 steps, q=0.005", {"scheme": "poisson", "steps": 400, "sampling_rate": 0.005}),
    (
        "poisson, 29000 steps, q=0.000344",
        {"scheme": "poisson", "steps": 29000, "sampling_rate": 0.000344},
    ),
]

# The previous search (Brent's method from the RDP calibration), for the "before" column: no
# cache (issue 30), no secant search (issue 17).
_OLD = (
    "import sys, dpsql.accounting as a, dpsql.accountant_requests as r; "
    "a._calibrate_from_cache = a._calibrate_pld_fast = lambda *args: None; "
    "sys.exit(r.main(sys.argv[1:]))"
)


def _request(config: dict, target: float) -> str:
    return json.dumps({"op": "calibrate", "target_epsilon": target, "delta": 1e-6, **config})


def _subprocess_seconds(argv: list[str], request: str) -> float:
    start = time.perf_counter()
    subprocess.run([*argv, request], check=True, capture_output=True)
    return time.perf_counter() - start


def _in_process(config: dict, target: float, cache: bool) -> tuple[float, int]:
    """Seconds and charged PLD evaluations of one calibrate() here, nothing remembered."""
    accounting._PLD_CACHE.clear()
    accounting._RDP_CACHE.clear()
    real_eps, real_cache = accounting._eps_pld, accounting._calibrate_from_cache
    charged: set[float] = set()

    def counted(mech: accounting.Mechanism, delta: float) -> float:
        charged.add(mech.noise_multiplier)
        return real_eps(mech, delta)

    accounting._eps_pld = counted
    if not cache:
        accounting._calibrate_from_cache = lambda *args: None
    try:
        start = time.perf_counter()
        accounting.calibrate(target, 1e-6, **config)
        return time.perf_counter() - start, len(charged)
    finally:
        accounting._eps_pld, accounting._calibrate_from_cache = real_eps, real_cache


def _account_seconds(conn: psycopg.Connection, request: str) -> float:
    start = time.perf_counter()
    conn.execute("SELECT dpsql_internal._account(%s::jsonb)", (request,))
    return time.perf_counter() - start


def _accountants(datadir: str) -> int:
    """Accountant processes of this server: Python with ``-m dpsql.accounting`` (not the shell
    that runs a per-call command, whose one argument is the whole command line)."""
    n = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "dpsql.accounting" in (p.info["cmdline"] or []) and p.cwd() == datadir:
                n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return n


def _stop_long_lived(conn: psycopg.Connection, datadir: str) -> None:
    """Terminate the accountant's worker (it stops its Python process), and wait."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "dpsql accountant" in " ".join(p.info["cmdline"] or []) and p.cwd() == datadir:
                p.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    deadline = time.monotonic() + 10
    while _accountants(datadir) and time.monotonic() < deadline:
        time.sleep(0.05)


def _concurrent_releases(
    uri: str, datadir: str, epsilons: Sequence[float], settings: str
) -> tuple[int, float, int]:
    """Max accountant processes alive, wall seconds, failures of len(epsilons) DP-SGD runs."""
    failures: list[BaseException] = []

    def train(eps: float) -> None:
        try:
            with psycopg.connect(uri, autocommit=True) as c:
                if settings:
                    c.execute(settings)
                c.execute(
                    "SELECT dpsql.train('acct', NULL, NULL, 'logistic', epochs => 2,"
                    " batch_size => 20, privacy => 'dpsgd', sampling => 'poisson',"
                    " epsilon => %s, delta => 1e-6, clip_norm => 1)",
                    (eps,),
                )
        except BaseException as exc:  # noqa: BLE001 - counted and printed
            failures.append(exc)

    threads = [threading.Thread(target=train, args=(e,)) for e in epsilons]
    peak = 0
    start = time.perf_counter()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, _accountants(datadir))
        time.sleep(0.01)
    wall = time.perf_counter() - start
    for exc in failures[:3]:
        print(f"# failure: {exc}", file=sys.stderr)
    return peak, wall, len(failures)


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 29000-step case")
    parser.add_argument("--concurrent", type=int, default=16)
    args = parser.parse_args(argv)
    configs = CONFIGS[:-1] if args.quick else CONFIGS
    python = [sys.executable]
    print(f"# bench/accountant.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with server.temporary_server() as uri, dpsql.connect(uri) as db:
        conn = psycopg.connect(uri, autocommit=True)
        datadir = str(conn.execute("SHOW data_directory").fetchone()[0])
        print(f"# server: PostgreSQL {conn.execute('SHOW server_version').fetchone()[0]}")

        # 2. the first call after the server started (worker + Python start + calibration)
        cold = _account_seconds(conn, _request(configs[1][1], 0.77))
        print(f"first call after a server start ({configs[1][0]}): {cold:.2f} s")
        warm_noop = _account_seconds(conn, _request(configs[0][1], 0.78))
        print(f"next call, warm ({configs[0][0]}): {warm_noop:.2f} s")

        # 1. new configurations, three ways (a fresh target each time: nothing cached)
        print(
            f"\n{'calibration at a new configuration (s)':40s}{'before':>10s}"
            f"{'process':>10s}{'server':>10s}"
        )
        print(f"{'(before: process per call, Brent;':40s}{'':>10s}{'per call':>10s}{'(warm)':>10s}")
        print(f"{' process per call: this version)':40s}")
        target = 1.0
        rows = []
        for label, config in configs:
            target += 0.001  # distinct requests, same difficulty
            before = _subprocess_seconds([*python, "-c", _OLD], _request(config, target))
            target += 0.001
            per_call = _subprocess_seconds(
                [*python, "-m", "dpsql.accounting"], _request(config, target)
            )
            target += 0.001
            warm = _account_seconds(conn, _request(config, target))
            rows.append((label, before, per_call, warm))
            print(f"{label:40s}{before:10.2f}{per_call:10.2f}{warm:10.2f}")

        # 1b. in this process: issue 17's search against issue 30's cache
        accountant_requests.quiet()
        accounting.calibrate(1.5, 1e-6, scheme="poisson", steps=10, sampling_rate=0.5)  # imports
        print(f"\n{'in-process calibrate() (s, charged PLDs)':40s}{'search':>10s}{'cache':>10s}")
        for label, config in configs:
            target += 0.001
            search, n_search = _in_process(config, target, cache=False)
            target += 0.001
            cached, n_cached = _in_process(config, target, cache=True)
            print(f"{label:40s}{search:7.2f} ({n_search}){cached:7.2f} ({n_cached})")

        # 3. concurrent private releases at distinct configurations
        X, y = datasets.synthetic_classification(2000, 10, seed=0)
        db.execute("CREATE TABLE acct (rid bigint, x float8[], y float8)")
        db.load_numpy("acct", X, y, schema="public", create=False)
        db.execute(
            "SELECT dpsql.register_dataset('public.acct', '{x}', 'y', epsilon_budget => 1e9,"
            " accept => true,"
            " delta_budget => 0.999, name => 'acct')"
        )
        n = args.concurrent
        print(f"\n{n} concurrent dpsql.train(privacy => 'dpsgd', sampling => 'poisson'),")
        print("2000 rows, batch 20, 2 epochs (200 steps, q = 0.01), epsilons 1.00x + 0.1 i:")
        for name, settings, eps0 in (
            ("long-lived accountant", "", 1.001),
            (
                "process per call (accountant_server = off)",
                "SET dpsql.accountant_server = off",
                1.002,
            ),
        ):
            if settings:
                _stop_long_lived(conn, datadir)
            peak, wall, failed = _concurrent_releases(
                uri, datadir, [eps0 + 0.1 * i for i in range(n)], settings
            )
            print(
                f"  {name:50s} max accountant processes {peak}, wall {wall:.2f} s"
                + (f", {failed} failed" if failed else "")
            )
        # before: what the server did, one previous-accountant process per call, all at once
        # (the accountant part only: the requests the 16 runs above send, new targets)
        procs = []
        peak = 0
        start = time.perf_counter()
        for i in range(n):
            request = _request(
                {"scheme": "poisson", "steps": 200, "sampling_rate": 0.01}, 1.003 + i / 10
            )
            procs.append(
                subprocess.Popen([*python, "-c", _OLD, request], stdout=subprocess.DEVNULL)
            )
        while any(p.poll() is None for p in procs):
            peak = max(peak, sum(p.poll() is None for p in procs))
            time.sleep(0.01)
        wall = time.perf_counter() - start
        print(
            f"  {'before: previous accountant, a process per call':50s} max accountant processes"
            f" {peak}, wall {wall:.2f} s (accountant only)"
        )
        conn.close()
        warm_calls = [r[3] for r in rows]
        print(
            "\nwarm server, first call at a new configuration:"
            f" median {statistics.median(warm_calls):.2f} s, max {max(warm_calls):.2f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
