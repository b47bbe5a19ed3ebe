"""Session settings cannot change a release (issue 9, F1).

Plans and parameters travel as jsonb and text, whose number formats follow the session: with
extra_float_digits = -15 an analyst once ran the state with step 0.1414 while the sensitivity
was computed from 0.1 (and the noise scaled to it). Every mechanism is replayed here with the
same seeds under hostile settings; the released model and its record must be bit-identical.
The cases come from the mechanisms' specs (sql/mechanisms/*.toml: each task a mechanism does,
on the specs' small tables, at its [small_table]'s arguments and each of its [[variants]]), so a
new mechanism is replayed without an edit here.
"""

from __future__ import annotations

import uuid

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from dpsql import mechanism_spec
from tests.pg_helpers import load

# What a caller may set that changes a value's text form, its parsing or the plan's shape.
HOSTILE = {
    "extra_float_digits": "-15",
    "lc_numeric": "de_DE.UTF-8",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "bytea_output": "escape",
    "standard_conforming_strings": "off",
    "array_nulls": "off",
    "transform_null_equals": "on",
    "debug_parallel_query": "on",
    "TimeZone": "Pacific/Chatham",
}

# Every pinned setting and its value (sql/install/85_pinned_settings.sql).
PINNED = {
    "extra_float_digits": "3",
    "lc_numeric": "C",
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "bytea_output": "hex",
    "standard_conforming_strings": "on",
    "array_nulls": "on",
    "transform_null_equals": "off",
    "plpgsql.extra_errors": "none",
    "debug_parallel_query": "off",
}

# (No hand list: the cases come from the specs; test_every_mechanism_is_replayed_here checks
# them against the server's registry.)
CLASSIFIER_MODELS = ("logistic", "huber", "multinomial")
SPECS = mechanism_spec.load_specs()


def _cases(task: str) -> list[tuple[str, str, dict]]:
    """(mechanism, model, arguments) of every spec (sql/mechanisms/*.toml) for a task it does:
    at epsilon 1, its [small_table]'s arguments, then each of its [[variants]] over them (the
    paths its defaults do not take)."""
    wanted = CLASSIFIER_MODELS if task == "cls" else ("linear",)
    cases = []
    for name, spec in SPECS.items():
        model = next((m for m in spec.trained_models if m in wanted), None)
        if model is not None:
            base = {"epsilon": 1.0, **spec.small_table}
            cases += [(name, model, {**base, **v}) for v in ({}, *spec.variants)]
    return cases


# auto chooses among the mechanisms: with delta (Gaussian ones) and without
CLASSIFIERS = [
    *_cases("cls"),
    ("auto", "logistic", {"epsilon": 1.0, "delta": 1e-5}),
    ("auto", "logistic", {"epsilon": 1.0}),
]
REGRESSORS = _cases("reg")

# Fields of a model row that differ between two runs whatever the settings.
VOLATILE = {"model_id", "created_at", "prepare_seconds", "train_seconds"}


def _named(conn: psycopg.Connection, settings: dict[str, str]) -> dict[str, str]:
    """The settings under this server's names: PostgreSQL 15 calls debug_parallel_query
    force_parallel_mode."""
    if conn.info.server_version >= 160000:
        return settings
    return {
        "force_parallel_mode" if k == "debug_parallel_query" else k: v for k, v in settings.items()
    }


def _set_hostile(conn: psycopg.Connection) -> None:
    for name, value in _named(conn, HOSTILE).items():
        try:
            conn.execute(f"SET {name} = '{value}'")
        except psycopg.errors.InvalidParameterValue:
            conn.execute(f"RESET {name}")  # lc_numeric: that locale may not be installed


def _release(conn: psycopg.Connection, source: str, model: str, privacy: str, kw: dict) -> dict:
    # two epochs where the mechanism takes epochs (auto chooses its own)
    takes = conn.execute(
        "SELECT params FROM dpsql.mechanism_catalog WHERE name = %s", (privacy,)
    ).fetchone()
    epochs = {"epochs": 2} if takes and "epochs" in takes[0] else {}
    args = {"model": model, "privacy": privacy, **epochs, "seed": 11, "noise_seed": 5, **kw}
    args = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in args.items()}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    (mid,) = conn.execute(
        f"SELECT dpsql.train(%(source)s, NULL, NULL, {names})", {"source": source, **args}
    ).fetchone()
    # Binary results: exact floats, and times that the hostile DateStyle cannot garble.
    with conn.cursor(row_factory=dict_row, binary=True) as cur:
        row = cur.execute("SELECT * FROM dpsql.model_store WHERE model_id = %s", (mid,)).fetchone()
    row = {k: v for k, v in row.items() if k not in VOLATILE}
    row["params"]["privacy"].pop("ledger_entry", None)
    return row


def _replay(server_uri: str, source: str, model: str, privacy: str, kw: dict) -> None:
    with psycopg.connect(server_uri, autocommit=True) as calm:
        expected = _release(calm, source, model, privacy, kw)
    with psycopg.connect(server_uri, autocommit=True) as hostile:
        _set_hostile(hostile)
        got = _release(hostile, source, model, privacy, kw)
    # The float8 columns come back as exact binary values: any rounding inside shows here.
    assert got == expected, privacy


