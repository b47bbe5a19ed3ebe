"""Connecting to a server that runs dpsql, and the :class:`Database` handle.

``dpsql.connect()`` accepts a DSN or URL (SQLAlchemy URLs such as ``postgresql+psycopg://``
included), a psycopg connection, or a SQLAlchemy engine; with none of them and no
``DPSQL_DSN`` in the environment it starts (or joins) the embedded PostgreSQL server.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypedDict

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from dpsql import accountant_config, extension, server
from dpsql.errors import (
    InvalidParameter,
    NoSuchModel,
    NothingReleased,
    NotRegistered,
    PermissionDenied,
    translate,
)
from dpsql.load_table import IfExists, LoadReport
from dpsql.models import Model
from dpsql.training import TrainingRun, server_progress, train_args

__all__ = ["Database", "Estimate", "FeatureBoundsEstimate", "LabelBoundEstimate", "connect"]

# What psycopg's Connection.execute takes (a str: any statement; dpsql does not require
# LiteralString).
Statement: TypeAlias = "str | bytes | sql.SQL | sql.Composed"


class _FeatureBoundsRequired(TypedDict):
    epsilon: float


class FeatureBoundsEstimate(_FeatureBoundsRequired, total=False):
    """Arguments of ``dpsql.estimate_bounds`` run at registration (left out: its defaults,
    ``search_range`` ``[-2**40, 2**40]``)."""

    search_range: Sequence[float]
    lower_quantile: float
    upper_quantile: float


class _LabelBoundRequired(TypedDict):
    epsilon: float


class LabelBoundEstimate(_LabelBoundRequired, total=False):
    """Arguments of ``dpsql.estimate_label_bound`` run at registration: ``search_range`` is a
    public range of |y|, ``[a, b]`` with ``0 <= a < b`` (left out: ``[0, 2**40]``)."""

    search_range: Sequence[float]
    quantile: float


class Estimate(TypedDict, total=False):
    """``register_dataset(estimate=...)``: private bounds estimated in the registration's
    transaction, each charged its own epsilon (the total is their sum, delta 0)."""

    feature_bounds: FeatureBoundsEstimate
    label_bound: LabelBoundEstimate
    noise_seed: int  # tests only: the draws are then not private


def _named_call(function: str, args: dict[str, Any]) -> sql.Composed:
    """``SELECT function(name => %s, ...)`` for the arguments that are not None (the server's
    defaults for the others: one place for each default)."""
    given = [k for k, v in args.items() if v is not None]
    return sql.SQL("SELECT {}({})").format(
        sql.SQL(function),
        sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in given
        ),
    )


def _libpq_url(url: str) -> str:
    """A libpq URI from a SQLAlchemy-style URL (drop the ``+driver`` part)."""
    return re.sub(r"^(postgres(?:ql)?)\+[A-Za-z0-9_]+://", r"\1://", url)


def _from_sqlalchemy(engine: Any) -> psycopg.Connection:
    url = engine.url.render_as_string(hide_password=False)
    return psycopg.connect(_libpq_url(url))


class Database:
    """A connection to a PostgreSQL server with the dpsql extension.

    Use :func:`connect` to make one. It is a context manager that closes the connection it
    opened (a connection handed in by the caller is left open).
    """

    def __init__(self, conn: psycopg.Connection, *, owns_connection: bool, embedded: bool) -> None:
        self.conn = conn
        self._owns = owns_connection
        self.embedded = embedded

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection if :func:`connect` opened it."""
        if self._owns and not self.conn.closed:
            self.conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        info = self.conn.info
        where = "embedded" if self.embedded else f"{info.host}:{info.port}"
        return f"<dpsql.Database {info.dbname} ({where})>"

    # -- training ------------------------------------------------------------------------

    @translate()
    def train(
        self,
        source: str,
        features: Sequence[str] | str | None,
        label: str | None,
        model: str = "logistic",
        *,
        epochs: int | None = None,
        batch_size: int | None = None,
        lambda_: float = 0.0,
        step_size: float | None = None,
        schedule: str | None = None,
        radius: float | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        privacy: Any = "none",
        labels: Sequence[float] | None = None,
        intercept: bool | None = None,
        row_norm: str = "none",
        huber_h: float = 0.1,
        step_offset: float = 0.0,
        tolerance: float | None = None,
        parallel_workers: int = 0,
        shard_parallel: bool = False,
        validation: str | None = None,
        progress: bool = True,
    ) -> Model:
        """Train a model inside the server, one aggregate scan per epoch.

        Arguments mirror ``dpsql.train`` in SQL (``lambda_`` is SQL's ``lambda``). ``privacy``
        is ``"none"`` or a mechanism such as :class:`dpsql.BoltOn`; a private run uses the
        registered dataset named by ``source`` (its features and labels), and ``features`` and
        ``label`` are None. Otherwise ``features`` is a list of numeric columns or the name of
        one ``float8[]`` column, ``label`` a column and ``source`` a table, view or SELECT
        query. ``shard_parallel=True`` accepts model averaging over the shards of a Citus
        distributed table (docs/citus.md). ``validation`` (with ``privacy=dpsql.Auto(...)``)
        names a validation dataset (a holdout): ``auto``'s candidates are then chosen among by
        private selection (:meth:`tune`). The run happens in one transaction: on any error
        (or Ctrl-C) nothing is left behind. ``epochs``, ``batch_size`` and ``schedule`` left
        at ``None`` mean 10, 1 and ``"constant"`` without privacy; a private run chooses them
        from public quantities (docs/defaults.md).

        Returns
        -------
        Model
            The stored model (``model_id``, ``coef_``, ``intercept_``, ``predict``, ...).

        Raises
        ------
        dpsql.errors.DpsqlError
            The server's refusal, by SQLSTATE: :class:`~dpsql.errors.BudgetExceeded`,
            :class:`~dpsql.errors.PermissionDenied` (an option for data owners' tests),
            :class:`~dpsql.errors.NotRegistered` (also a dataset not granted to you),
            :class:`~dpsql.errors.InvalidParameter` (also a parameter the mechanism does not
            take), ...
        dpsql.errors.NothingReleased
            The server stored no model (no mechanism of this version does that: objective and
            output perturbation release their last iterate since 0.8.0); the charge stands.
        """
        if not isinstance(privacy, str):
            extra = {} if validation is None else {"validation": validation}
            return self._train_private(
                source,
                model,
                privacy,
                features=[features] if isinstance(features, str) else features,
                label=label,
                progress=progress,
                epochs=epochs,
                batch_size=batch_size,
                lambda_=lambda_,
                step_size=step_size,
                schedule=schedule,
                radius=radius,
                shuffle=shuffle,
                seed=seed,
                labels=None if labels is None else list(labels),
                intercept=intercept,
                row_norm=row_norm,
                huber_h=huber_h,
                step_offset=step_offset,
                tolerance=tolerance,
                parallel_workers=parallel_workers,
                shard_parallel=shard_parallel,
                **extra,
            )
        if validation is not None:
            raise ValueError("dpsql: validation= is for privacy=dpsql.Auto(...)")
        if privacy != "none":
            raise ValueError(
                f"dpsql: privacy={privacy!r}: pass a mechanism object such as "
                "dpsql.BoltOn(epsilon=...), or 'none' for a non-private model"
            )
        (owner,) = self.conn.execute(
            "SELECT coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = session_user), false)"
            " OR pg_has_role(session_user, 'dpsql_admin', 'MEMBER')"
        ).fetchone() or (False,)
        if not owner:
            # the server refuses it anyway (dpsql_internal is closed to analysts): say why
            raise PermissionDenied(
                "dpsql: privacy='none' is for data owners (dpsql_admin): analysts train private "
                "models of registered datasets, e.g. privacy=dpsql.BoltOn(epsilon=1)"
            )
        if features is None or label is None:
            # Only a private run reads them from its registered dataset.
            raise InvalidParameter(
                "dpsql: a non-private run needs features and label (the source's columns); "
                "None is for private runs (privacy=dpsql.BoltOn(...), ...), which use the "
                "registered dataset's columns"
            )
        args = train_args(
            source=source,
            features=features,
            label=label,
            model=model,
            epochs=10 if epochs is None else epochs,
            batch_size=1 if batch_size is None else batch_size,
            lambda_=lambda_,
            step_size=step_size,
            schedule=schedule or "constant",
            radius=radius,
            shuffle=shuffle,
            seed=seed,
            labels=labels,
            intercept=True if intercept is None else intercept,  # scikit-learn's fit_intercept
            row_norm=row_norm,
            huber_h=huber_h,
            step_offset=step_offset,
            tolerance=tolerance,
            parallel_workers=parallel_workers,
            shard_parallel=shard_parallel,
        )
        with self.conn.transaction():
            run = TrainingRun.prepare(self.conn, args)
            run.run_epochs(progress=progress)
            model_id = run.finish()
        return self.model(model_id)

    @translate(not_found=NotRegistered)
    def _train_private(
        self,
        source: str,
        model: str,
        privacy: Any,
        *,
        features: Sequence[str] | None,
        label: str | None,
        progress: bool,
        **kw: Any,
    ) -> Model:
        """A private run: the server drives it and releases only the noisy model. Features
        and label, when given, must be the registration's (the server checks)."""
        args = _private_args(source, model, privacy, features=features, label=label, **kw)
        with server_progress(self.conn, f"dpsql {privacy.name}", enabled=progress):
            row = self.conn.execute(_call_all("dpsql.train", args), list(args.values())).fetchone()
        assert row is not None
        if row[0] is None:
            raise NothingReleased(
                f"dpsql: {privacy.name} released nothing; the budget of this call is spent"
            )
        return self.model(int(row[0]))

    @translate(not_found=NotRegistered)
    def preview(
        self,
        source: str,
        privacy: Any,
        model: str = "logistic",
        *,
        lambda_: float = 0.0,
        **train: Any,
    ) -> dict[str, Any]:
        """What ``train(source, None, None, model, privacy=privacy, **train)`` would do, without
        charging and without reading rows (``dpsql.preview``): the mechanism (``auto``'s
        choice), its plan and the defaults it fills in, the epsilon and delta it would charge,
        the budget before and after, every warning, and under ``"refused"`` the refusal the
        release would meet (``{"message", "hint", "sqlstate"}``) instead of raising it."""
        args = _private_args(
            source, model, privacy, features=None, label=None, lambda_=lambda_, **train
        )
        row = self.conn.execute(_call_all("dpsql.preview", args), list(args.values())).fetchone()
        assert row is not None
        result: dict[str, Any] = row[0]
        return result

    @translate(not_found=NotRegistered)
    def audit(
        self,
        dataset: str,
        privacy: Any,
        *,
        runs: int | None = None,
        method: str | None = None,
        model: str | None = None,
        confidence: float = 0.95,
        canaries: int | None = None,
        seed: int | None = None,
        test: str | None = None,
        **train: Any,
    ) -> dict[str, Any]:
        """An empirical lower bound on ``privacy``'s epsilon on copies of ``dataset`` with
        canaries (``dpsql.audit``, data owners; docs/audit.md). The mechanism object's other
        settings and ``train`` (``Database.train``'s keywords, ``lambda_`` as ``lambda``) are
        the audited configuration. Nothing is charged to the dataset and no model is left.
        ``method`` None: the most powerful method for the mechanism (``dirac``, white-box
        canaries, for the SGD family); ``test``: ``dp`` or ``gdp`` (dirac and distinguish).

        Returns ``dpsql.audit``'s row: ``epsilon_claimed``, ``epsilon_lower``, ``confidence``,
        ``runs``, ``method``."""
        from psycopg.rows import dict_row

        args = {k: v for k, v in privacy.sql_args().items() if v is not None}
        name, epsilon = args.pop("privacy"), args.pop("epsilon")
        delta = args.pop("delta", None)  # None: the mechanism's default
        if "lambda_" in train:
            train["lambda"] = train.pop("lambda_")
        options: dict[str, Any] = {"train": {**args, **train}, "confidence": confidence}
        for key, value in (
            ("model", model),
            ("canaries", canaries),
            ("seed", seed),
            ("test", test),
        ):
            if value is not None:
                options[key] = value
        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                "SELECT * FROM dpsql.audit(%s, %s, %s, %s, %s, %s, %s)",
                (dataset, name, epsilon, delta, runs, method, Jsonb(options)),
            ).fetchone()
        assert row is not None
        return row

    # -- datasets (data owners) ----------------------------------------------------------

    @translate()
    def register_dataset(
        self,
        source: str,
        features: Sequence[str] | str,
        label: str,
        *,
        epsilon_budget: float,
        delta_budget: float = 0.0,
        labels: Sequence[Any] | None = None,
        feature_bounds: Sequence[Sequence[float]] | None = None,
        row_norm: str | None = None,
        name: str | None = None,
        label_bound: float | None = None,
        row_bound: float | None = None,
        dim: int | None = None,
        regression: bool | None = None,
        estimate: Estimate | None = None,
        composition: str = "sum",
        categories: dict[str, Sequence[Any]] | None = None,
        accept: bool = False,
        holdout: float | None = None,
        key: str | None = None,
        privacy_unit: str | None = None,
        max_rows_per_unit: int | None = None,
    ) -> int:
        """Register a table for private training with its public schema and budget.

        Data owners only (members of ``dpsql_admin``). Classification: ``labels`` is the public
        label set (default (-1, 1)); rows are clipped to the unit ball (``row_norm="clip"``,
        the default) or normalised onto it (``"unit"``). Regression (the linear mechanisms):
        ``label_bound`` is a public bound on |y| and ``row_bound`` one on ||x||; rows are kept
        (``row_norm="none"``, the default) or clipped to the unit ball. ``feature_bounds``
        are public (lo, hi) per feature (features are rescaled onto [-1, 1]). ``dim`` declares
        the length of a feature array column (public; default: the bounds' rows, else the
        length of the first row, read once as the data owner). Returns the dataset id.

        Private bounds instead of declared ones (docs/privacy.md): ``regression=True`` without
        ``label_bound`` registers a regression dataset that cannot be trained on until
        :meth:`estimate_label_bound` sets it; ``estimate`` runs the estimates in the same
        transaction, e.g. ``{"feature_bounds": {"epsilon": 0.1, "search_range": [-10, 10]},
        "label_bound": {"epsilon": 0.1, "search_range": [0, 100]}}`` (a ``label_bound``
        estimate implies ``regression``). If an estimate fails, nothing is registered or charged.

        ``composition="pld"`` charges the budget by the PLD composition of the ledger's
        releases instead of summing their epsilons and deltas (docs/privacy.md, "Re-accounting
        the ledger").

        Tables as they come: ``labels`` are values of the label column's own type (numbers,
        booleans, or text such as ``["no", "yes"]``, the negative class first); ``categories``
        declares the public values of text (or integer) feature columns, encoded one-hot in
        the server (``{"colour": ["red", "green"]}``; a value not listed is all zeros); boolean
        features are read as 0/1. Registration counts the rows that training would drop
        (NULLs, labels outside ``labels``), encode as zeros or clip, and refuses unless
        ``accept=True``.

        ``holdout=0.2`` also registers that share of the rows, chosen by a secret-keyed hash of
        the ``key`` column (default: the one-column primary key), as ``<name>_holdout`` with the
        same declarations and budget of its own (validation and test sets: private evaluation,
        ``tune``); the training dataset excludes them (docs/privacy.md, "Holdout splits").

        ``privacy_unit="patient_id", max_rows_per_unit=k`` protects people, not rows: the rows
        sharing a value of that column are one unit, every private read keeps exactly ``k``
        slots per unit (its rows repeated or some left out), and every release's epsilon and
        delta hold for replacing all of one unit's rows (docs/privacy.md, "Privacy units").
        Without it, one row is one unit.
        """
        feats = [features] if isinstance(features, str) else list(features)
        bounds = None if feature_bounds is None else [list(map(float, b)) for b in feature_bounds]
        row = self.conn.execute(
            "SELECT dpsql.register_dataset(%s, %s, %s, epsilon_budget => %s,"
            " delta_budget => %s, feature_bounds => %s, row_norm => %s,"
            " name => %s, label_bound => %s, row_bound => %s, dim => %s, regression => %s,"
            " estimate => %s, composition => %s, categories => %s, accept => %s,"
            " holdout => %s, key => %s, privacy_unit => %s, max_rows_per_unit => %s"
            + ("" if labels is None else ", labels => %s")
            + ")",
            (
                source,
                feats,
                label,
                epsilon_budget,
                delta_budget,
                bounds,
                row_norm,
                name,
                label_bound,
                row_bound,
                dim,
                regression,
                None if estimate is None else Jsonb(estimate),
                composition,
                None if categories is None else Jsonb({k: list(v) for k, v in categories.items()}),
                accept,
                holdout,
                key,
                privacy_unit,
                max_rows_per_unit,
                *([] if labels is None else [_label_array(labels)]),
            ),
        ).fetchone()
        assert row is not None
        return int(row[0])

    @translate(not_found=NotRegistered)
    def budget_report(self, dataset: str) -> dict[str, Any]:
        """The dataset's ledger re-accounted (``dpsql.budget_report``): the charged sums next
        to the PLD (and RDP) composition of its releases at the delta budget, and what
        summation wastes (``epsilon_saving``)."""
        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute("SELECT * FROM dpsql.budget_report(%s)", (dataset,)).fetchone()
        assert row is not None
        return row

    @translate(not_found=NotRegistered)
    def estimate_bounds(
        self,
        dataset: str,
        epsilon: float,
        search_range: Sequence[float] | None = None,
        *,
        lower_quantile: float | None = None,
        upper_quantile: float | None = None,
        noise_seed: int | None = None,
    ) -> list[list[float]]:
        """Private per-feature (lo, hi) of a dataset registered without feature bounds, charged
        ``epsilon`` on its ledger and registered as its bounds (data owners only). Each bound
        is a point of a grid of magnitudes of ``search_range`` (default ``[-2**40, 2**40]``):
        a wide range costs little (docs/privacy.md)."""
        args = {
            "dataset": dataset,
            "epsilon": epsilon,
            "search_range": None if search_range is None else [float(v) for v in search_range],
            "lower_quantile": lower_quantile,
            "upper_quantile": upper_quantile,
            "noise_seed": noise_seed,
        }
        row = self.conn.execute(
            _named_call("dpsql.estimate_bounds", args), [v for v in args.values() if v is not None]
        ).fetchone()
        assert row is not None
        return [list(b) for b in row[0]]

    @translate(not_found=NotRegistered)
    def estimate_label_bound(
        self,
        dataset: str,
        epsilon: float,
        search_range: Sequence[float] | None = None,
        *,
        quantile: float | None = None,
        noise_seed: int | None = None,
    ) -> float:
        """Private bound on |y| of a regression dataset registered without one, charged
        ``epsilon`` on its ledger and registered as its ``label_bound`` (data owners only);
        ``search_range`` defaults to ``[0, 2**40]``."""
        args = {
            "dataset": dataset,
            "epsilon": epsilon,
            "search_range": None if search_range is None else [float(v) for v in search_range],
            "quantile": quantile,
            "noise_seed": noise_seed,
        }
        row = self.conn.execute(
            _named_call("dpsql.estimate_label_bound", args),
            [v for v in args.values() if v is not None],
        ).fetchone()
        assert row is not None
        return float(row[0])

    @translate(not_found=NotRegistered)
    def describe(
        self,
        dataset: str,
        epsilon: float,
        delta: float = 0.0,
        features: Sequence[str] | str | None = None,
    ) -> Any:
        """Private exploratory statistics of a registered dataset (``dpsql.describe``,
        docs/describe.md) as a pandas DataFrame with the columns ``feature, statistic, key,
        value, noise_sd``: each numeric column's mean, stddev, quantiles and histogram, each
        categorical column's and a classification label's frequencies, and the public row
        count. One charge of ``(epsilon, delta)`` to the dataset's ledger; an analyst needs no
        SELECT on its table. Needs pandas (:func:`dpsql.describe.describe_records` gives the
        rows as dicts without it)."""
        from dpsql import describe

        return describe.to_frame(
            describe.describe_records(self.conn, dataset, epsilon, delta, features)
        )

    @translate(not_found=NotRegistered)
    def preview_describe(
        self,
        dataset: str,
        epsilon: float,
        delta: float = 0.0,
        features: Sequence[str] | str | None = None,
    ) -> dict[str, Any]:
        """What :meth:`describe` would charge, without charging or reading a value
        (``dpsql.preview_describe``): the epsilon split under ``"plan"``, the ``dp_event``, the
        budget, and under ``"refused"`` the refusal it would meet."""
        from dpsql import describe

        return describe.preview_describe(self.conn, dataset, epsilon, delta, features)

    @translate()  # 42704: the dataset or the role
    def grant_dataset(self, dataset: str | int, role: str) -> None:
        """Let ``role`` (e.g. a member of ``dpsql_analyst``) train private models on the
        dataset (its name or id)."""
        self.conn.execute("SELECT dpsql.grant_dataset(%s::text, %s)", (str(dataset), role))

    @translate()
    def revoke_dataset(self, dataset: str | int, role: str) -> None:
        """Withdraw ``role``'s grant on the dataset (its name or id); its ledger entries stay."""
        self.conn.execute("SELECT dpsql.revoke_dataset(%s::text, %s)", (str(dataset), role))

    @translate()
    def alter_dataset(
        self,
        dataset: str | int,
        *,
        epsilon_budget: float | None = None,
        delta_budget: float | None = None,
        new_name: str | None = None,
        privacy_unit: str | None = None,
        max_rows_per_unit: int | None = None,
    ) -> None:
        """Change a dataset's budgets (never below what is spent), its name, or, while
        nothing is spent, its privacy unit (``privacy_unit=""``: a row is a unit again)
        (``dpsql.alter_dataset``: the registering data owner or a superuser; recorded in
        ``dpsql.dataset_history``)."""
        self.conn.execute(
            "SELECT dpsql.alter_dataset(%s::text, epsilon_budget => %s, delta_budget => %s,"
            " new_name => %s, privacy_unit => %s, max_rows_per_unit => %s)",
            (str(dataset), epsilon_budget, delta_budget, new_name, privacy_unit, max_rows_per_unit),
        )

    @translate()
    def drop_dataset(self, dataset: str | int) -> None:
        """Retire a dataset (``dpsql.drop_dataset``): its name and table are free for a new
        registration; its ledger and history stay."""
        self.conn.execute("SELECT dpsql.drop_dataset(%s::text)", (str(dataset),))

    @translate()
    def budgets(self) -> list[dict[str, Any]]:
        """Budgets, spending and what remains, for the datasets this role may use."""
        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute("SELECT * FROM dpsql.budgets ORDER BY dataset_id").fetchall()

    @translate()
    def mechanisms(self) -> list[dict[str, Any]]:
        """The privacy mechanisms the server offers (``SELECT * FROM dpsql.mechanisms()``): name,
        task, the models each trains, whether it needs delta > 0, the ``train`` parameters and
        ``options`` it takes, how it runs on a Citus distributed dataset (``distributed``:
        ``sums``, ``averaged``, ``sampled`` or None, refused; docs/citus.md), a summary and its
        docs page.
        ``dpsql.privacy.MECHANISMS`` holds their Python objects, by name."""
        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute("SELECT * FROM dpsql.mechanisms()").fetchall()

    # -- models --------------------------------------------------------------------------

    def model(self, model_id: int) -> Model:
        """The stored model with this id; :class:`dpsql.errors.NoSuchModel` if there is none."""
        return Model.load(self, model_id)

    @translate()
    def models(self) -> list[Model]:
        """All stored models, oldest first."""
        rows = self.conn.execute("SELECT model_id FROM dpsql.models ORDER BY model_id").fetchall()
        return [self.model(r[0]) for r in rows]

    @translate(not_found=NoSuchModel)
    def evaluate(
        self,
        model: Model | int,
        source: str,
        features: Sequence[str] | str | None = None,
        label: str | None = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        noise_seed: int | None = None,
    ) -> dict[str, Any]:
        """A model's metrics, computed in the server (``dpsql.evaluate``): ``accuracy``
        (classifiers) or ``mse`` (linear), ``rows``, ``baseline`` (the same metric of the
        majority class or the mean on the same rows) and every standard metric
        (``balanced_accuracy``, ``roc_auc``, ``log_loss``, ``f1``; ``mae``, ``r2``) with the
        baseline's under ``"baselines"``. ``source``: a table or query you can read, or, with
        ``epsilon`` (and ``delta``), a registered dataset's name: private metrics charged to
        its budget, each with its noise sd under ``"noise_sd"`` (:mod:`dpsql.evaluation`)."""
        from dpsql import evaluation

        model_id = model.model_id if isinstance(model, Model) else int(model)
        return evaluation.evaluate(
            self.conn,
            model_id,
            source,
            features,
            label,
            epsilon=epsilon,
            delta=delta,
            noise_seed=noise_seed,
        )

    @translate(not_found=NoSuchModel)
    def preview_evaluate(
        self, model: Model | int, dataset: str, epsilon: float, delta: float = 0.0
    ) -> dict[str, Any]:
        """What ``evaluate(model, dataset, epsilon=..., delta=...)`` would charge, without
        charging or reading a row (``dpsql.preview_evaluate``): ``epsilon``, ``delta``,
        ``dp_event``, the budget before and after, and under ``"refused"`` its refusal."""
        from dpsql import evaluation

        model_id = model.model_id if isinstance(model, Model) else int(model)
        return evaluation.preview_evaluate(self.conn, model_id, dataset, epsilon, delta)

    @translate(not_found=NotRegistered)
    def tune(
        self,
        dataset: str,
        validation: str,
        epsilon: float,
        delta: float | None = None,
        *,
        candidates: Sequence[Mapping[str, Any]] | None = None,
        metric: str | None = None,
        noise_seed: int | None = None,
    ) -> Model:
        """Private model selection (``dpsql.tune``, :mod:`dpsql.tuning`): trains the
        ``candidates`` (``train`` keywords without epsilon and delta, e.g. ``{"privacy":
        "dpsgd", "sampling": "poisson"}``; None: ``auto``'s own set) on ``dataset``, scores each
        privately on ``validation`` by ``metric`` (accuracy or mse by default), and returns only
        the best model. Each dataset is charged once, at most ``epsilon`` (and ``delta``; None:
        ``auto``'s rule), before any row is read. The winner's noisy score and the selection
        are in ``model.row["params"]["tune"]``."""
        from dpsql import tuning

        model_id = tuning.tune(
            self.conn, dataset, validation, epsilon, delta, candidates, metric, noise_seed
        )
        if model_id is None:
            raise NothingReleased(
                "dpsql: tune released nothing (no run released a model); the budget is spent"
            )
        return self.model(model_id)

    @translate(not_found=NotRegistered)
    def preview_tune(
        self,
        dataset: str,
        validation: str,
        epsilon: float,
        delta: float | None = None,
        *,
        candidates: Sequence[Mapping[str, Any]] | None = None,
        metric: str | None = None,
    ) -> dict[str, Any]:
        """What :meth:`tune` would do and charge (``dpsql.preview_tune``), charging nothing."""
        from dpsql import tuning

        return tuning.preview_tune(
            self.conn, dataset, validation, epsilon, delta, candidates, metric
        )

    @translate()
    def load_numpy(self, table: str, X: Any, y: Any, **kwargs: Any) -> int:
        """Create ``table(rid, x float8[], y float8)`` from numpy arrays (binary COPY)."""
        from dpsql.loading import load_numpy

        return load_numpy(self.conn, table, X, y, **kwargs)

    @translate()
    def load_file(
        self,
        path: str | os.PathLike[str],
        table: str,
        *,
        if_exists: IfExists = "fail",
        null: Sequence[str] = (),
        header: bool = True,
        columns: Sequence[str] | None = None,
        delimiter: str | None = None,
    ) -> LoadReport:
        """Load a CSV (optionally gzip-compressed) or Parquet file into a new table of the
        caller (the current schema: a data owner's own), with column types inferred and text
        trimmed; the report says what was changed (:func:`dpsql.load_table.load_file`)."""
        from dpsql.load_table import load_file

        return load_file(
            self.conn,
            path,
            table,
            if_exists=if_exists,
            null=null,
            header=header,
            columns=columns,
            delimiter=delimiter,
        )

    @translate()
    def load_dataframe(
        self, frame: Any, table: str, *, if_exists: IfExists = "fail", null: Sequence[str] = ()
    ) -> LoadReport:
        """Load a pandas DataFrame into a new table by the rule of :meth:`load_file`
        (:func:`dpsql.load_table.load_dataframe`)."""
        from dpsql.load_table import load_dataframe

        return load_dataframe(self.conn, frame, table, if_exists=if_exists, null=null)

    @translate()
    def execute(self, query: Statement, params: Any = None) -> psycopg.Cursor[Any]:
        """Run one statement on the underlying connection (errors as for the methods above:
        dpsql's classes by SQLSTATE)."""
        return self.conn.execute(query, params)


