"""Errors that help (issue 15): a bad parameter is reported as such before the budget is
checked, refusals carry no CONTEXT and no empty HINT, and a private model and its ledger
entry name the analyst who released it, at the time of the release."""

from __future__ import annotations

import uuid

import numpy as np
import psycopg
import pytest
from psycopg import errors as pg
from psycopg.types.json import Jsonb

from tests.pg_helpers import load


def _exhausted(conn, schema, regression: bool) -> str:
    """A dataset whose budget (epsilon 0.5, delta 1e-3) no release at epsilon 1 fits."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(12000 if regression else 3000, 3)) / 2
    y = X[:, 0] if regression else (X[:, 0] > 0).astype(float)
    source = load(conn, schema, f"t_{uuid.uuid4().hex[:6]}", X, y)
    extra = "label_bound => 2, row_bound => 2" if regression else "labels => '{0,1}'"
    conn.execute(
        f"SELECT dpsql.register_dataset(%s, '{{x}}', 'y', epsilon_budget => 0.5,"
        f" delta_budget => 1e-3, row_norm => 'clip', {extra})",
        (source,),
    )
    return source


def _bad_argument(params: list[str], options: list[str]) -> tuple[str, object]:
    """One argument the mechanism takes, with a value its checks refuse."""
    for name, value in [("step_size", -1.0), ("epochs", 0), ("steps", 0), ("lambda", -1.0)]:
        if name in params:
            return name, value
    for option in ["radius", "varrho", "l1_radius"]:
        if option in options:
            return "options", Jsonb({option: -1})
    raise AssertionError(f"no refusable argument among {params} {options}")


# Valid arguments where the defaults do not fit the rows.
_VALID = {
    "dp_ambssgd": {"steps": 2},
    "dp_ssgd": {"options": Jsonb({"baseline": True})},
    "frank_wolfe": {"options": Jsonb({"steps": 5})},  # its defaults refuse 3,000 rows
    # binary models at their default batches are refused (issue 42: they learn nothing)
    "dp_ftrl": {"batch_size": 128},
    "scs13": {"batch_size": 10},
}


def _train(conn, source, name, model, needs_delta, **kw):
    kw = {**_VALID.get(name, {}), **kw}
    names = ", ".join(f"{k} => %({k})s" for k in kw)
    delta = 1e-6 if needs_delta else 0
    return conn.execute(
        f"SELECT dpsql.train(%(s)s, NULL, NULL, %(m)s, privacy => %(p)s, epsilon => 1,"
        f" delta => %(d)s{', ' + names if names else ''})",
        {"s": source, "m": model, "p": name, "d": delta, **kw},
    )


def test_parameters_are_checked_before_the_budget(conn, scratch_schema) -> None:
    """Every mechanism: with valid arguments the exhausted dataset refuses the release
    (DP001); with one bad argument the error names the argument (22023), not the budget."""
    sources = {False: _exhausted(conn, scratch_schema, False)}
    sources[True] = _exhausted(conn, scratch_schema, True)
    mechanisms = conn.execute(
        "SELECT name, task, models, needs_delta, params, options FROM dpsql.mechanisms()"
    ).fetchall()
    assert len(mechanisms) >= 15
    for name, task, models, needs_delta, params, options in mechanisms:
        regression = task == "regression"
        model = "linear" if regression else "logistic"
        assert model in models, name
        with pytest.raises(psycopg.Error) as valid:
            _train(conn, sources[regression], name, model, needs_delta)
        assert valid.value.sqlstate == "DP001", (name, str(valid.value))
        arg, value = _bad_argument(params, options)
        with pytest.raises(pg.InvalidParameterValue) as bad:
            _train(conn, sources[regression], name, model, needs_delta, **{arg: value})
        assert "budget" not in str(bad.value), (name, arg, str(bad.value))
        assert bad.value.diag.context is None, (name, bad.value.diag.context)
        hint = bad.value.diag.message_hint
        assert hint is None or hint.strip(), name
    (spent,) = conn.execute(
        "SELECT sum(epsilon_spent) FROM dpsql.budgets b JOIN dpsql.datasets d USING (dataset_id)"
        " WHERE d.relid = ANY(%s::regclass[])",
        (list(sources.values()),),
    ).fetchone()
    assert spent == 0


def test_refusals_that_need_no_row_come_before_the_charge(conn, scratch_schema) -> None:
    """What the registration and the arguments alone refuse is refused before the charge, also
    when it is found by building the run's state or by private tuning's candidates: on an
    exhausted dataset the refusal is the argument's, not the budget's (DP001). Until the run's
    state was armed before the charge, these came after it."""
    source = _exhausted(conn, scratch_schema, False)  # 3000 rows
    tuning = "privacy => 'bolton', epsilon => 1, tuning_lambdas => '{0.1,0.2,0.3}'"
    cases = [
        # Algorithm 3: 3000 rows in 4 portions of 750, below one batch
        (f"{tuning}, batch_size => 800", "portions of at least one batch"),
        # Algorithm 3: the classic Gaussian needs epsilon < 1 per candidate
        (f"{tuning}, delta => 1e-6, gaussian => 'classic'", "classic Gaussian"),
    ]
    for args, message in cases:
        with pytest.raises(pg.InvalidParameterValue, match=message):
            conn.execute(f"SELECT dpsql.train(%s, NULL, NULL, {args})", (source,))
    # a model the core cannot hold: 2 (d + 1) outputs doubles over MaxAllocSize / 16
    wide = f"w_{uuid.uuid4().hex[:6]}"
    conn.execute(
        f"CREATE TABLE {wide} AS SELECT g AS id, array_fill(0::float8, ARRAY[33000]) AS x,"
        " (g % 1024)::float8 AS y FROM generate_series(1, 20) g"
    )
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 0.5,"
        " delta_budget => 1e-3, dim => 33000, row_norm => 'clip',"
        " labels => (SELECT array_agg(i::float8) FROM generate_series(0, 1023) i))",
        (wide,),
    )
    for args in [
        "privacy => 'dpsgd', delta => 1e-6, batch_size => 2, epochs => 1",
        "privacy => 'scs13', delta => 1e-6, batch_size => 2, epochs => 1",
        "privacy => 'bolton', tuning_lambdas => '{0.1,0.2}', batch_size => 2",
    ]:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(
                f"SELECT dpsql.train(%s, NULL, NULL, 'multinomial', epsilon => 1, {args})",
                (f"{scratch_schema}.{wide}",),
            )
        assert "invalid model shape" in str(refused.value), (args, str(refused.value))
    (spent,) = conn.execute(
        "SELECT count(*) FROM dpsql.ledger_entries e JOIN dpsql.datasets d USING (dataset_id)"
        " WHERE d.relid = ANY(%s::regclass[])",
        ([source, f"{scratch_schema}.{wide}"],),
    ).fetchone()
    assert spent == 0


def test_a_null_mechanism_is_refused_not_chosen(conn, scratch_schema) -> None:
    """privacy => NULL names no mechanism: refused as unknown before anything is charged (not
    taken for 'auto', which would choose one and charge it), by train and by preview."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 3)) / 2
    source = load(conn, scratch_schema, f"t_{uuid.uuid4().hex[:6]}", X, (X[:, 0] > 0) * 1.0)
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 10,"
        " delta_budget => 1e-3, row_norm => 'clip', labels => '{0,1}')",
        (source,),
    ).fetchone()
    with pytest.raises(pg.InvalidParameterValue, match="unknown privacy mechanism"):
        conn.execute("SELECT dpsql.train(%s, NULL, NULL, privacy => NULL, epsilon => 1)", (source,))
    (preview,) = conn.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => NULL, epsilon => 1)", (source,)
    ).fetchone()
    assert "unknown privacy mechanism" in preview["refused"]["message"]
    (entries,) = conn.execute(
        "SELECT count(*) FROM dpsql.ledger_entries WHERE dataset_id = %s", (ds,)
    ).fetchone()
    assert entries == 0


