"""Issue 27's done-means: the owner and analyst quickstarts (docs/quickstart-owner.md,
docs/quickstart-analyst.md), walked as login roles made by `dpsql role create`, on a raw public
table with text categorical columns and a text label (tests/data/hi_sample.csv.gz) loaded by
the owner: registration (refused with its findings, then accepted), grant, preview, a private
`auto` release, evaluate with baselines, predict, and the CLI. Every refusal charges nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import dpsql

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "hi_sample.csv.gz"
FEATURES = ["whrswk", "hhi", "hhi2", "education", "race", "hispanic", "experience", "kidslt6",
            "kids618", "husby", "region"]  # fmt: skip
CATEGORIES = {
    # the code book's levels (public), not the rows'
    "education": ["<9years", "9-11years", "12years", "13-15years", "16years", ">16years"],
    "race": ["white", "black", "other"],
    "region": ["northcentral", "south", "west", "other"],
    # yes/no columns: one coordinate, 1 for yes
    "hhi": ["yes"],
    "hhi2": ["yes"],
    "hispanic": ["yes"],
}
# hours a week, years, children, the husband's income in $1000s: from the meaning, not the rows
BOUNDS = [[0, 100], [0, 60], [0, 10], [0, 10], [0, 150]]


def dpsql_cli(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("dpsql")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "dpsql.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("DPSQL_DSN", "DPSQL_PGDATA")}
    env["DPSQL_PGDATA"] = str(Path(tempfile.gettempdir()) / f"dpsql-none-{uuid.uuid4().hex}")
    env["DPSQL_DSN"] = dsn
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=600)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def _charges(conn: psycopg.Connection, name: str) -> int:
    return conn.execute("SELECT count(*) FROM dpsql.ledger WHERE dataset = %s", (name,)).fetchone()[
        0
    ]


@pytest.fixture
def roles(conn, server_uri):
    made: list[str] = []

    def create(name: str, *flags: str) -> str:
        made.append(name)
        return ok(dpsql_cli("role", "create", name, *flags, dsn=server_uri)).strip()

    yield create
    for name in made:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_owner_and_analyst_quickstarts_on_a_raw_public_table(conn, server_uri, roles) -> None:
    tag = uuid.uuid4().hex[:6]
    owner, analyst = f"olivia_{tag}", f"alice_{tag}"
    owner_uri, analyst_uri = roles(owner, "--owner"), roles(analyst)
    name = f"hi_{tag}"
    _owner_quickstart(conn, owner_uri, analyst, name)
    _analyst_quickstart(conn, analyst_uri, f"{owner}.hi_test", name)
    # the owner raises the budget; the analyst sees it, and the one charge
    ok(dpsql_cli("dataset", "alter", name, "--epsilon-budget", "4", dsn=owner_uri))
    (budget,) = json.loads(ok(dpsql_cli("budgets", "--json", dsn=analyst_uri)))
    assert (budget["epsilon_budget"], budget["epsilon_spent"]) == (4, 1)
    assert _charges(conn, name) == 1


def _doc_block(path: Path, heading: str, language: str) -> str:
    """The first ``language`` code block under ``heading`` in a docs page, as written."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    start = section.index(f"```{language}\n") + len(language) + 4
    return section[start : section.index("```", start)]


