"""Issue 45 (hygiene): no SQL or PL/pgSQL function of the install SQL has a body over 100 lines
unless the comment block right above its CREATE has a line starting ``-- Over 100 lines:`` that
says why it is one function. Reads sql/install/*.sql; no server needed."""

from __future__ import annotations

import re
from pathlib import Path

INSTALL = Path(__file__).resolve().parents[2] / "sql" / "install"
LIMIT = 100
REASON = "-- Over 100 lines:"

_CREATE = re.compile(
    r"^[ \t]*CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+([\w.\"]+)", re.M | re.I
)
# the end of the header: a dollar-quoted body, or a C function's quoted link symbol
_AS = re.compile(r"\bAS\s+(\$\w*\$|')", re.I)


def functions(text: str) -> list[tuple[str, int, int, list[str]]]:
    """(name, line of its CREATE, body lines, comment block right above the CREATE) of every
    function with a dollar-quoted body; body lines are those between the opening and the
    closing quote (the line of ``END $$`` included)."""
    lines = text.split("\n")
    found: list[tuple[str, int, int, list[str]]] = []
    pos = 0
    while (m := _CREATE.search(text, pos)) is not None:
        pos = m.end()
        a = _AS.search(text, m.end())
        if a is None or a.group(1) == "'":
            continue
        tag = a.group(1)
        end = text.index(tag, a.end())
        pos = end + len(tag)
        first = text.count("\n", 0, m.start())  # 0-based line of the CREATE
        comments: list[str] = []
        i = first - 1
        while i >= 0 and lines[i].lstrip().startswith("--"):
            comments.insert(0, lines[i].strip())
            i -= 1
        found.append((m.group(1), first + 1, text.count("\n", a.end(), end), comments))
    return found


def over_limit(text: str) -> list[str]:
    return [
        f"{name} (line {line}): {length} lines"
        for name, line, length, comments in functions(text)
        if length > LIMIT and not any(c.startswith(REASON) for c in comments)
    ]


def test_no_function_over_100_lines_without_a_reason() -> None:
    files = sorted(INSTALL.glob("*.sql"))
    assert files
    bad = [f"{p.name} {found}" for p in files for found in over_limit(p.read_text("utf-8"))]
    assert bad == [], (
        f"split these functions into named steps, or write why each is one function in a "
        f"'{REASON} ...' comment line right above its CREATE:\n" + "\n".join(bad)
    )


def test_the_counter_finds_what_it_should() -> None:
    body = "\n".join(f"    x := {i};" for i in range(LIMIT))
    long = (
        "-- what it does\n"
        "CREATE OR REPLACE FUNCTION dpsql_internal._f(a int) RETURNS int\n"
        "LANGUAGE plpgsql AS $$\nBEGIN\n" + body + "\nEND $$;\n"
    )
    assert [(n, ln) for n, _, ln, _ in functions(long)] == [("dpsql_internal._f", LIMIT + 2)]
    assert len(over_limit(long)) == 1
    assert over_limit(long.replace("-- what it does", "-- what it does\n" + REASON + " why.")) == []
    # a blank line ends the comment block: the reason must be right above the CREATE
    assert len(over_limit(REASON + " why.\n\n" + long)) == 1
    # within the limit, a C function, and a SQL function with a tagged quote
    short = "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $f$ SELECT 1 $f$;\n"
    c = "CREATE FUNCTION g() RETURNS int AS 'MODULE_PATHNAME', 'g' LANGUAGE C;\n"
    assert [n for n, *_ in functions(c + short)] == ["f"]
    assert over_limit(c + short) == []
