"""scikit-learn estimators that train inside the server (``pip install dpsql[sklearn]``).

>>> from dpsql.estimators import LogisticRegression
>>> clf = LogisticRegression(db=db, privacy=dpsql.BoltOn(epsilon=1), epochs=5)
>>> clf.fit("protein")              # a registered dataset: the rows never leave the server
>>> clf.predict(X_test), clf.score(X_test, y_test)

``fit(name)`` trains a private model on a registered dataset (analysts and data owners).
``fit(X, y)`` is for data owners: the rows are loaded into a new table of ``table_schema``;
with ``privacy="none"`` the model is trained without privacy (the server refuses analysts:
:class:`dpsql.PermissionDenied`) and the table is dropped afterwards; with a mechanism the table
is registered as a dataset whose public schema comes from the estimator's parameters only
(``classes``, ``feature_bounds``, ``row_norm``, ``row_bound``, ``label_bound``: never read from
the rows) and whose budget is ``epsilon_budget`` (default: the mechanism's epsilon), emptied
after the release. An estimator and its clones (the folds of ``cross_val_score``), and fits of
rows shared with an earlier fit's, are charged to one dataset and budget (dpsql.fit_datasets).
Predictions run in Python
with the C core, exactly as the server predicts (``model_`` is the :class:`dpsql.Model`).

``db`` is a :class:`dpsql.Database` or a DSN string (connected for the fit and closed after:
such an estimator can be pickled, deep-copied and cloned into joblib workers). A pickled
estimator keeps its fitted model, not its connection.

``fit(X, y)`` takes arrays and DataFrames; text (or integer-coded) columns are encoded one-hot
over public ``categories`` (dpsql.encoding, as the server encodes a registered dataset's), and
``predict``, ``predict_proba``, ``decision_function`` and ``score`` take rows of the same kind,
encoded the same way, by column name for a DataFrame. ``model_`` records the columns, the
categories and the labels, so ``model_.predict`` takes the same DataFrame and returns labels.
Whatever predict and score do with such rows, fit does first, before any charge: model
selection on rows it could not score (a text column without categories) fails before the first
fold is charged.

A non-private ``fit(X, y)`` takes its default step from the owner's rows: the server's
1/sqrt(n), at most 1/L (L the loss's smoothness over these rows), so SGD cannot diverge on
unscaled features; it still converges slowly there (scale them: a ``StandardScaler`` in a
``Pipeline`` is fine without privacy). Private fits are untouched.

scikit-learn's ``check_estimator`` runs in full for every estimator with ``privacy="none"``
and a fixed ``seed`` (tests/python/test_estimators.py; docs/estimators.md): every check passes,
none expected to fail. What is outside it, and why:

- With a :class:`dpsql.Database` as ``db`` (not a DSN): ``check_estimators_overwrite_params``
  and ``check_set_params`` deep-copy and hash the parameters; a live connection can be neither.
- Sample-weight checks are not generated: ``fit`` takes no ``sample_weight`` (nor does
  ``dpsql.train``).
- Private estimators (a mechanism as ``privacy``) are not run through the suite: results are
  random by design (fresh noise; tag ``non_deterministic``), a private fit on arrays needs the
  public ``classes``/``label_bound`` declared before the checks draw their own labels, and each
  such fit registers a new dataset and spends its budget.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from psycopg import sql
from sklearn.base import (  # type: ignore[import-untyped]
    BaseEstimator,
    ClassifierMixin,
    RegressorMixin,
    clone,
)
from sklearn.utils.multiclass import check_classification_targets  # type: ignore[import-untyped]
from sklearn.utils.validation import (  # type: ignore[import-untyped]
    check_array,
    check_is_fitted,
    validate_data,
)

from dpsql.encoding import categorical_bounds, encode_rows, has_columns
from dpsql.errors import BudgetExceeded
from dpsql.models import Model

if TYPE_CHECKING:
    from dpsql.connection import Database

__all__ = ["LinearRegression", "LogisticRegression", "MultinomialLogisticRegression"]

# Database.train's keywords the estimators pass through as they are (their defaults are
# dpsql.train's "not set", which private mechanisms require for what they do not take).
_TRAIN_KEYWORDS = (
    "epochs",
    "batch_size",
    "lambda_",
    "step_size",
    "schedule",
    "radius",
    "shuffle",
    "seed",
    "intercept",
    "huber_h",
    "step_offset",
    "tolerance",
    "parallel_workers",
    "shard_parallel",
    "progress",
)


class _DpsqlEstimator(BaseEstimator):  # type: ignore[misc]
    """What the three estimators share: the connection, the two ways to fit, pickling."""

    _model: str = ""  # dpsql.train's model

    # Set by the subclasses' __init__ (sklearn: parameters are the __init__ signature).
    db: Database | str | None
    privacy: Any
    row_norm: str | None
    feature_bounds: Sequence[Sequence[float]] | None
    row_bound: float | None
    epsilon_budget: float | None
    delta_budget: float | None
    table_schema: str | None
    categories: Mapping[Any, Sequence[Any]] | None
    # fit(X, y): column position -> public categories (fit(name): None)
    _categorical: dict[int, list[Any]] | None

    # -- fitting ----------------------------------------------------------------------------

    def fit(self, X: Any, y: Any = None) -> Any:
        """Train in the server: ``fit("dataset")`` privately on a registered dataset (``y`` None),
        or ``fit(X, y)`` on a data owner's arrays (see the module docstring). Returns self."""
        private = self._private()
        with self._database() as db:
            if isinstance(X, str):
                if y is not None:
                    raise ValueError(
                        "dpsql: fit(dataset_name) takes no y: the labels are the dataset's"
                    )
                if not private:
                    raise ValueError(
                        "dpsql: privacy='none' trains on rows you own: fit(X, y), or "
                        "Database.train(table, features, label); a registered dataset's name is "
                        "for private training (privacy=dpsql.BoltOn(epsilon=...), ...)"
                    )
                model = db.train(
                    X, None, None, model=self._model, privacy=self.privacy, **self._train_kwargs()
                )
                self._set_fitted(model, None)
                self._categorical = None  # predict reads the registered columns by name
                self.dataset_ = X
                self.n_features_in_ = model.n_features_in_
                if hasattr(model, "feature_names_in_"):  # the registered columns
                    self.feature_names_in_ = model.feature_names_in_
                elif hasattr(self, "feature_names_in_"):
                    del self.feature_names_in_
                return self
            _require_owner(db)
            # Everything predict and score do with rows of the kind fit takes is done here,
            # before any charge: the same encoding (_encoded) reads both (issue 42:
            # cross_val_score spent its epsilon on folds it could not score).
            X, y = self._encoded(X, y, reset=True)
            y_train, classes, labels = self._encode(y, private)
            schema = self.table_schema or _current_schema(db)
            if not private:
                table = f"dpsql_fit_{uuid.uuid4().hex[:12]}"
                db.load_numpy(table, X, y_train, schema=schema)
                qualified = f"{schema}.{table}"
                if hasattr(self, "dataset_"):
                    del self.dataset_
                try:
                    model = db.train(
                        qualified,
                        "x",
                        "y",
                        model=self._model,
                        privacy="none",
                        labels=labels,
                        row_norm=self.row_norm or "none",
                        **{**self._train_kwargs(), "step_size": self._owner_step(db, X)},
                    )
                finally:
                    # The model holds its coefficients; the copy of the rows is not needed.
                    with contextlib.suppress(Exception):
                        db.execute(
                            sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, table))
                        )
            else:
                self.dataset_, model = self._fit_private(db, X, y_train, labels, schema)
            self._set_fitted(model, classes)
            names = getattr(self, "feature_names_in_", None)
            model._fitted_on_rows(
                None if names is None else list(names),
                None if names is None else self._categories_by_name(),
                classes,
            )
        return self

    def _encoded(self, X: Any, y: Any = None, *, reset: bool) -> tuple[np.ndarray, Any]:
        """Rows as the model reads them: numbers as float64, each column of ``categories``
        one-hot over its public values (dpsql.encoding, as a registered dataset's columns are),
        checked as scikit-learn checks them (``reset``: fit, which records the columns;
        otherwise their number and names must be fit's). A text column without categories is
        refused naming it."""
        if reset:
            rows, y = validate_data(
                self, X, y, dtype=None, ensure_all_finite=False, y_numeric=self._model == "linear"
            )
        else:
            rows = validate_data(self, X, reset=False, dtype=None, ensure_all_finite=False)
        if reset:
            self._categorical = self._category_positions(rows.shape[1])
        names = getattr(self, "feature_names_in_", None)
        encoded = encode_rows(
            rows,
            list(range(rows.shape[1])) if names is None else list(names),
            self._categorical or {},
        )
        # NaN and infinities after the encoding (a categorical column's missing value is all
        # zeros, as in the server), with scikit-learn's messages
        checked: np.ndarray = check_array(encoded, dtype=np.float64, input_name="X")
        return checked, y

    def _category_positions(self, width: int) -> dict[int, list[Any]]:
        """``categories`` by column position: keys are the columns' names when X names them
        (a DataFrame), else positions 0, 1, ...; values are public and declared, never read
        from the rows (register_dataset's rules: 1 to 1024 distinct values)."""
        if self.categories is None:
            return {}
        if not isinstance(self.categories, Mapping):
            raise ValueError(
                "dpsql: categories must be a dict {column: [value, ...]}, got "
                f"{type(self.categories).__name__}"
            )
        names = getattr(self, "feature_names_in_", None)
        columns: list[Any] = list(range(width)) if names is None else [str(n) for n in names]
        positions: dict[int, list[Any]] = {}
        for key, values in self.categories.items():
            if key not in columns or isinstance(key, bool):
                where = (
                    f"its columns are {columns}"
                    if names is not None
                    else f"X names no column: keys are positions 0 to {width - 1}"
                )
                raise ValueError(
                    f"dpsql: categories name {key!r}, which is not a column of X ({where})"
                )
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ValueError(f"dpsql: categories of {key!r} must be a list of values")
            texts = [str(v) for v in values]
            if not 1 <= len(texts) <= 1024 or len(set(texts)) != len(texts):
                raise ValueError(
                    f"dpsql: categories of {key!r} must be 1 to 1024 distinct values, got "
                    f"{list(values)}"
                )
            positions[columns.index(key)] = list(values)
        return positions

    def _categories_by_name(self) -> dict[str, list[Any]]:
        names = self.feature_names_in_
        return {str(names[j]): values for j, values in (self._categorical or {}).items()}

    def _owner_step(self, db: Database, rows: np.ndarray) -> float | None:
        """A non-private fit's default step, from the owner's rows (the fit is not private):
        the server's constant 1/sqrt(n), at most 1/L, L the loss's smoothness over these rows
        (beta ||x||^2 + lambda, beta the server's for ||x|| <= 1; the intercept's coordinate
        counts). SGD with steps up to 1/L cannot diverge, whatever the features' scale; steps
        of 1/sqrt(n) diverge on unscaled rows (features of mean 100: ||x||^2 = 20,000)."""
        if self.step_size is not None or self.schedule not in (None, "constant"):
            return None if self.step_size is None else float(self.step_size)
        if len(rows) == 0:
            return None  # (the server says the source has no rows)
        norms = np.einsum("ij,ij->i", rows, rows)
        if self.row_norm in ("clip", "unit"):
            norms = np.minimum(norms, 1.0)
        largest = float(norms.max()) + (0.0 if self.intercept is False else 1.0)
        row = db.execute(
            "SELECT smoothness FROM dpsql.loss_constants(%s, 0, 0, %s)",
            (self._model, float(self.huber_h)),
        ).fetchone()
        assert row is not None
        smoothness = float(row[0]) * largest + float(self.lambda_)
        return float(min(1.0 / np.sqrt(len(rows)), 1.0 / smoothness))

    def _fit_private(
        self, db: Database, X: np.ndarray, y: np.ndarray, labels: list[float] | None, schema: str
    ) -> tuple[str, Model]:
        """A private fit on arrays: charged to the one dataset of these rows (dpsql.fit_datasets),
        whose table is emptied after the release."""
        from dpsql.fit_datasets import empty, fit_dataset

        bounds = self.feature_bounds
        if bounds is not None and self._categorical:
            # given for the numeric columns only, as register_dataset takes them
            bounds = categorical_bounds(bounds, self.n_features_in_, self._categorical)
        declarations = {
            "labels": labels,
            "row_norm": self.row_norm,
            "feature_bounds": bounds,
            "row_bound": self.row_bound,
            "label_bound": getattr(self, "label_bound", None),
        }
        budget = self._budget(db)
        entry = fit_dataset(
            db,
            X,
            y,
            group=self._fit_group(),
            schema=schema,
            declarations=declarations,
            budget=budget,
            categories=self._public_categories(),
        )
        if entry.reused and self.epsilon_budget is not None:
            _warn_budget_kept(db, entry.name, budget)
        try:
            model = db.train(
                entry.name, None, None, model=self._model, privacy=self.privacy,
                **self._train_kwargs(),
            )  # fmt: skip
        except BudgetExceeded as err:
            # the rows' own dataset: the owner is the one to ask, and these are the ways
            raise BudgetExceeded(
                f"{str(err).splitlines()[0]}\nHINT: Nothing was charged. These rows are dataset "
                f"{entry.name!r}, registered by your earlier fits (one budget per rows): raise "
                f"its budget with db.alter_dataset({entry.name!r}, epsilon_budget=...), or "
                f"db.drop_dataset({entry.name!r}) to fit them under a new budget (its ledger "
                "stays)."
            ) from err
        finally:
            empty(db, entry)
        return entry.name, model

    def _public_categories(self) -> dict[str, list[Any]] | None:
        if not self._categorical:
            return None
        names = getattr(self, "feature_names_in_", None)
        return {
            str(j if names is None else names[j]): [str(v) for v in values]
            for j, values in sorted(self._categorical.items())
        }

    def _fit_group(self) -> str:
        """The estimator's fit group: kept by its clones (one dataset and budget for them)."""
        if "_group" not in self.__dict__:
            self.__dict__["_group"] = uuid.uuid4().hex[:12]
        group: str = self.__dict__["_group"]
        return group

    def _private(self) -> bool:
        if isinstance(self.privacy, str) and self.privacy == "none":
            return False
        if self.privacy is None or isinstance(self.privacy, str):
            raise ValueError(
                f"dpsql: privacy={self.privacy!r}: pass a mechanism object such as "
                "dpsql.BoltOn(epsilon=1) or dpsql.Auto(epsilon=1), or 'none' for a data owner's "
                "non-private model"
            )
        return True

    @contextlib.contextmanager
    def _database(self) -> Iterator[Database]:
        from dpsql.connection import Database, connect

        if isinstance(self.db, Database):
            yield self.db
        elif isinstance(self.db, str):
            with connect(self.db) as db:
                yield db
        else:
            raise ValueError("dpsql: db must be a dpsql.Database or a DSN string")

    def _train_kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _TRAIN_KEYWORDS}

    def _budget(self, db: Database) -> tuple[float, float]:
        """The new dataset's budget: one fit's worth unless the owner gives more. Delta: the
        mechanism's, or its default as the server has it (dpsql.mechanisms(): one default in
        SQL, Python and here); auto's is 0 (it then picks a pure epsilon-DP mechanism)."""
        eps = self.epsilon_budget
        if eps is None:
            eps = getattr(self.privacy, "epsilon", None)
            if eps is None:
                raise ValueError("dpsql: give epsilon_budget (the mechanism states no epsilon)")
        delta = self.delta_budget
        if delta is None:
            delta = getattr(self.privacy, "delta", None)
        if delta is None:
            row = db.execute(
                "SELECT delta_default FROM dpsql.mechanisms() WHERE name = %s",
                (getattr(self.privacy, "name", ""),),
            ).fetchone()
            delta = 0.0 if row is None else row[0]
        return float(eps), float(delta)

    def _encode(
        self, y: np.ndarray, private: bool
    ) -> tuple[np.ndarray, np.ndarray | None, list[float] | None]:
        """(y as loaded, the classes, the server's labels): regression keeps y as it is."""
        return np.asarray(y, dtype=np.float64), None, None

    def _set_fitted(self, model: Model, classes: np.ndarray | None) -> None:
        self.model_ = model
        self.coef_ = model.coef_
        self.intercept_ = model.intercept_

    # -- prediction ---------------------------------------------------------------------------

    def __sklearn_is_fitted__(self) -> bool:
        # Not sklearn's default (any attribute ending in "_"): the parameter lambda_ does.
        return hasattr(self, "model_")

    def _rows(self, X: Any) -> Any:
        check_is_fitted(self, "model_")
        if getattr(self, "_categorical", None) is None:  # fit(name)
            if has_columns(X) and hasattr(self.model_, "feature_names_in_"):
                return X  # a registered dataset's columns, found by name (categories encoded)
            registered: np.ndarray = validate_data(self, X, reset=False, dtype=np.float64)
            return registered
        # What fit(X, y) took, encoded as fit encoded it (issue 42: predict refused the
        # DataFrame fit took; text columns failed inside numpy).
        rows, _ = self._encoded(X, reset=False)
        return rows

    def predict(self, X: Any) -> np.ndarray:
        """Predicted values (regression) or classes, by the C core as the server predicts."""
        rows = self._rows(X)  # first: NotFittedError before model_ is read
        predicted: np.ndarray = self.model_.predict(rows)
        return predicted

    def _private_score(
        self, dataset: str, y: Any, sample_weight: Any, epsilon: Any, delta: Any, metric: str
    ) -> float:
        """score(dataset_name, epsilon=...): the metric of a private evaluation on a registered
        dataset (``dpsql.evaluate`` with epsilon: one charge to that dataset's budget)."""
        if y is not None or sample_weight is not None:
            raise ValueError(
                "dpsql: score(dataset_name, epsilon=...) takes no y or sample_weight: the labels "
                "are the dataset's"
            )
        if epsilon is None:
            raise ValueError(
                "dpsql: score(dataset_name) needs epsilon: a registered dataset is evaluated "
                "privately, charged to its budget"
            )
        check_is_fitted(self, "model_")
        with self._database() as db:
            result = db.evaluate(self.model_.model_id, dataset, epsilon=epsilon, delta=delta)
        value = result.get(metric)  # (R² is left out when the noisy label variance is not > 0)
        return float("nan") if value is None else float(value)

    @staticmethod
    def _no_epsilon_for_rows(epsilon: Any, delta: Any) -> None:
        if epsilon is not None or delta is not None:
            raise ValueError(
                "dpsql: epsilon and delta are for score(dataset_name, epsilon=...), a private "
                "evaluation of a registered dataset; score(X, y) scores rows you hold"
            )

    # -- scikit-learn plumbing -------------------------------------------------------------

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # Private fits draw fresh noise: two fits differ by design.
        tags.non_deterministic = not (isinstance(self.privacy, str) and self.privacy == "none")
        return tags

    def __sklearn_clone__(self) -> Any:
        """clone() deep-copies parameters; a Database (a live connection) is shared instead."""
        params = self.get_params(deep=False)
        new = type(self)(**{k: v if k == "db" else clone(v, safe=False) for k, v in params.items()})
        if self.privacy is not None and not isinstance(self.privacy, str):
            new.__dict__["_group"] = self._fit_group()  # clones: one dataset and one budget
        if hasattr(self, "_metadata_request"):
            new._metadata_request = copy.deepcopy(self._metadata_request)
        return new

    def __getstate__(self) -> dict[str, Any]:
        from dpsql.connection import Database

        state: dict[str, Any] = super().__getstate__()
        if isinstance(state.get("db"), Database):
            state["db"] = None  # a connection does not travel; set_params(db=...) to refit
        if "model_" in state:
            model = copy.copy(state["model_"])
            model.__dict__["_db"] = None  # predictions need only the coefficients
            state["model_"] = model
        return state


