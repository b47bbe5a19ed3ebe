"""The `dpsql` command against the test server, run as a user runs it: the installed entry point
in a subprocess (its output, exit code and what it changed in the server)."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import dpsql
from dpsql import cli, extension
from tests.pg_helpers import binary_dataset, load

COMMANDS = [
    "server",
    "role",
    "dataset",
    "install-extension",
    "demo",
    "datasets",
    "budgets",
    "models",
    "ledger",
    "mechanisms",
    "train",
    "plot",
    "load",
    "evaluate",
    "predict",
]


def _entry_point() -> list[str]:
    script = Path(sys.executable).with_name("dpsql")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dpsql.cli"]


def dpsql_cli(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `dpsql ARGS` with DPSQL_DSN set to ``dsn`` (or unset). DPSQL_PGDATA points at an
    empty directory: no command may fall back to the user's own embedded server."""
    env = {k: v for k, v in os.environ.items() if k not in ("DPSQL_DSN", "DPSQL_PGDATA")}
    env["DPSQL_PGDATA"] = str(Path(tempfile.gettempdir()) / f"dpsql-cli-none-{uuid.uuid4().hex}")
    if dsn is not None:
        env["DPSQL_DSN"] = dsn
    return subprocess.run(
        [*_entry_point(), *args], capture_output=True, text=True, env=env, timeout=600
    )


@functools.cache
def dpsql_help() -> subprocess.CompletedProcess[str]:
    """`dpsql --help`, run once for the tests that read it (issue 43)."""
    return dpsql_cli("--help")


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The CLI's error contract: exit ``code``, ``dpsql: ...`` plus at most a hint, no
    traceback. Returns the message line."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("dpsql:"), result.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), lines
    return lines[0]


def assert_aligned(text: str) -> None:
    """Every column of a text table starts where its dashes start, in every line."""
    lines = text.splitlines()
    assert set(lines[1]) <= {"-", " "}
    starts = [m.start() for m in re.finditer(r"-+", lines[1])]
    for line in lines[:1] + lines[2:]:
        for start in starts[1:]:
            if len(line) > start:
                assert line[start - 1] == " ", (line, start)


