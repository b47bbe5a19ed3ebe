"""Issue 27's done-means: the owner and analyst quickstarts (docs/quickstart-owner.md,
docs/quickstart-analyst.md), walked as login roles made by `dpsql role create`, on a raw public
table with text categorical columns and a text label (tests/data/hi_sample.csv.gz) loaded by
the owner: registration with a holdout (refused with its findings, then accepted), grants,
preview, a private `auto` release, private evaluation on the holdout, predict, and the CLI. No
table is ever granted to the analyst. Every refusal charges nothing."""

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
    _analyst_quickstart(conn, analyst_uri, f"{owner}.hi", name)
    # the owner raises the budget; the analyst sees it, and the charges
    ok(dpsql_cli("dataset", "alter", name, "--epsilon-budget", "5", dsn=owner_uri))
    budgets = {
        b["name"]: b for b in json.loads(ok(dpsql_cli("budgets", "--json", dsn=analyst_uri)))
    }
    assert (budgets[name]["epsilon_budget"], budgets[name]["epsilon_spent"]) == (5, 1)
    assert budgets[name + "_holdout"]["epsilon_spent"] == pytest.approx(0.25)
    assert _charges(conn, name) == 1 and _charges(conn, name + "_holdout") == 1


def _doc_block(path: Path, heading: str, language: str) -> str:
    """The first ``language`` code block under ``heading`` in a docs page, as written."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    start = section.index(f"```{language}\n") + len(language) + 4
    return section[start : section.index("```", start)]


def _owner_quickstart(conn, owner_uri: str, analyst: str, name: str) -> None:
    """Load, register with a holdout (findings first), grant both datasets; no table grant."""
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
        counts = owner.execute("SELECT count(*), count(DISTINCT id) FROM hi").fetchone()
        assert counts == (4000, 4000)
        (schema,) = owner.execute("SELECT current_schema()").fetchone()
    register = [
        "dataset", "register", "hi", "--name", name, "--features", ",".join(FEATURES),
        "--label", "whi", "--labels", "no,yes", "--epsilon-budget", "4", "--delta-budget",
        "1e-5", "--categories", json.dumps(CATEGORIES), "--feature-bounds", json.dumps(BOUNDS),
        "--holdout", "0.2",
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
    for dataset in (name, name + "_holdout"):
        ok(dpsql_cli("dataset", "grant", dataset, analyst, dsn=owner_uri))
    dims = conn.execute(
        "SELECT dim, split_side FROM dpsql.datasets WHERE name IN (%s, %s) ORDER BY name",
        (name, name + "_holdout"),
    ).fetchall()
    assert dims == [(21, "train"), (21, "holdout")]  # numbers, education, race, region, yes/no


def _analyst_quickstart(conn, analyst_uri: str, table: str, name: str) -> None:
    """What is there, a preview, a release, its private score on the holdout, predictions;
    never a row."""
    listed = {d["name"] for d in json.loads(ok(dpsql_cli("datasets", "--json", dsn=analyst_uri)))}
    assert listed == {name, name + "_holdout"}
    dry = json.loads(
        ok(dpsql_cli("train", name, "--privacy", "auto", "--epsilon", "1", "--dry-run", "--json",
                     dsn=analyst_uri))
    )  # fmt: skip
    held = conn.execute(
        "SELECT dpsql_internal._public_row_count(dpsql_internal._lookup_dataset(%s))",
        (name + "_holdout",),
    ).fetchone()[0]
    assert dry["rows"] + held == 4000 and 600 < held < 1000  # about a fifth held out
    assert dry["dim"] == 21 and "refused" not in dry
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
    with dpsql.connect(analyst_uri) as db:
        scored = db.evaluate(mid, name + "_holdout", epsilon=0.25)
        assert scored["rows"] == held
        assert {"accuracy", "balanced_accuracy", "roc_auc", "f1", "noise_sd"} <= set(scored)
        assert 0 < scored["noise_sd"]["accuracy"] < 0.05
        # predictions of a row given by its columns: SQL and Python agree
        row = {"whrswk": 40, "hhi": "yes", "hhi2": "no", "education": "16years", "race": "white",
               "hispanic": "no", "experience": 12, "kidslt6": 0, "kids618": 1, "husby": 50,
               "region": "west"}  # fmt: skip
        (label,) = db.conn.execute(
            "SELECT dpsql.predict_label(%s, %s)", (mid, json.dumps(row))
        ).fetchone()
        model = db.model(mid)
        frame = pd.DataFrame([row])[list(reversed(FEATURES))]  # columns found by name
        assert list(model.predict(frame)) == [label]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="features"):
            db.conn.execute("SELECT dpsql.predict(%s, '{1,2,3}')", (mid,))
        # without epsilon, a registered dataset is refused with a hint, never scored noiselessly
        with pytest.raises(dpsql.DpsqlError, match="epsilon"):
            db.evaluate(mid, name + "_holdout")
        # the analyst reads no registered row and cannot change the registration
        for query in (f"SELECT * FROM {table}",
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

    live = (
        "SELECT name FROM dpsql.datasets WHERE name IN ('hi', 'hi_holdout') AND dropped_at IS NULL"
    )
    for (name,) in conn.execute(live).fetchall():
        conn.execute("SELECT dpsql.drop_dataset(%s)", (name,))  # an interrupted run's
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
            "SELECT dataset, role, mechanism, epsilon FROM dpsql.ledger"
            " WHERE dataset IN ('hi', 'hi_holdout') AND entry_id > %s ORDER BY entry_id",
            (before,),
        ).fetchall()
        # describe; the CLI's selection (both datasets, the training side's Papernot-Steinke
        # bound just under 1); SQL's and Python's auto (its choice); Python's and SQL's
        # evaluate on the holdout. No SELECT on any table was ever granted.
        chosen = charges[3][2] if len(charges) > 3 else None
        assert charges == [
            ("hi", "alice", "describe", 0.25),
            ("hi_holdout", "alice", "tune", 1.0),
            ("hi", "alice", "tune", pytest.approx(1.0, abs=0.03)),
            ("hi", "alice", chosen, 1.0),
            ("hi", "alice", chosen, 1.0),
            ("hi_holdout", "alice", "evaluate", 0.25),
            ("hi_holdout", "alice", "evaluate", 0.25),
        ], charges
        assert not conn.execute(live).fetchone()  # the owner's last commands dropped them
    finally:
        session.close()
        for (name,) in conn.execute(live).fetchall():
            conn.execute("SELECT dpsql.drop_dataset(%s)", (name,))
        _drop_roles(conn, "olivia", "alice")
