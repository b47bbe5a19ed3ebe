"""Plots of private training (``pip install dpsql[plot]``: matplotlib is imported lazily).

:func:`privacy_utility` trains one private model per (mechanism, epsilon) and draws the test
accuracy (or MSE) against epsilon; :meth:`dpsql.Model.plot_loss` draws a non-private run's
per-epoch objective. Figures are built without pyplot (no display or global backend needed):
``path`` is written by the format's own backend (Agg for PNG).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpsql.errors import NothingReleased, NotRegistered

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from dpsql.connection import Database

__all__ = ["privacy_utility"]

# Slack for the budget comparison: the ledger sums floats too.
_BUDGET_SLACK = 1e-9


def figure_and_axes(ax: Axes | None) -> tuple[Figure, Axes]:
    """``ax`` and its figure, or a new figure with one axes (matplotlib imported here)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("dpsql: plotting needs matplotlib: pip install 'dpsql[plot]'") from err
    if ax is not None:
        root = ax.figure
        if not isinstance(root, Figure):  # a SubFigure: save and return the whole figure
            root = root.figure
        assert isinstance(root, Figure)
        return root, ax
    fig = Figure(figsize=(6.4, 4.8), layout="constrained")
    return fig, fig.add_subplot()


def mechanism(name: str, epsilon: float, delta: float | None) -> Any:
    """The mechanism object of a server name (``dpsql.privacy.MECHANISMS`` or ``"auto"``)."""
    from dpsql.privacy import mechanism_class

    cls = mechanism_class(name)
    kwargs: dict[str, Any] = {"epsilon": float(epsilon)}
    if delta is not None:
        kwargs["delta"] = float(delta)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ValueError(f"dpsql: {name} needs delta=... ({err})") from err


def privacy_utility(
    db: Database,
    dataset: str,
    mechanisms: Sequence[str],
    epsilons: Sequence[float],
    *,
    test: str | None = None,
    model: str | None = None,
    seed: int | None = None,
    delta: float | None = None,
    ax: Axes | None = None,
    path: str | None = None,
    **train_kwargs: Any,
) -> Figure:
    """Test accuracy (classification) or MSE (regression) against epsilon, one line per mechanism.

    **This spends budget**: one private model per (mechanism, epsilon) is trained on the
    registered ``dataset`` and charged to its ledger, ``len(mechanisms) * sum(epsilons)`` (and
    each mechanism's delta) in all. A plan that exceeds the dataset's remaining budget is
    refused with ValueError before anything is trained.

    Parameters
    ----------
    db : dpsql.Database
    dataset : str
        A registered dataset the caller may train on.
    mechanisms : sequence of str
        Server names (``SELECT name FROM dpsql.mechanisms()``, or ``"auto"``).
    epsilons : sequence of float
        The epsilons of the x axis (log scale).
    test : str, optional
        Table or SELECT query with the dataset's feature and label columns, evaluated with
        ``Database.evaluate``: the caller needs SELECT on it (analysts get it from the data
        owner). Default: the dataset's own source, which only its owner may read (and the
        accuracy on training rows is itself not private).
    model : str, optional
        ``dpsql.train``'s model; default logistic (classification) or linear (regression).
    seed : int, optional
        The shuffle seed of every run (the noise stays random).
    delta : float, optional
        Passed to every mechanism (default: each mechanism's own).
    ax : matplotlib Axes, optional
        Draw there instead of on a new figure.
    path : str, optional
        Also save the figure there (format from the suffix).
    **train_kwargs
        More keywords of :meth:`dpsql.Database.train` (epochs, batch_size, ...).

    Returns
    -------
    matplotlib.figure.Figure
        A run whose mechanism released nothing (:class:`dpsql.NothingReleased`, still charged)
        is a gap in its line.
    """
    fig, axes = figure_and_axes(ax)  # before spending anything: matplotlib must be there
    if not mechanisms or not epsilons:
        raise ValueError("dpsql: give at least one mechanism and one epsilon")
    if any(not (e > 0 and math.isfinite(e)) for e in epsilons):
        raise ValueError(f"dpsql: epsilons must be positive and finite, got {list(epsilons)}")
    row = db.execute(
        "SELECT source, labels, epsilon_remaining, delta_remaining FROM dpsql.my_datasets"
        " WHERE name = %s",
        (dataset,),
    ).fetchone()
    if row is None:
        raise NotRegistered(f"dpsql: no dataset {dataset!r} that this role may train on")
    source, labels, eps_left, delta_left = row
    regression = labels is None
    model = model or ("linear" if regression else "logistic")
    plan = [[mechanism(name, e, delta) for e in epsilons] for name in mechanisms]
    _check_models(db, mechanisms, model)
    eps_total = sum(float(m.epsilon) for line in plan for m in line)
    delta_total = sum(float(getattr(m, "delta", 0.0) or 0.0) for line in plan for m in line)
    if eps_total > eps_left + _BUDGET_SLACK or delta_total > delta_left + _BUDGET_SLACK:
        raise ValueError(
            f"dpsql: the plan spends epsilon {eps_total:g}, delta {delta_total:g} on "
            f"{dataset!r}, which has epsilon {eps_left:g}, delta {delta_left:g} left; "
            "use fewer mechanisms or epsilons"
        )
    metric = "mse" if regression else "accuracy"
    baselines: list[float] = []
    for name, line in zip(mechanisms, plan, strict=True):
        values = []
        for mech in line:
            try:
                released = db.train(
                    dataset,
                    None,
                    None,
                    model=model,
                    privacy=mech,
                    seed=seed,
                    progress=False,
                    **train_kwargs,
                )
            except NothingReleased:
                values.append(math.nan)
                continue
            scored = db.evaluate(released, test or source)
            values.append(float(scored[metric]))
            baselines.append(float(scored["baseline"]))
        axes.plot(list(epsilons), values, marker="o", label=name)
    if baselines:
        # the majority class (or the mean) on the same test rows: what a model must beat
        predictor = "mean" if regression else "majority class"
        axes.axhline(baselines[0], color="grey", linestyle="--", label=f"baseline ({predictor})")
    axes.set_xscale("log")
    # ticks at the epsilons themselves, without the log axis's crowded minor labels
    axes.set_xticks(list(epsilons), [f"{e:g}" for e in epsilons])
    axes.minorticks_off()
    axes.set_xlabel("epsilon")
    axes.set_ylabel("test MSE" if regression else "test accuracy")
    axes.set_title(f"{dataset}: {model}, privacy vs utility")
    axes.legend(title="mechanism")
    if path is not None:
        fig.savefig(path)
    return fig


def _check_models(db: Database, names: Sequence[str], model: str) -> None:
    """Refuse, before spending, a mechanism that does not train this model."""
    task = "regression" if model in ("linear", "lasso") else "classification"
    catalog = {r["name"]: r for r in db.mechanisms()}
    for name in names:
        entry = catalog.get(name)
        if entry is None:  # "auto": the server chooses among the others
            continue
        models = entry.get("models")
        fits = model in models if models else entry.get("task") in (task, "any")
        if not fits:
            raise ValueError(f"dpsql: {name} does not train {model} models")
