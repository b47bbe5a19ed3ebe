"""dpsql.estimators: scikit-learn estimators that train in the server (real server, real roles)."""

from __future__ import annotations

import pickle
import uuid

import numpy as np
import pytest
from psycopg import sql
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import (
    check_dataframe_column_names_consistency,
    check_estimator,
    check_n_features_in_after_fitting,
)

import dpsql
from dpsql.estimators import LinearRegression, LogisticRegression, MultinomialLogisticRegression


@pytest.fixture
def binary():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(600, 3)) * 0.4
    y = (X @ [2.0, -1.0, 1.0] > 0).astype(float)
    return X, y


@pytest.fixture
def db(server_uri):
    with dpsql.connect(server_uri) as database:
        yield database


def _register(db, schema: str, X, y, **kw) -> str:
    """Load (X, y) into a new table of schema and register it; the dataset's name."""
    name = f"est_{uuid.uuid4().hex[:8]}"
    db.load_numpy(name, X, y, schema=schema)
    db.register_dataset(f"{schema}.{name}", "x", "y", name=name, **kw)
    return name


def _spent(db, name: str) -> float:
    row = db.execute("SELECT epsilon_spent FROM dpsql.my_datasets WHERE name = %s", (name,))
    return float(row.fetchone()[0])


def test_private_fit_on_a_registered_dataset(db, scratch_schema, binary) -> None:
    X, y = binary
    name = _register(db, scratch_schema, X, y, epsilon_budget=10, labels=[0, 1], row_norm="clip")
    clf = LogisticRegression(db=db, privacy=dpsql.BoltOn(epsilon=4), epochs=5, seed=1)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    assert clf.fit(name) is clf
    assert isinstance(clf.model_, dpsql.Model) and clf.model_.row["privacy"] == "bolton"
    assert clf.dataset_ == name and _spent(db, name) == pytest.approx(4)
    assert clf.coef_.shape == (3,) and clf.intercept_.shape == (1,)
    assert clf.classes_.tolist() == [0.0, 1.0] and clf.n_features_in_ == 3
    pred = clf.predict(X)
    np.testing.assert_array_equal(pred, clf.model_.predict(X))
    assert clf.score(X, y) == pytest.approx(np.mean(pred == y))
    assert clf.score(X, y) > 0.7
    # The server's accuracy of the same model over the same rows.
    served = db.evaluate(clf.model_, f"{scratch_schema}.{name}")["accuracy"]
    assert served == pytest.approx(clf.score(X, y))
    proba = clf.predict_proba(X[:5])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(clf.decision_function(X[:5]) > 0, pred[:5] == 1)
    with pytest.raises(ValueError, match="X has 2 features"):
        clf.predict(X[:, :2])
    with pytest.raises(ValueError, match="takes no y"):
        clf.fit(name, y)
    with pytest.raises(ValueError, match="registered dataset's name is"):
        clf.set_params(privacy="none").fit(name)
    with pytest.raises(ValueError, match="pass a mechanism object"):
        LogisticRegression(db=db).fit(name)


def test_private_regression_and_multinomial(db, scratch_schema) -> None:
    rng = np.random.default_rng(6)
    X = rng.normal(size=(800, 2)) * 0.4
    y = np.clip(X @ [1.0, -0.5] + 0.05 * rng.normal(size=800), -1, 1)
    name = _register(
        db,
        scratch_schema,
        X,
        y,
        epsilon_budget=10,
        delta_budget=1e-3,
        label_bound=1.0,
        row_norm="clip",
    )
    reg = LinearRegression(db=db, privacy=dpsql.Auto(epsilon=5, delta=1e-5)).fit(name)
    assert reg.model_.model == "linear" and not hasattr(reg, "classes_")
    assert reg.score(X, y) > 0.5  # R², from the C core's predictions
    assert not hasattr(reg, "decision_function")  # a regressor (sklearn's convention)

    y3 = np.digitize(X[:, 0], [-0.15, 0.15]).astype(float)
    name3 = _register(
        db, scratch_schema, X, y3, epsilon_budget=10, labels=[0, 1, 2], row_norm="clip"
    )
    multi = MultinomialLogisticRegression(db=db, privacy=dpsql.BoltOn(epsilon=5), seed=2)
    multi.fit(name3)
    assert multi.coef_.shape == (3, 2) and multi.classes_.tolist() == [0.0, 1.0, 2.0]
    assert set(np.unique(multi.predict(X))) <= {0.0, 1.0, 2.0}
    assert multi.score(X, y3) > 0.5
    # softmax of the released scores: their argmax is the C core's class
    proba = multi.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(multi.classes_[proba.argmax(axis=1)], multi.predict(X))
    assert multi.decision_function(X).shape == (len(X), 3)


