"""A throwaway cluster of Debian's PostgreSQL 15, for the tests of what installs there (a PGXS
build right after the embedded one, the Debian package). Installing into it needs root; its
server runs as the system user postgres, on a socket in a private directory (no TCP), with a
password for every login, and is stopped and removed at the end of the block."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")
PG_CONFIG = BIN / "pg_config"
HEADERS = Path("/usr/include/postgresql/15/server/postgres.h")


def require(*, headers: bool = False) -> None:
    """Skip (fail under ``DPSQL_REQUIRE_PG15=1``) unless root and Debian's 15 are here."""
    missing = [
        what
        for what, ok in (
            ("root (installing into /usr)", os.geteuid() == 0),
            (f"Debian's PostgreSQL 15 ({BIN / 'initdb'})", (BIN / "initdb").exists()),
            (f"its server headers ({HEADERS})", HEADERS.exists() or not headers),
        )
        if not ok
    ]
    if missing:
        message = "needs " + ", ".join(missing)
        if os.environ.get("DPSQL_REQUIRE_PG15") == "1":
            pytest.fail(message)
        pytest.skip(message)


def _as_postgres(*command: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True)


@contextlib.contextmanager
def cluster(local_auth: str = "scram-sha-256") -> Iterator[str]:
    """Yield the superuser's DSN of a new running cluster (unix socket only; ``local_auth``:
    ``peer`` as Debian's own clusters, where the DSN's password does not help)."""
    home = Path(tempfile.mkdtemp(prefix="dpsql-pg15-"))
    data = home / "data"
    password = secrets.token_urlsafe(16)
    try:
        shutil.chown(home, "postgres")
        pwfile = home / "pw"
        pwfile.write_text(password + "\n")
        shutil.chown(pwfile, "postgres")
        _as_postgres(str(BIN / "initdb"), "-D", str(data), "-U", "postgres",
                     f"--auth-local={local_auth}", "--auth-host=scram-sha-256",
                     f"--pwfile={pwfile}")  # fmt: skip
        pwfile.unlink()
        _as_postgres(str(BIN / "pg_ctl"), "-D", str(data), "-l", str(home / "log"), "-w",
                     "-o", f"-c listen_addresses='' -k {home}", "start")  # fmt: skip
        yield f"host={home} user=postgres password={password} dbname=postgres"
    finally:
        if (data / "postmaster.pid").exists():
            _as_postgres(str(BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(home, ignore_errors=True)
