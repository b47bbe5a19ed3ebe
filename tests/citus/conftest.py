"""A real local Citus cluster (coordinator + 2 workers) for the tests of this directory.

Citus is built into the embedded PostgreSQL by ``make citus`` (``make test-citus`` does it and
sets ``DPSQL_REQUIRE_CITUS=1``, so that a missing Citus fails instead of skipping). Every node
runs with ``citus.coordinator_aggregation_strategy = 'disabled'``: an aggregate Citus cannot
push down fails instead of pulling every row to the coordinator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from dpsql import citus, extension, server

GUARD = {"citus.coordinator_aggregation_strategy": "'disabled'"}


@pytest.fixture(scope="session")
def cluster() -> Iterator[citus.Cluster]:
    if not citus.available(18):
        if os.environ.get("DPSQL_REQUIRE_CITUS") == "1":
            pytest.fail("Citus is not installed in the embedded PostgreSQL 18 (make citus)")
        pytest.skip("Citus is not installed in the embedded PostgreSQL 18: make test-citus")
    with citus.local_cluster(workers=2, version=18, settings=GUARD) as c:
        # the nodes share one PostgreSQL install: one build serves them all
        extension.ensure_available(c.coordinator.uri, server.pg_config_path(18))
        with psycopg.connect(c.coordinator.uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION dpsql")  # propagates to the workers
        yield c


@pytest.fixture
def coord(cluster: citus.Cluster) -> Iterator[psycopg.Connection]:
    """An autocommit superuser connection to the coordinator."""
    with psycopg.connect(cluster.coordinator.uri, autocommit=True) as conn:
        yield conn