def _install_extension(conn: psycopg.Connection, embedded: bool) -> None:
    if embedded:
        extension.ensure_available(conn)
        # Clusters made before the accountant existed: point the server at it once.
        row = conn.execute("SELECT current_setting('dpsql.accountant_command', true)").fetchone()
        if not (row and row[0]):
            accountant_config.set_command(conn, server.accountant_command())
    row = conn.execute(
        "SELECT installed_version, default_version FROM pg_available_extensions"
        " WHERE name = 'dpsql'"
    ).fetchone()
    if row is None:
        raise RuntimeError(
            "dpsql: the server does not have the dpsql extension; install it with "
            "`dpsql install-extension --pg-config /path/to/pg_config` (as the server's owner)"
        )
    installed, default = row
    if installed is None:
        conn.execute("CREATE EXTENSION dpsql")
    elif installed != default:
        conn.execute("ALTER EXTENSION dpsql UPDATE")


def connect(
    dsn: str | psycopg.Connection | Any | None = None,
    *,
    install: bool = True,
    pg_version: int | None = None,
) -> Database:
    """Connect to a dpsql server.

    Parameters
    ----------
    dsn : str, psycopg.Connection or sqlalchemy.engine.Engine, optional
        Where to connect. A string is a libpq DSN or URL (``postgresql+driver://`` accepted).
        When None, ``DPSQL_DSN`` is used if set, else the embedded server is started (or
        joined) and stays up only while this process needs it, unless it was already running.
    install : bool, default True
        Create (or update) the extension in the database when missing; for the embedded server
        also build and install it from the sources first.
    pg_version : int, optional
        PostgreSQL major version of the embedded server (16 or 18).

    Returns
    -------
    Database
    """
    embedded = False
    owns = True
    if dsn is None:
        dsn = os.environ.get("DPSQL_DSN") or None
    if dsn is None:
        dsn = server.start(pg_version, keep_running=False)
        embedded = True
    if isinstance(dsn, psycopg.Connection):
        conn, owns = dsn, False
    elif isinstance(dsn, str):
        conn = psycopg.connect(_libpq_url(dsn), autocommit=True)
    elif hasattr(dsn, "url") and hasattr(dsn, "raw_connection"):
        conn = _from_sqlalchemy(dsn)
        conn.autocommit = True
    else:
        raise TypeError(
            "dpsql.connect: expected a DSN/URL string, a psycopg connection or a SQLAlchemy "
            f"engine, got {type(dsn).__name__}"
        )
    try:
        if install:
            _install_extension(conn, embedded)
    except Exception:
        if owns:
            conn.close()
        raise
    return Database(conn, owns_connection=owns, embedded=embedded)