def _owner_quickstart(conn, owner_uri: str, analyst: str, name: str) -> None:
    """Load, register (findings first), grant, and give the analyst a held-out test table."""
    # step 2 exactly as docs/quickstart-owner.md writes it, through psql, from the checkout
    load = _doc_block(REPO / "docs" / "quickstart-owner.md", "## 2. Load", "sql")
    from dpsql import server

    psql = server.bin_dir(server.DEFAULT_PG_VERSION) / "psql"
    loaded = subprocess.run(
        [str(psql), owner_uri, "-v", "ON_ERROR_STOP=1", "-X", "-q"], input=load, cwd=REPO,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    with psycopg.connect(owner_uri, autocommit=True) as owner:
        counts = owner.execute("SELECT (SELECT count(*) FROM hi), (SELECT count(*) FROM hi_test)")
        assert counts.fetchone() == (3200, 800)
        (schema,) = owner.execute("SELECT current_schema()").fetchone()
        for grant in ("GRANT USAGE ON SCHEMA {} TO {}", "GRANT SELECT ON hi_test TO {}"):
            args = [sql.Identifier(schema)] if "SCHEMA" in grant else []
            owner.execute(sql.SQL(grant).format(*args, sql.Identifier(analyst)))
    register = [
        "dataset", "register", "hi", "--name", name, "--features", ",".join(FEATURES),
        "--label", "whi", "--labels", "no,yes", "--epsilon-budget", "3", "--delta-budget",
        "1e-5", "--categories", json.dumps(CATEGORIES), "--feature-bounds", json.dumps(BOUNDS),
    ]  # fmt: skip
    refused = dpsql_cli(*register, dsn=owner_uri)
    assert refused.returncode == 1
    assert "with a feature outside feature_bounds" in refused.stderr  # husby beyond 150
    assert "pass --accept" in refused.stderr and "=>" not in refused.stderr  # the CLI's flags
    # what docs/quickstart-owner.md shows it prints (its owner's schema is olivia)
    shown = _doc_block(REPO / "docs" / "quickstart-owner.md", "Here it refuses", "")
    assert refused.stderr.replace(f"{schema}.hi", "olivia.hi").strip() == shown.strip()
    assert not conn.execute("SELECT 1 FROM dpsql.datasets WHERE name = %s", (name,)).fetchone()
    ok(dpsql_cli(*register, "--accept", dsn=owner_uri))
    ok(dpsql_cli("dataset", "grant", name, analyst, dsn=owner_uri))
    (dim,) = conn.execute("SELECT dim FROM dpsql.datasets WHERE name = %s", (name,)).fetchone()
    assert dim == 5 + 6 + 3 + 4 + 3  # numbers, education, race, region, three yes/no


def _analyst_quickstart(conn, analyst_uri: str, test_table: str, name: str) -> None:
    """What is there, a preview, a release, its quality against the baseline, predictions."""
    (listed,) = json.loads(ok(dpsql_cli("datasets", "--json", dsn=analyst_uri)))
    assert listed["name"] == name
    dry = json.loads(
        ok(dpsql_cli("train", name, "--privacy", "auto", "--epsilon", "1", "--dry-run", "--json",
                     dsn=analyst_uri))
    )  # fmt: skip
    assert dry["rows"] == 3200 and dry["dim"] == 21 and "refused" not in dry
    assert _charges(conn, name) == 0
    too_much = dpsql_cli("train", name, "--privacy", "auto", "--epsilon", "5", "--dry-run",
                         dsn=analyst_uri)  # fmt: skip
    assert too_much.returncode == 1 and "exceeded" in too_much.stderr
    assert len(too_much.stdout.splitlines()) == 1  # the summary only (issue 42: 60 lines of JSON)
    trained = json.loads(
        ok(dpsql_cli("train", name, "--privacy", "auto", "--epsilon", "1", "--json",
                     "--no-progress", dsn=analyst_uri))
    )  # fmt: skip
    assert (trained["privacy"], trained["epsilon"]) == (dry["mechanism"], dry["epsilon"])
    assert _charges(conn, name) == 1
    mid = trained["model_id"]
    pd = pytest.importorskip("pandas")
    frame = pd.read_csv(DATA, skiprows=range(1, 3201))  # the test rows
    with dpsql.connect(analyst_uri) as db:
        scored = db.evaluate(mid, test_table)
        assert scored["rows"] == len(frame)
        majority = max((frame["whi"] == "yes").mean(), (frame["whi"] == "no").mean())
        assert scored["baseline"] == pytest.approx(majority)
        assert {"accuracy", "balanced_accuracy", "roc_auc", "f1"} <= set(scored)
        # predictions: by row in SQL, from a DataFrame in Python, the same labels
        rows = db.conn.execute(
            f"SELECT dpsql.predict_label(%s, to_jsonb(t)) FROM {test_table} t", (mid,)
        ).fetchall()
        model = db.model(mid)
        predicted = model.predict(frame[list(reversed(FEATURES))])  # columns found by name
        assert list(predicted) == [r[0] for r in rows]
        assert model.score(frame[FEATURES], frame["whi"]) == pytest.approx(scored["accuracy"])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="features"):
            db.conn.execute("SELECT dpsql.predict(%s, '{1,2,3}')", (mid,))
        # the analyst reads no registered row and cannot change the registration
        registered = test_table.removesuffix("_test")
        for query in (f"SELECT * FROM {registered}",
                      f"SELECT dpsql.alter_dataset('{name}', epsilon_budget => 100)"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.conn.execute(query)


def _drop_roles(conn, *names: str) -> None:
    for name in names:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_the_quickstarts_run_as_written(conn, server_uri) -> None:
    """Issue 42: every command of docs/quickstart-owner.md and docs/quickstart-analyst.md,
    extracted from the pages (tests/doc_session.py), run in a reader's order as the roles they
    name: the owner's sections 1-4, the analyst's page, the owner's section 5. The refusal the
    owner's page shows is the one printed; the analyst's three releases are the ledger's."""
    from dpsql import server
    from tests import doc_session

    live = "SELECT 1 FROM dpsql.datasets WHERE name = 'hi' AND dropped_at IS NULL"
    if conn.execute(live).fetchone():
        conn.execute("SELECT dpsql.drop_dataset('hi')")  # an interrupted run's
    _drop_roles(conn, "olivia", "alice")
    before = conn.execute("SELECT coalesce(max(entry_id), 0) FROM dpsql.ledger").fetchone()[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPSQL_", "PG"))}
    env["DPSQL_DSN"] = server_uri  # the page's superuser commands (no --dsn): this server
    env["PATH"] = f"{server.bin_dir(server.DEFAULT_PG_VERSION)}{os.pathsep}{env['PATH']}"
    env["DPSQL_PGDATA"] = str(Path(tempfile.gettempdir()) / f"dpsql-none-{uuid.uuid4().hex}")
    psql = server.bin_dir(server.DEFAULT_PG_VERSION) / "psql"
    owner = doc_session.blocks(REPO / "docs" / "quickstart-owner.md")
    analyst = doc_session.blocks(REPO / "docs" / "quickstart-analyst.md")
    late = next(i for i, b in enumerate(owner) if b.section.startswith("## 5."))
    session = doc_session.Session(REPO, env, psql, yours={"URI": "ALICE"})
    try:
        session.run(owner[:late], sql_as="OLIVIA")
        session.run(analyst, sql_as="URI")
        session.run(owner[late:], sql_as="OLIVIA")
        charges = conn.execute(
            "SELECT role, epsilon FROM dpsql.ledger WHERE dataset = 'hi' AND entry_id > %s",
            (before,),
        ).fetchall()
        assert charges == [("alice", 1.0)] * 3  # the CLI's, SQL's and Python's releases
        assert not conn.execute(live).fetchone()  # the owner's last command dropped it
    finally:
        session.close()
        if conn.execute(live).fetchone():
            conn.execute("SELECT dpsql.drop_dataset('hi')")
        _drop_roles(conn, "olivia", "alice")