def dataset_name(conn: psycopg.Connection, dataset_id: int) -> str:
    row = conn.execute(
        "SELECT name FROM dpsql.datasets WHERE dataset_id = %s", (dataset_id,)
    ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def dataset(conn: psycopg.Connection, scratch_schema: str) -> tuple[str, str]:
    """A registered binary dataset (budget epsilon 1000, delta 0.5): (name, source table)."""
    dataset_id, source, _, _ = binary_dataset(conn, scratch_schema)
    return dataset_name(conn, dataset_id), source


# --- help and versions ---------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    result = dpsql_help()
    assert result.returncode == 0
    for command in COMMANDS:
        assert re.search(rf"^\s+{re.escape(command)}\s", result.stdout, re.MULTILINE), command
    # --analyst and --owner exclude each other (a usage error, before any server is asked).
    assert cli.main(["role", "create", "x", "--analyst", "--owner"]) == 2


def test_version_reports_package_extension_and_server(conn: psycopg.Connection, server_uri) -> None:
    (installed,) = conn.execute(
        "SELECT extversion FROM pg_extension WHERE extname = 'dpsql'"
    ).fetchone()
    result = dpsql_cli("--version", dsn=server_uri)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"dpsql {dpsql.__version__}"
    assert lines[1].startswith(f"extension: {extension.control_default_version()} available")
    assert lines[2].startswith(f"server: dpsql extension {installed}")


def test_version_without_a_server() -> None:
    result = dpsql_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("server: not running")


def test_commands_without_a_server_exit_3() -> None:
    result = dpsql_cli("datasets")
    assert_one_line_error(result, code=cli.EXIT_NOT_RUNNING)
    assert "no server" in result.stderr


def test_a_database_without_the_extension(conn: psycopg.Connection, server_uri) -> None:
    """Said as such, by --version and by the commands (not "relation ... does not exist")."""
    name = f"cli_noext_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        uri = make_conninfo(server_uri, dbname=name)
        version = dpsql_cli("--version", dsn=uri)
        assert version.returncode == 0, version.stderr
        assert version.stdout.splitlines()[-1].startswith("server: dpsql extension not created")
        message = assert_one_line_error(dpsql_cli("ledger", "--dsn", uri))
        assert "extension is not created" in message and name in message
    finally:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


# --- listings ------------------------------------------------------------------------------


def test_listings_show_a_registered_dataset(dataset, server_uri) -> None:
    name, source = dataset
    rows = as_json(dpsql_cli("datasets", "--json", "--dataset", name, dsn=server_uri))
    assert [(r["name"], r["epsilon_budget"], r["delta_budget"]) for r in rows] == [
        (name, 1000, 0.5)
    ]
    assert rows[0]["features"] == ["x"] and rows[0]["label"] == "y"
    budgets = as_json(dpsql_cli("budgets", "--json", "--dataset", name, "--dsn", server_uri))
    assert [(b["epsilon_spent"], b["epsilon_remaining"]) for b in budgets] == [(0, 1000)]
    assert as_json(dpsql_cli("ledger", "--json", "--dataset", name, "--dsn", server_uri)) == []
    assert as_json(dpsql_cli("models", "--json", "--dataset", name, "--dsn", server_uri)) == []
    mechanisms = as_json(dpsql_cli("mechanisms", "--json", "--dsn", server_uri))
    assert "bolton" in {m["name"] for m in mechanisms}

    for command in ["datasets", "budgets"]:
        text = dpsql_cli(command, "--dsn", server_uri)
        assert text.returncode == 0, text.stderr
        assert text.stdout.startswith("dataset_id  name")
        assert_aligned(text.stdout)
        (line,) = [li for li in text.stdout.splitlines() if f" {name} " in li]
        assert "1000" in line
    empty = dpsql_cli("ledger", "--dataset", name, "--dsn", server_uri)
    assert empty.stdout.splitlines()[-1] == "(no rows)"


# --- train ---------------------------------------------------------------------------------


def test_train_private_charges_the_ledger(dataset, server_uri) -> None:
    name, _ = dataset
    args = f"train {name} --privacy bolton --epsilon 1 --epochs 2 --seed 3 --no-progress"
    result = dpsql_cli(*args.split(), "--dsn", server_uri)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    match = re.fullmatch(rf"model (\d+): logistic on {name}, bolton \(epsilon 1, delta 0\)", first)
    assert match, first
    model_id = int(match.group(1))
    assert second == f"budget left on {name}: epsilon 999 of 1000, delta 0.5 of 0.5"

    (entry,) = as_json(dpsql_cli("ledger", "--json", "--dataset", name, "--dsn", server_uri))
    assert (entry["model_id"], entry["mechanism"], entry["epsilon"], entry["delta"]) == (
        model_id,
        "bolton",
        1,
        0,
    )
    (budget,) = as_json(dpsql_cli("budgets", "--json", "--dataset", name, "--dsn", server_uri))
    assert (budget["epsilon_spent"], budget["epsilon_remaining"]) == (1, 999)
    (model,) = as_json(dpsql_cli("models", "--json", "--dataset", name, "--dsn", server_uri))
    assert (model["model_id"], model["privacy"], model["dataset"]) == (model_id, "bolton", name)
    assert model["source"] == name  # (issue 42: it showed the internal query that reads it)
    with dpsql.connect(server_uri, install=False) as db:
        assert f"dataset={name!r}" in repr(db.model(model_id))
    ledger = dpsql_cli("ledger", "--dataset", name, "--dsn", server_uri)
    assert_aligned(ledger.stdout)
    assert re.search(rf"^\s+\d+\s+{name}\s+{model_id}\s+bolton\s+1\s+0\s", ledger.stdout, re.M)

    # The JSON summary of a run with a mechanism parameter (--param) and --delta.
    args = f"train {name} --privacy bolton --epsilon 0.5 --delta 1e-6 --param gaussian=classic"
    summary = as_json(dpsql_cli(*args.split(), "--epochs", "1", "--json", "--dsn", server_uri))
    assert (summary["privacy"], summary["epsilon"], summary["delta"]) == ("bolton", 0.5, 1e-6)
    assert summary["budget"]["epsilon_remaining"] == pytest.approx(998.5)

    # The mechanism's own flags, from its spec: recorded as the Python class would send them.
    args = f"train {name} --privacy dpsgd --epsilon 0.5 --delta 1e-6 --sampling poisson"
    args += " --clip-norm 2 --epochs 1 --json"
    summary = as_json(dpsql_cli(*args.split(), "--dsn", server_uri))
    (privacy,) = db_privacy(server_uri, summary["model_id"])
    assert (privacy["sampling"], privacy["clip_norm"]) == ("poisson", 2)


def db_privacy(server_uri: str, model_id: int) -> tuple[dict]:
    with psycopg.connect(server_uri) as conn:
        return conn.execute(
            "SELECT params->'privacy' FROM dpsql.model_store WHERE model_id = %s", (model_id,)
        ).fetchone()


def test_train_refusals_are_one_line(dataset, server_uri) -> None:
    name, _ = dataset
    over = dpsql_cli(*f"train {name} --privacy bolton --epsilon 5000".split(), dsn=server_uri)
    message = assert_one_line_error(over)
    assert "budget" in message
    (budget,) = as_json(dpsql_cli("budgets", "--json", "--dataset", name, "--dsn", server_uri))
    assert budget["epsilon_spent"] == 0  # nothing charged

    unknown = dpsql_cli(
        *["train", "no_such_dataset", "--privacy", "bolton", "--epsilon", "1"], dsn=server_uri
    )
    assert_one_line_error(unknown)
    args = f"train {name} --privacy bolton --epsilon 1 --param clip=2"
    bad_param = dpsql_cli(*args.split(), dsn=server_uri)
    assert "gaussian" in assert_one_line_error(bad_param)  # it lists what bolton takes
    args = f"train {name} --privacy bolton --epsilon 1 --clip-norm 2"
    not_taken = assert_one_line_error(dpsql_cli(*args.split(), dsn=server_uri))
    assert "--clip-norm: bolton does not take it" in not_taken
    # Usage errors (exit 2): a private run needs epsilon; a non-private one its columns.
    assert dpsql_cli("train", name, "--privacy", "bolton", "--dsn", server_uri).returncode == 2
    assert dpsql_cli("train", "--privacy", "none", "--source", "t").returncode == 2


def test_train_not_private(dataset, server_uri) -> None:
    _, source = dataset
    args = f"train --privacy none --source {source} --features x --label y --labels 0,1"
    args += " --epochs 2 --seed 1 --intercept --json"
    summary = as_json(dpsql_cli(*args.split(), "--dsn", server_uri))
    assert (summary["privacy"], summary["epsilon"], summary["budget"]) == ("none", None, None)
    assert summary["epochs_run"] == 2
    models = as_json(dpsql_cli("models", "--json", "--dsn", server_uri))
    (model,) = [m for m in models if m["model_id"] == summary["model_id"]]
    assert model["source"] == source and model["fit_intercept"] is True


# --- roles ---------------------------------------------------------------------------------


def _drop_role(conn: psycopg.Connection, name: str) -> None:
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
    )
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_analyst_sees_only_granted_datasets(
    conn: psycopg.Connection, scratch_schema: str, server_uri
) -> None:
    granted = dataset_name(conn, binary_dataset(conn, scratch_schema)[0])
    other = dataset_name(conn, binary_dataset(conn, scratch_schema)[0])
    analyst, owner = f"cli_ana_{uuid.uuid4().hex[:8]}", f"cli_own_{uuid.uuid4().hex[:8]}"
    try:
        made = dpsql_cli("role", "create", analyst, "--analyst", "--dsn", server_uri)
        assert made.returncode == 0, made.stderr
        analyst_uri = made.stdout.strip()
        made = dpsql_cli("role", "create", owner, "--owner", dsn=server_uri)
        assert made.returncode == 0, made.stderr
        ((is_analyst, is_owner),) = conn.execute(
            "SELECT pg_has_role(%s, 'dpsql_analyst', 'MEMBER'),"
            " pg_has_role(%s, 'dpsql_admin', 'MEMBER')",
            (analyst, owner),
        ).fetchall()
        assert is_analyst and is_owner
        conn.execute(
            "SELECT dpsql.grant_dataset(dataset_id, %s) FROM dpsql.datasets WHERE name = %s",
            (analyst, granted),
        )

        rows = as_json(dpsql_cli("datasets", "--json", "--dsn", analyst_uri))
        assert [r["name"] for r in rows] == [granted]
        budgets = as_json(dpsql_cli("budgets", "--json", dsn=analyst_uri))
        assert [b["name"] for b in budgets] == [granted]

        # The analyst trains on the granted dataset, and sees the release; not on the other.
        args = f"train {granted} --privacy bolton --epsilon 1 --epochs 1"
        trained = dpsql_cli(*args.split(), "--dsn", analyst_uri)
        assert trained.returncode == 0, trained.stderr
        models = as_json(dpsql_cli("models", "--json", "--dsn", analyst_uri))
        assert [(m["dataset"], m["created_by"]) for m in models] == [(granted, analyst)]
        (entry,) = as_json(dpsql_cli("ledger", "--json", "--dsn", analyst_uri))
        assert (entry["dataset"], entry["role"]) == (granted, analyst)
        refused = dpsql_cli(*f"train {other} --privacy bolton --epsilon 1".split(), dsn=analyst_uri)
        assert_one_line_error(refused)
    finally:
        for name in (analyst, owner):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
                _drop_role(conn, name)


