"""``dpsql tune DATASET VALIDATION --epsilon E``: private model selection (dpsql.tune): the
candidates trained on DATASET, scored privately on VALIDATION, only the best released;
``--dry-run`` shows the plan and the charges without charging (dpsql.preview_tune)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["add_parser", "command"]

_DSN_HELP = "server (default: $DPSQL_DSN or the running embedded one)"


def _candidates(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise argparse.ArgumentTypeError(
            'a JSON array of objects, e.g. \'[{"privacy": "bolton"}]\''
        )
    return value


def add_parser(commands: Any) -> None:
    """The ``tune`` command."""
    tune = commands.add_parser(
        "tune",
        help="choose privately among candidate mechanisms and settings; release only the best",
        description="Private model selection: trains candidates on DATASET, scores each "
        "privately on VALIDATION (a holdout: dpsql dataset register ... --holdout 0.2), and "
        "releases only the best model. Each dataset is charged once, at most --epsilon (and "
        '--delta), before any row is read (docs/privacy.md, "Private selection").',
    )
    tune.add_argument("dataset", help="the registered dataset to train on")
    tune.add_argument("validation", help="the registered dataset to score on (e.g. NAME_holdout)")
    tune.add_argument("--epsilon", type=float, required=True, help="epsilon per dataset")
    tune.add_argument(
        "--delta",
        type=float,
        help="delta of the training dataset (default: auto's rule; 0: pure candidates only)",
    )
    tune.add_argument(
        "--candidates",
        type=_candidates,
        metavar="JSON",
        help='dpsql.train arguments per candidate, e.g. \'[{"privacy": "dpsgd", "sampling": '
        '"poisson"}, {"privacy": "bolton"}]\' (default: auto\'s candidates)',
    )
    tune.add_argument(
        "--metric",
        help="accuracy, balanced_accuracy, f1, roc_auc (classification); mse, mae, r2 "
        "(regression); default accuracy or mse",
    )
    tune.add_argument(
        "--dry-run", action="store_true", help="show the plan and the charges, charging nothing"
    )
    tune.add_argument("--dsn", help=_DSN_HELP)


def command(args: argparse.Namespace, connect: Callable[[str | None], Any]) -> int:
    """Run ``dpsql tune``: the released model (or, with ``--dry-run``, the plan; 1 if refused)."""
    from dpsql import tuning
    from dpsql.cli_tables import render_json
    from dpsql.errors import translated

    with connect(args.dsn) as db, translated():
        if args.dry_run:
            plan = tuning.preview_tune(
                db.conn,
                args.dataset,
                args.validation,
                args.epsilon,
                args.delta,
                args.candidates,
                args.metric,
            )
            print(render_json(plan))
            return (
                1
                if plan.get("refused") or any(b.get("exceeded") for b in plan.get("budgets") or [])
                else 0
            )
        model_id = tuning.tune(
            db.conn,
            args.dataset,
            args.validation,
            args.epsilon,
            args.delta,
            args.candidates,
            args.metric,
        )
        if model_id is None:
            print("dpsql: tune released nothing (no run released a model); the budget is spent",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(summary(db.model(model_id), args.dataset))
    return 0


def validated(
    args: argparse.Namespace,
    dataset: str,
    epsilon: float,
    delta: float | None,
    connect: Callable[[str | None], Any],
) -> int:
    """``dpsql train DATASET --privacy auto --validation V``: auto's candidates through
    ``dpsql.train(..., validation => V)`` (``--dry-run``: dpsql.preview_tune's plan)."""
    import dpsql
    from dpsql import tuning
    from dpsql.cli_tables import render_json
    from dpsql.errors import translated

    with connect(args.dsn) as db, translated():
        if args.dry_run:
            plan = tuning.preview_tune(db.conn, dataset, args.validation, epsilon, delta)
            print(render_json(plan))
            return 1 if plan.get("refused") else 0
        model = db.train(
            dataset,
            None,
            None,
            args.model,
            privacy=dpsql.Auto(epsilon=epsilon, delta=delta),
            validation=args.validation,
            progress=not args.no_progress,
        )
        print(summary(model, dataset))
    return 0


def summary(model: Any, dataset: str) -> str:
    """One line: the released model, the winning candidate, its noisy score and the charges."""
    t = model.row["params"]["tune"]
    return (
        f"model {model.model_id}: {model.row['privacy']} (candidate {t['candidate']} of "
        f"{len(t['candidates'])}: {json.dumps(t['candidates'][t['candidate'] - 1])}), "
        f"{t['metric']} {t['score']:.4g} on {t['validation']} (noisy, {t['score_noise']}); "
        f"{t['runs']} runs; charged epsilon {t['epsilon']:.4g} (delta {t['delta']:g}) to "
        f"{dataset} and {t['validation_epsilon']:.4g} to {t['validation']}"
    )
