"""The upgrade path: a database created with a released version and updated with ALTER
EXTENSION dpsql UPDATE has exactly the objects, code and privileges of a fresh install.

The released versions' install scripts are not shipped: each is built from git history, at the
commit sql/upgrade/releases.txt records for it, with that commit's own sql/Makefile, and put in
the test server's extension directory for the session. Without that history (a shallow clone,
an sdist) these tests skip, unless DPSQL_REQUIRE_HISTORY=1 (`make test`) makes that a failure."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from dpsql import extension, server
from dpsql.loading import load_numpy

ROOT = Path(__file__).resolve().parents[2]
RELEASED = extension.released_versions()
RELEASES_FILE = extension.source_dir() / "upgrade" / "releases.txt"


def _release_commits() -> dict[str, str]:
    """sql/upgrade/releases.txt: version -> the last commit at which it was current."""
    lines = RELEASES_FILE.read_text().splitlines()
    return dict(line.split() for line in lines if line.strip() and not line.startswith("#"))


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def _missing_history() -> str | None:
    """Why the release commits cannot be read here, or None when they can."""
    if _git("rev-parse", "--git-dir").returncode != 0:
        return f"{ROOT} is not a git checkout (an sdist?)"
    missing = [
        f"{version} ({commit[:12]})"
        for version, commit in _release_commits().items()
        if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0
    ]
    if missing:
        return f"release commits not in this clone (shallow?): {', '.join(missing)}"
    return None


def _build_at(version: str, commit: str, work: Path) -> bytes:
    """The install script of ``version`` as its release commit built it."""
    tree = work / version
    tree.mkdir()
    archive = _git("archive", "--format=tar", commit)
    assert archive.returncode == 0, archive.stderr.decode()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    control = (tree / "sql" / "dpsql.control").read_text()
    declared = re.search(r"^\s*default_version\s*=\s*'([^']*)'", control, re.M)
    assert declared and declared.group(1) == version, f"{commit} is not release {version}"
    script = f"dpsql--{version}.sql"
    made = subprocess.run(
        ["make", "-C", str(tree / "sql"), f"PG_CONFIG={server.pg_config_path()}", script],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    return (tree / "sql" / script).read_bytes()


@pytest.fixture(scope="module")
def _released_scripts(
    server_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Path, bytes]]:
    """Every released version's install script in the server's extension directory (built
    from history; removed again afterwards unless it was there before): path -> script."""
    problem = _missing_history()
    if problem:
        if os.environ.get("DPSQL_REQUIRE_HISTORY") == "1":
            pytest.fail(f"{problem}; DPSQL_REQUIRE_HISTORY=1 needs the full git history")
        pytest.skip(f"{problem}: the released versions are built from git history")
    try:
        with psycopg.connect(server_uri, autocommit=True) as conn:
            row = conn.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()
    except psycopg.Error:  # the pg_config view is for superusers
        row = None
    target = Path(row[0]) / "extension" if row else None
    if target is None or not os.access(target, os.W_OK):
        pytest.skip(f"the test server's extension directory ({target}) is not writable here")
    work = tmp_path_factory.mktemp("releases")
    scripts: dict[Path, bytes] = {}
    ours: list[Path] = []  # written here (or again by released_install_scripts): removed after
    try:
        for version, commit in _release_commits().items():
            path = target / f"dpsql--{version}.sql"
            script = _build_at(version, commit, work)
            if not path.exists():
                path.write_bytes(script)
                ours.append(path)
            assert path.read_bytes() == script, f"{path} is not release {version}'s script"
            scripts[path] = script
        yield scripts
    finally:
        for path in ours:
            path.unlink(missing_ok=True)


@pytest.fixture
def released_install_scripts(_released_scripts: dict[Path, bytes]) -> None:
    """The released scripts, there for this test: written again if a reinstall of the extension
    by a test on another worker (a build for another PostgreSQL, a stale library) removed
    them since the module started (one CI run lost 0.7.0's before its last test)."""
    for path, script in _released_scripts.items():
        if not path.exists():
            path.write_bytes(script)


# Everything a database's dpsql objects consist of, in comparable form.
CATALOG = {
    "functions": """
        SELECT p.oid::regprocedure::text, p.prosrc, p.prokind, p.provolatile, p.prosecdef,
               p.proisstrict, p.proparallel, coalesce(p.proconfig::text, ''),
               pg_get_function_result(p.oid), pg_get_function_arguments(p.oid),
               coalesce(p.proacl::text, '')
          FROM pg_proc p
         WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
         ORDER BY 1""",
    "relations": """
        SELECT c.relname, c.relkind, coalesce(c.relacl::text, ''),
               coalesce(array_to_string(c.reloptions, ','), '')
          FROM pg_class c
         WHERE c.relnamespace::regnamespace::text IN ('dpsql', 'dpsql_internal', 'dpsql_work')
         ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), '')
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'dpsql'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'dpsql'::regnamespace ORDER BY 1, 2""",
    "views": """
        SELECT viewname, definition FROM pg_views
         WHERE schemaname IN ('dpsql', 'dpsql_internal') ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid), tgenabled
          FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2""",
    "event_triggers": "SELECT evtname, evtevent, evtfoid::regproc::text FROM pg_event_trigger",
    "schemas": """
        SELECT nspname, coalesce(nspacl::text, '') FROM pg_namespace
         WHERE nspname LIKE 'dpsql%' ORDER BY 1""",
    "policies": """
        SELECT polrelid::regclass::text, polname, polcmd, polpermissive,
               coalesce(pg_get_expr(polqual, polrelid), ''),
               coalesce(pg_get_expr(polwithcheck, polrelid), '')
          FROM pg_policy ORDER BY 1, 2""",
    "column_privileges": """
        SELECT c.relname, a.attname, a.attacl::text FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
         WHERE c.relnamespace = 'dpsql'::regnamespace AND a.attacl IS NOT NULL ORDER BY 1, 2""",
    "members": """
        SELECT classid::regclass::text, count(*) FROM pg_depend
         WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
           AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'dpsql')
         GROUP BY 1 ORDER BY 1""",
}


@pytest.fixture
def database(server_uri: str) -> Iterator[Callable[[], psycopg.Connection]]:
    """Makes fresh databases on the test server; drops them afterwards."""
    made: list[str] = []

    def make() -> psycopg.Connection:
        name = f"upgrade_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server_uri, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return psycopg.connect(make_conninfo(server_uri, dbname=name), autocommit=True)

    yield make
    with psycopg.connect(server_uri, autocommit=True) as admin:
        for name in made:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _catalog(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    return {name: conn.execute(query).fetchall() for name, query in CATALOG.items()}


def test_every_released_version_has_a_commit_and_a_direct_upgrade(server_uri: str) -> None:
    current = extension.control_default_version()
    assert RELEASED and current not in RELEASED
    assert list(_release_commits()) == RELEASED
    with psycopg.connect(server_uri) as conn:
        paths: dict[str, str] = dict(
            conn.execute(
                "SELECT source, path FROM pg_extension_update_paths('dpsql') WHERE target = %s",
                (current,),
            ).fetchall()
        )
    for version in RELEASED:
        assert paths.get(version) == f"{version}--{current}", version


@pytest.mark.parametrize("version", RELEASED)
@pytest.mark.usefixtures("released_install_scripts")
def test_upgraded_database_equals_fresh_install(database, version: str) -> None:
    with database() as fresh, database() as upgraded:
        fresh.execute("CREATE EXTENSION dpsql")
        upgraded.execute(f"CREATE EXTENSION dpsql VERSION '{version}'")
        upgraded.execute("ALTER EXTENSION dpsql UPDATE")
        current = extension.control_default_version()
        for conn in (fresh, upgraded):
            (v,) = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'dpsql'"
            ).fetchone()
            assert v == current
        a, b = _catalog(fresh), _catalog(upgraded)
        for name in CATALOG:
            only_fresh = sorted(set(a[name]) - set(b[name]))
            only_upgraded = sorted(set(b[name]) - set(a[name]))
            assert not only_fresh and not only_upgraded, (name, only_fresh[:3], only_upgraded[:3])


@pytest.mark.usefixtures("released_install_scripts")
def test_upgrade_moves_what_owners_planted_in_dpsql_work(database) -> None:
    """Issue 24: before 0.8.0 data owners could create in dpsql_work; their relations and
    types there, under a future run's name, would fail (or be used by) private runs."""
    with database() as conn:
        conn.execute(f"CREATE EXTENSION dpsql VERSION '{RELEASED[-1]}'")
        owner = f"owner_{uuid.uuid4().hex[:8]}"
        conn.execute(f"CREATE ROLE {owner} IN ROLE dpsql_admin")
        try:
            conn.execute(f"SET ROLE {owner}")
            (n,) = conn.execute(
                "SELECT nextval(pg_get_serial_sequence('dpsql.runs', 'run_id'))"
            ).fetchone()
            conn.execute(f"CREATE TABLE dpsql_work.train_{n + 1} (id serial, x float8[])")
            conn.execute(f"CREATE VIEW dpsql_work.train_{n + 2} AS SELECT 1 AS x")
            conn.execute(f"CREATE TYPE dpsql_work.train_{n + 3} AS (x int)")
            conn.execute("RESET ROLE")
            conn.execute("ALTER EXTENSION dpsql UPDATE")
            left = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner"
                " WHERE c.relnamespace = 'dpsql_work'::regnamespace AND r.rolname = %s",
                (owner,),
            ).fetchone()[0]
            assert left == 0
            moved = conn.execute(
                "SELECT count(*) FROM pg_type WHERE typnamespace = 'dpsql_owner_work'::regnamespace"
                " AND typname LIKE 'train_%%' AND typcategory <> 'A'"
            ).fetchone()[0]
            assert moved == 3
            conn.execute(
                "CREATE TABLE pts AS SELECT (g % 7) / 7.0 AS a,"
                " CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END AS y"
                " FROM generate_series(1, 100) g"
            )
            conn.execute("SELECT dpsql.register_dataset('pts', '{a}', 'y', 10)")
            for _ in range(3):
                conn.execute(
                    "SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => 1,"
                    " epochs => 1)"
                )
        finally:
            conn.execute("RESET ROLE")
            conn.execute(f"DROP OWNED BY {owner}")
            conn.execute(f"DROP ROLE {owner}")


