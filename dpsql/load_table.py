"""Loading a CSV or Parquet file, or a pandas DataFrame, into a new table of the caller, with
column types inferred and text trimmed (``dpsql load``, ``Database.load_file``,
``Database.load_dataframe``).

Every source becomes one CSV byte stream (a file as it is, gzip-decompressed; a DataFrame by
``to_csv``; a Parquet file by pyarrow's CSV writer) that ``COPY ... FROM STDIN`` puts into a
temporary table of text columns. The typing and trimming rule (:data:`RULE`) then runs in the
server, in one scan, and ``INSERT ... SELECT`` casts the trimmed values into the table: one rule
for every source, and no per-row Python. Everything happens in one transaction: a refused load
creates, replaces or appends nothing.

The rule: leading and trailing whitespace is trimmed from every value (the UCI Adult CSV has
" <=50K", which registration then reports as a value that is not a declared label); a value
that is empty after trimming is NULL, as are the ``null`` marks the caller names; a column is
``bigint`` when every other value is an integer (``numeric`` past 18 digits), ``double
precision`` when every value is a number, ``boolean`` when every value is true or false (any
case), else ``text``. Usual marks of a missing value ("?", "NA", ...) are kept as text unless
named in ``null``, and the report counts them: dpsql does not guess which values are missing.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg import sql

__all__ = [
    "RULE",
    "ColumnReport",
    "LoadReport",
    "TableExists",
    "load_dataframe",
    "load_file",
    "table_identifier",
]

RULE = (
    "values trimmed of leading and trailing whitespace; empty values and the null marks are "
    "NULL; a column is bigint if every value is an integer (numeric past 18 digits), double "
    "precision if every value is a number, boolean if every value is true or false, else text"
)

IfExists = Literal["fail", "replace", "append"]

# The usual marks of a missing value: kept as text unless named in ``null``, but counted.
MISSING_MARKS = ("?", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "-")

_WHITESPACE = " \t\r\n\f\v"
_INTEGER = r"^[+-]?[0-9]+$"
_NUMBER = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_BIGINT_DIGITS = 18  # |v| < 10^18 always fits int8
_CHUNK = 1 << 20
_FRAME_ROWS = 100_000


class TableExists(ValueError):
    """The target table exists and ``if_exists`` is ``"fail"``: nothing was loaded."""

    def __init__(self, table: str, rows: int) -> None:
        self.table = table
        self.rows = rows
        super().__init__(
            f"dpsql: table {table} exists ({rows} rows): nothing loaded; pass "
            "if_exists='replace' to drop it first or if_exists='append' to add the rows"
        )


@dataclass(frozen=True)
class ColumnReport:
    """What a load did to one column.

    Attributes
    ----------
    name : str
        The column in the table: the file's header trimmed, ASCII-lowercased, with runs of
        other characters than letters, digits and ``_`` as ``_`` (so SQL and ``--features``
        name it unquoted).
    source_name : str
        The header as in the file (the DataFrame's column label as text).
    type : str
        The column's type: inferred (:data:`RULE`), or the existing column's when appending.
    trimmed : int
        Values that had leading or trailing whitespace.
    nulls : int
        NULLs loaded: missing and empty values plus ``marked_null``.
    marked_null : dict of str to int
        Values made NULL by the caller's ``null`` marks, per mark.
    kept_marks : dict of str to int
        Usual marks of a missing value (:data:`MISSING_MARKS`) kept as text, per mark.
    non_numbers : tuple of str
        For a text column whose values are mostly numbers: up to three of the values that are
        not (what kept it text).
    """

    name: str
    source_name: str
    type: str
    trimmed: int
    nulls: int
    marked_null: dict[str, int] = field(default_factory=dict)
    kept_marks: dict[str, int] = field(default_factory=dict)
    non_numbers: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadReport:
    """What a load did: the table, how many rows, and per column its type and changes.

    Attributes
    ----------
    table : str
        The table, schema-qualified.
    source : str
        The file loaded, or ``"DataFrame"``.
    rows : int
        Rows loaded.
    action : {"created", "replaced", "appended"}
    columns : tuple of ColumnReport
    seconds : float
        Wall time of the load.
    """

    table: str
    source: str
    rows: int
    action: str
    columns: tuple[ColumnReport, ...]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-ready)."""
        return dataclasses.asdict(self)


def column_names(headers: Sequence[str]) -> list[str]:
    """Table column names of a file's headers (see :class:`ColumnReport`), unique."""
    names: list[str] = []
    for k, header in enumerate(headers, start=1):
        name = re.sub(r"\W+", "_", header.strip()).strip("_")
        name = name.translate(
            str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
        )
        if not name:
            name = f"column_{k}"
        elif name[0].isdigit():
            name = "_" + name
        name = name.encode()[:63].decode(errors="ignore")  # PostgreSQL's NAMEDATALEN - 1
        base, n = name, 2
        while name in names:
            name, n = f"{base[:59]}_{n}", n + 1
        names.append(name)
    return names


def load_file(
    conn: psycopg.Connection[Any],
    path: str | os.PathLike[str],
    table: str,
    *,
    if_exists: IfExists = "fail",
    null: Sequence[str] = (),
    header: bool = True,
    columns: Sequence[str] | None = None,
    delimiter: str | None = None,
) -> LoadReport:
    """Load a CSV (optionally gzip-compressed) or Parquet file into ``table``.

    Parameters
    ----------
    conn : psycopg.Connection
    path : str or Path
        A CSV file, a gzip-compressed one, or a Parquet file (needs pyarrow); told apart by
        their first bytes, not their names. CSV files are UTF-8.
    table : str
        ``table`` (in the current schema: a data owner's own) or ``schema.table``, as SQL
        reads an identifier (unquoted parts lowercased).
    if_exists : {"fail", "replace", "append"}
        What to do when the table exists: refuse (:class:`TableExists`), drop it first, or add
        the rows (columns matched by name, values cast to the table's types).
    null : sequence of str
        Values (after trimming) to load as NULL, e.g. ``["?"]``; empty values always are.
    header : bool
        Whether the CSV's first line names the columns.
    columns : sequence of str, optional
        Column names to use instead of the header's (or for a file without one).
    delimiter : str, optional
        The CSV's delimiter: a tab for ``.tsv`` names (also ``.tsv.gz``), else a comma.

    Returns
    -------
    LoadReport
    """
    path = Path(path)
    with path.open("rb") as f:
        magic = f.read(4)
    if magic == b"PAR1":
        headers, chunks = _parquet_stream(path)
        delimiter, header = ",", False
    else:
        opener = gzip.open if magic[:2] == b"\x1f\x8b" else open
        if delimiter is None:
            delimiter = "\t" if ".tsv" in path.suffixes else ","
        with opener(path, "rt", encoding="utf-8-sig", newline="") as text:
            first = next(csv.reader(text, delimiter=delimiter), None)
        if first is None:
            raise ValueError(f"dpsql: {path} is empty: no header and no rows")
        headers = first if header else [f"column_{k}" for k in range(1, len(first) + 1)]
        chunks = _file_chunks(path, opener is gzip.open)
    if columns is not None:
        if len(columns) != len(headers):
            raise ValueError(
                f"dpsql: {len(columns)} column names given, the file has {len(headers)} columns"
            )
        headers = list(columns)
    return _load(conn, chunks, headers, table, if_exists, null, header, delimiter, str(path))


def load_dataframe(
    conn: psycopg.Connection[Any],
    frame: Any,
    table: str,
    *,
    if_exists: IfExists = "fail",
    null: Sequence[str] = (),
) -> LoadReport:
    """Load a pandas DataFrame into ``table`` by the same rule as a file (see
    :func:`load_file`): its values as ``to_csv`` writes them (NaN, None and NA are NULL;
    True and False are booleans; dates are text). The index is not loaded: ``reset_index()``
    first to keep it."""
    headers = [str(c) for c in frame.columns]

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(frame), _FRAME_ROWS):
            part = frame.iloc[start : start + _FRAME_ROWS]
            yield part.to_csv(index=False, header=False, lineterminator="\n").encode()

    return _load(conn, chunks(), headers, table, if_exists, null, False, ",", "DataFrame")


