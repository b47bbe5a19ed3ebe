"""The mechanism registry (sql/install/31_mechanisms.sql): dispatch, refusal hints, the
analysts' listing and the Python mechanism objects all come from one list."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg.types.json import Jsonb

import dpsql
from dpsql import mechanism_spec
from dpsql.privacy import MECHANISMS, mechanism_class
from tests.pg_helpers import load

REPO = Path(__file__).resolve().parents[2]
SIGNATURE = (
    "ds dpsql.datasets, model text, privacy text, params jsonb, epsilon double precision, "
    "delta double precision, noise_seed bigint"
)
# The plan-and-fit mechanisms' plan and fit functions, called by _train_planned (33_planned.sql).
PLAN_SIGNATURE = (
    "privacy text, ds dpsql.datasets, n bigint, d integer, epsilon double precision, "
    "delta double precision, params jsonb"
)
# (issue 45: the plan is the composite type its plan function returns, the fit takes it)
FIT_SIGNATURE = (
    "train_table text, plan {plan_type}, noise_seed bigint, OUT weights double precision[], "
    "OUT info jsonb, OUT iterates double precision[]"
)

# The container stage runs this module against the image (tests/container).
pytestmark = pytest.mark.smoke


def _catalog(conn) -> list[tuple]:
    return conn.execute(
        "SELECT name, train_function, task, sgd_defaults, needs_delta, docs"
        " FROM dpsql.mechanism_catalog ORDER BY name"
    ).fetchall()


def test_python_and_server_name_the_same_mechanisms(conn) -> None:
    names = {row[0] for row in conn.execute("SELECT name FROM dpsql.mechanisms()")}
    assert names == set(MECHANISMS)
    for name, cls in MECHANISMS.items():
        # (every generated class takes epsilon and delta; their base, the registry's type, does not)
        mechanism = cls(epsilon=1.0, delta=1e-6)  # type: ignore[call-arg]
        assert mechanism.sql_args()["privacy"] == name


def test_every_registered_train_function_has_the_common_signature(conn) -> None:
    for name, function, task, _, _, docs in _catalog(conn):
        (args, returns) = conn.execute(
            "SELECT pg_get_function_identity_arguments(p.oid), p.prorettype::regtype::text"
            " FROM pg_proc p"
            " WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace) AND"
            " p.proname = %s",
            (function,),
        ).fetchone()
        assert args == SIGNATURE, name
        # it plans (issue 45): the charge and the completion come from its plan
        assert returns == "dpsql_internal.release_plan", name
        assert task in ("classification", "regression", "any")
        page = (REPO / docs).read_text()
        assert re.search(rf"\b{name}\b", page), (name, docs)


def test_every_mechanism_says_when_it_is_recommended(conn) -> None:
    """Issue 25: dpsql.mechanisms() tells an analyst when to use each mechanism."""
    for name, recommended in conn.execute("SELECT name, recommended FROM dpsql.mechanisms()"):
        assert recommended and len(recommended) > 30, name


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


def _arguments(conn, function: str) -> str:
    (args,) = conn.execute(
        "SELECT pg_get_function_arguments(p.oid) FROM pg_proc p"
        " WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace) AND"
        " p.proname = %s",
        (function,),
    ).fetchone()
    return args


def test_plan_and_fit_mechanisms_register_a_plan_and_a_fit(conn) -> None:
    """Linear regression (_train_linear: its checks, then _train_planned) and the private-ERM
    toolbox (task 'any', _train_planned directly: 33_planned.sql)."""
    rows = conn.execute(
        "SELECT name, task, train_function, options, plan_function, fit_function"
        " FROM dpsql.mechanism_catalog ORDER BY name"
    ).fetchall()
    for name, task, train, options, plan, fit in rows:
        if task != "classification":
            expected = "_train_linear" if task == "regression" else "_train_planned"
            assert train == expected, name
            assert _arguments(conn, plan) == PLAN_SIGNATURE, name
            (plan_type,) = conn.execute(
                "SELECT p.prorettype::regtype::text FROM pg_proc p"
                " WHERE p.pronamespace = 'dpsql_internal'::regnamespace AND p.proname = %s",
                (plan,),
            ).fetchone()
            assert plan_type.startswith("dpsql_internal.") and plan_type.endswith("_plan"), name
            assert _arguments(conn, fit) == FIT_SIGNATURE.format(plan_type=plan_type), name
        else:
            assert (options, plan, fit) == ([], None, None), name


def test_the_registered_options_are_what_the_plans_accept(conn) -> None:
    """An unknown option is refused with the registered list as the hint; every registered one
    passes the check (JSON null: the default)."""
    rows = conn.execute(
        "SELECT name, options FROM dpsql.mechanism_catalog WHERE task <> 'classification'"
    ).fetchall()
    plan = "SELECT dpsql_internal._linear_plan(%s, NULL, 100000, 3, 1, 1e-6, %s)"
    for name, options in rows:
        assert options, name
        with pytest.raises(psycopg.Error, match=f"unknown options for {name}: bogus") as err:
            conn.execute(plan, (name, Jsonb({"options": {"bogus": 1}})))
        assert err.value.diag.message_hint == "Known: " + ", ".join(options) + "."
        try:
            conn.execute(plan, (name, Jsonb({"options": dict.fromkeys(options)})))
        except psycopg.Error as refusal:  # without a registered dataset: no bound on ||x||
            assert "unknown options" not in str(refusal), name


def test_every_registered_parameter_is_a_train_parameter(conn) -> None:
    """The registry's params name dpsql.train arguments that _given_params reports (not the
    registration's labels and row_norm)."""
    arguments = {a.name: a for a in mechanism_spec.load_arguments()}
    for name, params, options in conn.execute(
        "SELECT name, params, options FROM dpsql.mechanism_catalog"
    ).fetchall():
        for p in params:
            assert p in arguments and arguments[p].given, (name, p)
            assert p not in {"labels", "row_norm"}, name
        assert ("options" in params) == bool(options), name