@pytest.mark.parametrize("version", RELEASED)
@pytest.mark.usefixtures("released_install_scripts")
def test_upgrade_keeps_data_and_budgets(database, version: str) -> None:
    """A registered dataset, its ledger and its models survive the update, and still train."""
    with database() as conn:
        conn.execute(f"CREATE EXTENSION dpsql VERSION '{version}'")
        conn.execute("CREATE TABLE pts (x float8[], y float8)")
        conn.execute(
            "INSERT INTO pts SELECT ARRAY[(i % 7) / 7.0, (i % 5) / 5.0],"
            " CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END FROM generate_series(1, 200) i"
        )
        (ds,) = conn.execute(
            "SELECT dpsql.register_dataset('pts', '{x}', 'y', epsilon_budget => 2)"
        ).fetchone()
        (m1,) = conn.execute(
            "SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => 0.5,"
            " epochs => 1)"
        ).fetchone()
        conn.execute("ALTER EXTENSION dpsql UPDATE")
        (labels, spent) = conn.execute(
            "SELECT d.labels, b.epsilon_spent FROM dpsql.datasets d"
            " JOIN dpsql.budgets b USING (dataset_id) WHERE dataset_id = %s",
            (ds,),
        ).fetchone()
        assert labels == [-1.0, 1.0] and spent == pytest.approx(0.5)
        assert (
            conn.execute("SELECT count(*) FROM dpsql.models WHERE model_id = %s", (m1,)).fetchone()[
                0
            ]
            == 1
        )
        (m2,) = conn.execute(
            "SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => 0.5,"
            " epochs => 1)"
        ).fetchone()
        assert m2 > m1