def _file_chunks(path: Path, gzipped: bool) -> Iterator[bytes]:
    with gzip.open(path, "rb") if gzipped else path.open("rb") as f:
        first = True
        while chunk := f.read(_CHUNK):
            if first and chunk.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
                chunk = chunk[3:]
            first = False
            yield chunk


def _parquet_stream(path: Path) -> tuple[list[str], Iterator[bytes]]:
    try:
        import pyarrow.csv as pa_csv  # type: ignore[import-not-found,unused-ignore]
        import pyarrow.parquet as pq  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:
        raise RuntimeError(
            f"dpsql: {path} is a Parquet file: reading it needs pyarrow (pip install pyarrow)"
        ) from None
    parquet = pq.ParquetFile(path)
    options = pa_csv.WriteOptions(include_header=False)

    def chunks() -> Iterator[bytes]:
        for batch in parquet.iter_batches(batch_size=65_536):
            buffer = io.BytesIO()
            try:
                pa_csv.write_csv(batch, buffer, options)
            except Exception as err:  # pyarrow.ArrowInvalid: a nested column, say
                raise ValueError(f"dpsql: {path}: a column cannot be loaded: {err}") from None
            yield buffer.getvalue()

    return list(parquet.schema_arrow.names), chunks()


def _load(
    conn: psycopg.Connection[Any],
    chunks: Iterable[bytes],
    headers: Sequence[str],
    table: str,
    if_exists: IfExists,
    null: Sequence[str],
    header: bool,
    delimiter: str,
    source: str,
) -> LoadReport:
    if if_exists not in ("fail", "replace", "append"):
        raise ValueError(
            f"dpsql: if_exists must be 'fail', 'replace' or 'append', not {if_exists!r}"
        )
    started = time.monotonic()
    names = column_names(headers)
    null = [v.strip(_WHITESPACE) for v in null]
    with conn.transaction():
        target, existing = _target(conn, table)
        if existing is not None and if_exists == "fail":
            raise TableExists(_qualified(conn, target), existing)
        if existing is not None:
            _refuse_registered(conn, target)
        staging = sql.Identifier(f"dpsql_load_{uuid.uuid4().hex[:12]}")
        raw = [sql.Identifier(f"c{k}") for k in range(1, len(names) + 1)]
        conn.execute(
            sql.SQL("CREATE TEMPORARY TABLE {} ({}) ON COMMIT DROP").format(
                staging, sql.SQL(", ").join(sql.SQL("{} text").format(c) for c in raw)
            )
        )
        _copy(conn, staging, chunks, header, delimiter, source)
        stats = _column_stats(conn, staging, raw, null)
        types = [_inferred_type(s) for s in stats]
        if existing is not None and if_exists == "append":
            types = _existing_types(conn, target, names)
        else:
            if existing is not None:
                conn.execute(sql.SQL("DROP TABLE {}").format(target))
            conn.execute(
                sql.SQL("CREATE TABLE {} ({})").format(
                    target,
                    sql.SQL(", ").join(
                        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
                        for n, t in zip(names, types, strict=True)
                    ),
                )
            )
        cur = conn.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                target,
                sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(", ").join(
                    sql.SQL("{}::{}").format(_value(c, null), sql.SQL(t))
                    for c, t in zip(raw, types, strict=True)
                ),
                staging,
            )
        )
        rows = cur.rowcount
        kept, examples = _marks_and_examples(conn, staging, raw, null, stats, types)
        qualified = _qualified(conn, target)
    reports = tuple(
        ColumnReport(
            name=n,
            source_name=h,
            type=t,
            trimmed=s["trimmed"],
            nulls=s["rows"] - s["values"],
            marked_null={m: c for m, c in s["marked"].items() if c},
            kept_marks=kept.get(k, {}),
            non_numbers=tuple(examples.get(k, ())),
        )
        for k, (n, h, t, s) in enumerate(zip(names, headers, types, stats, strict=True))
    )
    action = "created" if existing is None else {"replace": "replaced"}.get(if_exists, "appended")
    return LoadReport(qualified, source, rows, action, reports, time.monotonic() - started)


