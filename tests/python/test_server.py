"""Tests of dpsql.server, dpsql.extension and the CLI, against real embedded servers.

Every server here runs on its own temporary data directory, so the user's default server is never
touched; each test stops what it started.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from dpsql import cli, extension, server


@pytest.fixture
def pgdata() -> Iterator[Path]:
    """A data directory that does not exist yet; its server is stopped after the test.

    Not under pytest's tmp_path: pytest resets its base directory to mode 0700, which cuts off
    the unprivileged server user (when tests run as root) if another pytest session starts.
    """
    parent = Path(tempfile.mkdtemp(prefix="dpsql-test-"))
    path = parent / "pg"
    yield path
    if (path / "PG_VERSION").exists():
        server.stop(pgdata=path)
    shutil.rmtree(parent, ignore_errors=True)


# One new cluster of the default version, started by this process with keep_running=False (as
# each of its tests started its own before issue 43): for the tests that look at a new cluster or
# need a running server of this installation, without starting or stopping it. The lifecycle
# tests (start, stop, idempotence, who keeps a server running) start their own.
SHARED = pytest.mark.xdist_group("test_server_shared_cluster")


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[tuple[Path, str]]:
    """(data directory, URI) of the module's running new cluster."""
    parent = Path(tempfile.mkdtemp(prefix="dpsql-test-"))
    path = parent / "pg"
    try:
        yield path, server.start(pgdata=path, keep_running=False)
    finally:
        if (path / "PG_VERSION").exists():
            server.stop(pgdata=path)
        shutil.rmtree(parent, ignore_errors=True)


def _postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def _select_one(uri: str) -> int:
    with psycopg.connect(uri, connect_timeout=10) as conn:
        return conn.execute("SELECT 1").fetchone()[0]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


# --- paths ----------------------------------------------------------------------------------


def test_pgdata_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPSQL_PGDATA", str(tmp_path / "elsewhere"))
    assert server.pgdata_dir() == tmp_path / "elsewhere"
    assert server.pgdata_dir(16) == tmp_path / "elsewhere"


def test_pgdata_dir_default_is_per_user_version_and_installation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DPSQL_PGDATA", raising=False)
    assert server.pgdata_dir(16).name.startswith("pgdata-16-")
    assert server.pgdata_dir(18).name.startswith("pgdata-18-")
    assert server.pgdata_dir(18).parent.name == "dpsql"
    assert server.pgdata_dir() == server.pgdata_dir(server.DEFAULT_PG_VERSION)
    # another checkout or virtualenv (other binaries): another default cluster
    ours = server.pgdata_dir(18)
    monkeypatch.setattr(server, "bin_dir", lambda version=None: tmp_path / "other" / "bin")
    assert server.pgdata_dir(18) != ours
    assert server.pgdata_dir(18).parent == ours.parent


