"""Trained models as Python objects (scikit-learn style attributes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from psycopg.rows import dict_row

from dpsql import _core
from dpsql.encoding import encode_columns, has_columns
from dpsql.errors import NoSuchModel, translate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from dpsql.connection import Database

__all__ = ["ConfidenceIntervals", "Model"]


@dataclass(frozen=True)
class ConfidenceIntervals:
    """Student-t confidence intervals of a DP-GD model's coefficients (``Model.confint``).

    ``estimate``, ``lower`` and ``upper`` have one entry per coefficient (the intercept last,
    when fitted). ``covers`` says what they cover: the OLS solution of the training rows, or
    the minimiser of the Huberised loss when gradients are clipped near it. ``target`` names
    the one the release estimates it covers, ``"ols"`` or ``"clipped least squares"``
    (``"huberised"`` in models released before 0.8.0), from a noisy count of the rows clipped
    at the estimate; ``clipped_fraction`` is that count's estimate of their fraction (None
    without the count). ``method``, ``draws`` and ``burn_in`` say how the draws came from the
    released iterates. ``mixed`` is
    False when the draws are correlated (``draw_autocorrelation`` >= 0.03, the correlation
    implied by the iterates' lag-1 autocorrelation): the run had not mixed. The intervals are
    widened for that correlation (docs/linear.md), and NaN (withheld) when the draws are worth
    fewer than two independent ones. ``epsilon`` and ``delta`` are what the model spent (the
    intervals are post-processing: no more).
    """

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    alpha: float
    method: str
    draws: int
    burn_in: int
    covers: str
    target: str | None
    clipped_fraction: float | None
    mixed: bool | None
    draw_autocorrelation: float | None
    epsilon: float
    delta: float


class Model:
    """A model stored in ``dpsql.models``.

    Attributes follow scikit-learn: ``coef_`` (n_features,) or (n_classes, n_features) for
    multinomial, ``intercept_`` (n_outputs,) (zeros when no intercept was fitted), ``classes_``.
    Predictions use the released coefficients with the C core, exactly as the server does: the
    same feature transform (a registered dataset's public bounds) and the same decision rule.
    """

    def __init__(self, db: Database, row: dict[str, Any]) -> None:
        self._db = db
        self.row = row
        self.model_id: int = row["model_id"]
        self.model: str = row["model"]
        self.weights_ = np.asarray(row["weights"], dtype=np.float64)
        self.coef_ = np.asarray(row["coef"], dtype=np.float64)
        n_out = 1 if self.weights_.ndim == 1 else self.weights_.shape[0]
        icpt = row["intercept"]
        self.intercept_ = np.zeros(n_out) if icpt is None else np.asarray(icpt, dtype=np.float64)
        self.classes_ = None if row["classes"] is None else np.asarray(row["classes"])
        params = row.get("params") or {}
        if params.get("label_values") is not None:
            # a text label (docs/registration.md): trained as classes 0, 1, ...; predicted as
            # the label's values, as dpsql.predict_label does
            self.classes_ = np.asarray(params["label_values"], dtype=object)
        # categorical columns, encoded one-hot from rows with named columns (dpsql.encoding)
        self._categories: dict[str, list[Any]] | None = params.get("categories")
        # scikit-learn's feature_names_in_: the registered (or trained) columns, when they are
        # the features one by one (not one array column)
        self.n_features_in_: int = row["n_features"]
        names = list(row.get("features") or [])
        if self._categories or len(names) == self.n_features_in_:
            self.feature_names_in_ = np.asarray(names, dtype=object)
        self.loss_history_ = list(row["loss_history"])
        self._flags: int = row["flags"]
        # A registered dataset's public feature bounds: the server applies them to every row
        # before the model (dpsql.predict, dpsql.evaluate), and so must Python.
        params = row.get("params") or {}
        bounds = params.get("feature_bounds")
        self._feature_bounds = None if bounds is None else np.asarray(bounds, dtype=np.float64)
        # DPSGD-F and the private-ERM fits with an intercept: the row transform alone (and a
        # centre, zero in models trained since 0.8.0), then the intercept (issue 25).
        self._preprocessing: dict[str, Any] | None = (params.get("privacy") or {}).get(
            "preprocessing"
        )

    @classmethod
    @translate(not_found=NoSuchModel)
    def load(cls, db: Database, model_id: int) -> Model:
        """The stored model with this id; :class:`dpsql.errors.NoSuchModel` if there is none."""
        with db.conn.cursor(row_factory=dict_row) as cur:
            # (with its dataset's name: dpsql.budgets, which every role may read, names it)
            row = cur.execute(
                "SELECT m.*, b.name AS dataset FROM dpsql.models m"
                " LEFT JOIN dpsql.budgets b ON b.dataset_id = m.dataset_id WHERE m.model_id = %s",
                (model_id,),
            ).fetchone()
        if row is None:
            raise NoSuchModel(f"dpsql: no model {model_id}")
        return cls(db, row)

    def _fitted_on_rows(
        self,
        feature_names: Sequence[str] | None,
        categories: Mapping[str, Sequence[Any]] | None,
        classes: np.ndarray | None,
    ) -> None:
        """What an estimator's ``fit(X, y)`` knows and the stored model does not: it trains
        on one array column of encoded rows and numeric labels (text labels as their index),
        so its row in ``dpsql.models`` names neither the columns, nor the categories, nor the
        labels. Recorded here, ``predict`` takes the rows ``fit`` took (a DataFrame by column
        name, text columns one-hot as the estimator encoded them) and returns the labels, not
        their indices. ``Model.load`` of the same id returns the stored model without them."""
        if feature_names is not None:
            self.feature_names_in_ = np.asarray(list(feature_names), dtype=object)
            self._categories = (
                None if not categories else {k: list(v) for k, v in categories.items()}
            )
        if classes is not None:
            self.classes_ = np.asarray(classes)

    def __repr__(self) -> str:
        row = self.row
        private = row["privacy"] != "none"
        where = "dataset" if private else "source"
        name = row.get("dataset") if private and row.get("dataset") else row["source"]
        if len(str(name)) > 60:  # a query as a source: its start only
            name = str(name)[:57] + "..."
        spent = f", epsilon={row['epsilon']:g}, delta={row['delta']:g}" if private else ""
        return (
            f"Model(id={self.model_id}, privacy={row['privacy']!r}, model={self.model!r}, "
            f"{where}={name!r}, features={self.n_features_in_}{spent})"
        )

    def _rows(self, X: Any) -> np.ndarray:
        """X as the model sees it before its row transform: the registration's bounds, or
        a recorded preprocessing (DPSGD-F, private-ERM fits with an intercept)."""
        if has_columns(X):
            X = self._by_name(X)
        rows: np.ndarray = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if rows.shape[1] != self.n_features_in_:
            raise ValueError(
                f"dpsql: model {self.model_id} expects {self.n_features_in_} "
                f"features, got {rows.shape[1]}"
            )
        if self._feature_bounds is not None:
            rows = _core.apply_bounds(rows, self._feature_bounds)
        if self._preprocessing is not None:
            # dpsql_internal._preprocessed: the clip radius, the row transform, the centre
            pre = self._preprocessing
            radius = pre.get("clip_radius")
            if radius is not None:
                with np.errstate(invalid="ignore", divide="ignore"):
                    norms = np.sqrt(np.sum(rows * rows, axis=1))
                    scale = np.where(norms > radius, radius / norms, 1.0)
                rows = rows * scale[:, None]
            rows = _core.preprocess(rows, None, int(pre["row_flags"]), pre.get("centre"))
        return rows

    def _by_name(self, X: Any) -> np.ndarray:
        """Rows with named columns (a DataFrame): the model's columns, found by name, never by
        position; columns missing or unknown are refused, as scikit-learn refuses them."""
        names = getattr(self, "feature_names_in_", None)
        if names is None:
            raise ValueError(
                f"dpsql: model {self.model_id} reads one array column: give X as an array"
            )
        given = [str(c) for c in (X.keys() if isinstance(X, dict) else X.columns)]
        missing = [n for n in names if n not in given]
        unknown = [c for c in given if c not in set(names)]
        if missing or unknown:
            raise ValueError(
                "dpsql: The feature names should match those of the model's registration: "
                + "; ".join(
                    part
                    for part in (
                        f"missing {missing}" if missing else "",
                        f"not features {unknown}" if unknown else "",
                    )
                    if part
                )
            )
        return encode_columns(X, list(names), self._categories)

    def _raw(self, X: Any) -> np.ndarray:
        return _core.predict(self.model, self._flags, self.weights_, self._rows(X))

    def _scores(self, X: Any) -> np.ndarray:
        """Per-output scores <w_c, x> of a multinomial or one-vs-rest model, (n, outputs): each
        row of weights as a linear model, so the row transform is the C core's own."""
        rows = self._rows(X)
        return np.column_stack(
            [_core.predict("linear", self._flags, w, rows) for w in self.weights_]
        )

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores <w, x> after the model's row transform: (n,) for binary and linear models
        (log-odds for logistic), (n, classes) for multinomial and one-vs-rest."""
        if self.weights_.ndim == 2:
            return self._scores(X)
        raw = self._raw(X)
        if self.model == "logistic":
            with np.errstate(divide="ignore"):
                scores: np.ndarray = np.log(raw) - np.log1p(-raw)
            return scores
        return raw

    def predict_proba(self, X: Any) -> np.ndarray:
        """Probabilities of ``classes_``: binary logistic; multinomial (softmax of the
        scores); one-vs-rest logistic (each class's sigmoid, normalised over the classes, as
        scikit-learn's one-vs-rest does). Huber and linear models have none."""
        if self.weights_.ndim == 2 and self.model in ("multinomial", "logistic"):
            scores = self._scores(X)
            if self.model == "multinomial":
                z = np.exp(scores - scores.max(axis=1, keepdims=True))
            else:
                z = 1.0 / (1.0 + np.exp(-scores))
            proba: np.ndarray = z / z.sum(axis=1, keepdims=True)
            return proba
        if self.model != "logistic":
            raise ValueError(f"dpsql: a {self.model} model gives no probabilities")
        p = self._raw(X)
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        """Class labels (classifiers, from the declared label set) or values (linear)."""
        raw = self._raw(X)
        if self.model == "linear":
            return raw
        assert self.classes_ is not None
        if self.weights_.ndim == 2:  # multinomial or one-vs-rest: a class index
            labels: np.ndarray = self.classes_[raw.astype(np.int64)]
            return labels
        positive = _core.is_positive(self.model, raw)
        if (positive < 0).any():
            raise ValueError("dpsql: the model predicts NaN for some rows")
        predicted: np.ndarray = np.where(positive == 1, self.classes_[1], self.classes_[0])
        return predicted

    @translate(not_found=NoSuchModel)
    def confint(self, alpha: float = 0.05) -> ConfidenceIntervals:
        """(1 - alpha) confidence intervals of the coefficients (DP-GD models), from the server.

        Raises :class:`dpsql.errors.InvalidParameter` for models without intervals (trained
        otherwise, or with ``ci="none"``).
        """
        rows = self._db.conn.execute(
            "SELECT coef_index, estimate, lower, upper FROM dpsql.confint(%s, %s)"
            " ORDER BY coef_index",
            (self.model_id, float(alpha)),
        ).fetchall()
        privacy = self.row["params"].get("privacy", {})
        ci = privacy.get("ci", {})
        cols = np.asarray([r[1:] for r in rows], dtype=np.float64).reshape(-1, 3)
        return ConfidenceIntervals(
            estimate=cols[:, 0],
            lower=cols[:, 1],
            upper=cols[:, 2],
            alpha=float(alpha),
            method=ci.get("method", ""),
            draws=int(ci.get("draws") or 0),
            burn_in=int(ci.get("burn_in") or 0),
            covers=ci.get("covers", ""),
            target=ci.get("target"),
            clipped_fraction=ci.get("clipped_fraction"),
            mixed=ci.get("mixed"),
            draw_autocorrelation=ci.get("draw_autocorrelation"),
            epsilon=float(privacy.get("epsilon", float("nan"))),
            delta=float(privacy.get("delta", float("nan"))),
        )

    def evaluate(
        self, source: str, features: Any = None, label: str | None = None
    ) -> dict[str, Any]:
        """Metrics over a table or query, computed in the server, with the baseline's
        (:meth:`dpsql.Database.evaluate`)."""
        return self._db.evaluate(self, source, features, label)

    def score(self, X: Any, y: Any) -> float:
        """scikit-learn's ``score``: accuracy for classifiers, R^2 for linear models, computed
        here with the released coefficients (as ``predict``)."""
        predicted = self.predict(X)
        truth = np.asarray(y).reshape(-1)
        if self.model == "linear":
            values = truth.astype(np.float64)
            total = float(np.sum((values - values.mean()) ** 2))
            residual = float(np.sum((values - predicted) ** 2))
            return 1.0 - residual / total if total > 0 else float("nan")
        return float(np.mean(predicted == truth))

    def plot_loss(self, ax: Axes | None = None, path: str | None = None) -> Figure:
        """The per-epoch training objective (``loss_history_``) of a non-private run, as a
        matplotlib Figure (``pip install dpsql[plot]``); also saved to ``path`` when given."""
        from dpsql.plot import figure_and_axes

        if not self.loss_history_:
            # The server stores '{}' for private models: the objective is computed from the rows.
            why = (
                "private runs release no loss history"
                if self.row["privacy"] != "none"
                else "the run recorded no epoch"
            )
            raise ValueError(f"dpsql: model {self.model_id} has no loss history: {why}")
        fig, axes = figure_and_axes(ax)
        epochs = range(1, len(self.loss_history_) + 1)
        axes.plot(epochs, self.loss_history_, marker="o")
        axes.set_xlabel("epoch")
        axes.set_ylabel("training objective")
        axes.set_title(f"model {self.model_id}: {self.model}")
        if path is not None:
            fig.savefig(path)
        return fig
