"""`dpsql load` and `Database.load_file` / `load_dataframe` (issue 42, item 5): a data owner's
CSV, CSV.gz, Parquet file or DataFrame into a new table of theirs, with inferred types, trimmed
text and a report of what changed; run as the owner, against the test server."""

from __future__ import annotations

import gzip
import importlib
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import dpsql
from dpsql import roles
from tests.python.test_cli import as_json, assert_one_line_error, dpsql_cli, dpsql_help

# The UCI Adult layout in small: text with a leading space (" <=50K"), '?' for missing
# values, a header with a dash, a boolean column and a column that is numbers but for '?'.
ADULT = """age, workclass, education-num, hours, capital, married, income
39, State-gov, 13, 40.5, 2174, true, <=50K
50, Self-emp-not-inc, 13, 13, 0, FALSE, <=50K
38, ?, 9, 40, ?, true, >50K
53,  Private , 7, , 0, false, >50K
"""


@pytest.fixture
def owner(conn: psycopg.Connection, server_uri: str) -> Iterator[tuple[str, str]]:
    """A data owner (their own schema, first on their search_path): (name, URI)."""
    name = f"load_own_{uuid.uuid4().hex[:8]}"
    password = roles.create_role(conn, name, "owner")
    yield name, roles.role_uri(server_uri, name, password)
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
    )
    roles.drop_role(conn, name, force=True)


def _columns(conn: psycopg.Connection, table: str) -> dict[str, str]:
    return dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
            (table,),
        ).fetchall()
    )


def test_load_csv_infers_types_trims_and_reports(conn, owner, tmp_path: Path) -> None:
    name, uri = owner
    path = tmp_path / "adult.csv.gz"  # compressed: told by its bytes
    path.write_bytes(gzip.compress(ADULT.encode()))
    report = as_json(dpsql_cli("load", str(path), "adult", "--json", "--dsn", uri))
    table = f"{name}.adult"
    assert (report["table"], report["rows"], report["action"]) == (table, 4, "created")
    assert _columns(conn, table) == {
        "age": "bigint",
        "workclass": "text",
        "education_num": "bigint",
        "hours": "double precision",
        "capital": "text",  # numbers but for '?': kept text, and said why
        "married": "boolean",
        "income": "text",
    }
    by_name = {c["name"]: c for c in report["columns"]}
    assert by_name["education_num"]["source_name"] == " education-num"
    assert by_name["income"]["trimmed"] == 4 and by_name["workclass"]["trimmed"] == 4
    assert by_name["workclass"]["kept_marks"] == {"?": 1}
    assert by_name["capital"]["non_numbers"] == ["?"]
    assert by_name["hours"]["nulls"] == 1  # the empty value
    rows = conn.execute(f"SELECT workclass, income, hours FROM {table} ORDER BY age").fetchall()
    assert rows == [
        ("?", ">50K", 40.0),
        ("State-gov", "<=50K", 40.5),
        ("Self-emp-not-inc", "<=50K", 13.0),
        ("Private", ">50K", None),
    ]

    # The human report: one line, then every column's type, counts and notes in CLI flags.
    again = dpsql_cli("load", str(path), "adult2", "--dsn", uri)
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0].startswith(f"created table {name}.adult2: 4 rows from ")
    assert lines[1].split() == ["column", "type", "trimmed", "nulls", "note"]
    workclass = next(line for line in lines if line.startswith("workclass"))
    assert "1 '?' kept as text (--null '?': NULL)" in workclass


def test_a_loaded_table_registers_without_whitespace_surprises(conn, owner, tmp_path) -> None:
    """Issue 42: the raw Adult CSV's " <=50K" made registration refuse confusingly; loaded,
    the labels are the values a person reads."""
    name, uri = owner
    path = tmp_path / "adult.csv"
    path.write_text(ADULT)
    loaded = dpsql_cli("load", str(path), "adult", "--null", "?", "--dsn", uri)
    assert loaded.returncode == 0, loaded.stderr
    assert "1 '?' as NULL" in loaded.stdout
    assert conn.execute(f"SELECT count(capital) FROM {name}.adult").fetchone() == (3,)
    assert _columns(conn, f"{name}.adult")["capital"] == "bigint"
    registered = dpsql_cli(
        *shlex.split(
            "dataset register adult --features age,education_num --label income"
            " --labels '<=50K,>50K' --epsilon-budget 1 --feature-bounds '[[0,100],[0,20]]'"
        ),
        "--dsn",
        uri,
    )
    assert registered.returncode == 0, registered.stderr
    # A registered table's rows are not replaced or appended to under its budget.
    for how in ("replace", "append"):
        refused = dpsql_cli("load", str(path), "adult", "--if-exists", how, "--dsn", uri)
        message = assert_one_line_error(refused)
        assert "is registered as dataset adult" in message and "dpsql dataset drop adult" in message
    assert conn.execute(f"SELECT count(*) FROM {name}.adult").fetchone() == (4,)


