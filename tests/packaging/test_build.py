"""The extension builds with PGXS against every PostgreSQL at hand (15 from Debian, 16, 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsql import server
from tests.packaging.pgxs import copy_sources, make

DEBIAN_15 = Path("/usr/lib/postgresql/15/bin/pg_config")


def _pg_configs() -> list[tuple[str, Path]]:
    found = [(f"embedded-{v}", server.pg_config_path(v)) for v in (16, 18)]
    if DEBIAN_15.exists() and Path("/usr/include/postgresql/15/server/postgres.h").exists():
        found.append(("debian-15", DEBIAN_15))
    return found


@pytest.mark.parametrize("name,pg_config", _pg_configs(), ids=[n for n, _ in _pg_configs()])
def test_extension_builds_without_warnings(
    request: pytest.FixtureRequest, tmp_path: Path, name: str, pg_config: Path
) -> None:
    if name == "embedded-18":  # the build test_pg15.py then installs into 15 (conftest.py)
        sql, out = request.getfixturevalue("embedded_18_build")
    else:
        sql = copy_sources(tmp_path)
        out = make(sql, pg_config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    warnings = [line for line in out.stderr.splitlines() if "warning:" in line]
    assert not warnings, "\n".join(warnings)
    assert (sql / "dpsql.so").exists()
