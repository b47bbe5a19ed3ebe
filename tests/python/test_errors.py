"""dpsql.errors: the Python API raises one class per dpsql SQLSTATE, as a data owner and an
analyst meet them on a real server, with the server's message and hint; each class is also
psycopg's class of its SQLSTATE."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import dpsql
from dpsql import errors
from tests.conftest import Role

Connect = Callable[[], dpsql.Database]


def _as(server_uri: str, role: Role) -> Connect:
    """dpsql.connect as a login role made by make_role (its password is in its connect())."""
    name, connect = role
    with connect() as c:
        password = c.info.password
    return lambda: dpsql.connect(make_conninfo(server_uri, user=name, password=password))


@pytest.fixture
def owner_and_analyst(conn, scratch_schema, server_uri, make_role) -> tuple[Connect, Connect, str]:  # noqa: F811
    """(owner, analyst, table): a data owner who may read ``table`` (features a, b; label y in
    {-1, 1}) and an analyst, both real login roles."""
    conn.execute(
        "CREATE TABLE points AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
        " CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 200) g"
    )
    owner = make_role("owner", "dpsql_admin")
    analyst = make_role("analyst", "dpsql_analyst")
    for role in (owner, analyst):
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(scratch_schema), sql.Identifier(role[0])
            )
        )
    conn.execute(sql.SQL("GRANT SELECT ON points TO {}").format(sql.Identifier(owner[0])))
    return _as(server_uri, owner), _as(server_uri, analyst), f"{scratch_schema}.points"


def _register(owner: dpsql.Database, table: str, epsilon_budget: float) -> tuple[int, str]:
    name = f"points_{uuid.uuid4().hex[:8]}"
    ds = owner.register_dataset(
        table,
        ["a", "b"],
        "y",
        epsilon_budget=epsilon_budget,
        feature_bounds=[(0, 1), (-1, 0)],
        name=name,
    )
    return ds, name


def _grant(owner: dpsql.Database, dataset_id: int, analyst: dpsql.Database) -> None:
    owner.grant_dataset(dataset_id, analyst.conn.info.user)


def _cause(err: BaseException) -> psycopg.Error:
    """The psycopg exception the dpsql one was raised from."""
    cause = err.__cause__
    assert isinstance(cause, psycopg.Error) and not isinstance(cause, errors.DpsqlError)
    return cause


def _preserves_the_server_report(err: errors.DpsqlError) -> None:
    cause = _cause(err)
    assert str(err) == str(cause) and str(err).startswith("dpsql: ")
    assert err.sqlstate == cause.sqlstate
    assert err.diag.message_primary == cause.diag.message_primary
    assert err.diag.message_hint == cause.diag.message_hint
    assert err.diag.sqlstate == cause.sqlstate
    # psycopg errors survive pickling (multiprocessing); these too, with their report.
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and str(again) == str(err)
    assert again.diag.message_hint == err.diag.message_hint


def test_budget_exhaustion_raises_budget_exceeded(owner_and_analyst) -> None:
    owner_of, analyst_of, table = owner_and_analyst
    with owner_of() as owner, analyst_of() as analyst:
        ds, name = _register(owner, table, epsilon_budget=1.0)
        _grant(owner, ds, analyst)
        mechanism = dpsql.BoltOn(epsilon=0.6)
        analyst.train(name, None, None, privacy=mechanism, epochs=1, progress=False)
        with pytest.raises(errors.BudgetExceeded) as caught:
            analyst.train(name, None, None, privacy=mechanism, epochs=1, progress=False)
        err = caught.value
        assert err.sqlstate == "DP001"
        assert isinstance(err, psycopg.DatabaseError)
        assert "privacy budget of dataset" in str(err) and "exceeded" in str(err)
        assert err.diag.message_hint is not None
        assert err.diag.message_hint.startswith("Nothing was charged.")
        _preserves_the_server_report(err)
        spent = [b["epsilon_spent"] for b in owner.budgets() if b["dataset_id"] == ds]
        assert spent == [pytest.approx(0.6)]


def test_an_ungranted_dataset_reads_as_an_unknown_one(owner_and_analyst) -> None:
    owner_of, analyst_of, table = owner_and_analyst
    with owner_of() as owner, analyst_of() as analyst:
        ds, name = _register(owner, table, epsilon_budget=1.0)
        # Its name and existence are not disclosed (issue 24): NotRegistered, as for no dataset.
        with pytest.raises(errors.NotRegistered, match="among the datasets you can use") as caught:
            analyst.train(name, None, None, privacy=dpsql.BoltOn(epsilon=0.5), progress=False)
        err = caught.value
        # Code that caught psycopg's class keeps working.
        assert isinstance(err, psycopg.errors.UndefinedObject)
        assert err.sqlstate == "42704"
        _preserves_the_server_report(err)
        # Owners' functions are not even executable by analysts: PostgreSQL's own refusal.
        with pytest.raises(errors.PermissionDenied, match="permission denied for function"):
            analyst.grant_dataset(ds, analyst.conn.info.user)


def test_a_refused_parameter_raises_invalid_parameter(owner_and_analyst) -> None:
    owner_of, analyst_of, table = owner_and_analyst
    with owner_of() as owner, analyst_of() as analyst:
        ds, name = _register(owner, table, epsilon_budget=1.0)
        _grant(owner, ds, analyst)
        with pytest.raises(errors.InvalidParameter, match="epsilon") as caught:
            analyst.train(name, None, None, privacy=dpsql.BoltOn(epsilon=-1.0), progress=False)
        err = caught.value
        assert isinstance(err, psycopg.errors.InvalidParameterValue)
        assert err.sqlstate == "22023"
        _preserves_the_server_report(err)
        # A refusal with a hint: privacy => 'none' is for data owners (42501), and an unknown
        # mechanism name is refused with the list of mechanisms.
        with pytest.raises(errors.InvalidParameter) as caught:
            analyst.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'nonsense', epsilon => 1)",
                (name,),
            )
        assert caught.value.diag.message_hint
        _preserves_the_server_report(caught.value)
        # Nothing was charged by the refusals.
        spent = [b["epsilon_spent"] for b in analyst.budgets() if b["dataset_id"] == ds]
        assert spent == [0]


def test_not_registered_and_no_such_model(owner_and_analyst, conn) -> None:
    _, analyst_of, table = owner_and_analyst
    with analyst_of() as analyst:
        with pytest.raises(errors.NotRegistered, match="among the datasets you can use") as caught:
            analyst.train(table, None, None, privacy=dpsql.BoltOn(epsilon=0.5), progress=False)
        assert isinstance(caught.value, errors.NotFound)
        assert isinstance(caught.value, psycopg.errors.UndefinedObject)
        _preserves_the_server_report(caught.value)
        row = conn.execute("SELECT coalesce(max(model_id), 0) + 1000 FROM dpsql.models")
        missing = int(row.fetchone()[0])
        # Python's lookup: still a LookupError, as before the error classes.
        with pytest.raises(errors.NoSuchModel, match=f"no model {missing}") as no_model:
            analyst.model(missing)
        assert isinstance(no_model.value, LookupError)
        assert no_model.value.sqlstate == "42704"
        # The server's lookup.
        with pytest.raises(errors.NoSuchModel, match=f"no model {missing}") as no_model:
            analyst.evaluate(missing, table)
        _preserves_the_server_report(no_model.value)


def test_a_non_private_run_needs_features_and_label(owner_and_analyst) -> None:
    owner_of, _, table = owner_and_analyst
    with owner_of() as owner:
        for features, label in ((None, "y"), (["a", "b"], None), (None, None)):
            with pytest.raises(errors.InvalidParameter, match="needs features and label"):
                owner.train(table, features, label, progress=False)


def test_other_errors_keep_psycopgs_class_and_psycopg_is_unchanged(server_uri) -> None:
    with dpsql.connect(server_uri) as db:
        with pytest.raises(psycopg.errors.DivisionByZero) as caught:
            db.execute("SELECT 1 / 0")
        assert not isinstance(caught.value, errors.DpsqlError)
    # Defining the classes registered nothing with psycopg: plain psycopg code is unaffected.
    assert psycopg.errors.lookup("42501") is psycopg.errors.InsufficientPrivilege
    assert psycopg.errors.lookup("22023") is psycopg.errors.InvalidParameterValue
    with psycopg.connect(server_uri, autocommit=True) as raw:
        with pytest.raises(psycopg.Error) as plain:
            raw.execute(
                "SELECT dpsql.train('no_such_dataset', NULL, NULL, privacy => 'bolton',"
                " epsilon => 1)"
            )
        assert type(plain.value) is psycopg.errors.UndefinedObject


def test_every_class_is_psycopgs_class_of_its_sqlstate() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        if not isinstance(cls, type) or cls in (errors.DpsqlError, errors.NothingReleased):
            continue  # the base, and the API's own (no SQLSTATE: nothing was raised)
        assert issubclass(cls, errors.DpsqlError) and issubclass(cls, psycopg.Error)
        assert cls.sqlstate is not None, name
        if not cls.sqlstate.startswith("DP"):  # dpsql's own codes: psycopg has no class
            assert issubclass(cls, psycopg.errors.lookup(cls.sqlstate)), name
        base = errors.NotFound if issubclass(cls, errors.NotFound) else cls
        assert errors.class_for_sqlstate(cls.sqlstate) is base
        assert getattr(dpsql, name) is cls  # exported at the top level too


def test_an_uncertified_minimiser_is_released_too(owner_and_analyst) -> None:
    """Objective perturbation that cannot certify its minimiser in newton_steps (a data owner's
    switch) releases its last iterate like a certified one (issue 24: whether it certified
    depends on the rows); the analyst may not set the cap."""
    owner_of, analyst_of, table = owner_and_analyst
    with owner_of() as owner, analyst_of() as analyst:
        ds, name = _register(owner, table, epsilon_budget=2.0)
        _grant(owner, ds, analyst)
        stuck = dpsql.ObjectivePerturbation(epsilon=0.5, options={"newton_steps": 1})
        # the cap is a data owner's test switch: an analyst's refusal would probe the data
        with pytest.raises(errors.PermissionDenied, match="newton_steps"):
            analyst.train(name, None, None, privacy=stuck, progress=False)
        old_name = dpsql.ObjectivePerturbation(epsilon=0.5, options={"max_scans": 1})
        with pytest.raises(errors.PermissionDenied, match="max_scans"):
            analyst.train(name, None, None, privacy=old_name, progress=False)
        stuck_model = owner.train(name, None, None, privacy=stuck, progress=False)
        assert "certified" not in stuck_model.row["params"]["privacy"]
        model = analyst.train(
            name, None, None, privacy=dpsql.ObjectivePerturbation(epsilon=0.5), progress=False
        )
        assert model.row["params"]["privacy"]["mechanism"] == "objective_perturbation"
        spent = [b["epsilon_spent"] for b in owner.budgets() if b["dataset_id"] == ds]
        assert spent == [pytest.approx(1.0)]


def test_python_passes_every_argument_and_the_server_refuses_the_unused(owner_and_analyst) -> None:
    """A private run's arguments reach the server, which refuses those the mechanism does not
    take (issue 15: none is dropped silently); nothing is charged."""
    owner_of, analyst_of, table = owner_and_analyst
    with owner_of() as owner, analyst_of() as analyst:
        ds, name = _register(owner, table, epsilon_budget=5.0)
        _grant(owner, ds, analyst)
        mechanism = dpsql.BoltOn(epsilon=0.5)
        refused: list[tuple[dict[str, Any], str]] = [
            ({"shuffle": False}, "shuffle"),
            ({"tolerance": 1e-3}, "tolerance"),
            ({"labels": [0, 1]}, "registration"),
            ({"row_norm": "unit"}, "registration"),
        ]
        for kw, message in refused:
            with pytest.raises(errors.InvalidParameter, match=message):
                analyst.train(name, None, None, privacy=mechanism, progress=False, **kw)
        with pytest.raises(errors.InvalidParameter, match="does not take epochs"):
            analyst.train(
                name, None, None, privacy=dpsql.ObjectivePerturbation(epsilon=0.5), epochs=3
            )
        spent = [b["epsilon_spent"] for b in owner.budgets() if b["dataset_id"] == ds]
        assert spent == [0.0]
