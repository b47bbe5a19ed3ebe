"""``dpsql describe DATASET --epsilon E``: private exploratory statistics of a registered
dataset (dpsql.describe), one charge to its ledger; ``--dry-run`` shows the charge and the
epsilon split without charging (dpsql.preview_describe)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["add_parser", "command"]

_DSN_HELP = "server (default: $DPSQL_DSN or the running embedded one)"


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_parser(commands: Any) -> None:
    """The ``describe`` command."""
    describe = commands.add_parser(
        "describe",
        help="private statistics of a registered dataset: means, spreads, quantiles, "
        "histograms, frequencies (charged once)",
        description="Private exploratory statistics of a registered dataset, for analysts "
        "without SELECT on its table: each numeric column's mean, stddev, quantiles (0.1, "
        "0.25, 0.5, 0.75, 0.9) and histogram over its public bounds, each categorical "
        "column's and a classification label's frequencies, and the public row count. One "
        "charge of (epsilon, delta) to the dataset's ledger, split over the statistics by a "
        "public rule (docs/describe.md).",
    )
    describe.add_argument("dataset", help="the registered dataset's name")
    describe.add_argument("--epsilon", type=float, required=True, help="epsilon to spend")
    describe.add_argument(
        "--delta",
        type=float,
        default=0.0,
        help="delta to spend (default 0: pure epsilon-DP; > 0: Gaussian noise on the sums)",
    )
    describe.add_argument(
        "--features",
        type=_list,
        metavar="A,B",
        help="the columns to describe (default: every feature and the label)",
    )
    describe.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be charged and the epsilon split, without charging",
    )
    describe.add_argument("--json", action="store_true", help="print the answer as JSON")
    describe.add_argument("--dsn", help=_DSN_HELP)


def command(args: argparse.Namespace, connect: Callable[[str | None], Any]) -> int:
    """Run ``dpsql describe``: the statistics as a table (or JSON); with ``--dry-run`` the
    preview (1 when the release would be refused)."""
    from dpsql import describe
    from dpsql.cli_tables import render_json
    from dpsql.errors import translated

    with connect(args.dsn) as db, translated():
        if args.dry_run:
            preview = describe.preview_describe(
                db.conn, args.dataset, args.epsilon, args.delta, args.features
            )
        else:
            records = describe.describe_records(
                db.conn, args.dataset, args.epsilon, args.delta, args.features
            )
    if args.dry_run:
        if args.json:
            print(render_json(preview))
        else:
            print(_render_preview(preview))
        return 1 if preview.get("refused") else 0
    print(render_json(records) if args.json else describe.render(records))
    return 0


def _render_preview(preview: dict[str, Any]) -> str:
    refused = preview.get("refused")
    if refused and "epsilon" not in preview:
        hint = f"\nhint: {refused['hint']}" if refused.get("hint") else ""
        return f"refused: {refused.get('message')}{hint}"
    budget = preview.get("budget", {})
    plan = preview.get("plan", {})
    lines = [
        f"describe {preview.get('dataset')} ({preview.get('rows')} rows) would charge "
        f"epsilon {preview.get('epsilon')}, delta {preview.get('delta')}",
        f"budget left after: epsilon {_after(budget, 'epsilon', preview)}, "
        f"delta {_after(budget, 'delta', preview)}",
        "split (epsilon per statistic):",
    ]
    for stat in ("mean", "stddev", "histogram", "quantile", "frequency", "sums"):
        if stat in plan:
            part = plan[stat]
            lines.append(f"  {stat}: {part['epsilon']:.4g} ({part['noise']})")
    if refused:
        lines.append(f"refused: {refused.get('message')}")
    return "\n".join(lines)


def _after(budget: dict[str, Any], what: str, preview: dict[str, Any]) -> str:
    remaining = budget.get(f"{what}_remaining")
    if remaining is None:
        return "?"
    return f"{remaining - float(preview.get(what) or 0):.6g}"