class _DpsqlClassifier(ClassifierMixin, _DpsqlEstimator):  # type: ignore[misc]
    classes: Sequence[Any] | None

    def _encode(
        self, y: np.ndarray, private: bool
    ) -> tuple[np.ndarray, np.ndarray | None, list[float] | None]:
        check_classification_targets(y)
        if self.classes is not None:
            classes = np.asarray(self.classes)
            known = np.isin(y, classes)
            if not known.all():
                raise ValueError(f"dpsql: y holds labels outside classes={list(classes)}")
        elif private:
            # The registered label set is public: it must not be read from the rows.
            raise ValueError(
                "dpsql: a private fit on arrays needs classes=[...], the public label set "
                "(the distinct values of y are data)"
            )
        else:
            classes = np.unique(y)
        if len(classes) < 2:
            raise ValueError(
                f"dpsql: a classifier needs 2 or more classes, got {len(classes)} class"
            )
        if np.issubdtype(classes.dtype, np.number):
            return np.asarray(y, dtype=np.float64), classes, [float(c) for c in classes]
        # The server's labels are numbers: other labels (strings...) are loaded as their index.
        order = np.argsort(classes)
        index = order[np.searchsorted(classes, y, sorter=order)]
        return index.astype(np.float64), classes, [float(i) for i in range(len(classes))]

    def _set_fitted(self, model: Model, classes: np.ndarray | None) -> None:
        super()._set_fitted(model, classes)
        assert model.classes_ is not None
        # fit(X, y) records its classes in model_ (fit: which predict then returns, labels
        # rather than their index in the server)
        self.classes_ = model.classes_ if classes is None else classes

    def predict(self, X: Any) -> np.ndarray:
        """Predicted classes (from ``classes_``), by the C core as the server predicts."""
        rows = self._rows(X)
        predicted: np.ndarray = self.model_.predict(rows)
        return predicted

    def score(
        self,
        X: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> float:
        """Accuracy: on rows ``X, y`` (scikit-learn's), or ``score("dataset", epsilon=e)``, a
        private evaluation on a registered dataset, charged to its budget (no SELECT needed)."""
        if isinstance(X, str):
            return self._private_score(X, y, sample_weight, epsilon, delta, "accuracy")
        self._no_epsilon_for_rows(epsilon, delta)
        result: float = super().score(X, y, sample_weight=sample_weight)
        return result

    def predict_proba(self, X: Any) -> np.ndarray:
        """Probabilities of ``classes_`` (binary; softmax for multinomial; one-vs-rest
        sigmoids normalised over the classes)."""
        rows = self._rows(X)
        proba: np.ndarray = self.model_.predict_proba(rows)
        return proba

    def decision_function(self, X: Any) -> np.ndarray:
        """Log-odds of ``classes_[1]`` (binary), or one score per class."""
        rows = self._rows(X)
        scores: np.ndarray = self.model_.decision_function(rows)
        if scores.ndim == 2 and scores.shape[1] == 2:
            # scikit-learn's binary convention: one score, positive for classes_[1]
            binary: np.ndarray = scores[:, 1] - scores[:, 0]
            return binary
        return scores

    # One __init__ for both classifiers: scikit-learn reads the parameters from its signature,
    # which subclasses inherit.
    def __init__(
        self,
        db: Database | str | None = None,
        privacy: Any = None,
        *,
        epochs: int | None = None,
        batch_size: int | None = None,
        lambda_: float = 0.0,
        step_size: float | None = None,
        schedule: str | None = None,
        radius: float | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        intercept: bool | None = None,
        huber_h: float = 0.1,
        step_offset: float = 0.0,
        tolerance: float | None = None,
        parallel_workers: int = 0,
        shard_parallel: bool = False,
        progress: bool = False,
        classes: Sequence[Any] | None = None,
        categories: Mapping[Any, Sequence[Any]] | None = None,
        row_norm: str | None = None,
        feature_bounds: Sequence[Sequence[float]] | None = None,
        row_bound: float | None = None,
        epsilon_budget: float | None = None,
        delta_budget: float | None = None,
        table_schema: str | None = None,
    ) -> None:
        self.db = db
        self.privacy = privacy
        self.epochs = epochs
        self.batch_size = batch_size
        self.lambda_ = lambda_
        self.step_size = step_size
        self.schedule = schedule
        self.radius = radius
        self.shuffle = shuffle
        self.seed = seed
        self.intercept = intercept
        self.huber_h = huber_h
        self.step_offset = step_offset
        self.tolerance = tolerance
        self.parallel_workers = parallel_workers
        self.shard_parallel = shard_parallel
        self.progress = progress
        self.classes = classes
        self.categories = categories
        self.row_norm = row_norm
        self.feature_bounds = feature_bounds
        self.row_bound = row_bound
        self.epsilon_budget = epsilon_budget
        self.delta_budget = delta_budget
        self.table_schema = table_schema


class LogisticRegression(_DpsqlClassifier):
    """Logistic regression trained in the server (one-vs-rest for 3 or more classes).

    Parameters
    ----------
    db : dpsql.Database or str
        The server (a DSN string is connected for each fit).
    privacy : mechanism or "none"
        E.g. ``dpsql.BoltOn(epsilon=1)``; ``"none"``: a data owner's non-private model.
    epochs, batch_size, lambda_, step_size, schedule, radius, shuffle, seed, intercept, huber_h,
    step_offset, tolerance, parallel_workers, shard_parallel, progress
        As in :meth:`dpsql.Database.train` (``None``/defaults: the server chooses, from public
        quantities for private runs).
    classes : sequence, optional
        The public label set; needed by a private ``fit(X, y)``. Default: the values of y
        (non-private fits) or the dataset's labels (``fit(name)``).
    categories : dict, optional
        ``fit(X, y)``'s text (or integer-coded) columns: column -> its public values, as in
        ``register_dataset``: one-hot in the given order, a value not listed (or missing) all
        zeros. Keys are X's column names (a DataFrame), else positions. A text column without
        categories is refused. ``predict`` and ``score`` encode X the same way, and so does
        ``model_.predict`` for a DataFrame.
    row_norm, feature_bounds, row_bound : optional
        Public row transform and bounds of a ``fit(X, y)`` (``register_dataset``'s meaning;
        ``row_norm`` also applies to non-private fits).
    epsilon_budget, delta_budget : float, optional
        Budget of the dataset a private ``fit(X, y)`` registers (default: the mechanism's).
    table_schema : str, optional
        Schema of the table ``fit(X, y)`` creates (default: the current schema).
    """

    _model = "logistic"


class MultinomialLogisticRegression(_DpsqlClassifier):
    """Multinomial (softmax) logistic regression trained in the server; parameters as for
    :class:`LogisticRegression`."""

    _model = "multinomial"


class LinearRegression(RegressorMixin, _DpsqlEstimator):  # type: ignore[misc]
    """Least-squares regression trained in the server; ``score`` is R².

    Parameters as for :class:`LogisticRegression`, without ``classes`` and with
    ``label_bound``: the public bound on |y| a private ``fit(X, y)`` registers (required there;
    never read from y).
    """

    _model = "linear"

    def score(
        self,
        X: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> float:
        """R²: on rows ``X, y`` (scikit-learn's), or ``score("dataset", epsilon=e)``, a private
        evaluation on a registered dataset, charged to its budget (no SELECT needed)."""
        if isinstance(X, str):
            return self._private_score(X, y, sample_weight, epsilon, delta, "r2")
        self._no_epsilon_for_rows(epsilon, delta)
        result: float = super().score(X, y, sample_weight=sample_weight)
        return result

    def __init__(
        self,
        db: Database | str | None = None,
        privacy: Any = None,
        *,
        epochs: int | None = None,
        batch_size: int | None = None,
        lambda_: float = 0.0,
        step_size: float | None = None,
        schedule: str | None = None,
        radius: float | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        intercept: bool | None = None,
        huber_h: float = 0.1,
        step_offset: float = 0.0,
        tolerance: float | None = None,
        parallel_workers: int = 0,
        shard_parallel: bool = False,
        progress: bool = False,
        label_bound: float | None = None,
        categories: Mapping[Any, Sequence[Any]] | None = None,
        row_norm: str | None = None,
        feature_bounds: Sequence[Sequence[float]] | None = None,
        row_bound: float | None = None,
        epsilon_budget: float | None = None,
        delta_budget: float | None = None,
        table_schema: str | None = None,
    ) -> None:
        self.db = db
        self.privacy = privacy
        self.epochs = epochs
        self.batch_size = batch_size
        self.lambda_ = lambda_
        self.step_size = step_size
        self.schedule = schedule
        self.radius = radius
        self.shuffle = shuffle
        self.seed = seed
        self.intercept = intercept
        self.huber_h = huber_h
        self.step_offset = step_offset
        self.tolerance = tolerance
        self.parallel_workers = parallel_workers
        self.shard_parallel = shard_parallel
        self.progress = progress
        self.label_bound = label_bound
        self.categories = categories
        self.row_norm = row_norm
        self.feature_bounds = feature_bounds
        self.row_bound = row_bound
        self.epsilon_budget = epsilon_budget
        self.delta_budget = delta_budget
        self.table_schema = table_schema

    def _encode(
        self, y: np.ndarray, private: bool
    ) -> tuple[np.ndarray, np.ndarray | None, list[float] | None]:
        if private and self.label_bound is None:
            raise ValueError(
                "dpsql: a private fit on arrays needs label_bound, a public bound on |y| "
                "(it is never read from y)"
            )
        return np.asarray(y, dtype=np.float64), None, None


def _current_schema(db: Database) -> str:
    row = db.execute("SELECT current_schema()").fetchone()
    if row is None or row[0] is None:
        raise ValueError("dpsql: no current schema: give table_schema=")
    return str(row[0])


def _require_owner(db: Database) -> None:
    """fit(X, y) loads rows into a table: data owners only. An analyst is told what to do."""
    row = db.execute(
        "SELECT coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = session_user), false)"
        " OR pg_has_role(session_user, 'dpsql_admin', 'MEMBER')"
    ).fetchone()
    if row is None or not row[0]:
        from dpsql.errors import PermissionDenied

        raise PermissionDenied(
            "dpsql: fit(X, y) is for data owners (it loads the rows into a new table); analysts "
            "fit a registered dataset by name: est.fit('dataset_name') (dpsql datasets lists "
            "yours)"
        )


def _warn_budget_kept(db: Database, name: str, budget: tuple[float, float]) -> None:
    """A fit of rows an earlier fit registered keeps that dataset's budget: say so when the
    estimator asked for another."""
    row = db.execute(
        "SELECT epsilon_budget, delta_budget FROM dpsql.my_datasets WHERE name = %s", (name,)
    ).fetchone()
    if row is not None and (float(row[0]), float(row[1])) != budget:
        warnings.warn(
            f"dpsql: these rows are dataset {name!r}, registered by an earlier fit with budget "
            f"epsilon={row[0]:g}, delta={row[1]:g}; epsilon_budget={budget[0]:g} does not apply "
            f"(one budget per rows): db.alter_dataset({name!r}, epsilon_budget=...) changes it",
            UserWarning,
            stacklevel=4,
        )
