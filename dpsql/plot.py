"""Plots of private training (``pip install dpsql[plot]``: matplotlib is imported lazily).

:func:`privacy_utility` trains private models per (mechanism, epsilon), ``runs`` of each, and
draws the test accuracy (or MSE, or R^2) against epsilon; :func:`draw_utility` is its drawing,
for numbers measured elsewhere (the benchmarks' figures); :meth:`dpsql.Model.plot_loss` draws a
non-private run's per-epoch objective. Figures are built without pyplot (no display or global
backend needed): ``path`` is written by the format's own backend (Agg for PNG).

The rules every utility plot follows (issue 42): the y axis is fixed, from the trivial model
(the majority class, or the mean predictor) to a perfect one, so noise in the third digit does
not look like a collapse; a mean outside it is marked on the edge; several runs per point give
error bars (one standard deviation); ``auto`` is labelled with the mechanism it chose; colours
and markers are not repeated within a panel; the legend sits outside the data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from dpsql.errors import NothingReleased, NotRegistered

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from dpsql.connection import Database

__all__ = ["PrivacyUtility", "draw_utility", "privacy_utility", "privacy_utility_runs"]

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
    fig = Figure(figsize=(8.0, 4.8), layout="constrained")  # room for the legend on the right
    return fig, fig.add_subplot()


def chosen_mechanism(params: Any) -> str | None:
    """The mechanism ``auto`` chose, from a model's ``params`` (``dpsql.models.params``):
    ``params->'privacy'->'auto'->'chosen'`` as its server name, with a sampling other than the
    default in brackets (``"dpsgd (poisson)"``); None for a model not trained by ``auto``."""
    privacy = (params or {}).get("privacy") or {}
    chosen = (privacy.get("auto") or {}).get("chosen") if isinstance(privacy, dict) else None
    if not isinstance(chosen, dict) or not chosen.get("privacy"):
        return None
    name = str(chosen["privacy"])
    return f"{name} ({chosen['sampling']})" if chosen.get("sampling") else name


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


METRICS = ("accuracy", "mse", "r2")
_YLABELS = {"accuracy": "test accuracy", "mse": "test MSE", "r2": "test R²"}
# Ten markers and twenty colours (tab10, then tab20's light shades): a panel of up to twenty
# series repeats neither a colour nor a (colour, marker) pair.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")
# the error bars' offset from their epsilon, per series, in decades of the log axis
_DODGE = 0.02
_REFERENCE_STYLES = ((":", "black"), ("-.", "dimgrey"), ((0, (1, 3)), "black"))


@dataclass
class PrivacyUtility:
    """What :func:`privacy_utility_runs` measured: ``values[mechanism][epsilon]`` holds one
    metric per released run; ``chosen[mechanism][epsilon]`` the mechanism each ``auto`` run
    chose; ``failed`` counts runs that released nothing (charged all the same)."""

    dataset: str
    model: str
    metric: str
    epsilons: list[float]
    baseline: float
    values: dict[str, dict[float, list[float]]]
    chosen: dict[str, dict[float, list[str]]] = field(default_factory=dict)
    failed: dict[str, dict[float, int]] = field(default_factory=dict)
    epsilon_spent: float = 0.0
    delta_spent: float = 0.0

    @property
    def baseline_label(self) -> str:
        return "mean predictor" if self.metric in ("mse", "r2") else "majority class"

    def label(self, mechanism: str) -> str:
        """The legend's name: ``auto`` with the mechanism it chose."""
        return series_label(mechanism, self.chosen.get(mechanism, {}))

    def table(self) -> str:
        """The numbers as a fixed-width table: epsilon, mechanism, mean ± sd, runs."""
        head = ("epsilon", "mechanism", f"{self.metric} mean ± sd", "runs")
        rows: list[tuple[str, ...]] = []
        for name, by_eps in self.values.items():
            for eps in self.epsilons:
                vals = by_eps.get(eps, [])
                chosen = sorted(set(self.chosen.get(name, {}).get(eps, [])))
                mech = f"{name} → {', '.join(chosen)}" if chosen else name
                failed = self.failed.get(name, {}).get(eps, 0)
                runs = f"{len(vals)}" + (f" (+{failed} released nothing)" if failed else "")
                rows.append((f"{eps:g}", mech, mean_sd(vals), runs))
        rows.append(("", f"baseline ({self.baseline_label})", f"{self.baseline:.4f}", ""))
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in (head, *rows)
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def spent(self) -> str:
        """The total charged to the dataset's ledger by these runs."""
        return (
            f"spent on {self.dataset}: epsilon {self.epsilon_spent:g}, delta {self.delta_spent:g}"
        )


