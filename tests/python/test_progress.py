"""Progress of private runs (issue 15): the server reports epochs and steps as NOTICEs while
the statement runs, and Python turns them into a bar; Python refuses what a private run does
not take instead of dropping it."""

from __future__ import annotations

import random

import pytest
from psycopg.pq import TransactionStatus

import dpsql
from dpsql.training import server_progress
from tests.pg_helpers import binary_dataset


@pytest.fixture
def binary(conn, scratch_schema):
    return binary_dataset(conn, scratch_schema)


def _db(conn) -> dpsql.Database:
    return dpsql.Database(conn, owns_connection=False, embedded=False)


def test_epochs_arrive_while_the_release_runs(conn, binary) -> None:
    ds, source, X, y = binary
    seen: list[tuple[str, TransactionStatus]] = []
    conn.add_notice_handler(
        lambda d: seen.append((d.message_primary, conn.pgconn.transaction_status))
    )
    conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, epochs => 4)",
        (source,),
    )
    progress = [(m, s) for m, s in seen if m.startswith("dpsql: epoch")]
    # the first and the last always; the others at most once a second
    assert progress[0][0] == "dpsql: epoch 1/4" and progress[-1][0] == "dpsql: epoch 4/4"
    # delivered while the statement was still running, not after it
    assert all(status == TransactionStatus.ACTIVE for _, status in progress)


def test_python_bar_events_and_silence(conn, binary) -> None:
    ds, source, X, y = binary
    db = _db(conn)
    with server_progress(conn, "test", enabled=True) as events:
        m = db.train(source, None, None, privacy=dpsql.BoltOn(epsilon=1), epochs=3, progress=False)
    assert events[0] == ("epoch", 1, 3) and events[-1] == ("epoch", 3, 3)
    assert m.row["epochs"] == 3
    with server_progress(conn, "test", enabled=False) as quiet:
        db.train(source, None, None, privacy=dpsql.BoltOn(epsilon=1), epochs=2, progress=False)
    assert quiet == []
    # Database.train's own bar reads the same events (and must not break the call)
    assert db.train(source, None, None, privacy=dpsql.BoltOn(epsilon=1), epochs=2).model_id


def test_steps_and_accountant_calibration(conn, binary) -> None:
    ds, source, X, y = binary
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary))
    # a configuration the accountant has not answered yet (its answers are cached)
    epsilon = 1 + random.Random().random()
    conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'dpsgd', epsilon => %s, delta => 1e-5,"
        " epochs => 2, batch_size => 50)",
        (source, epsilon),
    )
    assert any(n.startswith("dpsql: calibrating the noise") for n in notes)
    assert "dpsql: epoch 2/2" in notes


def test_private_runs_refuse_what_they_do_not_take(conn, binary) -> None:
    """Python used to drop features and label on private runs: now the server checks them."""
    ds, source, X, y = binary
    db = _db(conn)
    (spent,) = conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    refused: list[dict[str, object]] = [
        {"features": ["bogus"], "label": None},
        {"features": None, "label": "bogus"},
        {"features": None, "label": None, "shuffle": False},
        {"features": None, "label": None, "tolerance": 1e-3},
        {"features": None, "label": None, "row_norm": "clip"},
        {"features": None, "label": None, "labels": [0, 1]},
    ]
    for kw in refused:
        with pytest.raises(dpsql.InvalidParameter):
            db.train(source, privacy=dpsql.BoltOn(epsilon=1), progress=False, **kw)  # type: ignore[arg-type]
    assert conn.execute(
        "SELECT epsilon_spent FROM dpsql.budgets WHERE dataset_id = %s", (ds,)
    ).fetchone() == (spent,)
    # the registration's own names are accepted
    (features, label) = conn.execute(
        "SELECT features, label FROM dpsql.datasets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    m = db.train(source, features, label, privacy=dpsql.BoltOn(epsilon=1), progress=False)
    assert m.model_id
