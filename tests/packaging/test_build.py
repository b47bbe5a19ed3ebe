"""The extension builds with PGXS against every PostgreSQL at hand (15 from Debian, 16, 18)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dpsql import server

REPO = Path(__file__).resolve().parents[2]
DEBIAN_15 = Path("/usr/lib/postgresql/15/bin/pg_config")


def _pg_configs() -> list[tuple[str, Path]]:
    found = [(f"embedded-{v}", server.pg_config_path(v)) for v in (16, 18)]
    if DEBIAN_15.exists() and Path("/usr/include/postgresql/15/server/postgres.h").exists():
        found.append(("debian-15", DEBIAN_15))
    return found


@pytest.mark.parametrize("name,pg_config", _pg_configs(), ids=[n for n, _ in _pg_configs()])
def test_extension_builds_without_warnings(tmp_path: Path, name: str, pg_config: Path) -> None:
    # A private copy: the checkout's objects belong to the installed build.
    shutil.copytree(
        REPO / "sql", tmp_path / "sql", ignore=shutil.ignore_patterns("*.o", "*.so", "build")
    )
    shutil.copytree(
        REPO / "core",
        tmp_path / "core",
        ignore=shutil.ignore_patterns("*.o"),
    )
    out = subprocess.run(
        ["make", "-C", str(tmp_path / "sql"), f"PG_CONFIG={pg_config}"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    warnings = [line for line in out.stderr.splitlines() if "warning:" in line]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "sql" / "dpsql.so").exists()