def table_identifier(conn: psycopg.Connection[Any], table: str) -> sql.Identifier:
    """The identifier of ``table`` as SQL reads it (``parse_ident``: ``[schema.]table``,
    unquoted parts lowercased, quoted ones kept): a name, never a query."""
    try:
        row = conn.execute("SELECT parse_ident(%s)", (table,)).fetchone()
    except psycopg.errors.InvalidParameterValue:
        row = None
    if row is None or len(row[0]) > 2:
        raise ValueError(f"dpsql: {table!r} is not a table name ([schema.]table)")
    return sql.Identifier(*row[0])


def _target(conn: psycopg.Connection[Any], table: str) -> tuple[sql.Identifier, int | None]:
    """The table's identifier and its row count if it exists."""
    target = table_identifier(conn, table)
    found = conn.execute("SELECT to_regclass(%s)::oid", (target.as_string(conn),)).fetchone()
    if found is None or found[0] is None:
        return target, None
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(target)).fetchone()
    assert count is not None
    return target, int(count[0])


def _refuse_registered(conn: psycopg.Connection[Any], target: sql.Identifier) -> None:
    """Replacing or appending to a registered dataset's table would change the rows under its
    budget, past registration's checks: refused (the owner retires the dataset first)."""
    if conn.execute("SELECT to_regclass('dpsql.my_datasets')").fetchone() == (None,):
        return  # no dpsql extension here: no datasets
    row = conn.execute(
        "SELECT name FROM dpsql.my_datasets WHERE to_regclass(source) = %s::regclass",
        (target.as_string(conn),),
    ).fetchone()
    if row is not None:
        raise ValueError(
            f"dpsql: table {_qualified(conn, target)} is registered as dataset {row[0]}: "
            "replacing it or appending to it would change the rows under its budget; nothing "
            f"loaded. Load into another table, or retire the dataset first (`dpsql dataset "
            f"drop {row[0]}`, db.drop_dataset({row[0]!r}))"
        )