@pytest.mark.parametrize("version", server.SUPPORTED_PG_VERSIONS)
def test_embedded_pg_config(version: int) -> None:
    pg_config = server.pg_config_path(version)
    assert pg_config.parent == server.bin_dir(version)
    assert os.access(pg_config, os.X_OK)
    out = subprocess.run([pg_config, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"PostgreSQL {version}.")


def test_unsupported_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not embedded"):
        server.pg_config_path(15)
    with pytest.raises(ValueError, match="not embedded"):
        server.start(15, tmp_path / "pg")
    assert not (tmp_path / "pg").exists()


def test_importing_pgserver_does_not_warn() -> None:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    code = "from dpsql import server; server.bin_dir(); server.status(pgdata='/nonexistent')"
    result = _run("-W", "error", "-c", code, env=env)
    assert result.returncode == 0, result.stderr


# --- start / status / stop ------------------------------------------------------------------


@pytest.mark.parametrize("version", server.SUPPORTED_PG_VERSIONS)
def test_start_is_idempotent(pgdata: Path, version: int) -> None:
    uri = server.start(version, pgdata, keep_running=False)
    assert uri.startswith("postgresql://")
    pid = _postmaster_pid(pgdata)
    assert server.start(version, pgdata) == uri
    assert server.start(None, pgdata) == uri  # the cluster's own version is adopted
    assert _postmaster_pid(pgdata) == pid  # no second server, no restart
    assert _select_one(uri) == 1
    with psycopg.connect(uri) as conn:
        assert conn.info.server_version // 10000 == version


@SHARED
def test_new_cluster_is_tuned(shared_cluster: tuple[Path, str]) -> None:
    _, uri = shared_cluster
    with psycopg.connect(uri) as conn:
        for name, value in server._tuning(server.DEFAULT_PG_VERSION).items():
            assert conn.execute(f"SHOW {name}").fetchone()[0] == value
        # Written like ALTER SYSTEM would, hence undoable with ALTER SYSTEM RESET.
        rows = conn.execute(
            "SELECT name, sourcefile FROM pg_settings WHERE name = 'work_mem'"
        ).fetchall()
        assert rows[0][1].endswith("postgresql.auto.conf")


def test_status_and_stop(pgdata: Path) -> None:
    assert server.status(pgdata=pgdata) is None
    assert server.stop(pgdata=pgdata) is False
    uri = server.start(pgdata=pgdata, keep_running=False)
    assert server.status(pgdata=pgdata) == uri
    assert server.stop(pgdata=pgdata) is True
    assert server.status(pgdata=pgdata) is None
    assert server.stop(pgdata=pgdata) is False
    with pytest.raises(psycopg.OperationalError):
        _select_one(uri)
    # Restart in the same process (pgserver caches handles per data directory).
    assert server.start(pgdata=pgdata, keep_running=False) == uri
    assert _select_one(uri) == 1


@SHARED
def test_a_server_of_other_binaries_is_not_adopted(
    shared_cluster: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The server another checkout (other binaries) left running on the data directory.
    pgdata, _ = shared_cluster
    version = server.DEFAULT_PG_VERSION
    uri = server.start(version, pgdata)
    running = Path(os.readlink(f"/proc/{_postmaster_pid(pgdata)}/exe"))
    assert running == (server.bin_dir(version) / "postgres").resolve()
    with monkeypatch.context() as seen_from_another_install:
        other = tmp_path / "other-checkout" / "bin"
        seen_from_another_install.setattr(server, "bin_dir", lambda version=None: other)
        for adopt in (server.start, server.status):
            with pytest.raises(RuntimeError, match="not from this installation") as err:
                adopt(version, pgdata)
            assert str(running) in str(err.value) and str(other) in str(err.value)
        code = cli.main(["server", "start", "--pgdata", str(pgdata)])
        assert code == cli.EXIT_ERROR
    assert server.start(version, pgdata) == uri  # its own installation adopts it


def test_a_server_whose_binaries_were_deleted_is_not_adopted(tmp_path: Path) -> None:
    program = tmp_path / "postgres"
    shutil.copy("/bin/sleep", program)
    process = subprocess.Popen([str(program), "60"])
    try:
        program.unlink()  # as when a virtualenv is removed or pgserver upgraded under it
        info = type("Info", (), {"pid": process.pid})()
        with pytest.raises(RuntimeError, match="binaries were deleted or replaced"):
            server._check_ours(info, tmp_path, 18)
    finally:
        process.kill()
        process.wait()


def test_version_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    pgdata = tmp_path / "pg"
    pgdata.mkdir()
    (pgdata / "PG_VERSION").write_text("16\n")
    with pytest.raises(RuntimeError, match="PostgreSQL 16 cluster"):
        server.start(18, pgdata)


@pytest.mark.parametrize("keep_running", [True, False])
def test_keep_running_decides_whether_the_server_outlives_its_starter(
    pgdata: Path, keep_running: bool
) -> None:
    code = (
        "import sys; from dpsql import server; "
        f"print(server.start(pgdata=sys.argv[1], keep_running={keep_running}))"
    )
    result = _run("-c", code, str(pgdata))
    assert result.returncode == 0, result.stderr
    uri = result.stdout.strip()
    if keep_running:
        assert server.status(pgdata=pgdata) == uri
        assert _select_one(uri) == 1
    else:
        assert server.status(pgdata=pgdata) is None


@SHARED
def test_keep_running_false_never_stops_a_server_it_did_not_start(
    shared_cluster: tuple[Path, str],
) -> None:
    pgdata, uri = shared_cluster  # started by this process, not by the one below
    code = (
        "import sys; from dpsql import server; server.start(pgdata=sys.argv[1], keep_running=False)"
    )
    result = _run("-c", code, str(pgdata))
    assert result.returncode == 0, result.stderr
    assert server.status(pgdata=pgdata) == uri


def test_temporary_server_is_removed(tmp_path: Path) -> None:
    with server.temporary_server() as uri:
        assert _select_one(uri) == 1
        pgdata = Path(str(conninfo_to_dict(uri)["host"]))
        assert (pgdata / "PG_VERSION").exists()
        assert server.password_file(pgdata).exists()
    assert not pgdata.exists()
    assert not server.password_file(pgdata).exists()


# --- CLI ------------------------------------------------------------------------------------


def test_cli_server_lifecycle(pgdata: Path) -> None:
    env = {**os.environ, "DPSQL_PGDATA": str(pgdata)}

    def dpsql(*args: str) -> subprocess.CompletedProcess[str]:
        return _run("-m", "dpsql.cli", "server", *args, env=env)

    started = dpsql("start")
    assert started.returncode == 0, started.stderr
    uri = started.stdout.strip()
    assert uri.startswith("postgresql://") and str(pgdata) in uri
    # The CLI process has exited; the server must still be there.
    assert _select_one(uri) == 1
    assert dpsql("start").stdout.strip() == uri
    status = dpsql("status")
    assert (status.returncode, status.stdout.strip()) == (0, uri)
    assert dpsql("uri").stdout.strip() == uri

    stopped = dpsql("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert server.status(pgdata=pgdata) is None
    status = dpsql("status")
    assert status.returncode == cli.EXIT_NOT_RUNNING and "not running" in status.stdout
    assert dpsql("uri").returncode == cli.EXIT_NOT_RUNNING
    again = dpsql("stop")
    assert again.returncode == 0 and "not running" in again.stdout


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["server", "start", "--pg-version", "15"]) == 2
    assert "not an embedded version" in capsys.readouterr().err
    assert cli.main(["install-extension", "--pg-config", "x", "--pg-version", "18"]) == 2
    assert cli.main(["--help"]) == 0


def test_cli_install_extension_reports_bad_pg_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["install-extension", "--pg-config", "/nonexistent/pg_config"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dpsql: error:") and "/nonexistent/pg_config" in err


# --- extension build ------------------------------------------------------------------------


def test_source_dir_and_control_version() -> None:
    sql_dir = extension.source_dir()
    assert (sql_dir / "dpsql.control").is_file()
    assert (sql_dir / "Makefile").is_file()
    assert extension.control_default_version().count(".") == 2


@pytest.mark.parametrize("bogus", ["/nonexistent/pg_config", "/bin/false"])
def test_build_and_install_rejects_bogus_pg_config(bogus: str) -> None:
    with pytest.raises(RuntimeError, match="pg_config"):
        extension.build_and_install(bogus)


def _fake_pg_config(tmp_path: Path) -> Path:
    """A pg_config answering --pkglibdir/--sharedir with folders under tmp_path."""
    script = tmp_path / "pg_config"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --pkglibdir) echo {tmp_path}/lib;; --sharedir) echo {tmp_path}/share;; '
        "*) exit 1;; esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_installed_library_is_stale(tmp_path: Path) -> None:
    pg_config = _fake_pg_config(tmp_path)
    assert extension.installed_library_is_stale(pg_config)  # nothing installed
    library = tmp_path / "lib" / "dpsql.so"
    control = tmp_path / "share" / "extension" / "dpsql.control"
    for path in (library, control):
        path.parent.mkdir(parents=True)
        path.touch()
    assert not extension.installed_library_is_stale(pg_config)  # installed after the sources
    os.utime(library, (0, 0))
    assert extension.installed_library_is_stale(pg_config)  # sources edited since


def test_each_postgresql_builds_in_a_copy_kept_in_step_with_the_sources(tmp_path: Path) -> None:
    """install-extension builds in sql/build/<PostgreSQL>/: one copy per version and headers; a
    changed source reaches it newer than its objects (even when the new file is older), a
    removed one leaves it, and nothing else (objects) is touched."""
    sql = tmp_path / "src" / "sql"
    for name in ("Makefile", "dpsql.control", "src/glue.c", "install/10_a.sql", "install/20_b.sql"):
        (sql / name).parent.mkdir(parents=True, exist_ok=True)
        (sql / name).write_text(name)
    (sql.parent / "core").mkdir()
    (sql.parent / "core" / "core.c").write_text("core")
    trees = []
    for version in ("15.1", "18.4"):
        script = tmp_path / f"pg_config_{version}"
        script.write_text(
            f'#!/bin/sh\ncase "$1" in --version) echo PostgreSQL {version};; '
            "--includedir-server) echo /usr/include/server;; *) exit 1;; esac\n"
        )
        script.chmod(0o755)
        trees.append(extension._build_tree(sql, script))
    tree = trees[0]
    assert trees[0] != trees[1] and tree.parent == sql / "build"
    extension._sync(sql, tree)
    assert (tree / "core" / "core.c").read_text() == "core"
    assert (tree / "sql" / "install" / "20_b.sql").is_file()
    (tree / "sql" / "src" / "glue.o").write_text("object")
    built = time.time()
    os.utime(tree / "sql" / "src" / "glue.o", (built, built))
    (sql / "src" / "glue.c").write_text("changed")
    os.utime(sql / "src" / "glue.c", (0, 0))  # e.g. restored from an old archive
    (sql / "install" / "20_b.sql").unlink()
    extension._sync(sql, tree)
    copy = tree / "sql" / "src" / "glue.c"
    assert copy.read_text() == "changed" and copy.stat().st_mtime >= built
    assert not (tree / "sql" / "install" / "20_b.sql").exists()
    assert (tree / "sql" / "src" / "glue.o").read_text() == "object"
    unchanged = (tree / "sql" / "Makefile").stat().st_mtime_ns
    extension._sync(sql, tree)
    assert (tree / "sql" / "Makefile").stat().st_mtime_ns == unchanged


def test_ensure_available_on_the_test_server(server_uri: str) -> None:
    try:
        extension.ensure_available(server_uri)
    except RuntimeError as err:
        pytest.skip(f"the extension does not build or install here: {err}")
    assert extension.ensure_available(server_uri) is False  # up to date: nothing to do
    with psycopg.connect(server_uri) as conn:
        row = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'dpsql'"
        ).fetchone()
    assert row == (extension.control_default_version(),)


