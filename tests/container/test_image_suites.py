"""The suites that need the image rather than the embedded server, each once: the server suite's
smoke subset (``-m smoke``; `make test` runs all of it on the embedded server) and pg_regress
against the container, the single-node compose file, and the Citus compose file with the Citus
suite's smoke subset (`make test` runs all of it on a local cluster)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from dpsql import server
from tests.container.conftest import CITUS_IMAGE, IMAGE, ROOT, free_port


def _pytest(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def _compose(project: str, file: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        ["docker-compose", "-p", project, "-f", str(ROOT / "docker" / file), *args],
        env={**os.environ, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_server_smoke_subset_passes_against_the_image(running) -> None:
    _pytest("-m", "smoke", "tests/server", env={"DPSQL_TEST_DSN": running.dsn})


def test_pg_regress_against_the_image(running) -> None:
    info = conninfo_to_dict(running.dsn)
    libpq = {"PGHOST": "127.0.0.1", "PGPORT": str(info["port"]), "PGUSER": "postgres",
             "PGPASSWORD": str(info["password"])}  # fmt: skip
    done = subprocess.run(
        ["make", "-s", "installcheck", f"PG_CONFIG={server.pg_config_path()}"],
        cwd=ROOT, env={**os.environ, **libpq}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_compose_yml_creates_the_extension_on_first_start() -> None:
    if not IMAGE:
        pytest.skip("make docker-test runs these (DPSQL_IMAGE)")
    project = f"dpsql-compose-{secrets.token_hex(4)}"
    port, password = free_port(), secrets.token_urlsafe(16)
    env = {"POSTGRES_PASSWORD": password, "DPSQL_PORT": str(port), "DPSQL_IMAGE": IMAGE}
    try:
        _compose(project, "compose.yml", env, "up", "-d")
        dsn = f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"
        server.wait_until_ready(dsn, 180)
        with psycopg.connect(dsn) as conn:
            version = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'dpsql'"
            ).fetchone()
        assert version is not None, "compose: the extension was not created on first start"
    finally:
        _compose(project, "compose.yml", env, "down", "-v")


def test_the_citus_smoke_subset_passes_on_compose_citus() -> None:
    if not CITUS_IMAGE:
        pytest.skip("make docker-test runs these (DPSQL_CITUS_IMAGE)")
    project = f"dpsql-citus-{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(16)
    ports = {name: free_port() for name in ("coordinator", "worker1", "worker2")}
    env = {
        "POSTGRES_PASSWORD": password,
        "DPSQL_CITUS_IMAGE": CITUS_IMAGE,
        "DPSQL_COORDINATOR_PORT": str(ports["coordinator"]),
        "DPSQL_WORKER1_PORT": str(ports["worker1"]),
        "DPSQL_WORKER2_PORT": str(ports["worker2"]),
    }
    try:
        _compose(project, "compose.citus.yml", env, "up", "-d")
        dsn = f"postgresql://postgres:{password}@127.0.0.1:{ports['coordinator']}/postgres"
        server.wait_until_ready(dsn, 180)
        nodes = {
            name: {"port": port, "container": _compose(project, "compose.citus.yml", env, "ps",
                                                       "-q", name).strip()}
            for name, port in ports.items()
        }  # fmt: skip
        external = json.dumps({"password": password, "nodes": nodes})
        _pytest("-m", "smoke", "tests/citus",
                env={"DPSQL_CITUS_EXTERNAL": external, "DPSQL_REQUIRE_CITUS": "1"})  # fmt: skip
    finally:
        _compose(project, "compose.citus.yml", env, "down", "-v")