def _qualified(conn: psycopg.Connection[Any], target: sql.Identifier) -> str:
    row = conn.execute(
        "SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        (target.as_string(conn),),
    ).fetchone()
    return target.as_string(conn) if row is None else str(row[0])


def _copy(
    conn: psycopg.Connection[Any],
    staging: sql.Identifier,
    chunks: Iterable[bytes],
    header: bool,
    delimiter: str,
    source: str,
) -> None:
    statement = sql.SQL(
        "COPY {} FROM STDIN (FORMAT csv, HEADER {}, DELIMITER {}, ENCODING 'UTF8')"
    ).format(staging, sql.SQL("true" if header else "false"), sql.Literal(delimiter))
    try:
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for chunk in chunks:
                copy.write(chunk)
    except (psycopg.errors.DataError, psycopg.errors.BadCopyFileFormat) as err:
        # the server's CONTEXT names the line ("COPY dpsql_load_..., line 7: ...")
        where = re.search(r"line (\d+)", err.diag.context or "")
        at = f"line {where.group(1)} of " if where else ""
        raise ValueError(
            f"dpsql: {at}{source}: {err.diag.message_primary}: nothing loaded"
        ) from None


def _trimmed(column: sql.Identifier) -> sql.Composable:
    return sql.SQL("nullif(btrim({}, {}), '')").format(column, sql.Literal(_WHITESPACE))


def _value(column: sql.Identifier, null: Sequence[str]) -> sql.Composable:
    """A raw column's value as loaded: trimmed, NULL if empty or a null mark."""
    if not null:
        return _trimmed(column)
    return sql.SQL("CASE WHEN {t} = ANY({marks}) THEN NULL ELSE {t} END").format(
        t=_trimmed(column), marks=sql.Literal(list(null))
    )


def _column_stats(
    conn: psycopg.Connection[Any],
    staging: sql.Identifier,
    raw: Sequence[sql.Identifier],
    null: Sequence[str],
) -> list[dict[str, Any]]:
    """Per raw column, in one scan: rows, values (not NULL after the rule), trimmed, integers,
    numbers, booleans, the longest integer and the count of each null mark."""
    # Each value's kind, once (the regular expressions are most of the work): NULL (missing
    # or empty), m (a null mark), i (integer), f (other number), b (boolean), t (text).
    kinds: list[sql.Composable] = []
    parts: list[sql.Composable] = []
    for k, c in enumerate(raw):
        v, kind, trim = (sql.Identifier(f"{p}{k}") for p in ("v", "k", "t"))
        kinds.append(
            sql.SQL(
                "{v}, CASE WHEN {v} IS NULL THEN NULL {mark} WHEN {v} ~ {i} THEN 'i'"
                " WHEN {v} ~ {f} THEN 'f' WHEN lower({v}) IN ('true', 'false') THEN 'b'"
                " ELSE 't' END AS {kind}, length({c}) <> coalesce(length({v}), 0) AS {trim}"
            ).format(
                v=v,
                c=c,
                kind=kind,
                trim=trim,
                i=sql.Literal(_INTEGER),
                f=sql.Literal(_NUMBER),
                mark=sql.SQL("WHEN {} = ANY({}) THEN 'm'").format(v, sql.Literal(list(null)))
                if null
                else sql.SQL(""),
            )
        )
        parts += [
            sql.SQL("count(*) FILTER (WHERE {} <> 'm')").format(kind),
            sql.SQL("count(*) FILTER (WHERE {})").format(trim),
            sql.SQL("count(*) FILTER (WHERE {} = 'i')").format(kind),
            sql.SQL("count(*) FILTER (WHERE {} IN ('i', 'f'))").format(kind),
            sql.SQL("count(*) FILTER (WHERE {} = 'b')").format(kind),
            sql.SQL("coalesce(max(length(ltrim({}, '+-'))) FILTER (WHERE {} = 'i'), 0)").format(
                v, kind
            ),
            *(sql.SQL("count(*) FILTER (WHERE {} = {})").format(v, sql.Literal(m)) for m in null),
        ]
    # OFFSET 0: each trimmed value and kind is computed once per row, not in every aggregate
    query = sql.SQL(
        "SELECT count(*), {} FROM (SELECT {} FROM (SELECT {}, {} FROM {} OFFSET 0) a OFFSET 0) s"
    ).format(
        sql.SQL(", ").join(parts),
        sql.SQL(", ").join(kinds),
        sql.SQL(", ").join(raw),
        sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(_trimmed(c), sql.Identifier(f"v{k}"))
            for k, c in enumerate(raw)
        ),
        staging,
    )
    row = conn.execute(query).fetchone()
    assert row is not None
    rows, rest, width = row[0], list(row[1:]), 6 + len(null)
    stats = []
    for k in range(len(raw)):
        values, trimmed, ints, numbers, bools, digits, *marked = rest[k * width : (k + 1) * width]
        stats.append(
            {
                "rows": rows,
                "values": values,
                "trimmed": trimmed,
                "integers": ints,
                "numbers": numbers,
                "booleans": bools,
                "digits": digits,
                "marked": dict(zip(null, marked, strict=True)),
            }
        )
    return stats


