"""The dpsql Docker image in running containers, through testcontainers-python.

``make docker-test`` (docker/docker_test.py) brings a Docker engine, builds the images and runs
this directory with ``DPSQL_IMAGE`` (the single-node image, ``--target dpsql``) and
``DPSQL_CITUS_IMAGE`` (``--target citus``) set; without them these tests skip. No image registry
is reachable on these machines, so testcontainers' reaper container (Ryuk) is off
(``TESTCONTAINERS_RYUK_DISABLED``): every container here is removed by its fixture, and
docker_test.py removes what is left by label at the end.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpsql import server

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("DPSQL_IMAGE")
CITUS_IMAGE = os.environ.get("DPSQL_CITUS_IMAGE")
LABEL = "dpsql.test"  # docker_test.py removes every container and volume carrying it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    """A container of the image: its superuser's, analyst's and owner's URIs over TCP."""

    container: object  # testcontainers' DockerContainer
    dsn: str
    analyst: str
    owner: str

    def restart(self) -> None:
        self.container.get_wrapped_container().restart(timeout=30)  # type: ignore[attr-defined]
        server.wait_until_ready(self.dsn, 120)


@pytest.fixture(scope="session")
def image() -> str:
    if not IMAGE:
        pytest.skip("make docker-test runs these (DPSQL_IMAGE)")
    return IMAGE


@pytest.fixture(scope="session")
def running(image: str) -> Iterator[Running]:
    """One container of the image (host network, 127.0.0.1 only, a free port) on a volume of
    its own, with the roles docker/initdb/10-dpsql.sh creates from the environment."""
    from testcontainers.core.container import DockerContainer

    port, password = free_port(), secrets.token_urlsafe(16)
    users = {role: (role, secrets.token_urlsafe(16)) for role in ("alice", "olivia")}
    volume = f"dpsql-test-{secrets.token_hex(4)}"
    container = DockerContainer(
        image,
        command=f"postgres -c port={port} -c listen_addresses=127.0.0.1",
        env={
            "POSTGRES_PASSWORD": password,
            "DPSQL_ANALYST": "alice",
            "DPSQL_ANALYST_PASSWORD": users["alice"][1],
            "DPSQL_OWNER": "olivia",
            "DPSQL_OWNER_PASSWORD": users["olivia"][1],
        },
        network_mode="host",
        labels={LABEL: "1"},
        volumes=[(volume, "/var/lib/postgresql/data", "rw")],
    )
    container.start()
    try:

        def uri(user: str, pw: str) -> str:
            return f"postgresql://{user}:{pw}@127.0.0.1:{port}/postgres"

        dsn = uri("postgres", password)
        server.wait_until_ready(dsn, 180)
        yield Running(container, dsn, uri(*users["alice"]), uri(*users["olivia"]))
    finally:
        container.stop()  # removes the container
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, check=False)