def test_role_create_owner_list_reset_and_drop(conn: psycopg.Connection, server_uri) -> None:
    """Issue 27: an owner made by `dpsql role create --owner` creates tables unqualified (a
    schema of their own, first on their search_path); logins are postgresql:// URIs that psycopg
    and SQLAlchemy take; list, reset and drop."""
    owner = f"cli_own_{uuid.uuid4().hex[:8]}"
    try:
        made = dpsql_cli("role", "create", owner, "--owner", dsn=server_uri)
        assert made.returncode == 0, made.stderr
        uri = made.stdout.strip()
        assert uri.startswith("postgresql://")
        with psycopg.connect(uri, autocommit=True) as o:
            o.execute("CREATE TABLE mine (a float8, y float8)")
            (schema,) = o.execute(
                "SELECT relnamespace::regnamespace::text FROM pg_class WHERE relname = 'mine'"
            ).fetchone()
            assert schema == owner
        sqlalchemy = pytest.importorskip("sqlalchemy")
        engine = sqlalchemy.create_engine(uri.replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect() as c:
            assert c.execute(sqlalchemy.text("SELECT current_user")).scalar() == owner
        engine.dispose()
        (listed,) = [
            r
            for r in as_json(dpsql_cli("role", "list", "--json", dsn=server_uri))
            if r["name"] == owner
        ]
        assert (listed["kind"], listed["schema"], listed["login"]) == ("owner", owner, True)
        reset = dpsql_cli("role", "reset", owner, dsn=server_uri)
        assert reset.returncode == 0, reset.stderr
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(uri).close()
        psycopg.connect(reset.stdout.strip()).close()
        # the owner's schema and table: refused without --force, dropped with it
        assert_one_line_error(dpsql_cli("role", "drop", owner, dsn=server_uri))
        dropped = dpsql_cli("role", "drop", owner, "--force", dsn=server_uri)
        assert dropped.returncode == 0, dropped.stderr
        assert (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (owner,)).fetchone() is None
        )
        assert_one_line_error(dpsql_cli("role", "drop", "postgres", dsn=server_uri))
    finally:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (owner,)).fetchone():
            _drop_role(conn, owner)


