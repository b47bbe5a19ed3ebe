"""The mechanism registry (sql/install/31_mechanisms.sql): dispatch, refusal hints, the
analysts' listing and the Python mechanism objects all come from one list."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from dpsql.privacy import MECHANISMS

REPO = Path(__file__).resolve().parents[2]
SIGNATURE = (
    "ds dpsql.datasets, model text, privacy text, params jsonb, epsilon double precision, "
    "delta double precision, noise_seed bigint"
)


def _catalog(conn) -> list[tuple]:
    return conn.execute(
        "SELECT name, train_function, task, sgd_defaults, needs_delta, docs"
        " FROM dpsql.mechanism_catalog ORDER BY name"
    ).fetchall()


def test_python_and_server_name_the_same_mechanisms(conn) -> None:
    names = {row[0] for row in conn.execute("SELECT name FROM dpsql.mechanisms()")}
    assert names == set(MECHANISMS)
    for name, cls in MECHANISMS.items():
        assert cls(epsilon=1.0, delta=1e-6).sql_args()["privacy"] == name


def test_every_registered_train_function_has_the_common_signature(conn) -> None:
    for name, function, task, _, _, docs in _catalog(conn):
        (args,) = conn.execute(
            "SELECT pg_get_function_identity_arguments(p.oid) FROM pg_proc p"
            " WHERE p.pronamespace = 'dpsql'::regnamespace AND p.proname = %s",
            (function,),
        ).fetchone()
        assert args == SIGNATURE, name
        assert task in ("classification", "regression")
        page = (REPO / docs).read_text()
        assert re.search(rf"\b{name}\b", page), (name, docs)


def test_unknown_mechanism_hint_lists_the_registry(conn) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT dpsql.train('nowhere', NULL, NULL, privacy => 'nope', epsilon => 1)")
    hint = err.value.diag.message_hint or ""
    for name, *_ in _catalog(conn):
        assert name in hint
    assert "auto" in hint


def test_the_sgd_defaults_apply_to_the_registered_sgd_mechanisms(conn) -> None:
    """The registry's sgd_defaults flag is what 34_defaults.sql serves: the SGD family."""
    flagged = {row[0] for row in _catalog(conn) if row[3]}
    assert flagged == {"bolton", "dpsgd", "dpsgd_f", "scs13", "bst14"}