@pytest.mark.usefixtures("released_install_scripts")
def test_upgraded_models_mean_what_they_say(database) -> None:
    """Issue 25: 0.7.0 stored DPSGD-F models for rows centred on their private mean, and scored
    the private-ERM fits with an intercept in another representation than they trained in.
    The upgrade folds the centre into the intercept (predictions unchanged to 1e-12) and records
    the ERM fits' representation: afterwards predict equals sigmoid(x_t . coef + intercept) by
    hand, x_t the row clipped to the unit ball as registered."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 3)) / 2 + 0.5  # far from the origin: centring matters
    y = np.where(X @ np.array([2.0, -1.0, 0.5]) > 0.6, 1.0, -1.0)
    probe = X[:50]
    with database() as conn:
        conn.execute(f"CREATE EXTENSION dpsql VERSION '{RELEASED[-1]}'")
        load_numpy(conn, "cls", X, y, schema="public")
        conn.execute(
            "SELECT dpsql.register_dataset('public.cls', '{x}', 'y', 1e6, 0.5, name => 'cls',"
            " row_norm => 'clip')"
        )

        def predict(mid: int) -> np.ndarray:
            return np.array(
                [
                    conn.execute(
                        "SELECT dpsql.predict(%s, %s)", (mid, [float(v) for v in x])
                    ).fetchone()[0]
                    for x in probe
                ]
            )

        before = {}
        for privacy, extra in (
            ("dpsgd_f", "delta => 1e-5"),
            ("objective_perturbation", "intercept => true"),
        ):
            (mid,) = conn.execute(
                f"SELECT dpsql.train('cls', NULL, NULL, 'logistic', privacy => '{privacy}',"
                f" epsilon => 100, noise_seed => 3, {extra})"
            ).fetchone()
            before[privacy] = (mid, predict(mid))
        conn.execute("ALTER EXTENSION dpsql UPDATE")
        clipped = probe / np.maximum(1.0, np.linalg.norm(probe, axis=1))[:, None]
        for privacy, (mid, old) in before.items():
            coef, intercept = conn.execute(
                "SELECT coef, intercept FROM dpsql.models WHERE model_id = %s", (mid,)
            ).fetchone()
            by_hand = 1 / (1 + np.exp(-(clipped @ np.asarray(coef) + intercept[0])))
            new = predict(mid)
            assert np.abs(new - by_hand).max() < 1e-12, privacy
            if privacy == "dpsgd_f":
                assert np.abs(new - old).max() < 1e-12  # the fold is exact
            else:
                assert np.abs(new - old).max() > 1e-3  # scored as trained now, not as before