# --- authentication (issue 24) --------------------------------------------------------------


@SHARED
def test_a_new_cluster_never_trusts(shared_cluster: tuple[Path, str]) -> None:
    pgdata, uri = shared_cluster
    passfile = server.password_file(pgdata)
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert not server._hba_trusts(pgdata)
    params = conninfo_to_dict(uri)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=params["host"], user="postgres", dbname="postgres", passfile="")
    assert _select_one(uri) == 1


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_a_planted_password_file_is_refused(pgdata: Path, tmp_path: Path, planted: str) -> None:
    """A password file that exists before the first start is someone else's: no cluster."""
    passfile = server.password_file(pgdata)
    target = tmp_path / "theirs"
    if planted == "file":
        passfile.write_text("*:*:*:postgres:chosen-by-someone-else\n")
    else:
        passfile.symlink_to(target)
    with pytest.raises(RuntimeError, match=r"^dpsql: .*\.pgpass exists"):
        server.start(pgdata=pgdata, keep_running=False)
    assert server.status(pgdata=pgdata) is None
    assert not (pgdata / "PG_VERSION").exists()  # refused before initdb
    if planted == "file":
        assert passfile.read_text() == "*:*:*:postgres:chosen-by-someone-else\n"
    else:
        assert passfile.is_symlink() and not target.exists()


