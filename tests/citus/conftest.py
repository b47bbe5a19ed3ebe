"""A real Citus cluster (coordinator + 2 workers) for the tests of this directory.

By default a local one on the embedded PostgreSQL 18 (dpsql.citus.local_cluster); Citus is
built into it by ``make citus`` (``make test`` does it and sets ``DPSQL_REQUIRE_CITUS=1``, so
that a missing Citus fails instead of skipping). ``make docker-test`` runs these tests against
``docker/compose.citus.yml`` instead, through ``DPSQL_CITUS_EXTERNAL`` (JSON: the superuser's
password and each node's port and container). Every node runs with
``citus.coordinator_aggregation_strategy = 'disabled'``: an aggregate Citus cannot push down
fails instead of pulling every row to the coordinator.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from dpsql import citus, server

GUARD = {"citus.coordinator_aggregation_strategy": "'disabled'"}


@dataclass
class ExternalNode:
    """A node of a cluster in containers (the fields the tests use of citus.Node)."""

    name: str
    port: int
    container: str
    password: str

    @property
    def uri(self) -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/postgres"


@dataclass
class ExternalCluster:
    coordinator: ExternalNode
    workers: list[ExternalNode] = field(default_factory=list)

    def stop_node(self, node: ExternalNode, mode: str = "fast") -> None:
        # Always a fast shutdown here (the image's STOPSIGNAL), whatever the mode: after a
        # `docker kill` mid-training, the worker's crash recovery sometimes failed ("could not
        # create file base/...: File exists", an unlogged training table created in the crash
        # window), so the container never came back. The local cluster keeps -m immediate.
        del mode
        subprocess.run(
            ["docker", "stop", "-t", "30", node.container], check=True, capture_output=True
        )

    def start_node(self, node: ExternalNode) -> None:
        subprocess.run(["docker", "start", node.container], check=True, capture_output=True)
        try:
            # crash recovery after a kill, on a loaded machine, can take a while
            server.wait_until_ready(node.uri, 180)
        except psycopg.OperationalError as err:
            logs = subprocess.run(
                ["docker", "logs", "--tail", "40", node.container], capture_output=True, text=True
            )
            raise AssertionError(
                f"{node.name} did not come back:\n{logs.stdout}{logs.stderr}"
            ) from err


def _external(spec: dict[str, Any]) -> ExternalCluster:
    nodes = {
        name: ExternalNode(name, int(n["port"]), n["container"], spec["password"])
        for name, n in spec["nodes"].items()
    }
    cluster = ExternalCluster(
        nodes.pop("coordinator"), sorted(nodes.values(), key=lambda n: n.name)
    )
    for node in [cluster.coordinator, *cluster.workers]:
        with psycopg.connect(node.uri, autocommit=True) as conn:
            for name, value in GUARD.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
    return cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    external = os.environ.get("DPSQL_CITUS_EXTERNAL")
    if external:
        c = _external(json.loads(external))
        with psycopg.connect(c.coordinator.uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS dpsql")  # the image made it already
        yield c
        return
    if not citus.available(18):
        if os.environ.get("DPSQL_REQUIRE_CITUS") == "1":
            pytest.fail("Citus is not installed in the embedded PostgreSQL 18 (make citus)")
        pytest.skip("Citus is not installed in the embedded PostgreSQL 18: make test-citus")
    with citus.local_cluster(workers=2, version=18, settings=GUARD) as local:
        local.install_dpsql()  # CREATE EXTENSION propagates to the workers
        yield local


@pytest.fixture
def coord(cluster: Any) -> Iterator[psycopg.Connection]:
    """An autocommit superuser connection to the coordinator."""
    with psycopg.connect(cluster.coordinator.uri, autocommit=True) as conn:
        yield conn