def mean_sd(values: Sequence[float]) -> str:
    """``mean ± sd`` (sample sd), the mean alone for one value, ``-`` for none."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "-"
    if len(finite) == 1:
        return f"{finite[0]:.4f}"
    return f"{statistics.mean(finite):.4f} ± {statistics.stdev(finite):.4f}"


def series_label(name: str, chosen: Mapping[float, Sequence[str]]) -> str:
    """``name``, or ``"auto → objective_perturbation"`` when runs of it chose mechanisms;
    a choice that changed with epsilon names each one's epsilons:
    ``"auto → dpsgd_f (ε 0.1–0.5), dpgd (ε 1–4)"``."""
    spans: list[tuple[str, list[float]]] = []
    for eps in sorted(chosen):
        for pick in sorted(set(chosen[eps])):
            if spans and spans[-1][0] == pick:
                spans[-1][1].append(eps)
            else:
                spans.append((pick, [eps]))
    if not spans:
        return name
    if len({pick for pick, _ in spans}) == 1:
        return f"{name} → {spans[0][0]}"
    parts = []
    for pick, at in spans:
        where = f"{at[0]:g}" if len(at) == 1 else f"{at[0]:g}–{at[-1]:g}"
        parts.append(f"{pick} (ε {where})")
    return f"{name} → " + ", ".join(parts)


def utility_limits(metric: str, baseline: float) -> tuple[float, float]:
    """The y axis of a utility plot: from the trivial model up to a perfect one (accuracy and
    R^2 up to 1), or for MSE from 0 up to a quarter above the trivial model's, whatever was
    measured: the same data always gives the same axis."""
    if metric == "mse":
        return 0.0, 1.25 * baseline if baseline > 0 else 1.0
    if metric not in ("accuracy", "r2"):
        raise ValueError(f"dpsql: metric must be one of {', '.join(METRICS)}, got {metric!r}")
    top = 1.0
    span = top - baseline if top > baseline else 1.0
    return baseline - 0.05 * span, top


def draw_utility(
    ax: Axes,
    epsilons: Sequence[float],
    series: Mapping[str, Mapping[float, Sequence[float]]],
    *,
    metric: str,
    baseline: float,
    baseline_label: str = "majority class",
    references: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    legend: bool = True,
) -> None:
    """Draw utility against epsilon on ``ax`` by the module's rules.

    ``series[name][epsilon]`` holds the runs' values of one point (several give an error bar of
    one standard deviation around their mean, the series' bars set a little apart around each
    epsilon; none leaves a gap); ``labels[name]`` replaces the
    name in the legend (:func:`series_label`); ``references`` are horizontal lines such as a
    non-private model's; ``baseline`` is the trivial model's value, the bottom of the axis
    (``metric`` ``"accuracy"`` or ``"r2"``) or near its top (``"mse"``).
    """
    low, high = _axis_range(metric, baseline)
    colours = _colours(len(series))
    several = any(len(v) > 1 for by_eps in series.values() for v in by_eps.values())
    handles: list[Any] = []  # the legend in drawing order (errorbar containers last otherwise)
    for i, (name, by_eps) in enumerate(series.items()):
        label = (labels or {}).get(name, name)
        xs = [e for e in epsilons if _finite(by_eps.get(e, []))]
        if not xs:
            continue  # nothing released at any epsilon: said in the caller's table
        means = [statistics.mean(_finite(by_eps[e])) for e in xs]
        # a mean beyond the axis is a triangle on its edge, not a line or a bar through the data
        shown = [m if low <= m <= high else math.nan for m in means]
        style = {"color": colours[i], "marker": _MARKERS[i % len(_MARKERS)], "label": label}
        # side by side around each epsilon (a few percent on the log axis): bars stay apart
        shift = 10 ** (_DODGE * (i - (len(series) - 1) / 2)) if several else 1.0
        if several:
            sds = [statistics.stdev(v) if len(v := _finite(by_eps[e])) > 1 else 0.0 for e in xs]
            sds = [sd if math.isfinite(m) else math.nan for sd, m in zip(sds, shown, strict=True)]
            handles.append(
                ax.errorbar(
                    [x * shift for x in xs],
                    shown,
                    yerr=sds,
                    capsize=3,
                    markersize=5,
                    linewidth=1.4,
                    **style,
                )
            )
        else:
            handles += ax.plot(xs, shown, markersize=5, linewidth=1.4, **style)
        _mark_outside(ax, [x * shift for x in xs], means, (low, high), colours[i])
    for j, (name, value) in enumerate((references or {}).items()):
        linestyle, colour = _REFERENCE_STYLES[j % len(_REFERENCE_STYLES)]
        handles.append(
            ax.axhline(value, color=colour, linestyle=linestyle, linewidth=1.2, label=name)
        )
    if math.isfinite(baseline):
        label = f"baseline ({baseline_label})"
        handles.append(
            ax.axhline(baseline, color="grey", linestyle="--", linewidth=1.2, label=label)
        )
    if math.isfinite(low) and math.isfinite(high):
        ax.set_ylim(low, high)
    ax.set_xscale("log")
    # ticks at the epsilons themselves, without the log axis's crowded minor labels
    ax.set_xticks(list(epsilons), [f"{e:g}" for e in epsilons])
    ax.minorticks_off()
    ax.set_xlabel("epsilon")
    ax.set_ylabel(_YLABELS[metric])
    ax.grid(True, alpha=0.3)
    if legend:
        # outside the data, to the right of the axes
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            fontsize=8,
        )


def _axis_range(metric: str, baseline: float) -> tuple[float, float]:
    if math.isfinite(baseline):
        return utility_limits(metric, baseline)
    # nothing was scored, so no trivial model either: accuracy's whole range, else autoscale
    return (0.0, 1.0) if metric == "accuracy" else (-math.inf, math.inf)


def _mark_outside(
    ax: Axes, xs: Sequence[float], means: Sequence[float], limits: tuple[float, float], colour: Any
) -> None:
    """A mean beyond the axis: a triangle on the edge, pointing the way out."""
    low, high = limits
    for x, m in zip(xs, means, strict=True):
        if m < low or m > high:
            edge, mark = (low, "v") if m < low else (high, "^")
            ax.plot(
                [x],
                [edge],
                marker=mark,
                color=colour,
                markersize=9,
                markeredgecolor="white",
                linestyle="none",
                clip_on=False,
                zorder=5,  # above the spine it sits on
            )


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    tab10 = list(colormaps["tab10"].colors)  # type: ignore[attr-defined]
    light = list(colormaps["tab20"].colors)[1::2]  # type: ignore[attr-defined]
    palette = tab10 + light
    return [palette[i % len(palette)] for i in range(n)]


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
    runs: int = 1,
    metric: str | None = None,
    ax: Axes | None = None,
    path: str | None = None,
    report: TextIO | None = None,
    **train_kwargs: Any,
) -> Figure:
    """Test accuracy (classification) or MSE (regression) against epsilon, one line per mechanism.

    **This spends budget**: ``runs`` private models per (mechanism, epsilon) are trained on the
    registered ``dataset`` and charged to its ledger, ``runs * len(mechanisms) * sum(epsilons)``
    (and each mechanism's delta) in all. A plan that exceeds the dataset's remaining budget is
    refused with ValueError before anything is trained.

    The y axis runs from the trivial model (the majority class, or the mean predictor) to a
    perfect one (:func:`utility_limits`); several runs give error bars of one standard deviation;
    ``auto`` is labelled with the mechanism it chose (``auto → dpsgd (poisson)``).

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
        The shuffle seed of the first run; run i uses ``seed + i`` (the noise stays random).
    delta : float, optional
        Passed to every mechanism (default: each mechanism's own).
    runs : int
        Models per (mechanism, epsilon): the error bars' sample.
    metric : str, optional
        ``"accuracy"`` (classification, the default), ``"mse"`` (regression's default) or
        ``"r2"``.
    ax : matplotlib Axes, optional
        Draw there instead of on a new figure.
    path : str, optional
        Also save the figure there (format from the suffix).
    report : text file, optional
        Also write the numbers there (:meth:`PrivacyUtility.table`) and what was spent, e.g.
        ``sys.stdout`` (``dpsql plot`` does).
    **train_kwargs
        More keywords of :meth:`dpsql.Database.train` (epochs, batch_size, ...).

    Returns
    -------
    matplotlib.figure.Figure
        A run whose mechanism released nothing (:class:`dpsql.NothingReleased`, still charged)
        is left out of its point's mean (a point with no release is a gap).
    """
    fig, axes = figure_and_axes(ax)  # before spending anything: matplotlib must be there
    result = privacy_utility_runs(
        db,
        dataset,
        mechanisms,
        epsilons,
        test=test,
        model=model,
        seed=seed,
        delta=delta,
        runs=runs,
        metric=metric,
        **train_kwargs,
    )
    draw_utility(
        axes,
        result.epsilons,
        result.values,
        metric=result.metric,
        baseline=result.baseline,
        baseline_label=result.baseline_label,
        labels={name: result.label(name) for name in result.values},
    )
    per_point = f"mean ± sd of {runs} runs" if runs > 1 else "one run per point"
    axes.set_title(f"{dataset}: {result.model}, privacy vs utility ({per_point})", fontsize=10)
    if report is not None:
        print(result.table(), file=report)
        print(result.spent(), file=report)
    if path is not None:
        fig.savefig(path)
    return fig


def privacy_utility_runs(
    db: Database,
    dataset: str,
    mechanisms: Sequence[str],
    epsilons: Sequence[float],
    *,
    test: str | None = None,
    model: str | None = None,
    seed: int | None = None,
    delta: float | None = None,
    runs: int = 1,
    metric: str | None = None,
    **train_kwargs: Any,
) -> PrivacyUtility:
    """The trainings and evaluations of :func:`privacy_utility` (the same arguments and the
    same charge), without drawing."""
    before, regression = _plan(db, dataset, mechanisms, epsilons, model, delta, runs)
    metric = metric or ("mse" if regression else "accuracy")
    if metric not in METRICS or (metric == "accuracy") == regression:
        task = "regression" if regression else "classification"
        allowed = "mse, r2" if regression else "accuracy"
        raise ValueError(f"dpsql: metric {metric!r} does not fit {task}: use {allowed}")
    model = model or ("linear" if regression else "logistic")
    plan = [[mechanism(name, e, delta) for e in epsilons] for name in mechanisms]
    source = before["source"]
    epsilons = [float(e) for e in epsilons]
    result = PrivacyUtility(dataset, model, metric, epsilons, math.nan, {})
    for name, line in zip(mechanisms, plan, strict=True):
        values = result.values.setdefault(name, {})
        for eps, mech in zip(epsilons, line, strict=True):
            values[eps] = []
            for run in range(runs):
                try:
                    released = db.train(
                        dataset,
                        None,
                        None,
                        model=model,
                        privacy=mech,
                        seed=None if seed is None else seed + run,
                        progress=False,
                        **train_kwargs,
                    )
                except NothingReleased:
                    failed = result.failed.setdefault(name, {})
                    failed[eps] = failed.get(eps, 0) + 1
                    continue
                scored = db.evaluate(released, test or source)
                values[eps].append(float(scored[metric]))
                # the trivial model's score on the same test rows: what a model must beat
                base = scored["baseline"] if metric != "r2" else scored["baselines"].get("r2", 0)
                result.baseline = float(base)
                pick = chosen_mechanism(released.row.get("params"))
                if pick is not None:
                    result.chosen.setdefault(name, {}).setdefault(eps, []).append(pick)
    after = db.execute(
        "SELECT epsilon_spent, delta_spent FROM dpsql.my_datasets WHERE name = %s", (dataset,)
    ).fetchone()
    if after is not None:  # what the ledger charged, NothingReleased runs included
        result.epsilon_spent = float(after[0]) - before["epsilon_spent"]
        result.delta_spent = float(after[1]) - before["delta_spent"]
    return result


def _plan(
    db: Database,
    dataset: str,
    mechanisms: Sequence[str],
    epsilons: Sequence[float],
    model: str | None,
    delta: float | None,
    runs: int,
) -> tuple[dict[str, Any], bool]:
    """Refuse, before spending, a plan that cannot run or that the budget cannot pay; the
    dataset's source and ledger before the runs, and whether it is a regression."""
    if not mechanisms or not epsilons:
        raise ValueError("dpsql: give at least one mechanism and one epsilon")
    if any(not (e > 0 and math.isfinite(e)) for e in epsilons):
        raise ValueError(f"dpsql: epsilons must be positive and finite, got {list(epsilons)}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"dpsql: runs must be a positive integer, got {runs!r}")
    row = db.execute(
        "SELECT source, labels, epsilon_remaining, delta_remaining, epsilon_spent, delta_spent"
        " FROM dpsql.my_datasets WHERE name = %s",
        (dataset,),
    ).fetchone()
    if row is None:
        raise NotRegistered(f"dpsql: no dataset {dataset!r} that this role may train on")
    source, labels, eps_left, delta_left, eps_spent, delta_spent = row
    regression = labels is None
    plan = [[mechanism(name, e, delta) for e in epsilons] for name in mechanisms]
    _check_models(db, mechanisms, model or ("linear" if regression else "logistic"))
    eps_total = runs * sum(float(m.epsilon) for line in plan for m in line)
    delta_total = runs * sum(float(getattr(m, "delta", 0.0) or 0.0) for line in plan for m in line)
    if eps_total > eps_left + _BUDGET_SLACK or delta_total > delta_left + _BUDGET_SLACK:
        raise ValueError(
            f"dpsql: the plan spends epsilon {eps_total:g}, delta {delta_total:g} on "
            f"{dataset!r}, which has epsilon {eps_left:g}, delta {delta_left:g} left; "
            "use fewer mechanisms, epsilons or runs"
        )
    ledger = {
        "source": source,
        "epsilon_spent": float(eps_spent),
        "delta_spent": float(delta_spent),
    }
    return ledger, regression


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