def test_a_trusting_cluster_with_a_planted_password_file_is_refused(pgdata: Path) -> None:
    """A cluster initialised (trusting) but never secured by dpsql does not start with a
    password file dpsql did not write; without one, it is secured."""
    pgdata.mkdir()
    server._pgserver().PostgresServer(
        pgdata, cleanup_mode=None, postgres_version=server.DEFAULT_PG_VERSION
    ).ensure_pgdata_inited()
    assert server._hba_trusts(pgdata)
    passfile = server.password_file(pgdata)
    passfile.write_text("*:*:*:postgres:x\n")
    with pytest.raises(RuntimeError, match=r"^dpsql: .*\.pgpass exists"):
        server.start(pgdata=pgdata, keep_running=False)
    assert server.status(pgdata=pgdata) is None
    passfile.unlink()
    uri = server.start(pgdata=pgdata, keep_running=False)
    assert not server._hba_trusts(pgdata)
    assert _select_one(uri) == 1


def test_a_legacy_default_cluster_is_mentioned(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # before 0.8.0: <user data dir>/dpsql/pgdata-18, shared by every installation
    legacy = tmp_path / "pgdata-18"
    legacy.mkdir()
    (legacy / "PG_VERSION").write_text("18\n")
    new = tmp_path / "pgdata-18-0123abcd"
    with pytest.warns(UserWarning, match="DPSQL_PGDATA=.*pgdata-18"):
        server._mention_legacy_default(new, 18)
    new.mkdir()  # once the new one exists, nothing more is said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        server._mention_legacy_default(new, 18)