def test_a_closed_pipe_is_no_error_message(dataset, server_uri) -> None:
    """`dpsql budgets --json | head -1`: the reader leaves early, and dpsql says nothing."""
    cmd = " ".join(shlex.quote(a) for a in [*_entry_point(), "mechanisms", "--json"])
    env = {**os.environ, "DPSQL_DSN": server_uri}
    done = subprocess.run(
        f"{cmd} | head -c 1", shell=True, capture_output=True, text=True, env=env, timeout=120
    )
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr


# --- plot ----------------------------------------------------------------------------------


def test_plot_writes_an_image(
    conn: psycopg.Connection, scratch_schema: str, server_uri, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("dpsql.plot")
    dataset_id, _, _, _ = binary_dataset(conn, scratch_schema)
    name = dataset_name(conn, dataset_id)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(500, 4)) / 2
    y = (X @ np.array([2.0, -1.0, 0.5, 0.0]) > 0).astype(float)
    test = load(conn, scratch_schema, "cli_test_rows", X, y)
    out = tmp_path / "fig.png"
    args = f"plot {name} --mechanisms bolton,dpsgd --epsilons 0.5,1 --test {test} --out {out}"
    result = dpsql_cli(*args.split(), "--epochs", "1", "--seed", "1", "--dsn", server_uri)
    assert result.returncode == 0, result.stderr
    # the numbers behind the figure and the epsilon they spent, then where it went (issue 42)
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == f"wrote {out}"
    assert lines[0].split()[:2] == ["epsilon", "mechanism"]
    assert any(line.split()[:2] == ["1", "dpsgd"] for line in lines)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (budget,) = as_json(dpsql_cli("budgets", "--json", "--dataset", name, "--dsn", server_uri))
    assert budget["epsilon_spent"] == pytest.approx(3)  # two mechanisms at 0.5 and 1

    # A plan beyond the remaining budget is refused before any run: one line, exit 1.
    args = f"plot {name} --mechanisms bolton --epsilons 600,600 --test {test} --out {out}"
    assert "1200" in assert_one_line_error(dpsql_cli(*args.split(), "--dsn", server_uri))
    (after,) = as_json(dpsql_cli("budgets", "--json", "--dataset", name, "--dsn", server_uri))
    assert after["epsilon_spent"] == budget["epsilon_spent"]