def test_refusals_have_no_context_and_no_empty_hint(conn, scratch_schema) -> None:
    source = _exhausted(conn, scratch_schema, False)
    refusals = [
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => -1)",
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'nonesuch', epsilon => 1)",
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, tolerance => 1)",
        # a RAISE of the registration (dpsql's module is loaded by now)
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1, labels => '{1}')",
    ]
    for query in refusals:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(query, (source,))
        diag = err.value.diag
        assert diag.message_primary.startswith("dpsql: "), query
        assert diag.context is None, (query, diag.context)
        assert diag.message_hint is None or diag.message_hint.strip(), query
    # Internal errors (SQLSTATE class XX) keep their context for the bug report.
    with pytest.raises(pg.InternalError) as internal:
        conn.execute("SELECT dpsql_internal._fail('x', 'XX000')")
    assert internal.value.diag.message_primary == "dpsql: x"
    with pytest.raises(pg.InvalidParameterValue, match="five digits or capitals"):
        conn.execute("SELECT dpsql_internal._fail('x', 'bad')")


def test_private_model_and_ledger_name_the_analyst(conn, scratch_schema, make_role) -> None:
    source = _exhausted(conn, scratch_schema, False)
    conn.execute(
        "UPDATE dpsql.datasets SET epsilon_budget = 10 WHERE relid = %s::regclass", (source,)
    )
    name, connect = make_role("analyst", "dpsql_analyst")
    (ds,) = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE relid = %s::regclass", (source,)
    ).fetchone()
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, name))
    with connect() as analyst:
        analyst.execute("BEGIN")
        (started,) = analyst.execute("SELECT now()").fetchone()
        analyst.execute("SELECT pg_sleep(0.05)")
        (mid,) = analyst.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (source,)
        ).fetchone()
        analyst.execute("COMMIT")
        (created_by,) = analyst.execute(
            "SELECT created_by FROM dpsql.models WHERE model_id = %s", (mid,)
        ).fetchone()
        role, charged_at = analyst.execute(
            "SELECT role, charged_at FROM dpsql.ledger WHERE model_id = %s", (mid,)
        ).fetchone()
    assert created_by == name and role == name
    # the release's clock time, not the transaction's start
    assert charged_at > started