def test_an_existing_table_is_refused_replaced_or_appended(conn, owner, tmp_path) -> None:
    name, uri = owner
    path = tmp_path / "a.csv"
    path.write_text("x,y\n1,a\n2,b\n")
    assert dpsql_cli("load", str(path), "t", "--dsn", uri).returncode == 0
    refused = dpsql_cli("load", str(path), "t", "--dsn", uri)
    message = assert_one_line_error(refused)
    assert message == f"dpsql: table {name}.t exists (2 rows): nothing loaded"
    assert "--if-exists replace" in refused.stderr and "=" not in refused.stderr
    appended = as_json(
        dpsql_cli("load", str(path), "t", "--if-exists", "append", "--json", "--dsn", uri)
    )
    assert (appended["action"], appended["rows"]) == ("appended", 2)
    assert conn.execute(f"SELECT count(*) FROM {name}.t").fetchone() == (4,)
    path.write_text("x,z\n1.5,true\n")
    replaced = as_json(
        dpsql_cli("load", str(path), "t", "--if-exists", "replace", "--json", "--dsn", uri)
    )
    assert (replaced["action"], replaced["rows"]) == ("replaced", 1)
    assert _columns(conn, f"{name}.t") == {"x": "double precision", "z": "boolean"}
    # appending columns the table does not have: refused, nothing added
    path.write_text("x,w\n1,2\n")
    assert_one_line_error(dpsql_cli("load", str(path), "t", "--if-exists", "append", "--dsn", uri))
    assert conn.execute(f"SELECT count(*) FROM {name}.t").fetchone() == (1,)


def test_bad_files_are_one_line_errors_and_create_nothing(conn, owner, tmp_path) -> None:
    name, uri = owner
    path = tmp_path / "bad.csv"
    path.write_text("x,y\n1,2\n3,4,5\n")
    message = assert_one_line_error(dpsql_cli("load", str(path), "bad", "--dsn", uri))
    assert message.startswith(f"dpsql: line 3 of {path}: extra data after last expected column")
    path.write_text("")
    assert_one_line_error(dpsql_cli("load", str(path), "bad", "--dsn", uri))
    missing = assert_one_line_error(
        dpsql_cli("load", str(tmp_path / "no.csv"), "bad", "--dsn", uri)
    )
    assert "no.csv" in missing
    path.write_text("x\n1\n")
    assert_one_line_error(dpsql_cli("load", str(path), "a; DROP TABLE x", "--dsn", uri))
    assert conn.execute("SELECT to_regclass(%s)", (f"{name}.bad",)).fetchone() == (None,)


def test_no_header_columns_and_tsv(conn, owner, tmp_path) -> None:
    name, uri = owner
    path = tmp_path / "rows.tsv"
    path.write_text("1\t x \n2\ty\n")
    report = as_json(dpsql_cli("load", str(path), "rows", "--no-header", "--json", "--dsn", uri))
    assert [c["name"] for c in report["columns"]] == ["column_1", "column_2"]
    named = dpsql_cli("load", str(path), "rows2", "--no-header", "--columns", "n,s", "--dsn", uri)
    assert named.returncode == 0, named.stderr
    assert conn.execute(f"SELECT n, s FROM {name}.rows2 ORDER BY n").fetchall() == [
        (1, "x"),
        (2, "y"),
    ]


def test_load_dataframe_follows_the_same_rule(conn, owner, tmp_path) -> None:
    pd = pytest.importorskip("pandas")
    name, uri = owner
    path = tmp_path / "adult.csv"
    path.write_text(ADULT)
    frame = pd.read_csv(path, skipinitialspace=False, dtype=str, keep_default_na=False)
    with dpsql.connect(uri, install=False) as db:
        from_file = db.load_file(path, "from_file")
        from_frame = db.load_dataframe(frame, "from_frame")
        assert from_frame.source == "DataFrame"
        strip = ("table", "source", "seconds")
        a, b = from_file.as_dict(), from_frame.as_dict()
        assert {k: v for k, v in a.items() if k not in strip} == {
            k: v for k, v in b.items() if k not in strip
        }
        # typed columns, NaN and None: numbers, booleans and NULLs
        typed = pd.DataFrame(
            {
                "f": [0.1, float("nan"), 3.0],
                "i": [1, 2, 3],
                "b": [True, False, True],
                "s": [" a", None, "c "],
            }
        )
        report = db.load_dataframe(typed, "typed")
        with pytest.raises(dpsql.load_table.TableExists):
            db.load_dataframe(typed, "typed")
    assert [c.type for c in report.columns] == ["double precision", "bigint", "boolean", "text"]
    assert conn.execute(f"SELECT f, s FROM {name}.typed ORDER BY i").fetchall() == [
        (0.1, "a"),
        (None, None),
        (3.0, "c"),
    ]


def test_parquet(conn, owner, tmp_path) -> None:
    name, uri = owner
    path = tmp_path / "t.parquet"
    # (by name: pyarrow has no stubs; it is in the test extra)
    pa = importlib.import_module("pyarrow")
    pq = importlib.import_module("pyarrow.parquet")
    pq.write_table(
        pa.table({"a": [1, 2, None], "b": [" x", "y", None], "c": [0.5, 1.5, 2.5]}), path
    )
    report = as_json(dpsql_cli("load", str(path), "p", "--json", "--dsn", uri))
    assert [(c["name"], c["type"], c["trimmed"]) for c in report["columns"]] == [
        ("a", "bigint", 0),
        ("b", "text", 1),
        ("c", "double precision", 0),
    ]
    assert conn.execute(f"SELECT a, b, c FROM {name}.p ORDER BY c").fetchall() == [
        (1, "x", 0.5),
        (2, "y", 1.5),
        (None, None, 2.5),
    ]


def test_help_names_the_new_commands() -> None:
    listed = dpsql_help().stdout
    for command in ("load", "evaluate", "predict"):
        assert f"    {command}" in listed
        assert dpsql_cli(command, "--help").returncode == 0
    assert "estimate-bounds" in dpsql_cli("dataset", "--help").stdout
