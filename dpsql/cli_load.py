"""``dpsql load FILE TABLE``: a CSV (optionally gzip-compressed) or Parquet file into a new
table of the caller, with the report of what was changed (dpsql.load_table holds the rule)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "command", "render_report"]

_DSN_HELP = "server (default: $DPSQL_DSN or the running embedded one)"


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")]


def add_parser(commands: Any) -> None:
    """The ``load`` command."""
    from dpsql.load_table import RULE

    load = commands.add_parser(
        "load",
        help="load a CSV (.gz) or Parquet file into a new table: types inferred, text trimmed",
        description="Load a CSV file (optionally gzip-compressed) or a Parquet file (needs "
        "pyarrow) into a new table of yours (TABLE: in your current schema, a data owner's "
        f"own, or schema.table). The rule: {RULE}. Column names are the header's, lowercased, "
        "other characters than letters, digits and _ as _. Prints what was done: rows, each "
        "column's type, how many values were trimmed or made NULL, the usual missing-value "
        "marks (such as '?') kept as text. One transaction: a refused load changes nothing.",
    )
    load.add_argument("file", type=Path, help="the CSV, CSV.gz or Parquet file")
    load.add_argument("table", help="the table to create ([schema.]table)")
    load.add_argument(
        "--if-exists",
        choices=("fail", "replace", "append"),
        default="fail",
        help="when TABLE exists: refuse (the default), replace it (drop it first) or append "
        "the rows (columns matched by name, values cast to the table's types)",
    )
    load.add_argument(
        "--null",
        action="append",
        default=[],
        metavar="MARK",
        help="load this value (after trimming) as NULL, e.g. --null '?' (repeatable); empty "
        "values are always NULL",
    )
    load.add_argument(
        "--no-header",
        dest="header",
        action="store_false",
        help="the CSV's first line is data (columns: column_1, ... or --columns)",
    )
    load.add_argument(
        "--columns", type=_list, metavar="A,B", help="column names instead of the header's"
    )
    load.add_argument(
        "--delimiter", help="the CSV's delimiter (default: a tab for .tsv files, else a comma)"
    )
    load.add_argument("--json", action="store_true", help="print the report as JSON")
    load.add_argument("--dsn", help=_DSN_HELP)


def command(args: argparse.Namespace, connect: Callable[[str | None], Any]) -> int:
    """Run ``dpsql load``; prints the report (1 and one line if refused)."""
    from dpsql.cli_tables import render_json
    from dpsql.load_table import TableExists

    with connect(args.dsn) as db:
        try:
            report = db.load_file(
                args.file,
                args.table,
                if_exists=args.if_exists,
                null=args.null,
                header=args.header,
                columns=args.columns,
                delimiter=args.delimiter,
            )
        except TableExists as err:
            print(
                f"dpsql: table {err.table} exists ({err.rows} rows): nothing loaded\n"
                "hint: --if-exists replace drops it first, --if-exists append adds the rows",
                file=sys.stderr,
            )
            return 1
    print(render_json(report.as_dict()) if args.json else render_report(report))
    return 0


def _note(column: Any) -> str:
    """What a person should know about a column's values, in the CLI's flags."""
    notes = []
    if column.name != column.source_name:
        notes.append(f"from {column.source_name!r}")
    for mark, count in column.marked_null.items():
        notes.append(f"{count} {mark!r} as NULL")
    for mark, count in column.kept_marks.items():
        notes.append(f"{count} {mark!r} kept as text (--null {_shell(mark)}: NULL)")
    if column.non_numbers:
        shown = ", ".join(repr(v) for v in column.non_numbers)
        notes.append(f"numbers but for {shown}")
    return "; ".join(notes)


def _shell(mark: str) -> str:
    import shlex

    return shlex.quote(mark)


def render_report(report: Any) -> str:
    """The report as a person reads it: one line, then a table of the columns."""
    from dpsql.cli_tables import render_table

    rows = [
        {
            "column": c.name,
            "type": c.type,
            "trimmed": c.trimmed,
            "nulls": c.nulls,
            "note": _note(c),
        }
        for c in report.columns
    ]
    head = (
        f"{report.action} table {report.table}: {report.rows} rows from {report.source} "
        f"in {report.seconds:.1f} s"
    )
    columns = ["column", "type", "trimmed", "nulls", "note"]
    # (notes are whole here: render_table would cut them at its cell width)
    table = render_table([{**r, "note": ""} for r in rows], columns[:-1]).splitlines()
    lines = [line.ljust(len(table[0])) for line in table]
    lines[0] += "  note"
    lines[1] += "  ----"
    for k, row in enumerate(rows):
        lines[k + 2] = (lines[k + 2] + "  " + row["note"]).rstrip()
    return "\n".join([head, *(line.rstrip() for line in lines)])