def _classification(conn, schema: str, rows: int, dim: int) -> str:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(rows, dim)) / 3
    y = np.where(X @ np.array([1.0, -0.7, 0.3, 0.1])[:dim] > 0, 1.0, -1.0)
    source = load(conn, schema, f"cls{rows}", X, y)
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1000,"
        " delta_budget => 0.5, name => %s)",
        (source, f"cls_{uuid.uuid4().hex[:8]}"),
    )
    return source


@pytest.fixture
def classification(conn, scratch_schema) -> str:
    """300 rows of 4 features (the red team's plan)."""
    return _classification(conn, scratch_schema, 300, 4)


@pytest.fixture
def small_classification(conn, scratch_schema) -> str:
    """The specs' small table (2,000 rows of 2 features: sql/mechanisms/*.toml, small_table)."""
    return _classification(conn, scratch_schema, 2000, 2)


@pytest.fixture
def small_regression(conn, scratch_schema) -> str:
    """The specs' small regression table (6,000 rows of 2 features, as test_durable_charge's:
    DP-AMBSSGD's DP-STAT needs them at epsilon 1), |y| <= 2 and ||x|| <= 2."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(6000, 2)) / 2
    y = X @ np.array([0.5, -0.25]) + 0.1 * rng.normal(size=6000)
    source = load(conn, scratch_schema, "reg", X, y)
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1000,"
        " delta_budget => 0.5, label_bound => 2, row_bound => 2, row_norm => 'clip',"
        " name => %s)",
        (source, f"reg_{uuid.uuid4().hex[:8]}"),
    )
    return source


def test_every_mechanism_is_replayed_here(conn) -> None:
    """Each mechanism of the server's registry has a case for each task it does (the cases come
    from the specs: a registry that has a mechanism the specs have not fails here)."""
    cases = {"cls": {n for n, _, _ in CLASSIFIERS}, "reg": {n for n, _, _ in REGRESSORS}}
    for name, models in conn.execute("SELECT name, models FROM dpsql.mechanisms()"):
        if set(models) & set(CLASSIFIER_MODELS):
            assert name in cases["cls"], name
        if "linear" in models:
            assert name in cases["reg"], name


def test_every_sql_function_pins_the_settings(conn) -> None:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}'), p.prosecdef"
        "  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace) AND"
        " l.lanname IN ('sql', 'plpgsql')"
    ).fetchall()
    assert len(rows) > 50
    for name, config, definer in rows:
        settings = dict(c.split("=", 1) for c in config)
        lowered = {k.lower(): v for k, v in settings.items()}
        for key, value in _named(conn, PINNED).items():
            assert lowered.get(key.lower()) == value, (name, key, settings)
        if definer:
            assert settings.get("search_path") == "pg_catalog, pg_temp", name


def _id(case: object) -> str:
    return str(case)


@pytest.mark.parametrize(("privacy", "model", "kw"), CLASSIFIERS, ids=_id)
def test_classifier_release_ignores_session_settings(
    server_uri, small_classification, privacy, model, kw
) -> None:
    _replay(server_uri, small_classification, model, privacy, kw)


@pytest.mark.parametrize(("privacy", "model", "kw"), REGRESSORS, ids=_id)
def test_regression_release_ignores_session_settings(
    server_uri, small_regression, privacy, model, kw
) -> None:
    _replay(server_uri, small_regression, model, privacy, kw)


def test_default_step_reaches_the_sensitivity_unrounded(server_uri, classification) -> None:
    """The red team's case: the default step 1/sqrt(m) under extra_float_digits = -15."""
    with psycopg.connect(server_uri, autocommit=True) as c:
        c.execute("SET extra_float_digits = -15")
        row = _release(
            c,
            classification,
            "logistic",
            "bolton",
            {
                "epsilon": 1.0,
                "batch_size": 1,
                "schedule": "constant",
                "step_size": 1 / np.sqrt(300),
            },
        )
    m = row["rows"]
    assert m == 300 and row["step_size"] == 1.0 / np.sqrt(m)
    # Algorithm 1, constant step, b = 1: sensitivity 2 k L eta.
    assert row["sensitivity"] == pytest.approx(2 * 2 * 1.0 / np.sqrt(m), rel=1e-12)


def test_analyst_settings_do_not_reach_the_plan(conn, classification, make_role) -> None:  # noqa: F811
    """As the red team ran it: an analyst (no noise seed) under hostile settings gets the plan
    (step, sensitivity, noise scale, charge) of a calm session."""
    analyst, connect = make_role("analyst", "dpsql_analyst")
    (ds,) = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE source = %s", (classification,)
    ).fetchone()
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
    plans = []
    for hostile in (False, True):
        with connect() as a:
            if hostile:
                _set_hostile(a)
            (mid,) = a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 5, batch_size => 1,"
                " schedule => 'constant', step_size => 1 / sqrt(300), privacy => 'bolton',"
                " epsilon => 1, seed => 7)",
                (classification,),
            ).fetchone()
            with a.cursor(binary=True) as cur:
                plans.append(
                    cur.execute(
                        "SELECT step_size, sensitivity, noise_scale, epsilon, rows"
                        " FROM dpsql.models WHERE model_id = %s",
                        (mid,),
                    ).fetchone()
                )
    assert plans[0] == plans[1]
    step, sensitivity, _, epsilon, rows = plans[1]
    assert step == 1 / np.sqrt(rows) and epsilon == 1.0
    assert sensitivity == pytest.approx(2 * 5 * step, rel=1e-12)  # 2 k L eta / b, L = 1