def test_version_asks_the_server_of_dsn(server_uri) -> None:
    """Issue 42: `dpsql --version --dsn URI` ignored --dsn (and said "not running")."""
    result = dpsql_cli("--version", "--dsn", server_uri)  # (no DPSQL_DSN, no embedded server)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("server: dpsql extension")


def test_datasets_shows_text_labels_and_categories(conn, scratch_schema, server_uri) -> None:
    """Issue 42: `dpsql datasets` showed a text label as 0,1 and no categorical features."""
    table = f"{scratch_schema}.cats_{uuid.uuid4().hex[:6]}"
    conn.execute(
        f"CREATE TABLE {table} AS SELECT g::float8 / 100 AS a,"
        " (ARRAY['red', 'blue', 'green'])[1 + g % 3] AS colour,"
        " (ARRAY['<=50K', '>50K'])[1 + g % 2] AS income FROM generate_series(1, 200) g"
    )
    name = f"cats_{uuid.uuid4().hex[:6]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,colour}', 'income', 1.0,"
        " labels => '{<=50K,>50K}'::text[],"
        """ categories => '{"colour": ["red", "blue", "green"]}',"""
        " feature_bounds => '{{0,2}}', name => %s)",
        (table, name),
    )
    (row,) = as_json(dpsql_cli("datasets", "--json", "--dataset", name, "--dsn", server_uri))
    assert row["label_set"] == ["<=50K", ">50K"] and row["categorical"] == "colour(3)"
    text = dpsql_cli("datasets", "--dataset", name, "--dsn", server_uri).stdout
    assert "<=50K,>50K" in text and "colour(3)" in text
