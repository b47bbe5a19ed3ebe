"""Long C calls stop on statement_timeout, and sizes have limits (red team, issue 9 F3).

A loop whose trip count comes from an argument must check for interrupts (the core's host hook
is CHECK_FOR_INTERRUPTS in the server), and a work area must be PostgreSQL memory of a bounded,
checked size: an analyst must not be able to start a call nothing stops.
"""

from __future__ import annotations

import contextlib
import threading
import time

import psutil
import psycopg
import pytest
from psycopg import errors

# Generous: the point is "seconds", not "minutes or never", on a shared 2-core machine.
WITHIN_SECONDS = 15.0


@pytest.fixture
def timed_conn(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute("SET statement_timeout = '1s'")
    return conn


def _canceled_quickly(conn: psycopg.Connection, query: str, params: tuple = ()) -> None:
    start = time.monotonic()
    with pytest.raises(errors.QueryCanceled):
        conn.execute(query, params)
    assert time.monotonic() - start < WITHIN_SECONDS
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_exact_sensitivity_over_the_step_limit_is_refused(timed_conn: psycopg.Connection) -> None:
    # the red team's call: 10^15 steps of the growth recursion
    start = time.monotonic()
    with pytest.raises(errors.ProgramLimitExceeded, match=r"dpsql: .*limited to 4294967296 steps"):
        timed_conn.execute(
            "SELECT dpsql.bolton_sensitivity('constant', 0.1, 0, 1, 1, 0, 1000000000000000, 1, "
            "1000, true, true, false)"
        )
    assert time.monotonic() - start < WITHIN_SECONDS


def test_exact_sensitivity_huge_work_area_is_refused(timed_conn: psycopg.Connection) -> None:
    # one permutation keeps a double per step of a pass: 2e8 of them was a 1.6 GB calloc
    with pytest.raises(errors.ProgramLimitExceeded, match=r"dpsql: .*16777216 steps per pass"):
        timed_conn.execute(
            "SELECT dpsql.bolton_sensitivity('constant', 0.1, 0, 1, 1, 0, 200000000, 1, 1, "
            "false, true, false)"
        )


def test_exact_sensitivity_within_limits_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # 2^32 steps (the limit) with fresh permutations: many seconds of work, canceled at 1 s
    _canceled_quickly(
        timed_conn,
        "SELECT dpsql.bolton_sensitivity('inverse', 0.1, 1, 1, 1, 0, 2147483648, 1, 2, "
        "true, true, false)",
    )


def test_exact_sensitivity_work_area_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # one permutation, 2^24 positions, 256 passes: the palloc'd area is freed by the abort
    _canceled_quickly(
        timed_conn,
        "SELECT dpsql.bolton_sensitivity('inverse', 0.1, 1, 1, 1, 0, 16777216, 1, 256, "
        "false, true, false)",
    )
    # and the session can do it again (no leak that fails the next call)
    _canceled_quickly(
        timed_conn,
        "SELECT dpsql.bolton_sensitivity('inverse', 0.1, 1, 1, 1, 0, 16777216, 1, 256, "
        "false, true, false)",
    )


def test_closed_form_epoch_sum_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # the inverse schedule's sum has one term per epoch: 2^31 - 1 of them
    timed_conn.execute("SET statement_timeout = '300ms'")
    start = time.monotonic()
    with contextlib.suppress(errors.QueryCanceled):
        timed_conn.execute(
            "SELECT dpsql.bolton_sensitivity('inverse', 0.1, 1, 1, 1, 0, 100, 1, 2147483647)"
        )
    assert time.monotonic() - start < WITHIN_SECONDS


def test_steps_per_epoch_limit(conn: psycopg.Connection) -> None:
    limit = "dpsql: steps_per_epoch is limited to 2147483647"
    with pytest.raises(errors.ProgramLimitExceeded, match=limit):
        conn.execute(
            "SELECT dpsql_internal._sgd_init('logistic', 2, 2, 0.01, 'constant', 0.1, 0, 0, 0.1,"
            " 1, 0, "
            "1.0, 'gaussian', 1.0, 1, 1099511627776, 7)"
        )


def test_batched_epoch_over_empty_steps_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # one row in the last batch of 2^31 - 1: every empty step before it adds its noise
    state = timed_conn.execute(
        "SELECT dpsql_internal._sgd_init('logistic', 50, 2, 0.01, 'constant', 0.1, 0, 0, 0.1, 1,"
        " 0, "
        "1.0, 'gaussian', 1.0, 1, 2147483647, 7)"
    ).fetchone()[0]
    _canceled_quickly(
        timed_conn,
        "SELECT dpsql.sgd_epoch_batches(x, y, b, %s::float8[]) FROM (VALUES "
        "(array_fill(0.1::float8, ARRAY[50]), 1.0::float8, 2147483647::bigint)) AS t(x, y, b)",
        (state,),
    )


def test_poisson_batches_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # q = 1 over 2^31 - 1 steps: an int[] of every step, refused above 1 GB or canceled first
    start = time.monotonic()
    with pytest.raises((errors.QueryCanceled, errors.ProgramLimitExceeded, errors.InternalError)):
        timed_conn.execute(
            "SELECT cardinality(dpsql_internal._poisson_batches(1, 1, 2147483647, 1.0))"
        )
    assert time.monotonic() - start < WITHIN_SECONDS


def test_sampled_epoch_replay_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # two rows, q = 1 over 2^31 - 1 steps: the replay's steps (and their noise) never end
    state = timed_conn.execute(
        "SELECT dpsql_internal._sgd_init('logistic', 50, 2, 0.01, 'constant', 0.1, 0, 0, 0.1, 1,"
        " 0, 1.0, 'gaussian', 1.0, 1, 2147483647, 7)"
    ).fetchone()[0]
    _canceled_quickly(
        timed_conn,
        "SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, %s::float8[], 'poisson', 1, 2, 1.0,"
        " NULL, NULL) FROM (VALUES (1::bigint, array_fill(0.1::float8, ARRAY[50]), 1.0::float8),"
        " (2, array_fill(0.1::float8, ARRAY[50]), -1.0)) AS t(rid, x, y)",
        (state,),
    )


def test_sampled_members_is_interruptible(timed_conn: psycopg.Connection) -> None:
    # every row of 2^40 in every step: the members are counted, never all generated
    _canceled_quickly(
        timed_conn,
        "SELECT count(*) FROM dpsql_internal._sampled_members('poisson', 1, 1099511627776,"
        " 2147483647, 1.0, 1)",
    )


def test_cancel_request_stops_a_long_call(conn: psycopg.Connection, server_uri: str) -> None:
    # pg_cancel_backend from another session, not only the timeout
    pid = conn.info.backend_pid
    with psycopg.connect(server_uri, autocommit=True) as other:

        def cancel_soon() -> None:
            time.sleep(0.5)
            other.execute("SELECT pg_cancel_backend(%s)", (pid,))

        thread = threading.Thread(target=cancel_soon)
        thread.start()
        start = time.monotonic()
        with pytest.raises(errors.QueryCanceled):
            conn.execute(
                "SELECT dpsql.bolton_sensitivity('inverse', 0.1, 1, 1, 1, 0, 2147483648, 1, 2, "
                "true, true, false)"
            )
        thread.join()
        assert time.monotonic() - start < WITHIN_SECONDS


def test_accountant_is_cancelled_and_killed(conn: psycopg.Connection, server_uri: str) -> None:
    """The accountant is an outside process: a statement timeout kills it (it used to be
    waited for with a blocking read)."""
    with psycopg.connect(server_uri, autocommit=True) as c:
        # A stand-in accountant that never answers (dpsql.accountant_command is superuser-only).
        c.execute("SET dpsql.accountant_command = 'sleep 77; echo'")
        c.execute("SET statement_timeout = '1s'")
        _canceled_quickly(c, "SELECT dpsql_internal._accountant('{}')")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            alive = [
                p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "77"]
            ]
            if not alive:
                break
            time.sleep(0.2)
        assert not alive, "the accountant's process outlived the cancelled call"
        # and an answer still comes through
        c.execute("SET dpsql.accountant_command = 'echo'")
        assert c.execute("SELECT dpsql_internal._accountant('{}')").fetchone()[0].strip() == "{}"
