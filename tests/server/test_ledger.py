"""The privacy ledger (docs/architecture.md, privacy rule 3): budget arithmetic of
dpsql_internal._charge, refusals that write nothing, append-only entries, and concurrent charges
that never overspend."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from psycopg import errors

# The container stage runs this module against the image (tests/container).
pytestmark = pytest.mark.smoke

BUDGET_EXCEEDED = "DP001"


@pytest.fixture
def make_dataset(conn, scratch_schema):
    """Factory: a fresh table registered with the given budget; returns its dataset_id."""

    def make(epsilon_budget: float = 1.0, delta_budget: float = 0.0) -> int:
        table = f"t_{uuid.uuid4().hex[:10]}"
        conn.execute(
            f"CREATE TABLE {table} AS SELECT g::float8 AS f, (g % 2) * 2 - 1 AS y"
            " FROM generate_series(1, 10) g"
        )
        (ds,) = conn.execute(
            "SELECT dpsql.register_dataset(%s, '{f}', 'y', %s, %s, name => %s)",
            (f"{scratch_schema}.{table}", epsilon_budget, delta_budget, table),
        ).fetchone()
        return ds

    return make


def _charge(conn, ds, epsilon, delta=0.0, mechanism="test"):
    return conn.execute(
        "SELECT dpsql_internal._charge(%s, %s, %s, %s)", (ds, epsilon, delta, mechanism)
    ).fetchone()[0]


def _spent(conn, ds) -> tuple[int, float, float]:
    return conn.execute(
        "SELECT count(*), coalesce(sum(epsilon), 0), coalesce(sum(delta), 0)"
        " FROM dpsql.ledger_entries WHERE dataset_id = %s",
        (ds,),
    ).fetchone()


def _budget(conn, ds):
    return conn.execute(
        "SELECT epsilon_spent, delta_spent, epsilon_remaining, delta_remaining"
        " FROM dpsql.budgets WHERE dataset_id = %s",
        (ds,),
    ).fetchone()


def test_charges_accumulate_until_the_budget_is_spent(conn, make_dataset) -> None:
    ds = make_dataset(1.0, 1e-5)
    entries = [_charge(conn, ds, 0.25, 2e-6) for _ in range(4)]
    assert entries == sorted(entries) and len(set(entries)) == 4
    assert _budget(conn, ds) == (1.0, pytest.approx(8e-6), 0.0, pytest.approx(2e-6))
    rows = conn.execute(
        "SELECT dataset_id, model_id, mechanism, epsilon, delta, role = session_user"
        " FROM dpsql.ledger_entries WHERE dataset_id = %s ORDER BY entry_id",
        (ds,),
    ).fetchall()
    assert rows == [(ds, None, "test", 0.25, 2e-6, True)] * 4
    # The epsilon budget is spent: any further charge is refused, and nothing is written.
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds, 1e-9)
    assert err.value.sqlstate == BUDGET_EXCEEDED
    message = str(err.value)
    assert message.startswith("dpsql: privacy budget of dataset")
    assert "spent ε=1, δ=8e-06; budget ε=1, δ=1e-05; this release needs ε=1e-09, δ=0" in message
    assert _spent(conn, ds)[0] == 4
    charges = conn.execute("SELECT charges FROM dpsql.datasets WHERE dataset_id = %s", (ds,))
    assert charges.fetchone()[0] == 4


def test_a_charge_larger_than_the_remainder_is_refused_whole(conn, make_dataset) -> None:
    ds = make_dataset(1.0)
    _charge(conn, ds, 0.7)
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds, 0.4)  # 0.3 remain: no partial charge
    assert err.value.sqlstate == BUDGET_EXCEEDED
    assert _spent(conn, ds) == (1, 0.7, 0.0)
    _charge(conn, ds, 0.3)  # exactly the remainder
    assert _spent(conn, ds)[0] == 2


def test_delta_budget(conn, make_dataset) -> None:
    ds = make_dataset(10.0, 1e-5)
    _charge(conn, ds, 0.1, 6e-6)
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds, 0.1, 6e-6)
    assert err.value.sqlstate == BUDGET_EXCEEDED and "δ=6e-06" in str(err.value)
    _charge(conn, ds, 0.1, 4e-6)
    _charge(conn, ds, 0.1, 0.0)  # pure epsilon-DP still fits
    assert _spent(conn, ds)[0] == 3
    # A dataset with no delta budget takes pure epsilon-DP releases only.
    pure = make_dataset(1.0, 0.0)
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, pure, 0.1, 1e-12)
    assert err.value.sqlstate == BUDGET_EXCEEDED
    _charge(conn, pure, 0.1, 0.0)


def test_float_sums_get_a_relative_slack_of_1e_12(conn, make_dataset) -> None:
    ds = make_dataset(0.3)
    _charge(conn, ds, 0.1)
    _charge(conn, ds, 0.2)  # 0.1 + 0.2 = 0.30000000000000004 > 0.3 in floating point
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds, 1e-9)  # beyond the slack
    assert err.value.sqlstate == BUDGET_EXCEEDED


@pytest.mark.parametrize(
    "epsilon,delta,mechanism,code",
    [
        (0.0, 0.0, "test", "22023"),
        (-0.5, 0.0, "test", "22023"),
        (float("nan"), 0.0, "test", "22023"),
        (float("inf"), 0.0, "test", "22023"),
        (None, 0.0, "test", "22023"),
        (0.1, -1e-9, "test", "22023"),
        (0.1, 1.0, "test", "22023"),
        (0.1, float("nan"), "test", "22023"),
        (0.1, None, "test", "22023"),
        (0.1, 0.0, "", "22023"),
        (0.1, 0.0, None, "22023"),
    ],
)
def test_bad_charges_are_refused_and_write_nothing(
    conn, make_dataset, epsilon, delta, mechanism, code
) -> None:
    ds = make_dataset(1.0, 0.5)
    with pytest.raises(psycopg.Error) as err:
        conn.execute(
            "SELECT dpsql_internal._charge(%s, %s::float8, %s::float8, %s)",
            (ds, epsilon, delta, mechanism),
        )
    assert err.value.sqlstate == code and str(err.value).startswith("dpsql:"), str(err.value)
    assert _spent(conn, ds)[0] == 0


def test_unknown_dataset(conn) -> None:
    with pytest.raises(errors.UndefinedObject, match="no dataset"):
        conn.execute("SELECT dpsql_internal._charge(-1, 0.1, 0, 'test')")


def test_ledger_is_append_only(conn, make_dataset) -> None:
    ds = make_dataset(1.0)
    entry = _charge(conn, ds, 0.1)
    for stmt in [
        "UPDATE dpsql.ledger_entries SET epsilon = 0 WHERE entry_id = %(e)s",
        "UPDATE dpsql.ledger_entries SET note = 'x' WHERE entry_id = %(e)s",
        "UPDATE dpsql.ledger_entries SET model_id = 1, epsilon = 0 WHERE entry_id = %(e)s",
        # the recorded DpEvent neither (dpsql.budget_report re-accounts it)
        'UPDATE dpsql.ledger_entries SET dp_event = \'{"type": "NoOp"}\' WHERE entry_id = %(e)s',
        "UPDATE dpsql.ledger_entries SET dp_event = NULL WHERE entry_id = %(e)s",
        "UPDATE dpsql.ledger_entries SET model_id = 1, dp_event = NULL WHERE entry_id = %(e)s",
        "DELETE FROM dpsql.ledger_entries WHERE entry_id = %(e)s",
        "TRUNCATE dpsql.ledger_entries",
        "DELETE FROM dpsql.datasets WHERE dataset_id = %(d)s",  # its entries would dangle
    ]:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(stmt, {"e": entry, "d": ds})
        assert err.value.sqlstate in ("42501", "23503"), (stmt, str(err.value))
    # model_id may be filled in once, and only it.
    conn.execute("SELECT dpsql_internal._set_ledger_model(%s, 41)", (entry,))
    with pytest.raises(errors.InsufficientPrivilege, match="append-only"):
        conn.execute("SELECT dpsql_internal._set_ledger_model(%s, 42)", (entry,))
    with pytest.raises(errors.UndefinedObject):
        conn.execute("SELECT dpsql_internal._set_ledger_model(-1, 42)")
    row = conn.execute(
        "SELECT model_id, epsilon, note, dp_event FROM dpsql.ledger_entries WHERE entry_id = %s",
        (entry,),
    ).fetchone()
    assert row == (41, 0.1, None, {"type": "EpsilonDelta", "epsilon": 0.1, "delta": 0.0})


def test_concurrent_charges_never_overspend(conn, server_uri, make_dataset) -> None:
    """N=16 sessions charge 0.3 each, together, against a budget of 1.0: exactly 3 succeed,
    and every other session rolls back its own transaction after its charge: the charges stay.

    Deterministic (false-failure rate 0): each charge commits in a transaction of its own that
    locks the dataset row before summing the ledger, so the charges are serialized whatever the
    timing, and a caller's ROLLBACK cannot reach them.
    """
    ds = make_dataset(1.0)
    n = 16
    barrier = threading.Barrier(n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with psycopg.connect(server_uri) as c:  # not autocommit: one transaction each
            barrier.wait(timeout=30)
            try:
                c.execute("SELECT dpsql_internal._charge(%s, 0.3, 0, 'test')", (ds,))
                c.execute("SELECT pg_sleep(0.05)")
                c.rollback() if i % 2 else c.commit()
                result = "ok"
            except psycopg.Error as err:
                c.rollback()
                result = err.sqlstate or "?"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(outcomes) == sorted(["ok"] * 3 + [BUDGET_EXCEEDED] * (n - 3))
    count, epsilon, _ = _spent(conn, ds)
    assert count == 3 and epsilon == pytest.approx(0.9) and epsilon <= 1.0


def test_a_stale_snapshot_cannot_charge_past_the_budget(conn, server_uri, make_dataset) -> None:
    """A REPEATABLE READ snapshot taken before another charge committed does not hide it: a
    charge in such a transaction is refused before anything (issue 41: its own charge would
    commit where the snapshot cannot see it), and nothing is charged."""
    ds = make_dataset(1.0)
    with psycopg.connect(server_uri) as stale:
        stale.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert (
            stale.execute(
                "SELECT count(*) FROM dpsql.ledger_entries WHERE dataset_id = %s", (ds,)
            ).fetchone()[0]
            == 0
        )  # the snapshot is taken here
        _charge(conn, ds, 0.6)  # commits (autocommit)
        with pytest.raises(psycopg.Error) as err:
            stale.execute("SELECT dpsql_internal._charge(%s, 0.6, 0, 'test')", (ds,))
        assert err.value.sqlstate == "25001" and "READ COMMITTED" in str(err.value)
        stale.rollback()
    assert _spent(conn, ds) == (1, 0.6, 0.0)
