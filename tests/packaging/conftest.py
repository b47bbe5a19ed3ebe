"""The packaging tests' shared builds (issue 43: each PGXS build of the extension takes 10-15 s;
one build for the embedded PostgreSQL 18 serves test_build.py and test_pg15.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dpsql import server
from tests.packaging.pgxs import copy_sources, make


@pytest.fixture(scope="session")
def embedded_18_build(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A fresh copy of the sources built for the embedded PostgreSQL 18 (`make -C sql`), and
    that build's outcome. Its tree is not to be changed: copy it (copy_built) to build on."""
    sql = copy_sources(tmp_path_factory.mktemp("build18"))
    return sql, make(sql, server.pg_config_path(18))