@pytest.mark.parametrize(
    ("privacy", "model", "kw", "message"),
    [
        ("adassp", "linear", {"epochs": 3}, "adassp does not take epochs"),
        (
            "dpgd",
            "linear",
            {"lambda": 0.1, "batch_size": 5},
            "dpgd does not take batch_size, lambda",
        ),
        ("bolton", "logistic", {"clip_norm": 1.0}, "bolton does not take clip_norm"),
        ("scs13", "logistic", {"tuning_lambdas": [0.1]}, "scs13 does not take tuning_lambdas"),
        ("dpsgd", "logistic", {"permutation": "fresh"}, "dpsgd does not take permutation"),
        ("frank_wolfe", "logistic", {"huber_h": 0.3}, "frank_wolfe does not take huber_h"),
        ("bolton", "logistic", {"labels": [0, 1]}, "the registration"),
        ("bolton", "logistic", {"row_norm": "unit"}, "the registration"),
    ],
)
def test_a_parameter_the_mechanism_does_not_take_is_refused(
    conn, scratch_schema, privacy, model, kw, message
) -> None:
    """Given away from its default and not in the mechanism's registered params: refused with
    what it takes, before anything is charged (rather than silently ignored)."""
    import numpy as np

    from tests.pg_helpers import register

    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 2))
    if model == "linear":
        _, source = register(conn, scratch_schema, X, X[:, 0], label_bound=3.0, row_bound=3.0)
    else:
        _, source = register(conn, scratch_schema, X, (X[:, 0] > 0).astype(float), labels=[0, 1])
    ledger = conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()
    args = {"privacy": privacy, "epsilon": 1.0, "delta": 1e-6, **kw}
    args = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in args.items()}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    with pytest.raises(psycopg.Error, match=message) as err:
        conn.execute(
            f"SELECT dpsql.train(%(s)s, NULL, NULL, %(m)s, {names})",
            {"s": source, "m": model, **args},
        )
    assert err.value.diag.message_hint
    assert conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone() == ledger