def test_params_clone_and_pickle(db, scratch_schema, binary) -> None:
    X, y = binary
    clf = LogisticRegression(db=db, privacy=dpsql.BoltOn(epsilon=1), epochs=3, lambda_=0.01)
    params = clf.get_params()
    assert params["db"] is db and params["privacy"] == dpsql.BoltOn(epsilon=1)
    for key in (
        "epochs",
        "batch_size",
        "lambda_",
        "step_size",
        "schedule",
        "radius",
        "seed",
        "intercept",
        "huber_h",
        "step_offset",
        "parallel_workers",
        "progress",
    ):
        assert key in params
    twin = clone(clf)
    assert twin is not clf and twin.db is db  # the connection is shared, not copied
    assert twin.get_params() == params
    twin.set_params(epochs=7, privacy="none", table_schema=scratch_schema)
    assert twin.epochs == 7 and clf.epochs == 3
    twin.fit(X, y)
    assert not hasattr(clone(twin), "model_")
    # A fitted estimator pickles with its model, without its connection.
    back = pickle.loads(pickle.dumps(twin))
    assert back.db is None
    np.testing.assert_array_equal(back.predict(X), twin.predict(X))
    np.testing.assert_array_equal(back.predict_proba(X), twin.predict_proba(X))


def test_pipeline(db, scratch_schema, binary) -> None:
    X, y = binary
    half = FunctionTransformer(lambda rows: rows / 2)
    pipe = Pipeline(
        [
            ("half", half),
            ("clf", LogisticRegression(db, "none", epochs=3, seed=1, table_schema=scratch_schema)),
        ]
    )
    pipe.fit(X, y)  # a data owner's non-private fit on arrays
    assert pipe.score(X, y) > 0.9
    np.testing.assert_array_equal(pipe.predict(X), pipe[-1].predict(X / 2))
    # A privately fitted estimator as the last step, for prediction only.
    name = _register(db, scratch_schema, X / 2, y, epsilon_budget=5, labels=[0, 1])
    private = LogisticRegression(db, dpsql.BoltOn(epsilon=5), seed=1).fit(name)
    served = make_pipeline(FunctionTransformer(lambda rows: rows / 2), private)
    np.testing.assert_array_equal(served.predict(X), private.predict(X / 2))


def test_owner_fit_on_arrays(db, scratch_schema, binary) -> None:
    X, y = binary
    labels = np.where(y == 1, "yes", "no")
    clf = LogisticRegression(db, "none", epochs=3, seed=1, table_schema=scratch_schema)
    clf.fit(X, labels)
    assert clf.classes_.tolist() == ["no", "yes"] and clf.score(X, labels) > 0.9
    assert clf.model_.row["privacy"] == "none" and len(clf.model_.loss_history_) == 3
    # The rows' copy is dropped after a non-private fit.
    assert _tables(db, scratch_schema) == []

    budgets = {r["name"]: r["epsilon_spent"] for r in db.budgets()}
    private = LogisticRegression(
        db,
        dpsql.BoltOn(epsilon=0.5),
        classes=["no", "yes"],
        row_norm="clip",
        epochs=2,
        table_schema=scratch_schema,
    ).fit(X, labels)
    # A new dataset, budgeted for this one fit: its budget is spent, no other dataset's.
    row = db.execute(
        "SELECT epsilon_budget, epsilon_spent, labels FROM dpsql.my_datasets WHERE name = %s",
        (private.dataset_,),
    ).fetchone()
    assert row == (0.5, 0.5, [0.0, 1.0])
    after = {r["name"]: r["epsilon_spent"] for r in db.budgets()}
    assert {k: after[k] for k in budgets} == budgets
    assert set(private.predict(X)) <= {"no", "yes"}
    # The rows are not kept (the dataset and its ledger are); fitting the same rows again is
    # charged to the same, spent budget (issue 27).
    (table,) = _tables(db, scratch_schema)
    assert db.execute(f"SELECT count(*) FROM {scratch_schema}.{table}").fetchone()[0] == 0
    with pytest.raises(dpsql.BudgetExceeded):
        clone(private).fit(X, labels)
    # Public declarations only: never read from the rows.
    with pytest.raises(ValueError, match="classes=\\[...\\], the public label set"):
        LogisticRegression(db, dpsql.BoltOn(epsilon=1), table_schema=scratch_schema).fit(X, y)
    with pytest.raises(ValueError, match="label_bound"):
        LinearRegression(db, dpsql.Auto(epsilon=1), table_schema=scratch_schema).fit(X, y)


def _tables(db, schema: str) -> list[str]:
    rows = db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'dpsql_fit_%%'",
        (schema,),
    ).fetchall()
    return [r[0] for r in rows]