def _private_args(
    source: str,
    model: str,
    privacy: Any,
    *,
    features: Sequence[str] | None,
    label: str | None,
    **kw: Any,
) -> dict[str, Any]:
    """``dpsql.train``'s (and ``dpsql.preview``'s) named arguments of a private run."""
    if not hasattr(privacy, "sql_args"):
        raise TypeError(f"dpsql: not a privacy mechanism: {privacy!r}")
    kw["lambda"] = float(kw.pop("lambda_", 0.0))
    if kw.get("labels") is not None:
        kw["labels"] = list(kw["labels"])
    return {
        "source": source,
        "features": None if features is None else list(features),
        "label": label,
        "model": model,
        **kw,
        **privacy.sql_args(),
    }


def _call_all(function: str, args: dict[str, Any]) -> sql.Composed:
    """``SELECT function(name => %s, ...)`` for every argument given, None as NULL."""
    schema, name = function.split(".")
    return sql.SQL("SELECT {}.{}({})").format(
        sql.Identifier(schema),
        sql.Identifier(name),
        sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in args
        ),
    )


def _label_array(labels: Sequence[Any]) -> list[Any]:
    """Labels for the server's polymorphic ``labels`` (numbers, booleans or text, in the label
    column's type): a list psycopg sends as float8[], boolean[] or text[]."""
    values = list(labels)
    if all(isinstance(v, bool) for v in values):
        return values
    if all(isinstance(v, (int, float)) for v in values):
        return [float(v) for v in values]
    return [str(v) for v in values]