def _inferred_type(stats: dict[str, Any]) -> str:
    """The typing rule (:data:`RULE`) on one column's counts."""
    values = stats["values"]
    if values == 0:
        return "text"
    if stats["integers"] == values:
        return "bigint" if stats["digits"] <= _BIGINT_DIGITS else "numeric"
    if stats["numbers"] == values:
        return "double precision"
    if stats["booleans"] == values:
        return "boolean"
    return "text"


def _existing_types(
    conn: psycopg.Connection[Any], target: sql.Identifier, names: Sequence[str]
) -> list[str]:
    """The existing table's types of ``names`` (appending); every name must be a column."""
    found = dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (target.as_string(conn),),
        ).fetchall()
    )
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(
            f"dpsql: cannot append: the table has no column {', '.join(missing)} "
            f"(its columns: {', '.join(found)}): nothing loaded"
        )
    return [found[n] for n in names]


def _marks_and_examples(
    conn: psycopg.Connection[Any],
    staging: sql.Identifier,
    raw: Sequence[sql.Identifier],
    null: Sequence[str],
    stats: Sequence[dict[str, Any]],
    types: Sequence[str],
) -> tuple[dict[int, dict[str, int]], dict[int, list[str]]]:
    """Per column index, the usual missing-value marks kept as text and their counts; and for
    a text column whose values are mostly numbers, up to three values that are not (one
    scan of the rows, unpivoted)."""
    kept_marks = [m for m in MISSING_MARKS if m not in null]
    mostly_numbers = [
        k
        for k, (s, t) in enumerate(zip(stats, types, strict=True))
        if t == "text" and s["values"] and 2 * s["numbers"] >= s["values"]
    ]
    text = [k for k, t in enumerate(types) if t == "text"]
    if not text:
        return {}, {}
    query = sql.SQL(
        "SELECT k, v, count(*) FROM {}, LATERAL (VALUES {}) u(k, v)"
        " WHERE v = ANY(%(marks)s) OR (k = ANY(%(columns)s) AND NOT v ~ %(number)s"
        " AND NOT v = ANY(%(null)s))"
        " GROUP BY k, v ORDER BY k, count(*) DESC, v"
    ).format(
        staging,
        sql.SQL(", ").join(
            sql.SQL("({}, {})").format(sql.Literal(k), _trimmed(raw[k])) for k in text
        ),
    )
    kept: dict[int, dict[str, int]] = {}
    examples: dict[int, list[str]] = {}
    params = {
        "marks": kept_marks,
        "columns": mostly_numbers,
        "number": _NUMBER,
        "null": list(null),
    }
    for k, value, count in conn.execute(query, params):
        if value in kept_marks:
            kept.setdefault(k, {})[value] = count
        if k in mostly_numbers and len(examples.setdefault(k, [])) < 3:
            examples[k].append(value)
    return kept, examples