def test_analyst_non_private_fit_is_refused_by_the_server(
    db, conn, scratch_schema, make_role, binary
) -> None:
    X, y = binary
    analyst, connect = make_role("analyst", "dpsql_analyst")
    # Enough to load rows (so that the refusal is the training's, not the schema's).
    conn.execute(
        sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(
            sql.Identifier(scratch_schema), sql.Identifier(analyst)
        )
    )
    name = _register(db, scratch_schema, X, y, epsilon_budget=5, labels=[0, 1])
    (ds,) = db.execute("SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name,)).fetchone()
    db.grant_dataset(ds, analyst)
    with connect() as raw, dpsql.connect(raw) as adb:
        clf = LogisticRegression(adb, "none", epochs=2, table_schema=scratch_schema)
        with pytest.raises(dpsql.PermissionDenied, match="for data owners"):
            clf.fit(X, y)
        assert _tables(adb, scratch_schema) == []
        # The same estimator, private, on the granted dataset.
        clf.set_params(privacy=dpsql.BoltOn(epsilon=2), seed=3).fit(name)
        assert clf.model_.row["privacy"] == "bolton" and clf.score(X, y) > 0.6


# With db= a Database (not a DSN), these two checks copy.deepcopy the parameters (and
# joblib.hash them): a live psycopg connection can be neither; dpsql.Database would have to
# deep-copy as itself and hash as its DSN (dpsql/connection.py). A DSN passes both.
_CONNECTION_XFAIL = {
    "check_estimators_overwrite_params": "a live connection (db=Database) cannot be hashed",
    "check_set_params": "a live connection (db=Database) cannot be deep-copied",
}


@pytest.mark.parametrize(
    "cls", [LogisticRegression, MultinomialLogisticRegression, LinearRegression]
)
def test_sklearn_check_estimator(server_uri, scratch_schema, cls, monkeypatch) -> None:
    """scikit-learn's check_estimator in full: every check runs and passes, none expected to
    fail, none skipped; each fit a real non-private training in the server. (Issue 42: on
    59df5fe LinearRegression failed six checks, three of them by diverging on features of
    mean 100.)"""
    # the array API check with NumPy inputs runs only with this set (scikit-learn's switch)
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    est = cls(db=server_uri, privacy="none", seed=0, intercept=True, table_schema=scratch_schema)
    results = check_estimator(est, on_fail=None, on_skip=None)
    status = {r["check_name"]: r["status"] for r in results}
    assert {c: s for c, s in status.items() if s != "passed"} == {}
    named = (
        ["check_regressor_data_not_an_array", "check_regressors_int"]
        if cls is LinearRegression
        else ["check_classifier_data_not_an_array"]
    )
    for check in [
        *named,
        "check_supervised_y_2d",
        "check_fit_idempotent",
        "check_fit_check_is_fitted",
        "check_n_features_in",
        "check_array_api_input",
    ]:
        assert status[check] == "passed"
    assert len(results) >= 50  # (some checks run more than once)
    # scikit-learn's checks of its own estimators that check_estimator does not run: the
    # feature names and their number after fitting (predict takes what fit took)
    check_dataframe_column_names_consistency(cls.__name__, est)
    check_n_features_in_after_fitting(cls.__name__, est)


def test_check_estimator_with_a_database_object(db, scratch_schema) -> None:
    est = LogisticRegression(
        db=db, privacy="none", seed=0, intercept=True, table_schema=scratch_schema
    )
    results = check_estimator(
        est, expected_failed_checks=_CONNECTION_XFAIL, on_fail=None, on_skip=None
    )
    status = {r["check_name"]: r["status"] for r in results}
    assert [c for c, s in status.items() if s == "failed"] == []
    assert {c for c, s in status.items() if s == "xfail"} == set(_CONNECTION_XFAIL)


def test_cross_validation_charges_one_dataset_and_keeps_no_rows(db, scratch_schema, binary) -> None:
    """Issue 27: the folds of cross_val_score fit overlapping rows: one registered dataset,
    one budget (each fold's release charged to it), no table of rows left behind; an analyst's
    fit(X, y) is told to fit a registered dataset by name. (Unseeded bolt-on noise: at epsilon
    0.5 a fold once scored 0.495 in a run of the suite; at 2, 120 folds scored 0.775 at the
    least.)"""
    from sklearn.model_selection import cross_val_score

    X, y = binary
    before = {r["name"] for r in db.budgets()}
    clf = LogisticRegression(
        db, dpsql.BoltOn(epsilon=2.0), classes=[0.0, 1.0], row_norm="clip", epochs=2,
        epsilon_budget=6.0, table_schema=scratch_schema,
    )  # fmt: skip
    scores = cross_val_score(clf, X, y, cv=3)
    assert len(scores) == 3 and np.all(scores > 0.5)
    # two folds train on disjoint rows: the clones' group still makes them one dataset
    X2 = np.random.default_rng(9).normal(size=(400, 3)) * 0.4
    y2 = (X2 @ [2.0, -1.0, 1.0] > 0).astype(float)
    two = LogisticRegression(
        db, dpsql.BoltOn(epsilon=0.5), classes=[0.0, 1.0], row_norm="clip", epochs=2,
        epsilon_budget=1.0, table_schema=scratch_schema,
    )  # fmt: skip
    assert len(cross_val_score(two, X2, y2, cv=2)) == 2
    new = sorted(
        (r for r in db.budgets() if r["name"] not in before), key=lambda r: r["dataset_id"]
    )
    assert [(r["epsilon_budget"], r["epsilon_spent"]) for r in new] == [(6.0, 6.0), (1.0, 1.0)]
    table, _ = _tables(db, scratch_schema)
    assert db.execute(f"SELECT count(*) FROM {scratch_schema}.{table}").fetchone()[0] == 0
    with pytest.raises(dpsql.BudgetExceeded):  # a fourth fold would overspend
        clone(clf).fit(X[:100], y[:100])
    # other declarations for the same rows: refused, not a second budget
    with pytest.raises(ValueError, match="other public declarations"):
        LogisticRegression(
            db, dpsql.BoltOn(epsilon=0.5), classes=[0.0, 1.0], row_norm="unit",
            table_schema=scratch_schema,
        ).fit(X, y)  # fmt: skip


_OTHER_PROCESS_FIT = """
import sys
import numpy as np
import dpsql
from dpsql.estimators import LogisticRegression

uri, schema = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(5)
X = rng.normal(size=(600, 3)) * 0.4
y = (X @ [2.0, -1.0, 1.0] > 0).astype(float)
with dpsql.connect(uri) as db:
    clf = LogisticRegression(db, dpsql.BoltOn(epsilon=0.5), classes=[0.0, 1.0], row_norm="clip",
                             epsilon_budget=1.0, table_schema=schema).fit(X, y)
    print(clf.dataset_)
"""


def test_the_same_rows_are_one_budget_across_processes(db, server_uri, scratch_schema, binary):
    """Issue 41, route 9: a fit in another process, then a new estimator here on rows it shares
    with that fit: one dataset, one budget (on 59df5fe each process registered its own)."""
    import subprocess
    import sys

    X, y = binary
    other = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS_FIT, server_uri, scratch_schema],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    first = other.stdout.strip().splitlines()[-1]
    # (issue 42: the budget asked for does not apply, and the owner is told so)
    with pytest.warns(UserWarning, match="does not apply"):
        here = LogisticRegression(
            db, dpsql.BoltOn(epsilon=0.5), classes=[0.0, 1.0], row_norm="clip",
            epsilon_budget=50.0, table_schema=scratch_schema,
        ).fit(X[:100], y[:100])  # fmt: skip
    assert here.dataset_ == first
    row = db.execute(
        "SELECT epsilon_budget, epsilon_spent FROM dpsql.my_datasets WHERE name = %s", (first,)
    ).fetchone()
    assert row == (1.0, 1.0)
    refused = pytest.raises(dpsql.BudgetExceeded, match=f"db.drop_dataset\\('{first}'\\)")
    with refused as err, pytest.warns(UserWarning, match="does not apply"):
        clone(here).fit(X[50:150], y[50:150])
    assert "data owner" not in str(err.value)  # the owner is the one asking
    # the fingerprints are the owner's, and hold no row
    keys = db.execute(
        sql.SQL("SELECT count(*), max(octet_length(key)) FROM {}.dpsql_row_keys").format(
            sql.Identifier(scratch_schema)
        )
    ).fetchone()
    assert keys == (600, 16)


def test_what_fit_took_predict_and_score_take(db, scratch_schema, binary) -> None:
    """Issue 42: fit(DataFrame, y) worked and predict/score on the same DataFrame refused it
    ("give X as an array"), so cross_val_score spent its epsilon and returned NaN."""
    import pandas as pd
    from sklearn.model_selection import cross_val_score

    X, y = binary
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    clf = LogisticRegression(
        db, dpsql.BoltOn(epsilon=2.0), classes=[0.0, 1.0], row_norm="clip", epochs=2,
        epsilon_budget=8.0, table_schema=scratch_schema,
    ).fit(frame, y)  # fmt: skip
    assert list(clf.feature_names_in_) == ["a", "b", "c"]
    with pytest.warns(UserWarning, match="valid feature names"):  # scikit-learn's own
        by_position = clf.predict(X)
    assert np.array_equal(clf.predict(frame), by_position)
    assert clf.score(frame, y) > 0.5
    with pytest.raises(ValueError, match="feature names"):
        clf.predict(frame.rename(columns={"c": "d"}))
    scores = cross_val_score(clone(clf), frame, y, cv=3, error_score="raise")
    assert not np.isnan(scores).any()