def test_evaluate_says_it_needs_select_on_the_test_rows(conn, scratch_schema, make_role) -> None:
    source = _exhausted(conn, scratch_schema, False)
    conn.execute(
        "UPDATE dpsql.datasets SET epsilon_budget = 10 WHERE relid = %s::regclass", (source,)
    )
    test = f"{scratch_schema}.held_out"
    conn.execute(f"CREATE TABLE {test} AS SELECT * FROM {source} LIMIT 100")
    name, connect = make_role("analyst", "dpsql_analyst")
    conn.execute(
        "SELECT dpsql.grant_dataset(dataset_id, %s) FROM dpsql.datasets WHERE relid = %s::regclass",
        (name, source),
    )
    conn.execute(f"GRANT USAGE ON SCHEMA {scratch_schema} TO {name}")
    with connect() as analyst:
        (mid,) = analyst.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (source,)
        ).fetchone()
        with pytest.raises(pg.InsufficientPrivilege) as err:
            analyst.execute("SELECT metric, value, rows FROM dpsql.evaluate(%s, %s)", (mid, test))
        assert err.value.diag.message_primary.startswith("dpsql: evaluate reads the rows of")
        assert "GRANT SELECT" in err.value.diag.message_hint
        assert err.value.diag.context is None  # no internal SQL
        conn.execute(f"GRANT SELECT ON {test} TO {name}")
        metric, value, rows = analyst.execute(
            "SELECT metric, value, rows FROM dpsql.evaluate(%s, %s)", (mid, test)
        ).fetchone()
    assert metric == "accuracy" and rows == 100 and 0 <= value <= 1


def test_divergence_is_reported_as_such(conn, scratch_schema) -> None:
    """Features of mean 100 at the default step overflow the squared loss before any score is
    non-finite: that was reported as a malformed state; it is a divergence, with advice."""
    rng = np.random.default_rng(0)
    X = rng.normal(loc=100, size=(80, 2))
    source = load(conn, scratch_schema, "far", X, X[:, 0])
    with pytest.raises(pg.NumericValueOutOfRange, match="diverged") as err:
        conn.execute(
            "SELECT dpsql.train(%s, '{x}', 'y', 'linear', seed => 0, intercept => true)",
            (source,),
        )
    assert "step size" in str(err.value)