@pytest.mark.parametrize(
    ("privacy", "model", "kw"),
    [
        ("objective_perturbation", "logistic", {}),
        ("output_perturbation", "logistic", {"delta": 1e-6}),
        ("dp_ftrl", "logistic", {"delta": 1e-6, "batch_size": 50}),  # (issue 42: few steps)
        ("frank_wolfe", "logistic", {"options": {"steps": 5}}),
        ("exponential_mechanism", "logistic", {"options": {"grid_points": 64}}),
    ],
)
def test_an_analyst_trains_the_erm_toolbox_and_sees_only_the_release(
    conn, scratch_schema, make_role, privacy, model, kw
) -> None:
    """As an analyst granted the dataset: the release is charged to the ledger under the
    analyst's name, the analyst sees the released model, and nothing of the run (runs, training
    tables, internal functions such as the noiseless solver)."""
    import numpy as np

    from tests.pg_helpers import register

    rng = np.random.default_rng(5)
    X = rng.normal(size=(400, 2)) / 2
    ds, source = register(conn, scratch_schema, X, (X[:, 0] > 0).astype(float), labels=[0, 1])
    name, connect = make_role("erm", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, name))
    (dataset,) = conn.execute(
        "SELECT name FROM dpsql.datasets WHERE dataset_id = %s", (ds,)
    ).fetchone()
    args = {"privacy": privacy, "epsilon": 1.0, **kw}
    args = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in args.items()}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    with connect() as analyst:
        (mid,) = analyst.execute(
            f"SELECT dpsql.train(%(s)s, NULL, NULL, %(m)s, {names})",
            {"s": dataset, "m": model, **args},
        ).fetchone()
        (seen,) = analyst.execute(
            "SELECT count(*) FROM dpsql.models WHERE model_id = %s", (mid,)
        ).fetchone()
        assert seen == 1
        for forbidden in (
            "SELECT * FROM dpsql.runs",
            "SELECT * FROM dpsql.model_store",
            "SELECT dpsql_internal._erm_tolerance(1, 1)",
            "SELECT * FROM dpsql_internal._glm_constants(1, 0, 1, 1, false, 2)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                analyst.execute(forbidden)
    (who, mech) = conn.execute(
        "SELECT role, mechanism FROM dpsql.ledger WHERE model_id = %s", (mid,)
    ).fetchone()
    assert (who, mech) == (name, privacy)


def _record(conn, model_id: int) -> tuple[Any, ...]:
    """What a release records about its privacy, less the ledger entry's id."""
    (row,) = conn.execute(
        "SELECT jsonb_build_array((params->'privacy')::jsonb - 'ledger_entry'::text, epochs_run,"
        " batch_size, step_size, fit_intercept, weights) FROM dpsql.model_store"
        " WHERE model_id = %s",
        (model_id,),
    ).fetchall()
    return tuple(row)


def test_python_and_sql_release_the_same_model(conn, scratch_schema, server_uri) -> None:
    """Issue 26 (drift), over the specs: every mechanism's Python class with only epsilon and a
    noise seed asks the server for exactly what SQL's dpsql.train does with the same two, for
    every model its spec lists (and auto): the recorded privacy parameters, the filled-in
    defaults (delta too) and the weights are identical (the noise is seeded, so both draws
    are the same), or both are refused with the same message."""
    rng = np.random.default_rng(26)
    X = rng.uniform(-1, 1, size=(2000, 3))
    registrations = {
        "binary": (
            (X[:, 0] > 0).astype(float),
            "labels => '{0,1}', row_norm => 'clip', delta_budget => 0.9",
        ),
        "multiclass": (
            np.digitize(X[:, 0], [-0.3, 0.3]).astype(float),
            "labels => '{0,1,2}', row_norm => 'clip', delta_budget => 0.9",
        ),
        "regression": (
            X @ np.array([1.0, -0.5, 0.25]) + 1,
            "label_bound => 3, feature_bounds => '{{-1,1},{-1,1},{-1,1}}', delta_budget => 0.9",
        ),
        # no delta budget: auto falls back to pure epsilon-DP, the others' defaults are refused
        "binary_pure": ((X[:, 0] > 0).astype(float), "labels => '{0,1}', row_norm => 'clip'"),
    }
    names = {}
    for kind, (y, extra) in registrations.items():
        source = load(conn, scratch_schema, kind, X, y)
        names[kind] = f"drift_{kind}_{scratch_schema}"
        conn.execute(
            f"SELECT dpsql.register_dataset(%s, '{{x}}', 'y', 1e9, name => %s, {extra})",
            (source, names[kind]),
        )
    dataset_of = {
        "logistic": ["binary", "binary_pure"],
        "huber": ["binary"],
        "multinomial": ["multiclass"],
        "linear": ["regression"],
        "lasso": ["regression"],
    }
    specs = mechanism_spec.load_specs()
    cases = [
        (name, model, kind)
        for name, spec in specs.items()
        for model in spec.trained_models
        for kind in dataset_of[model]
    ]
    cases += [
        ("auto", model, kind) for model in ("logistic", "linear") for kind in dataset_of[model]
    ]
    released = 0
    with dpsql.connect(server_uri) as db:
        for name, model, kind in cases:
            sql_error = py_error = None
            # issue 27: the preview says what the release then does, charging nothing
            (preview,) = conn.execute(
                "SELECT dpsql.preview(%s, NULL, NULL, %s, privacy => %s, epsilon => 1,"
                " noise_seed => 7, seed => 3)",
                (names[kind], model, name),
            ).fetchone()
            try:
                (sql_id,) = conn.execute(
                    "SELECT dpsql.train(%s, NULL, NULL, %s, privacy => %s, epsilon => 1,"
                    " noise_seed => 7, seed => 3)",
                    (names[kind], model, name),
                ).fetchone()
            except psycopg.Error as err:
                sql_error = err.diag.message_primary
            try:
                py = db.train(
                    names[kind],
                    None,
                    None,
                    model,
                    seed=3,
                    progress=False,
                    privacy=mechanism_class(name)(epsilon=1.0, noise_seed=7),
                )
            except psycopg.Error as err:
                py_error = err.diag.message_primary
            assert sql_error == py_error, (name, model, kind, sql_error, py_error)
            refused = preview.get("refused", {}).get("message")
            assert refused == sql_error, (name, model, kind, preview, sql_error)
            if sql_error is None:
                row = conn.execute(
                    "SELECT privacy, epsilon, delta FROM dpsql.models WHERE model_id = %s",
                    (sql_id,),
                ).fetchone()
                assert row == (preview["mechanism"], preview["epsilon"], preview["delta"]), (
                    name,
                    model,
                    kind,
                    preview,
                )
                assert _record(conn, py.model_id) == _record(conn, sql_id), (name, model, kind)
                released += 1
    # most cases release (a refusal on both sides would also agree): the comparison has teeth
    # (since issue 42 SCS13's and DP-FTRL's binary defaults refuse: 36 of 51 release, at 2,000
    # rows as at 20,000)
    assert released >= 0.65 * len(cases), (released, len(cases))


def test_the_registry_is_the_specs(conn) -> None:
    """What the server registered (dpsql.mechanisms()) is each spec's registry row, and the
    parameters' SQL types and defaults are dpsql.train's signature."""
    specs = mechanism_spec.load_specs()
    rows = {
        r[0]: r[1:]
        for r in conn.execute(
            "SELECT name, task, needs_delta, params, options, distributed, delta_default,"
            " parameters FROM dpsql.mechanisms()"
        )
    }
    assert set(rows) == set(specs)
    for name, spec in specs.items():
        row = spec.registry_json()
        assert rows[name] == (
            row["task"],
            row["needs_delta"],
            row["params"],
            row["options"],
            row["distributed"],
            row["delta_default"],
            row["parameters"],
        ), name
    parameters = mechanism_spec.load_parameters()
    (huber_h,) = conn.execute("SELECT dpsql_internal._huber_h('{}')").fetchone()
    assert huber_h == parameters["huber_h"]["sql_default"]  # the SQL helpers' one default


def _signature(conn, function: str) -> list[tuple[str, str, str | None]]:
    """A function's arguments as the server shows them: (name, type, default or None)."""
    (text,) = conn.execute("SELECT pg_get_function_arguments(%s::regproc)", (function,)).fetchone()
    out = []
    for arg in text.split(", "):
        head, _, default = arg.partition(" DEFAULT ")
        name, sql_type = head.split(" ", 1)
        out.append((name, sql_type, default or None))
    return out


@pytest.mark.parametrize("function", ["dpsql.train", "dpsql.preview"])
def test_the_signatures_are_parameters_toml(conn, function) -> None:
    """dpsql.train's and dpsql.preview's arguments, in order, with parameters.toml's types and
    defaults (they are generated from it: this holds the installed server to the file)."""
    types = {
        "float8": "double precision",
        "int": "integer",
        "float8[]": "double precision[]",
        "int[]": "integer[]",
    }
    preview = function == "dpsql.preview"
    arguments = [a for a in mechanism_spec.load_arguments() if a.preview or not preview]
    signature = _signature(conn, function)
    assert [s[0] for s in signature] == [a.name for a in arguments]
    for a, (name, sql_type, default) in zip(arguments, signature, strict=True):
        assert types.get(a.sql, a.sql) == sql_type, name
        expected = a.preview_default if preview and a.preview_default else a.sql_default
        if a.required:
            assert default is None, name
        elif expected is None:
            assert default.split("::")[0] == "NULL", name
        elif isinstance(expected, bool):
            assert default == str(expected).lower(), name
        elif isinstance(expected, str):
            assert default == f"'{expected}'::text", name
        else:
            assert float(default.split("::")[0]) == expected, name


def test_given_params_reports_each_argument_set_away_from_its_default(conn) -> None:
    """_given_params (generated from parameters.toml) names every argument marked given when
    it is set away from its default, and none at the defaults."""
    given = [a for a in mechanism_spec.load_arguments() if a.given]
    parameters = mechanism_spec.load_parameters()
    values: dict[str, Any] = {}
    for a in given:
        choices = [c for c in parameters.get(a.name, {}).get("choices", []) if c != a.sql_default]
        if a.sql == "boolean":
            values[a.name] = not a.sql_default
        elif a.sql == "text":
            values[a.name] = choices[0] if choices else "x"
        elif a.sql == "jsonb":
            values[a.name] = {}
        elif a.sql.endswith("[]"):
            values[a.name] = [1]
        else:
            values[a.name] = (a.sql_default or 0) + 1
    (names,) = conn.execute("SELECT dpsql_internal._given_params(%s)", (Jsonb(values),)).fetchone()
    assert sorted(names) == sorted(values)
    defaults = {a.name: a.sql_default for a in given}
    (none,) = conn.execute("SELECT dpsql_internal._given_params(%s)", (Jsonb(defaults),)).fetchone()
    assert none == []
